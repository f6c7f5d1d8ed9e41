/* test_equivalence.c: exact equivalences of the Focus model with the base model.
 * - router off (dense) and soft gate with w >= T give identical logits;
 * - hard top-k with k = K gives the dense logits;
 * - the hard mask attention equals a naive per-pair reference under the same mask;
 * - router-only training leaves every backbone weight byte-identical. */
#include <math.h>
#include <string.h>

#include "../kernels/attention.h"
#include "../model/model.h"
#include "testutil.h"

/* Per-pair reference: keep (i, j) iff j <= i and (i - j <= w or masks intersect). */
/* max |logits - ref| after a pass of m in the given mode (keep = 1: the training path, with
 * targets) */
static double pass_diff(Model* m, const real* ref, AttnMode mode, int keep, const int* tok,
                        const int* tgt, int B, int T) {
    m->fc.attn = mode;
    model_forward(m, tok, keep ? tgt : NULL, B, T, keep);
    return tu_max_abs_diff(ref, model_logits(m), (size_t)B * T * m->cfg.V);
}

static void naive_hard_attention(real* out, const real* qkv, const uint32_t* mask, int B, int T,
                                 int NH, int NKV, int hs, int w, int sinks) {
    int C = NH * hs, QKV = (NH + 2 * NKV) * hs;
    double* p = mallocCheck(sizeof(double) * T);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            int kvh = h / (NH / NKV);
            for (int i = 0; i < T; i++) {
                const real* q = qkv + ((size_t)b * T + i) * QKV + h * hs;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= i; j++) {
                    int keep = i - j <= w || j < sinks || (mask[b * T + i] & mask[b * T + j]);
                    const real* k = qkv + ((size_t)b * T + j) * QKV + C + kvh * hs;
                    double s = 0;
                    for (int e = 0; e < hs; e++) s += (double)q[e] * k[e];
                    p[j] = keep ? s / sqrt((double)hs) : -INFINITY;
                    mx = fmax(mx, p[j]);
                }
                for (int j = 0; j <= i; j++) sum += p[j] = exp(p[j] - mx);
                for (int e = 0; e < hs; e++) {
                    double o = 0;
                    for (int j = 0; j <= i; j++)
                        o += p[j] * qkv[((size_t)b * T + j) * QKV + C + NKV * hs + kvh * hs + e];
                    out[((size_t)b * T + i) * C + h * hs + e] = (real)(o / sum);
                }
            }
        }
    }
    free(p);
}

static void check_hard_kernel(int K, int topk, int T, int sinks) {
    enum { B = 2, NH = 4, NKV = 2, hs = 16, w = 9 };
    Rng rng;
    rng_seed(&rng, (uint64_t)(K * 100 + topk * 10 + T));
    size_t nqkv = (size_t)B * T * (NH + 2 * NKV) * hs, nout = (size_t)B * T * NH * hs;
    real* qkv = mallocCheck(sizeof(real) * nqkv);
    real* out = mallocCheck(sizeof(real) * nout);
    real* ref = mallocCheck(sizeof(real) * nout);
    real* lse = mallocCheck(sizeof(real) * B * NH * T);
    uint32_t* mask = mallocCheck(sizeof(uint32_t) * B * T);
    tu_randn(qkv, nqkv, 1, &rng);
    /* Random top-k masks; group K-1 is left empty to cover empty groups. */
    for (int i = 0; i < B * T; i++) {
        uint32_t m = 0;
        while (__builtin_popcount(m) < topk) m |= 1u << (rng_u64(&rng) % (K > 1 ? K - 1 : 1));
        mask[i] = m;
    }
    AttnGate g = {GATE_HARD, K, w, NULL, mask, 0, 0, sinks};
    attention_forward(out, lse, qkv, &g, B, T, NH, NKV, hs);
    naive_hard_attention(ref, qkv, mask, B, T, NH, NKV, hs, w, sinks);
    double d = tu_max_abs_diff(out, ref, nout);
    printf(
        "  hard mask attention vs per-pair reference, K=%d k=%d T=%d sinks=%d: max |diff| = %.2e\n",
        K, topk, T, sinks, d);
    CHECK(d < 1e-5, "hard attention differs from the reference by %g (K=%d k=%d T=%d)", d, K, topk,
          T);
    free(qkv), free(out), free(ref), free(lse), free(mask);
}

