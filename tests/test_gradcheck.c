/* test_gradcheck.c: every backward pass against central finite differences, in double
 * precision (this test links the FOCUS_DOUBLE build of the engine).
 *
 * For a kernel y = f(x) the scalar checked is sum(y * R) for a fixed random R, whose gradient
 * is the kernel's backward with dout = R. The error measure is the worst absolute difference
 * between analytic and numeric gradient, divided by the largest numeric gradient entry of that
 * tensor. Whole-model checks use the mean cross-entropy of tiny GPT-2 and LLaMA models with the
 * router on (K = 4, w = 8, T = 40, 10 Sinkhorn iterations). */
#include <math.h>
#include <string.h>

#include "../kernels/attention.h"
#include "../kernels/cpu.h"
#include "../model/model.h"
#include "../kernels/router.h"
#include "testutil.h"

#ifndef FOCUS_DOUBLE
#error "test_gradcheck must be built against the double engine (focus_core64)"
#endif

typedef double (*LossFn)(void* ctx);

static double worst_overall = 0;

/* Worst relative error of analytic gradient g against central differences of fn in x.
 * At most maxn entries are checked, evenly strided. */
static double fd_check(LossFn fn, void* ctx, real* x, const real* g, size_t n, size_t maxn,
                       double h) {
    size_t step = n > maxn ? n / maxn : 1;
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n; i += step) {
        real keep = x[i];
        x[i] = keep + h;
        double lp = fn(ctx);
        x[i] = keep - h;
        double lm = fn(ctx);
        x[i] = keep;
        double num = (lp - lm) / (2 * h);
        double d = fabs(num - g[i]);
        if (d > worst) worst = d;
        if (fabs(num) > scale) scale = fabs(num);
    }
    return worst / (scale > 1e-30 ? scale : 1e-30);
}

static void report(const char* what, double err, double bound) {
    printf("  %-44s worst rel err %.3e (bound %.0e)\n", what, err, bound);
    if (err > worst_overall) worst_overall = err;
    CHECK(err < bound, "%s: gradient error %.3e exceeds %.0e", what, err, bound);
}

static double dot_r(const real* y, const real* r, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)y[i] * r[i];
    return s;
}

static Rng rng;
#define TOL 1e-6

/* ---------------------------------------------------------------- matmul */
typedef struct {
    real *inp, *w, *b, *out, *R;
    int N, IC, OC;
} MatmulCtx;
static double matmul_loss(void* p) {
    MatmulCtx* c = p;
    matmul_forward(c->out, c->inp, c->w, c->b, c->N, c->IC, c->OC);
    return dot_r(c->out, c->R, (size_t)c->N * c->OC);
}
static void check_matmul(void) {
    MatmulCtx c = {.N = 5, .IC = 7, .OC = 6};
    real buf[5 * 7 + 6 * 7 + 6 + 5 * 6 * 2];
    c.inp = buf, c.w = c.inp + 35, c.b = c.w + 42, c.out = c.b + 6, c.R = c.out + 30;
    tu_randn(buf, 35 + 42 + 6, 1, &rng);
    tu_randn(c.R, 30, 1, &rng);
    real dinp[35] = {0}, dw[42] = {0}, db[6] = {0};
    matmul_backward(dinp, dw, db, c.R, c.inp, c.w, c.N, c.IC, c.OC);
    report("matmul dinp", fd_check(matmul_loss, &c, c.inp, dinp, 35, 1000, 1e-6), TOL);
    report("matmul dweight", fd_check(matmul_loss, &c, c.w, dw, 42, 1000, 1e-6), TOL);
    report("matmul dbias", fd_check(matmul_loss, &c, c.b, db, 6, 1000, 1e-6), TOL);
}

