/* test_causality.c: causal routing must not leak the future (METHOD.md section 4).
 * For many positions i, every token after i is replaced by random tokens and the logits at
 * positions <= i are compared. In `causal` and `prefix_sinkhorn` routing (soft and hard
 * attention) they must not change; in `sinkhorn` routing they do change, which documents why
 * `causal` is the default for evaluation. */
#include <math.h>
#include <string.h>

#include "../model/model.h"
#include "testutil.h"

enum { T = 96 };

/* Largest change of any logit at positions <= i when the tokens after i change, over i. */
static double leak(Model* m, Rng* rng, int* worst_i) {
    const int V = m->cfg.V;
    int tok[T], tok2[T];
    for (int t = 0; t < T; t++) tok[t] = (int)(rng_u64(rng) % V);
    model_forward(m, tok, NULL, 1, T, 0);
    real* ref = mallocCheck(sizeof(real) * T * V);
    memcpy(ref, model_logits(m), sizeof(real) * T * V);
    double worst = 0;
    *worst_i = -1;
    for (int i = 0; i < T - 1; i += 5) {
        memcpy(tok2, tok, sizeof tok);
        for (int t = i + 1; t < T; t++) tok2[t] = (int)(rng_u64(rng) % V);
        model_forward(m, tok2, NULL, 1, T, 0);
        double d = tu_max_abs_diff(ref, model_logits(m), (size_t)(i + 1) * V);
        if (d > worst) worst = d, *worst_i = i;
    }
    free(ref);
    return worst;
}

static void run(const char* preset) {
    ModelConfig cfg;
    FocusConfig fc;
    model_config_preset(preset, &cfg);
    cfg.maxT = T;
    focus_config_default(&fc);
    fc.K = 4, fc.dg = 8, fc.w = 6, fc.lambda = 10, fc.bias = 0.5f;
    Model m;
    model_build(&m, &cfg, &fc);
    model_init_backbone(&m, 11);
    for (size_t i = 0; i < m.num_params; i++) {
        if (m.params_mem[i] != 1 && m.params_mem[i] != 0) m.params_mem[i] *= 10;
    }
    for (int i = 0; i < cfg.L * fc.K; i++) m.beta[i] = (real)(0.5 * (i % 3));
    Rng rng;
    rng_seed(&rng, 99);
    struct {
        Routing r;
        AttnMode a;
        int topk;
        int expect_leak;
        int sinks;
        float topp;
    } cases[] = {
        {ROUTE_CAUSAL, ATTN_SOFT, 1, 0, 0, 0},   {ROUTE_CAUSAL, ATTN_HARD, 1, 0, 0, 0},
        {ROUTE_CAUSAL, ATTN_HARD, 2, 0, 0, 0},   {ROUTE_PREFIX, ATTN_SOFT, 1, 0, 0, 0},
        {ROUTE_PREFIX, ATTN_HARD, 2, 0, 0, 0},   {ROUTE_SINKHORN, ATTN_SOFT, 1, 1, 0, 0},
        {ROUTE_SINKHORN, ATTN_HARD, 1, 1, 0, 0}, {ROUTE_CAUSAL, ATTN_SOFT, 1, 0, 3, 0},
        {ROUTE_CAUSAL, ATTN_HARD, 1, 0, 3, 0},   {ROUTE_CAUSAL, ATTN_HARD, 0, 0, 2, 0.7f},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        m.fc.routing = cases[c].r;
        m.fc.attn = cases[c].a;
        m.fc.topk = cases[c].topk;
        m.fc.sinks = cases[c].sinks;
        m.fc.topp = cases[c].topp;
        int at;
        double d = leak(&m, &rng, &at);
        printf(
            "  %-10s %-15s %-4s k=%d p=%.1f sinks=%d: max change of logits at or before i = %.3e "
            "(at i = %d)\n",
            preset, routing_name(cases[c].r), cases[c].a == ATTN_SOFT ? "soft" : "hard",
            cases[c].topk, (double)cases[c].topp, cases[c].sinks, d, at);
        if (cases[c].expect_leak) {
            CHECK(d > 1e-3, "%s: sinkhorn routing was expected to leak future tokens (%g)", preset,
                  d);
        } else {
            CHECK(d < 1e-5, "%s %s: logits at or before i changed by %g", preset,
                  routing_name(cases[c].r), d);
        }
    }
    model_free(&m);
}

int main(void) {
    printf(
        "causality: tokens after i replaced, logits at positions <= i compared (T = %d, w = 6)\n",
        T);
    run("tiny-gpt2");
    run("tiny-llama");
    return tu_finish("test_causality");
}