/* gemma3: its sliding-window layers through the band kernel (evaluation) and through the
 * reference kernel with an all-zero hard gate (training) give the same model; the head of an
 * evaluation pass computed a few rows at a time (model_head_rows: Gemma's 262,144-token
 * vocabulary at long context) gives every row's loss and greedy statistics unchanged. */
static void check_gemma3(void) {
    ModelConfig cfg;
    FocusConfig fc;
    model_config_preset("tiny-gemma3", &cfg);
    focus_config_default(&fc);
    fc.attn = ATTN_DENSE;
    Model m;
    model_build(&m, &cfg, &fc);
    model_init_backbone(&m, 6);
    enum { B = 2, T = 40 };
    int tok[B * T], tgt[B * T];
    Rng rng;
    rng_seed(&rng, 9);
    for (int i = 0; i < B * T; i++)
        tok[i] = (int)(rng_u64(&rng) % cfg.V), tgt[i] = i % 7 ? (int)(rng_u64(&rng) % cfg.V) : -1;
    const size_t n = (size_t)B * T * cfg.V, bt = (size_t)B * T;
    real* ref = mallocCheck(sizeof(real) * n);
    real *loss = mallocCheck(sizeof(real) * bt * 3), *mx = loss + bt, *ty = mx + bt;
    model_forward(&m, tok, tgt, B, T, 1); /* reference kernel, zero masks on local layers */
    memcpy(ref, model_logits(&m), sizeof(real) * n);
    model_forward(&m, tok, tgt, B, T, 0); /* band kernel on local layers, flash on the global */
    const double kernels = tu_max_abs_diff(ref, model_logits(&m), n);
    memcpy(loss, m.losses, sizeof(real) * bt);
    memcpy(mx, m.row_max, sizeof(real) * bt);
    memcpy(ty, m.row_target, sizeof(real) * bt);
    model_set_head_limit((size_t)cfg.V * 16); /* chunks of 4 rows */
    CHECK(model_head_rows(&cfg, bt, 0) == 4, "head rows %zu", model_head_rows(&cfg, bt, 0));
    model_forward(&m, tok, tgt, B, T, 0);
    /* The same rows, the same arithmetic, but the BLAS library may take another kernel for a
     * 4-row product than for an 80-row one (OpenBLAS does on AMD Zen; on Intel Sapphire Rapids
     * the results were bit for bit), so rounding in the last bits is allowed. */
    const double dloss = tu_max_abs_diff(loss, m.losses, bt); /* masked rows hold 0 in both */
    const double dstat =
        fmax(tu_max_abs_diff(mx, m.row_max, bt), tu_max_abs_diff(ty, m.row_target, bt));
    model_set_head_limit(0);
    printf(
        "tiny-gemma3: local layers' band vs gated kernel %.2e; head in chunks of 4 rows: loss "
        "%.2e, greedy statistics %.2e\n",
        kernels, dloss, dstat);
    CHECK(kernels < 1e-5, "gemma3: band and gated local attention differ by %g", kernels);
    CHECK(dloss < 1e-5 && dstat < 1e-5,
          "gemma3: the chunked head changed a loss (%g) or a greedy statistic (%g)", dloss, dstat);
    free(ref), free(loss);
    model_free(&m);
}