/* ---------------------------------------------------------------- norms */
typedef struct {
    real *inp, *w, *b, *out, *mean, *rstd, *R;
    int N, C, rms;
} NormCtx;
static double norm_loss(void* p) {
    NormCtx* c = p;
    if (c->rms)
        rmsnorm_forward(c->out, c->rstd, c->inp, c->w, c->N, c->C, 1e-5);
    else
        layernorm_forward(c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C, 1e-5);
    return dot_r(c->out, c->R, (size_t)c->N * c->C);
}
static void check_norm(int rms) {
    enum { N = 4, C = 9 };
    real inp[N * C], w[C], b[C], out[N * C], mean[N], rstd[N], R[N * C];
    NormCtx c = {inp, w, b, out, mean, rstd, R, N, C, rms};
    tu_randn(inp, N * C, 2, &rng);
    tu_randn(w, C, 1, &rng);
    tu_randn(b, C, 1, &rng);
    tu_randn(R, N * C, 1, &rng);
    norm_loss(&c);
    real dinp[N * C] = {0}, dw[C] = {0}, db[C] = {0};
    if (rms)
        rmsnorm_backward(dinp, dw, R, inp, w, rstd, N, C);
    else
        layernorm_backward(dinp, dw, db, R, inp, w, mean, rstd, N, C);
    const char* nm = rms ? "rmsnorm" : "layernorm";
    char what[64];
    snprintf(what, sizeof what, "%s dinp", nm);
    report(what, fd_check(norm_loss, &c, inp, dinp, N * C, 1000, 1e-6), TOL);
    snprintf(what, sizeof what, "%s dweight", nm);
    report(what, fd_check(norm_loss, &c, w, dw, C, 1000, 1e-6), TOL);
    if (!rms) report("layernorm dbias", fd_check(norm_loss, &c, b, db, C, 1000, 1e-6), TOL);
}

/* ---------------------------------------------------------------- pointwise */
typedef struct {
    real *inp, *out, *R;
    int N, F, kind; /* 0 gelu, 1 swiglu, 2 geglu */
} PointCtx;
static double point_loss(void* p) {
    PointCtx* c = p;
    if (c->kind == 0)
        gelu_forward(c->out, c->inp, (size_t)c->N * c->F);
    else if (c->kind == 1)
        swiglu_forward(c->out, c->inp, c->N, c->F);
    else
        geglu_forward(c->out, c->inp, c->N, c->F);
    return dot_r(c->out, c->R, (size_t)c->N * c->F);
}
static void check_pointwise(int kind) {
    enum { N = 3, F = 11 };
    real inp[N * 2 * F], out[N * F], R[N * F], dinp[N * 2 * F] = {0};
    PointCtx c = {inp, out, R, N, F, kind};
    tu_randn(inp, N * 2 * F, 2, &rng);
    tu_randn(R, N * F, 1, &rng);
    if (kind == 0)
        gelu_backward(dinp, inp, R, N * F);
    else if (kind == 1)
        swiglu_backward(dinp, inp, R, N, F);
    else
        geglu_backward(dinp, inp, R, N, F);
    report(kind == 0   ? "gelu dinp"
           : kind == 1 ? "swiglu dinp"
                       : "geglu dinp",
           fd_check(point_loss, &c, inp, dinp, kind ? N * 2 * F : N * F, 1000, 1e-6), TOL);
}

/* ---------------------------------------------------------------- rope */
typedef struct {
    real *qkv, *tmp, *R;
    int B, T, NH, NKV, hs, halves;
} RopeCtx;
static double rope_loss(void* p) {
    RopeCtx* c = p;
    size_t n = (size_t)c->B * c->T * (c->NH + 2 * c->NKV) * c->hs;
    memcpy(c->tmp, c->qkv, n * sizeof(real));
    (c->halves ? rope_halves_forward : rope_forward)(c->tmp, c->B, c->T, c->NH, c->NKV, c->hs,
                                                     10000, 3);
    return dot_r(c->tmp, c->R, n);
}
static void check_rope(int halves) {
    enum { B = 2, T = 5, NH = 4, NKV = 2, hs = 6, n = B * T * (NH + 2 * NKV) * hs };
    real qkv[n], tmp[n], R[n], d[n];
    RopeCtx c = {qkv, tmp, R, B, T, NH, NKV, hs, halves};
    tu_randn(qkv, n, 1, &rng);
    tu_randn(R, n, 1, &rng);
    memcpy(d, R, sizeof d);
    (halves ? rope_halves_backward : rope_backward)(d, B, T, NH, NKV, hs, 10000, 3);
    report(halves ? "rope (half-split pairs) dqkv" : "rope dqkv",
           fd_check(rope_loss, &c, qkv, d, n, 1000, 1e-6), TOL);
}