int main(void) {
    check_gemma3();
    for (int p = 0; p < 2; p++) {
        const char* preset = p ? "tiny-llama" : "tiny-gpt2";
        ModelConfig cfg;
        FocusConfig fc;
        model_config_preset(preset, &cfg);
        focus_config_default(&fc);
        fc.K = 4, fc.dg = 8, fc.w = 5, fc.routing = ROUTE_CAUSAL;
        Model m;
        model_build(&m, &cfg, &fc);
        model_init_backbone(&m, 5);
        enum { B = 2, T = 50 };
        int tok[B * T], tgt[B * T];
        Rng rng;
        rng_seed(&rng, 8);
        for (int i = 0; i < B * T; i++)
            tok[i] = (int)(rng_u64(&rng) % cfg.V), tgt[i] = (int)(rng_u64(&rng) % cfg.V);
        size_t n = (size_t)B * T * cfg.V;
        real* dense = mallocCheck(sizeof(real) * n);
        real* fast = mallocCheck(sizeof(real) * n);
        m.fc.attn = ATTN_DENSE;
        model_forward(&m, tok, tgt, B, T, 1); /* training path: reference attention kernel */
        memcpy(dense, model_logits(&m), sizeof(real) * n);
        model_forward(&m, tok, NULL, B, T, 0); /* inference path: flash kernel */
        memcpy(fast, model_logits(&m), sizeof(real) * n);
        double kernels = tu_max_abs_diff(dense, fast, n);

#define DIFF(ref, mode, keep) pass_diff(&m, ref, mode, keep, tok, tgt, B, T)
        double gated = DIFF(dense, ATTN_SOFT, 1);
        m.fc.w = T;
        double wide = DIFF(dense, ATTN_SOFT, 1);
        m.fc.w = 5;
        m.fc.topk = fc.K;
        double hardK = DIFF(fast, ATTN_HARD, 0);
        m.fc.topk = 1;
        double hard1 = DIFF(fast, ATTN_HARD, 0);
        /* every position a sink: every pair kept, in every mode */
        m.fc.sinks = T;
        double hard_sinks = DIFF(fast, ATTN_HARD, 0), soft_sinks = DIFF(dense, ATTN_SOFT, 1);
        /* one sink changes the hard model (position 0 is kept by every query) */
        m.fc.sinks = 1;
        double hard_sink1 = DIFF(fast, ATTN_HARD, 0);
        /* every layer dense: the router is off everywhere */
        m.fc.sinks = 0;
        m.fc.dense_layers[0] = (1u << cfg.L) - 1;
        double all_dense = DIFF(fast, ATTN_HARD, 0);
        m.fc.dense_layers[0] = 0;
#undef DIFF
        printf(
            "%s: sinks = T: hard %.2e, soft %.2e; one sink, hard k=1: %.2e; every layer in "
            "dense_layers: %.2e\n",
            preset, hard_sinks, soft_sinks, hard_sink1, all_dense);
        CHECK(hard_sinks < 1e-5, "%s: hard with sinks = T must equal dense (%g)", preset,
              hard_sinks);
        CHECK(soft_sinks == 0, "%s: soft with sinks = T must equal dense (%g)", preset, soft_sinks);
        CHECK(fabs(hard_sink1 - hard1) > 1e-7, "%s: a sink must change the hard model", preset);
        CHECK(all_dense == 0, "%s: all layers dense must equal dense (%g)", preset, all_dense);
        printf(
            "%s: max |logit - dense| soft w=5: %.2e, soft w>=T: %.2e, hard k=K: %.2e, hard k=1: "
            "%.2e; "
            "flash vs reference dense kernel: %.2e\n",
            preset, gated, wide, hardK, hard1, kernels);
        CHECK(kernels < 1e-5, "%s: flash and reference dense attention differ by %g", preset,
              kernels);
        CHECK(gated > 1e-6, "%s: the gate must change something when w < T", preset);
        CHECK(wide == 0, "%s: soft gate with w >= T must equal the base model (%g)", preset, wide);
        CHECK(hardK == 0, "%s: hard with k = K must equal dense (%g)", preset, hardK);
        CHECK(hard1 > 1e-6, "%s: hard with k = 1 must drop pairs", preset);

        /* Router-only training steps leave the backbone byte-identical. */
        real* before = mallocCheck(sizeof(real) * m.num_params);
        memcpy(before, m.params_mem, sizeof(real) * m.num_params);
        m.fc.attn = ATTN_SOFT;
        m.fc.routing = ROUTE_SINKHORN;
        model_forward(&m, tok, tgt, B, T, 1);
        model_zero_grad(&m, GRAD_ROUTER);
        model_backward(&m, GRAD_ROUTER);
        double gnorm = 0;
        for (size_t i = 0; i < m.num_router; i++)
            gnorm += (double)m.rgrads_mem[i] * m.rgrads_mem[i];
        CHECK(gnorm > 0, "%s: router gradient must be non-zero", preset);
        CHECK(m.grads_mem == NULL, "%s: router-only backward must not allocate backbone gradients",
              preset);
        CHECK(!memcmp(before, m.params_mem, sizeof(real) * m.num_params), "%s: backbone changed",
              preset);
        free(before);
        free(dense);
        free(fast);
        model_free(&m);
    }
    for (int K = 4; K <= 8; K += 4) {
        for (int k = 1; k <= 3; k++) check_hard_kernel(K, k, 150, 0);
    }
    check_hard_kernel(4, 1, 64, 0);
    check_hard_kernel(8, 1, 150, 4);
    return tu_finish("test_equivalence");
}