/* QK-norm: the per-head RMSNorm of q and k heads (v left alone) */
typedef struct {
    real *qkv, *tmp, *pre, *rstd, *qw, *kw, *R;
    int N, NH, NKV, hs;
} QkCtx;
static double qk_loss(void* p) {
    QkCtx* c = p;
    size_t n = (size_t)c->N * (c->NH + 2 * c->NKV) * c->hs;
    memcpy(c->tmp, c->qkv, n * sizeof(real));
    qknorm_forward(c->tmp, c->pre, c->rstd, c->qw, c->kw, c->N, c->NH, c->NKV, c->hs, 1e-6);
    return dot_r(c->tmp, c->R, n);
}
static void check_qknorm(void) {
    enum { N = 5, NH = 4, NKV = 2, hs = 6, n = N * (NH + 2 * NKV) * hs };
    real qkv[n], tmp[n], R[n], d[n], pre[N * (NH + NKV) * hs], rstd[N * (NH + NKV)], qw[hs], kw[hs];
    QkCtx c = {qkv, tmp, pre, rstd, qw, kw, R, N, NH, NKV, hs};
    tu_randn(qkv, n, 1, &rng);
    tu_randn(R, n, 1, &rng);
    tu_randn(qw, hs, 1, &rng);
    tu_randn(kw, hs, 1, &rng);
    qk_loss(&c); /* pre and rstd of the point */
    memcpy(d, R, sizeof d);
    qknorm_backward(d, pre, rstd, qw, kw, N, NH, NKV, hs);
    report("qk-norm dqkv", fd_check(qk_loss, &c, qkv, d, n, 1000, 1e-6), TOL);
}

/* ---------------------------------------------------------------- attention */
typedef struct {
    real *qkv, *G, *gatep, *out, *lse, *R;
    AttnGate gate;
    int B, T, NH, NKV, hs;
} AttnCtx;
static double attn_loss(void* p) {
    AttnCtx* c = p;
    c->gate.lambda = c->gatep[0];
    c->gate.bias = c->gatep[1];
    attention_forward(c->out, c->lse, c->qkv, &c->gate, c->B, c->T, c->NH, c->NKV, c->hs);
    return dot_r(c->out, c->R, (size_t)c->B * c->T * c->NH * c->hs);
}
static void check_attention(GateMode mode, int sinks) {
    /* T = 70 spans two row blocks of 64; GQA with 2 query heads per key/value head. */
    enum { B = 2, T = 70, NH = 4, NKV = 2, hs = 8, K = 3 };
    size_t nqkv = (size_t)B * T * (NH + 2 * NKV) * hs, nout = (size_t)B * T * NH * hs;
    real* qkv = mallocCheck(sizeof(real) * nqkv);
    real* out = mallocCheck(sizeof(real) * nout);
    real* R = mallocCheck(sizeof(real) * nout);
    real lse[B * NH * T], G[B * T * K], gatep[2] = {4, 0.4};
    tu_randn(qkv, nqkv, 1, &rng);
    tu_randn(R, nout, 1, &rng);
    for (int i = 0; i < B * T * K; i++) G[i] = (real)rng_uniform(&rng);
    AttnCtx c = {qkv, G, gatep, out, lse, R, {mode, K, 5, G, NULL, 0, 0, sinks}, B, T, NH, NKV, hs};
    attn_loss(&c);
    real* dqkv = callocCheck(nqkv, sizeof(real));
    real dG[B * T * K], dgate[2] = {0, 0};
    memset(dG, 0, sizeof dG);
    attention_backward(dqkv, dG, dgate, R, qkv, out, lse, &c.gate, B, T, NH, NKV, hs);
    char nm[64], what[96];
    snprintf(nm, sizeof nm, "attention (%s, GQA%s)", mode == GATE_SOFT ? "soft gate" : "no gate",
             sinks ? ", 3 sinks" : "");
    snprintf(what, sizeof what, "%s dqkv", nm);
    report(what, fd_check(attn_loss, &c, qkv, dqkv, nqkv, 600, 1e-6), TOL);
    if (mode == GATE_SOFT) {
        snprintf(what, sizeof what, "%s dG", nm);
        report(what, fd_check(attn_loss, &c, G, dG, B * T * K, 420, 1e-6), TOL);
        snprintf(what, sizeof what, "%s dlambda, db", nm);
        report(what, fd_check(attn_loss, &c, gatep, dgate, 2, 2, 1e-6), TOL);
    }
    free(qkv);
    free(out);
    free(R);
    free(dqkv);
}

/* ---------------------------------------------------------------- router */
typedef struct {
    real *h, *wg, *cent, *proj, *S, *R;
    int N, C, dg, K;
} ScoreCtx;
static double score_loss(void* p) {
    ScoreCtx* c = p;
    router_scores_forward(c->proj, c->S, c->h, c->wg, c->cent, c->N, c->C, c->dg, c->K);
    return dot_r(c->S, c->R, (size_t)c->N * c->K);
}
static void check_scores(void) {
    enum { N = 6, C = 10, dg = 4, K = 3 };
    real h[N * C], wg[C * dg], cent[K * dg], proj[N * dg], S[N * K], R[N * K], dproj[N * dg];
    ScoreCtx c = {h, wg, cent, proj, S, R, N, C, dg, K};
    tu_randn(h, N * C, 1, &rng);
    tu_randn(wg, C * dg, 1, &rng);
    tu_randn(cent, K * dg, 1, &rng);
    tu_randn(R, N * K, 1, &rng);
    score_loss(&c);
    real dh[N * C] = {0}, dwg[C * dg] = {0}, dcent[K * dg] = {0};
    router_scores_backward(dh, dwg, dcent, dproj, R, h, proj, wg, cent, N, C, dg, K);
    report("router scores dh", fd_check(score_loss, &c, h, dh, N * C, 1000, 1e-6), TOL);
    report("router scores dW_g", fd_check(score_loss, &c, wg, dwg, C * dg, 1000, 1e-6), TOL);
    report("router scores dC", fd_check(score_loss, &c, cent, dcent, K * dg, 1000, 1e-6), TOL);
}

typedef struct {
    real *S, *G, *beta, *R;
    Routing mode;
    int B, T, K, iters;
    real tau;
} RouteCtx;
static double route_loss(void* p) {
    RouteCtx* c = p;
    routing_forward(c->G, NULL, c->S, c->beta, c->mode, c->B, c->T, c->K, c->tau, c->iters);
    return dot_r(c->G, c->R, (size_t)c->B * c->T * c->K);
}
static void check_routing(Routing mode) {
    enum { B = 2, T = 13, K = 4 };
    real S[B * T * K], G[B * T * K], beta[K], R[B * T * K], dS[B * T * K];
    RouteCtx c = {S, G, beta, R, mode, B, T, K, 10, 0.1f};
    tu_randn(S, B * T * K, 0.3, &rng); /* S / tau then has unit scale */
    tu_randn(beta, K, 1, &rng);
    tu_randn(R, B * T * K, 1, &rng);
    route_loss(&c);
    memset(dS, 0, sizeof dS);
    routing_backward(dS, R, S, G, beta, mode, B, T, K, c.tau, c.iters);
    char what[64];
    snprintf(what, sizeof what, "routing %s (10 iterations) dS", routing_name(mode));
    report(what, fd_check(route_loss, &c, S, dS, B * T * K, 1000, 1e-6), TOL);
}

/* ---------------------------------------------------------------- whole model */
typedef struct {
    Model* m;
    int *inp, *tgt, B, T;
} ModelCtx;
static double model_loss(void* p) {
    ModelCtx* c = p;
    model_forward(c->m, c->inp, c->tgt, c->B, c->T, 1);
    return c->m->mean_loss;
}

/* A model whose gradients carry signal everywhere: larger weights than a trained model's init, so
 * attention and routing are far from uniform; random tokens and targets (B, T), one ignored. */
static void build_checked_model(Model* m, const ModelConfig* cfg, const FocusConfig* fc,
                                uint64_t seed, int* inp, int* tgt, int n, int ignored) {
    model_build(m, cfg, fc);
    model_init_backbone(m, seed);
    for (size_t i = 0; i < m->num_params; i++)
        if (m->params_mem[i] != 1 && m->params_mem[i] != 0) m->params_mem[i] *= 12;
    for (size_t i = 0; i < m->router_sizes[0] + m->router_sizes[1]; i++) m->router_mem[i] *= 0.2;
    for (int i = 0; i < n; i++) {
        inp[i] = (int)(rng_u64(&rng) % cfg->V);
        tgt[i] = (int)(rng_u64(&rng) % cfg->V);
    }
    tgt[ignored] = -1;
}

/* sinks: attention sinks; dense1: layer 1 keeps dense attention (router gradient zero there). */
static void check_model(const char* preset, Routing routing, int qkv_bias, int sinks, int dense1) {
    ModelConfig cfg;
    FocusConfig fc;
    model_config_preset(preset, &cfg);
    cfg.qkv_bias = qkv_bias;
    focus_config_default(&fc);
    fc.K = 4, fc.dg = 4, fc.w = 8, fc.iters = 10, fc.routing = routing, fc.learn_gate = 1;
    fc.lambda = 4, fc.bias = 0.4f, fc.sinks = sinks;
    if (dense1) fc.dense_layers[0] = 2;
    /* gemma3 (tiny: layers local, global, local): the router on the global layer only, its
     * gradient flowing back through the local layer after it; with qkv_bias set here, the
     * router on every layer (local = route) */
    if (cfg.arch == ARCH_GEMMA3 && qkv_bias) cfg.qkv_bias = 0, fc.local = LOCAL_ROUTE;
    enum { B = 2, T = 40 };
    int inp[B * T], tgt[B * T];
    Model m;
    build_checked_model(&m, &cfg, &fc, 7, inp, tgt, B * T, 3);
    ModelCtx c = {&m, inp, tgt, B, T};
    char what[96], name[64];
    snprintf(name, sizeof name, "%s%s%s%s", routing_name(routing), sinks ? " +sinks" : "",
             dense1 ? " +dense layer 1" : "",
             fc.local == LOCAL_ROUTE ? " +routed local layers" : "");

    model_loss(&c);
    model_zero_grad(&m, GRAD_ROUTER);
    model_backward(&m, GRAD_ROUTER);
    real* rg = mallocCheck(sizeof(real) * m.num_router);
    memcpy(rg, m.rgrads_mem, sizeof(real) * m.num_router);
    snprintf(what, sizeof what, "%s %s router-only: W_g", preset, name);
    report(what, fd_check(model_loss, &c, m.router.wg, rg, m.router_sizes[0], 300, 1e-6), 2e-6);
    snprintf(what, sizeof what, "%s %s router-only: C", preset, name);
    report(what,
           fd_check(model_loss, &c, m.router.cent, rg + m.router_sizes[0], m.router_sizes[1], 300,
                    1e-6),
           2e-6);
    snprintf(what, sizeof what, "%s %s router-only: lambda, b", preset, name);
    report(what,
           fd_check(model_loss, &c, m.router.gate, rg + m.router_sizes[0] + m.router_sizes[1],
                    m.router_sizes[ROUTER_GATE], 100, 1e-6),
           2e-6);

    if (cfg.arch == ARCH_GEMMA3) { /* gemma3 trains its router only */
        free(rg);
        model_free(&m);
        return;
    }
    /* All parameters: backbone gradients too; router gradients must agree with router-only. */
    model_loss(&c);
    model_zero_grad(&m, GRAD_ALL);
    model_backward(&m, GRAD_ALL);
    double rdiff = tu_max_abs_diff(rg, m.rgrads_mem, m.num_router);
    CHECK(rdiff < 1e-12, "%s: router gradients differ between GRAD_ROUTER and GRAD_ALL by %g",
          preset, rdiff);
    real* g = mallocCheck(sizeof(real) * m.num_params);
    memcpy(g, m.grads_mem, sizeof(real) * m.num_params);
    real** pt = (real**)&m.params;
    real** gt = (real**)&m.grads;
    static const char* names[NUM_PARAM_TENSORS] = {
        "wte",      "wpe",  "ln1w",   "ln1b",   "qkvw",   "qkvb",    "attprojw",
        "attprojb", "ln2w", "ln2b",   "fcw",    "fcb",    "fcprojw", "fcprojb",
        "lnfw",     "lnfb", "lmhead", "qnormw", "knormw", "pan",     "pfn"};
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        if (!pt[t]) continue;
        snprintf(what, sizeof what, "%s %s all-params: %s", preset, name, names[t]);
        report(
            what,
            fd_check(model_loss, &c, pt[t], g + (gt[t] - m.grads_mem), m.param_sizes[t], 60, 1e-6),
            2e-6);
    }
    free(rg);
    free(g);
    model_free(&m);
}

/* ---------------------------------------------------------------- objectives */
static double model_kl_loss(void* p) {
    ModelCtx* c = p;
    model_forward(c->m, c->inp, c->tgt, c->B, c->T, 1);
    return c->m->mean_kl;
}
/* The attn objective with its targets held fixed (they are the teacher's, a constant). */
static double model_attn_loss(void* p) {
    ModelCtx* c = p;
    AttnMode keep = c->m->fc.attn;
    c->m->fc.attn = ATTN_DENSE;
    c->m->pass.routed_dense = 1;
    model_forward(c->m, c->inp, NULL, c->B, c->T, 1);
    c->m->pass.routed_dense = 0;
    c->m->fc.attn = keep;
    return model_attn_objective(c->m, 1, 0);
}

/* The kl and attn objectives' router gradients (METHOD.md section 9) by finite differences. */
/* Finite differences on 200 entries of W_g and of C against the router gradients rg. */
static void check_router_grads(const char* what, double (*loss)(void*), ModelCtx* c,
                               const real* rg) {
    Model* m = c->m;
    char name[128];
    snprintf(name, sizeof name, "%s: W_g", what);
    report(name, fd_check(loss, c, m->router.wg, rg, m->router_sizes[0], 200, 1e-6), 2e-6);
    snprintf(name, sizeof name, "%s: C", what);
    report(
        name,
        fd_check(loss, c, m->router.cent, rg + m->router_sizes[0], m->router_sizes[1], 200, 1e-6),
        2e-6);
}

static void check_objectives(void) {
    ModelConfig cfg;
    FocusConfig fc;
    model_config_preset("tiny-llama", &cfg);
    focus_config_default(&fc);
    fc.K = 4, fc.dg = 4, fc.w = 8, fc.iters = 10, fc.lambda = 4, fc.bias = 0.4f, fc.sinks = 2;
    enum { B = 2, T = 40 };
    int inp[B * T], tgt[B * T];
    Model m;
    build_checked_model(&m, &cfg, &fc, 9, inp, tgt, B * T, 5);
    ModelCtx c = {&m, inp, tgt, B, T};
    real* rg = mallocCheck(sizeof(real) * m.num_router);

    /* kl: KL(dense || soft-gated model) on next-token distributions */
    model_teacher_forward(&m, inp, B, T, 1, 0);
    model_forward(&m, inp, tgt, B, T, 1);
    CHECK(m.mean_kl > 0, "kl objective: the gated model must differ from its teacher (%g)",
          (double)m.mean_kl);
    model_zero_grad(&m, GRAD_ROUTER);
    model_backward(&m, GRAD_ROUTER);
    memcpy(rg, m.rgrads_mem, sizeof(real) * m.num_router);
    model_teacher_forward(&m, inp, B, T, 1, 0);
    check_router_grads("objective kl (2 sinks)", model_kl_loss, &c, rg);
    m.pass.kl_active = 0;

    /* attn: dense attention mass by group as each layer's routing target */
    model_teacher_forward(&m, inp, B, T, 0, 1);
    model_zero_grad(&m, GRAD_ROUTER);
    double a = model_attn_objective(&m, 1, 1);
    CHECK(a > 0 && isfinite(a), "attn objective: expected a positive loss, got %g", a);
    memcpy(rg, m.rgrads_mem, sizeof(real) * m.num_router);
    check_router_grads("objective attn (2 sinks)", model_attn_loss, &c, rg);
    free(rg);
    model_free(&m);
}

/* LoRA adapters on every target, the model dense (a fine-tuning baseline): A and B of each
 * target against finite differences (B made non-zero so that A's gradient is not). */
static void check_lora(const char* preset) {
    ModelConfig cfg;
    FocusConfig fc;
    model_config_preset(preset, &cfg);
    focus_config_default(&fc);
    fc.attn = ATTN_DENSE;
    enum { B = 2, T = 24 };
    int inp[B * T], tgt[B * T];
    Model m;
    build_checked_model(&m, &cfg, &fc, 13, inp, tgt, B * T, 2);
    LoraConfig lc = {2, 4.0f, LORA_QKV | LORA_O | LORA_FC | LORA_FCPROJ};
    model_lora_init(&m, &lc, 5);
    for (size_t i = 0; i < m.num_lora; i++) m.lora_mem[i] += (real)(0.3 * rng_normal(&rng));
    ModelCtx c = {&m, inp, tgt, B, T};
    model_loss(&c);
    model_zero_grad(&m, GRAD_LORA);
    model_backward(&m, GRAD_LORA);
    real* lg = mallocCheck(sizeof(real) * m.num_lora);
    memcpy(lg, m.lora_grads_mem, sizeof(real) * m.num_lora);
    static const char* names[] = {"qkv A", "qkv B", "o A",      "o B",
                                  "fc A",  "fc B",  "fcproj A", "fcproj B"};
    real** w = (real**)&m.lw;
    size_t off = 0;
    for (int k = 0; k < NUM_LORA_TENSORS; k++) {
        char what[96];
        snprintf(what, sizeof what, "%s LoRA: %s", preset, names[k]);
        report(what, fd_check(model_loss, &c, w[k], lg + off, m.lora_sizes[k], 150, 1e-6), 2e-6);
        off += m.lora_sizes[k];
    }
    /* merging folds the adapters into the weights: the same logits with no adapter */
    const size_t n = (size_t)B * T * cfg.V;
    real* before = mallocCheck(sizeof(real) * n);
    model_forward(&m, inp, NULL, B, T, 0);
    memcpy(before, model_logits(&m), sizeof(real) * n);
    model_lora_merge(&m);
    model_forward(&m, inp, NULL, B, T, 0);
    double d = tu_max_abs_diff(before, model_logits(&m), n);
    CHECK(d < 1e-9 && m.lora.rank == 0, "%s: merged LoRA changes the logits by %g", preset, d);
    free(before);
    free(lg);
    model_free(&m);
}

int main(void) {
    rng_seed(&rng, 42);
    printf("per-kernel gradients (double precision, central differences, h = 1e-6):\n");
    check_matmul();
    check_norm(0);
    check_norm(1);
    check_pointwise(0);
    check_pointwise(1);
    check_pointwise(2);
    check_rope(0);
    check_rope(1);
    check_qknorm();
    check_attention(GATE_NONE, 0);
    check_attention(GATE_SOFT, 0);
    check_attention(GATE_SOFT, 3);
    check_scores();
    check_routing(ROUTE_SINKHORN);
    check_routing(ROUTE_CAUSAL);
    check_routing(ROUTE_PREFIX);
    printf(
        "whole-model gradients (L = 2, C = 32, T = 40, K = 4, w = 8, 10 Sinkhorn iterations):\n");
    check_model("tiny-gpt2", ROUTE_SINKHORN, 0, 0, 0);
    check_model("tiny-llama", ROUTE_SINKHORN, 1, 0, 0);
    check_model("tiny-llama", ROUTE_PREFIX, 0, 0, 0);
    check_model("tiny-llama", ROUTE_SINKHORN, 0, 2, 1);
    check_model("tiny-gemma3", ROUTE_SINKHORN, 0, 2, 0);
    check_model("tiny-gemma3", ROUTE_CAUSAL, 1, 2, 0);
    check_objectives();
    check_lora("tiny-llama");
    check_lora("tiny-gpt2");
    printf("worst relative error over all checks: %.3e\n", worst_overall);
    return tu_finish("test_gradcheck");
}
