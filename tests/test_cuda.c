/* test_cuda.c: every GPU kernel against its CPU counterpart on the same random inputs, then a
 * whole router training step (forward, loss, router gradients, AdamW) and hard-attention
 * evaluation of tiny LLaMA and GPT-2 models on the GPU against the CPU model. GEMMs run in full
 * fp32 here (cuda_set_tf32(0)), so fp32 paths must agree to float round-off; the bf16 tensor-core
 * kernels to bf16 precision. Exits 77 (skipped) where no GPU is. */
#include <math.h>
#include <string.h>

#include "../kernels/attention.h"
#include "../kernels/cpu.h"
#include "../kernels/cuda/cuda.h"
#include "../kernels/sparse.h"
#include "../model/model.h"
#include "../kernels/router.h"
#include "../kernels/adamw.h"
#include "testutil.h"

static Rng rng;

static float *dev(const float *h, size_t n) {
    float *d = cuda_malloc(sizeof(float) * (n ? n : 1));
    cuda_upload(d, h, sizeof(float) * n);
    return d;
}
static float *devzero(size_t n) {
    float *d = cuda_malloc(sizeof(float) * (n ? n : 1));
    cuda_memset0(d, sizeof(float) * (n ? n : 1));
    return d;
}
static float *randn(size_t n, double scale) {
    float *h = mallocCheck(sizeof(float) * (n ? n : 1));
    tu_randn(h, n, scale, &rng);
    return h;
}

/* max |gpu - cpu| / max(|cpu|, floor) */
static double rel_dev(const float *d, const float *ref, size_t n) {
    float *h = mallocCheck(sizeof(float) * (n ? n : 1));
    cuda_download(h, d, sizeof(float) * n);
    double e = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        double a = h[i], b = ref[i];
        if (isinf(a) && isinf(b) && (a > 0) == (b > 0)) continue;
        e = fmax(e, fabs(a - b));
        s = fmax(s, fabs(b));
        if (isnan(a)) e = INFINITY;
    }
    free(h);
    return e / (s > 1e-3 ? s : 1e-3);
}

#define EXPECT(name, err, tol)                                                        \
    do {                                                                              \
        double e_ = (err);                                                            \
        printf("  %-44s %.2e\n", name, e_);                                           \
        CHECK(e_ <= (tol), "%s: GPU differs from CPU by %g (tolerance %g)", name, e_, \
              (double)(tol));                                                         \
    } while (0)

static void test_dense_layers(void) {
    const size_t N = 77;
    const int C = 96, OC = 40, F = 48;
    float *x = randn(N * C, 1), *w = randn(OC * C, 0.5), *bias = randn(OC, 1),
          *dy = randn(N * OC, 1);
    float *out = mallocCheck(sizeof(float) * N * OC);
    matmul_forward(out, x, w, bias, N, C, OC);
    float *dx_ = dev(x, N * C), *dw_ = dev(w, OC * C), *db_ = dev(bias, OC),
          *dout = devzero(N * OC);
    matmul_forward_cuda(dout, dx_, dw_, db_, N, C, OC);
    EXPECT("matmul_forward", rel_dev(dout, out, N * OC), 1e-5);
    float *gx = calloc(N * C, 4), *gw = calloc(OC * C, 4), *gb = calloc(OC, 4);
    matmul_backward(gx, gw, gb, dy, x, w, N, C, OC);
    float *dgx = devzero(N * C), *dgw = devzero(OC * C), *dgb = devzero(OC), *ddy = dev(dy, N * OC);
    matmul_backward_cuda(dgx, dgw, dgb, ddy, dx_, dw_, N, C, OC);
    EXPECT("matmul_backward dinp", rel_dev(dgx, gx, N * C), 1e-5);
    EXPECT("matmul_backward dweight", rel_dev(dgw, gw, OC * C), 1e-5);
    EXPECT("matmul_backward dbias", rel_dev(dgb, gb, OC), 1e-5);

    /* norms */
    float *nw = randn(C, 1), *nb = randn(C, 1), *dyc = randn(N * C, 1);
    float *y = mallocCheck(4 * N * C), *mean = mallocCheck(4 * N), *rstd = mallocCheck(4 * N);
    layernorm_forward(y, mean, rstd, x, nw, nb, N, C, 1e-5f);
    float *dnw = dev(nw, C), *dnb = dev(nb, C), *dy_ = devzero(N * C), *dmean = devzero(N),
          *drstd = devzero(N), *ddyc = dev(dyc, N * C);
    layernorm_forward_cuda(dy_, dmean, drstd, dx_, dnw, dnb, N, C, 1e-5f);
    EXPECT("layernorm_forward", rel_dev(dy_, y, N * C), 1e-5);
    float *gxn = calloc(N * C, 4), *gwn = calloc(C, 4), *gbn = calloc(C, 4);
    layernorm_backward(gxn, gwn, gbn, dyc, x, nw, mean, rstd, N, C);
    float *dgxn = devzero(N * C), *dgwn = devzero(C), *dgbn = devzero(C);
    layernorm_backward_cuda(dgxn, dgwn, dgbn, ddyc, dx_, dnw, dmean, drstd, N, C);
    EXPECT("layernorm_backward dinp", rel_dev(dgxn, gxn, N * C), 1e-5);
    EXPECT("layernorm_backward dweight", rel_dev(dgwn, gwn, C), 1e-5);
    EXPECT("layernorm_backward dbias", rel_dev(dgbn, gbn, C), 1e-5);
    rmsnorm_forward(y, rstd, x, nw, N, C, 1e-5f);
    rmsnorm_forward_cuda(dy_, drstd, dx_, dnw, N, C, 1e-5f);
    EXPECT("rmsnorm_forward", rel_dev(dy_, y, N * C), 1e-5);
    memset(gxn, 0, 4 * N * C);
    memset(gwn, 0, 4 * C);
    rmsnorm_backward(gxn, gwn, dyc, x, nw, rstd, N, C);
    cuda_memset0(dgxn, 4 * N * C);
    cuda_memset0(dgwn, 4 * C);
    rmsnorm_backward_cuda(dgxn, dgwn, ddyc, dx_, dnw, drstd, N, C);
    EXPECT("rmsnorm_backward dinp", rel_dev(dgxn, gxn, N * C), 1e-5);
    EXPECT("rmsnorm_backward dweight", rel_dev(dgwn, gwn, C), 1e-5);

    /* rope: B=1, T=N, NH=2, NKV=1, hs=32 -> QKV = 128 */
    float *qkv = randn(N * 128, 1);
    float *dq = dev(qkv, N * 128);
    rope_forward(qkv, 1, (int)N, 2, 1, 32, 10000.f, 3);
    rope_forward_cuda(dq, 1, (int)N, 2, 1, 32, 10000.f, 3);
    EXPECT("rope_forward", rel_dev(dq, qkv, N * 128), 1e-5);
    rope_backward(qkv, 1, (int)N, 2, 1, 32, 10000.f, 3);
    rope_backward_cuda(dq, 1, (int)N, 2, 1, 32, 10000.f, 3);
    EXPECT("rope_backward", rel_dev(dq, qkv, N * 128), 1e-5);

    /* activations */
    float *h2 = randn(N * 2 * F, 1.5), *go = randn(N * F, 1);
    float *act = mallocCheck(4 * N * 2 * F), *gin = calloc(N * 2 * F, 4);
    float *dh2 = dev(h2, N * 2 * F), *dgo = dev(go, N * F), *dact = devzero(N * 2 * F),
          *dgin = devzero(N * 2 * F);
    gelu_forward(act, h2, N * F);
    gelu_forward_cuda(dact, dh2, N * F);
    EXPECT("gelu_forward", rel_dev(dact, act, N * F), 1e-5);
    gelu_backward(gin, h2, go, N * F);
    gelu_backward_cuda(dgin, dh2, dgo, N * F);
    EXPECT("gelu_backward", rel_dev(dgin, gin, N * F), 1e-5);
    swiglu_forward(act, h2, N, F);
    swiglu_forward_cuda(dact, dh2, N, F);
    EXPECT("swiglu_forward", rel_dev(dact, act, N * F), 1e-5);
    memset(gin, 0, sizeof(float) * N * 2 * F); /* swiglu_backward accumulates */
    cuda_memset0(dgin, sizeof(float) * N * 2 * F);
    swiglu_backward(gin, h2, go, N, F);
    swiglu_backward_cuda(dgin, dh2, dgo, N, F);
    EXPECT("swiglu_backward", rel_dev(dgin, gin, N * 2 * F), 1e-5);

    /* encoder and cross-entropy (V = 500, one ignored target) */
    const int V = 500, B = 1, T = (int)N;
    int *tok = mallocCheck(sizeof(int) * N), *tgt = mallocCheck(sizeof(int) * N);
    for (size_t i = 0; i < N; i++)
        tok[i] = (int)(rng_u64(&rng) % V), tgt[i] = (int)(rng_u64(&rng) % V);
    tgt[5] = -1;
    float *wte = randn((size_t)V * C, 1), *wpe = randn(N * C, 1);
    float *enc = mallocCheck(4 * N * C);
    encoder_forward(enc, tok, wte, wpe, B, T, C);
    int *dtok = cuda_malloc(sizeof(int) * N);
    int *dtgt = cuda_malloc(sizeof(int) * N);
    cuda_upload(dtok, tok, sizeof(int) * N);
    cuda_upload(dtgt, tgt, sizeof(int) * N);
    float *dwte = dev(wte, (size_t)V * C), *dwpe = dev(wpe, N * C), *denc = devzero(N * C);
    encoder_forward_cuda(denc, dtok, dwte, dwpe, B, T, C);
    EXPECT("encoder_forward", rel_dev(denc, enc, N * C), 1e-6);
    float *logits = randn(N * V, 3), *loss = mallocCheck(4 * N);
    float *dlog = dev(logits, N * V), *dloss = devzero(N);
    crossentropy_backward(logits, loss, logits, tgt, N, V, 0.5f);
    crossentropy_backward_cuda(dlog, dloss, dlog, dtgt, N, V, 0.5f);
    EXPECT("crossentropy_backward loss", rel_dev(dloss, loss, N), 1e-5);
    EXPECT("crossentropy_backward dlogits (in place)", rel_dev(dlog, logits, N * V), 1e-5);
}

static void test_router(void) {
    const int B = 3, T = 200, K = 8, C = 64, dg = 16, iters = 5;
    const size_t N = (size_t)B * T;
    float *h = randn(N * C, 1), *wg = randn((size_t)C * dg, 0.2),
          *cent = randn((size_t)K * dg, 0.5);
    float *proj = mallocCheck(4 * N * dg), *S = mallocCheck(4 * N * K);
    router_scores_forward(proj, S, h, wg, cent, N, C, dg, K);
    float *dh_ = dev(h, N * C), *dwg = dev(wg, C * dg), *dcent = dev(cent, K * dg),
          *dproj = devzero(N * dg), *dS = devzero(N * K);
    router_scores_forward_cuda(dproj, dS, dh_, dwg, dcent, N, C, dg, K);
    EXPECT("router_scores_forward", rel_dev(dS, S, N * K), 1e-5);
    float *gS = randn(N * K, 1), *gh = calloc(N * C, 4), *gwg = calloc(C * dg, 4),
          *gcent = calloc(K * dg, 4), *gproj = mallocCheck(4 * N * dg);
    router_scores_backward(gh, gwg, gcent, gproj, gS, h, proj, wg, cent, N, C, dg, K);
    float *dgS = dev(gS, N * K), *dgh = devzero(N * C), *dgwg = devzero(C * dg),
          *dgcent = devzero(K * dg), *dgproj = devzero(N * dg);
    router_scores_backward_cuda(dgh, dgwg, dgcent, dgproj, dgS, dh_, dproj, dwg, dcent, N, C, dg,
                                K);
    EXPECT("router_scores_backward dh", rel_dev(dgh, gh, N * C), 1e-5);
    EXPECT("router_scores_backward dwg", rel_dev(dgwg, gwg, C * dg), 1e-5);
    EXPECT("router_scores_backward dcent", rel_dev(dgcent, gcent, K * dg), 1e-5);

    float *beta = randn(K, 0.3);
    float *dbeta = dev(beta, K);
    float *scr = devzero(routing_scratch_floats(B, T, K, iters));
    Routing modes[3] = {ROUTE_SINKHORN, ROUTE_CAUSAL, ROUTE_PREFIX};
    for (int mi = 0; mi < 3; mi++) {
        char name[96];
        float *G = mallocCheck(4 * N * K), *col = mallocCheck(4 * B * K);
        routing_forward(G, col, S, beta, modes[mi], B, T, K, 0.5f, iters);
        float *dG = devzero(N * K), *dcol = devzero(B * K);
        routing_forward_cuda(dG, dcol, dS, dbeta, modes[mi], B, T, K, 0.5f, iters);
        snprintf(name, sizeof name, "routing_forward %s", routing_name(modes[mi]));
        EXPECT(name, rel_dev(dG, G, N * K), 2e-5);
        if (modes[mi] != ROUTE_CAUSAL) {
            snprintf(name, sizeof name, "routing_forward %s offsets", routing_name(modes[mi]));
            EXPECT(name, rel_dev(dcol, col, B * K), 2e-5);
        }
        float *gG = randn(N * K, 1), *gS2 = calloc(N * K, 4);
        routing_backward(gS2, gG, S, G, beta, modes[mi], B, T, K, 0.5f, iters);
        float *dgG = dev(gG, N * K), *dgS2 = devzero(N * K);
        routing_backward_cuda(dgS2, dgG, dS, dG, dbeta, modes[mi], B, T, K, 0.5f, iters, scr);
        snprintf(name, sizeof name, "routing_backward %s", routing_name(modes[mi]));
        EXPECT(name, rel_dev(dgS2, gS2, N * K), 1e-4);
        if (mi == 0) {
            uint32_t *mask = mallocCheck(4 * N), *mh = mallocCheck(4 * N);
            uint32_t *dmask = cuda_malloc(4 * N);
            routing_topk_mask(mask, G, B, T, K, 2, 0, 0, 0);
            routing_topk_mask_cuda(dmask, dG, B, T, K, 2, 0, 0, 0);
            cuda_download(mh, dmask, 4 * N);
            size_t diff = 0;
            for (size_t i = 0; i < N; i++) diff += mask[i] != mh[i];
            EXPECT("routing_topk_mask (mismatches)", (double)diff, 0);
            /* adaptive budget and attention sinks */
            routing_topk_mask(mask, G, B, T, K, 0, 0.7f, 3, 0);
            routing_topk_mask_cuda(dmask, dG, B, T, K, 0, 0.7f, 3, 0);
            cuda_download(mh, dmask, 4 * N);
            diff = 0;
            for (size_t i = 0; i < N; i++) diff += mask[i] != mh[i];
            EXPECT("routing_topk_mask p0.7, 3 sinks (mismatches)", (double)diff, 0);
            free(mask), free(mh), cuda_free(dmask);
        }
        free(G), free(col), free(gG), free(gS2);
        cuda_free(dG), cuda_free(dcol), cuda_free(dgG), cuda_free(dgS2);
    }
}

static uint32_t *random_masks(size_t n, int K, int topk) {
    uint32_t *m = mallocCheck(sizeof(uint32_t) * n);
    for (size_t i = 0; i < n; i++) {
        uint32_t x = 0;
        while (__builtin_popcount(x) < topk) x |= 1u << (rng_u64(&rng) % (uint64_t)K);
        m[i] = x;
    }
    return m;
}

/* mma: the bf16 tensor-core kernels (head size 64), compared at bf16 tolerances */
static void test_attention(int hs, int mma) {
    const int B = 2, T = 300, NH = 4, NKV = 2, K = 6, w = 20;
    const double tf = mma ? 1e-2 : 2e-5, tb = mma ? 3e-2 : 5e-5, tg = mma ? 3e-2 : 1e-4;
    const size_t BT = (size_t)B * T, QKV = (size_t)(NH + 2 * NKV) * hs, C = (size_t)NH * hs;
    float *qkv = randn(BT * QKV, 1), *dout = randn(BT * C, 1);
    float *G = mallocCheck(4 * BT * K), *S = randn(BT * K, 1);
    routing_forward(G, NULL, S, NULL, ROUTE_CAUSAL, B, T, K, 0.3f, 0);
    uint32_t *mask = random_masks(BT, K, 2);
    float *dqkv_ = dev(qkv, BT * QKV), *ddout = dev(dout, BT * C), *dGg = dev(G, BT * K);
    uint32_t *dmask = cuda_malloc(4 * BT);
    cuda_upload(dmask, mask, 4 * BT);
    float *scr = devzero((size_t)B * NH * T);
    /* the gated modes also with 5 attention sinks */
    GateMode modes[5] = {GATE_NONE, GATE_SOFT, GATE_HARD, GATE_SOFT, GATE_HARD};
    const char *names[5] = {"none", "soft", "hard", "soft, 5 sinks", "hard, 5 sinks"};
    for (int mi = 0; mi < 5; mi++) {
        char name[96];
        const int sinks = mi >= 3 ? 5 : 0;
        AttnGate g = {modes[mi], K, w, G, mask, 4.f, 0.3f, sinks};
        AttnGate gd = {modes[mi], K, w, dGg, dmask, 4.f, 0.3f, sinks};
        float *out = mallocCheck(4 * BT * C), *lse = mallocCheck(4 * B * NH * T);
        attention_forward(out, lse, qkv, &g, B, T, NH, NKV, hs);
        float *dO = devzero(BT * C), *dL = devzero((size_t)B * NH * T);
        if (mma)
            attention_forward_mma_cuda(dO, dL, dqkv_, &gd, B, T, NH, NKV);
        else
            attention_forward_cuda(dO, dL, dqkv_, &gd, B, T, NH, NKV, hs);
        const char *kind = mma ? " bf16 mma" : "";
        snprintf(name, sizeof name, "attention_forward%s hs=%d gate %s", kind, hs, names[mi]);
        EXPECT(name, rel_dev(dO, out, BT * C), tf);
        snprintf(name, sizeof name, "attention_forward%s hs=%d gate %s lse", kind, hs, names[mi]);
        EXPECT(name, rel_dev(dL, lse, (size_t)B * NH * T), tf);
        float *gq = calloc(BT * QKV, 4), *gG = calloc(BT * K, 4), gg[2] = {0, 0};
        attention_backward(gq, gG, gg, dout, qkv, out, lse, &g, B, T, NH, NKV, hs);
        float *dgq = devzero(BT * QKV), *dgG = devzero(BT * K), *dgg = devzero(2);
        if (mma)
            attention_backward_mma_cuda(dgq, dgG, dgg, ddout, dqkv_, dO, dL, &gd, B, T, NH, NKV,
                                        scr);
        else
            attention_backward_cuda(dgq, dgG, dgg, ddout, dqkv_, dO, dL, &gd, B, T, NH, NKV, hs,
                                    scr);
        snprintf(name, sizeof name, "attention_backward%s hs=%d gate %s dqkv", kind, hs, names[mi]);
        EXPECT(name, rel_dev(dgq, gq, BT * QKV), tb);
        if (modes[mi] == GATE_SOFT) {
            snprintf(name, sizeof name, "attention_backward%s hs=%d gate %s dG", kind, hs,
                     names[mi]);
            EXPECT(name, rel_dev(dgG, gG, BT * K), tg);
            snprintf(name, sizeof name, "attention_backward%s hs=%d gate %s dlambda, db", kind, hs,
                     names[mi]);
            EXPECT(name, rel_dev(dgg, gg, 2), tg);
        }
        free(out), free(lse), free(gq), free(gG);
        cuda_free(dO), cuda_free(dL), cuda_free(dgq), cuda_free(dgG), cuda_free(dgg);
    }
    free(qkv), free(dout), free(G), free(S), free(mask);
    cuda_free(dqkv_), cuda_free(ddout), cuda_free(dGg), cuda_free(dmask), cuda_free(scr);
}

static void test_hard(int B, int T, int K, int topk, int w, int hs, int bf16, int sinks) {
    const int NH = 4, NKV = 2;
    const size_t BT = (size_t)B * T, QKV = (size_t)(NH + 2 * NKV) * hs, C = (size_t)NH * hs;
    float *qkv = randn(BT * QKV, 1);
    uint32_t *mask = random_masks(BT, K, topk);
    for (size_t i = 0; i < BT; i++)
        if ((int)(i % T) < sinks) mask[i] = (1u << K) - 1; /* sinks: members of every group */
    float *out = mallocCheck(4 * BT * C), *lse = mallocCheck(4 * B * NH * T);
    attention_hard_forward(out, lse, qkv, mask, mask, K, w, B, T, NH, NKV, hs);
    float *dq = dev(qkv, BT * QKV), *dO = devzero(BT * C), *dL = devzero((size_t)B * NH * T);
    uint32_t *dmask = cuda_malloc(4 * BT);
    cuda_upload(dmask, mask, 4 * BT);
    HardPlan *plan = hard_plan_create();
    char name[128];
    if (bf16) {
        uint16_t *q16 = cuda_malloc(2 * BT * QKV);
        float_to_bf16_cuda(q16, dq, BT * QKV);
        attention_hard_forward_bf16_cuda(plan, dO, dL, q16, dmask, K, w, B, T, NH, NKV, hs);
        snprintf(name, sizeof name, "hard executor bf16 T=%d K=%d k=%d w=%d sinks=%d", T, K, topk,
                 w, sinks);
        EXPECT(name, rel_dev(dO, out, BT * C), 2e-2);
        /* the dense tensor-core kernel against the CPU's flash kernel */
        attention_flash_forward(out, lse, qkv, B, T, NH, NKV, hs);
        attention_flash_forward_bf16_cuda(dO, dL, q16, B, T, NH, NKV, hs);
        snprintf(name, sizeof name, "dense bf16 T=%d", T);
        EXPECT(name, rel_dev(dO, out, BT * C), 2e-2);
        snprintf(name, sizeof name, "dense bf16 T=%d lse", T);
        EXPECT(name, rel_dev(dL, lse, (size_t)B * NH * T), 1e-2);
        cuda_free(q16);
    } else {
        attention_hard_forward_cuda(plan, dO, dL, dq, dmask, K, w, B, T, NH, NKV, hs);
        snprintf(name, sizeof name, "hard executor fp32 hs=%d T=%d K=%d k=%d w=%d sinks=%d", hs, T,
                 K, topk, w, sinks);
        EXPECT(name, rel_dev(dO, out, BT * C), 2e-5);
        snprintf(name, sizeof name, "hard executor fp32 hs=%d T=%d K=%d k=%d lse", hs, T, K, topk);
        EXPECT(name, rel_dev(dL, lse, (size_t)B * NH * T), 2e-5);
    }
    hard_plan_free(plan);
    free(qkv), free(mask), free(out), free(lse);
    cuda_free(dq), cuda_free(dO), cuda_free(dL), cuda_free(dmask);
}

/* The objectives that target the dense model: teacher probabilities, KL and its gradient, and
 * the dense attention mass by group. */
static void test_objectives(void) {
    const size_t N = 70;
    const int V = 1000;
    float *x = randn(N * V, 3), *p = randn(N * V, 3), *ne = mallocCheck(4 * N);
    int *tg = mallocCheck(sizeof(int) * N);
    for (size_t i = 0; i < N; i++) tg[i] = i % 9 == 4 ? -1 : (int)(i % V);
    float *dp = dev(p, N * V), *dne = devzero(N), *dx = dev(x, N * V);
    teacher_probs_forward(p, ne, N, V);
    teacher_probs_forward_cuda(dp, dne, N, V);
    EXPECT("teacher_probs_forward", rel_dev(dp, p, N * V), 1e-5);
    EXPECT("teacher_probs_forward negent", rel_dev(dne, ne, N), 1e-5);
    float *loss = mallocCheck(4 * N), *dl = mallocCheck(4 * N * V);
    kl_backward(dl, loss, x, p, ne, tg, N, V, 0.5f);
    int *dtg = cuda_malloc(sizeof(int) * N);
    cuda_upload(dtg, tg, sizeof(int) * N);
    float *dloss = devzero(N), *ddl = devzero(N * V);
    kl_backward_cuda(ddl, dloss, dx, dp, dne, dtg, N, V, 0.5f);
    EXPECT("kl_backward loss", rel_dev(dloss, loss, N), 1e-4);
    EXPECT("kl_backward dlogits", rel_dev(ddl, dl, N * V), 1e-5);
    free(x), free(p), free(ne), free(tg), free(loss), free(dl);
    cuda_free(dp), cuda_free(dne), cuda_free(dx), cuda_free(dtg), cuda_free(dloss), cuda_free(ddl);

    const int B = 2, T = 300, NH = 4, NKV = 2, hs = 64, K = 8, w = 20;
    const size_t BT = (size_t)B * T, QKV = (size_t)(NH + 2 * NKV) * hs, C = (size_t)NH * hs;
    float *qkv = randn(BT * QKV, 1), *G = mallocCheck(4 * BT * K), *S = randn(BT * K, 1);
    routing_forward(G, NULL, S, NULL, ROUTE_CAUSAL, B, T, K, 0.3f, 0);
    float *out = mallocCheck(4 * BT * C), *lse = mallocCheck(4 * B * NH * T);
    attention_forward(out, lse, qkv, NULL, B, T, NH, NKV, hs);
    float *mass = mallocCheck(4 * BT * K);
    attention_group_mass(mass, qkv, lse, G, K, w, 3, B, T, NH, NKV, hs);
    float *dq = dev(qkv, BT * QKV), *dL = dev(lse, (size_t)B * NH * T), *dG = dev(G, BT * K);
    float *dm = devzero(BT * K), *scr = devzero(BT * NH * K);
    attention_group_mass_cuda(dm, dq, dL, dG, K, w, 3, B, T, NH, NKV, hs, scr);
    EXPECT("attention_group_mass (3 sinks)", rel_dev(dm, mass, BT * K), 1e-5);
    free(qkv), free(G), free(S), free(out), free(lse), free(mass);
    cuda_free(dq), cuda_free(dL), cuda_free(dG), cuda_free(dm), cuda_free(scr);
}

static void test_adamw(void) {
    const size_t n = 1000;
    float *p = randn(n, 1), *g = randn(n, 1);
    float *dp = dev(p, n);
    float *dg = dev(g, n);
    float *dm = devzero(n), *dv = devzero(n);
    AdamW o;
    adamw_init(&o, n, 0.9f, 0.95f, 1e-8f, 0.01f);
    for (int s = 1; s <= 3; s++) {
        adamw_step(&o, p, g, 1e-2f);
        adamw_step_cuda(dp, dg, dm, dv, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.01f, s, 1.f);
    }
    EXPECT("adamw_step (3 steps)", rel_dev(dp, p, n), 1e-6);
    adamw_free(&o);
}

/* One router training step and a hard-mode evaluation, CPU model against its GPU copy. */
/* hs64: widen the preset to head size 64, so that attention runs on the tensor-core kernels
 * (tolerances for bf16 operands). */
/* recipe: 3 attention sinks, layer 0 dense, and an adaptive budget (p0.6) in the hard check */
static void test_model(const char *preset, Routing routing, int hs64, int recipe) {
    ModelConfig cfg;
    FocusConfig fc;
    model_config_preset(preset, &cfg);
    if (hs64) {
        cfg.C = 128;
        cfg.NH = 2;
        cfg.NKV = cfg.arch == ARCH_GPT2 ? 2 : 1; /* GPT-2 has no grouped-query attention */
    }
    const double tl = hs64 ? 2e-3 : 1e-5, tgr = hs64 ? 5e-2 : 2e-4, tev = hs64 ? 2e-2 : 1e-4;
    focus_config_default(&fc);
    fc.K = 4;
    fc.w = 8;
    fc.iters = 4;
    fc.routing = routing;
    fc.learn_gate = 1;
    if (recipe) fc.sinks = 3, fc.dense_layers[0] = 1;
    Model a, b;
    model_build(&a, &cfg, &fc);
    model_init_backbone(&a, 11);
    model_build(&b, &cfg, &fc);
    memcpy(b.params_mem, a.params_mem, sizeof(real) * a.num_params);
    memcpy(b.router_mem, a.router_mem, sizeof(real) * a.num_router);
    model_place(&b, "cuda");
    const int B = 2, T = 60; /* tiny-gpt2 has 64 positions */
    int *inp = mallocCheck(sizeof(int) * B * T), *tgt = mallocCheck(sizeof(int) * B * T);
    for (int i = 0; i < B * T; i++)
        inp[i] = (int)(rng_u64(&rng) % cfg.V), tgt[i] = (int)(rng_u64(&rng) % cfg.V);
    char name[128];
    model_zero_grad(&a, GRAD_ROUTER);
    model_zero_grad(&b, GRAD_ROUTER);
    model_forward(&a, inp, tgt, B, T, 1);
    model_forward(&b, inp, tgt, B, T, 1);
    char tag[64];
    snprintf(tag, sizeof tag, "%s%s",
             !hs64                             ? ""
             : attention_mma_applies(NULL, 64) ? " hs=64 mma"
                                               : " hs=64",
             recipe ? " sinks+dense0" : "");
    snprintf(name, sizeof name, "%s%s %s: training loss", preset, tag, routing_name(routing));
    EXPECT(name, fabs(a.mean_loss - b.mean_loss) / a.mean_loss, tl);
    model_update_beta(&a);
    model_update_beta(&b);
    model_backward(&a, GRAD_ROUTER);
    model_backward(&b, GRAD_ROUTER);
    float *dref = dev(a.rgrads_mem, a.num_router);
    snprintf(name, sizeof name, "%s%s %s: router gradients", preset, tag, routing_name(routing));
    /* compare the GPU gradients (downloaded to b.rgrads_mem) with the CPU's */
    float *dgot = dev(b.rgrads_mem, b.num_router);
    EXPECT(name, rel_dev(dgot, a.rgrads_mem, a.num_router), tgr);
    AdamW oa, ob;
    adamw_init(&oa, a.num_router, 0.9f, 0.95f, 1e-8f, 0);
    adamw_init(&ob, b.num_router, 0.9f, 0.95f, 1e-8f, 0);
    adamw_step(&oa, a.router_mem, a.rgrads_mem, 1e-3f);
    model_router_adamw(&b, &ob, 1e-3f, 0, 0, 1);
    float *rp = dev(b.router_mem, b.num_router);
    snprintf(name, sizeof name, "%s%s %s: router after AdamW", preset, tag, routing_name(routing));
    EXPECT(name, rel_dev(rp, a.router_mem, a.num_router), hs64 ? 1e-2 : 1e-4);
    /* hard top-k evaluation, k = 2 */
    a.fc.attn = b.fc.attn = ATTN_HARD;
    a.fc.topk = b.fc.topk = recipe ? 0 : 2;
    a.fc.topp = b.fc.topp = recipe ? 0.6f : 0;
    a.fc.routing = b.fc.routing = ROUTE_CAUSAL;
    model_forward(&a, inp, tgt, 1, T, 0);
    model_forward(&b, inp, tgt, 1, T, 0);
    snprintf(name, sizeof name, "%s%s: hard %s evaluation losses", preset, tag,
             recipe ? "p0.6" : "k=2");
    float *dl = dev(b.losses, T);
    EXPECT(name, rel_dev(dl, a.losses, T), tev);
    snprintf(name, sizeof name, "%s%s: group distributions (last layer)", preset, tag);
    float *dgr = dev(model_groups(&b, cfg.L - 1), (size_t)T * fc.K);
    EXPECT(name, rel_dev(dgr, model_groups(&a, cfg.L - 1), (size_t)T * fc.K), tev);
    if (recipe) {
        /* the objectives that target the dense model, on the same batch */
        a.fc.attn = b.fc.attn = ATTN_SOFT;
        a.fc.routing = b.fc.routing = routing;
        model_zero_grad(&a, GRAD_ROUTER);
        model_zero_grad(&b, GRAD_ROUTER);
        model_teacher_forward(&a, inp, B, T, 1, 0);
        model_teacher_forward(&b, inp, B, T, 1, 0);
        model_forward(&a, inp, tgt, B, T, 1);
        model_forward(&b, inp, tgt, B, T, 1);
        snprintf(name, sizeof name, "%s%s: kl objective", preset, tag);
        EXPECT(name, fabs(a.mean_kl - b.mean_kl) / fmax(a.mean_kl, 1e-3), tl * 10);
        model_backward(&a, GRAD_ROUTER);
        model_backward(&b, GRAD_ROUTER);
        float *kg = dev(b.rgrads_mem, b.num_router);
        snprintf(name, sizeof name, "%s%s: kl router gradients", preset, tag);
        EXPECT(name, rel_dev(kg, a.rgrads_mem, a.num_router), tgr);
        model_zero_grad(&a, GRAD_ROUTER);
        model_zero_grad(&b, GRAD_ROUTER);
        model_teacher_forward(&a, inp, B, T, 0, 1);
        model_teacher_forward(&b, inp, B, T, 0, 1);
        double la = model_attn_objective(&a, 1, 1), lb = model_attn_objective(&b, 1, 1);
        snprintf(name, sizeof name, "%s%s: attn objective", preset, tag);
        EXPECT(name, fabs(la - lb) / fmax(la, 1e-3), tl * 10);
        float *ag = dev(b.rgrads_mem, b.num_router);
        snprintf(name, sizeof name, "%s%s: attn router gradients", preset, tag);
        EXPECT(name, rel_dev(ag, a.rgrads_mem, a.num_router), tgr);
        cuda_free(kg), cuda_free(ag);
    }
    cuda_free(dref), cuda_free(dgot), cuda_free(rp), cuda_free(dl), cuda_free(dgr);
    adamw_free(&oa), adamw_free(&ob);
    free(inp), free(tgt);
    model_free(&a);
    model_free(&b);
}

/* test_cuda [mma]: every check, or only the tensor-core training attention's (to run those alone,
 * for example under compute-sanitizer). The tensor-core checks run last, so that a fault there
 * cannot hide the results of the others. */
int main(int argc, char **argv) {
    if (!cuda_available()) {
        printf("test_cuda: no CUDA device; skipped\n");
        return 77;
    }
    const int only_mma = argc > 1 && strcmp(argv[1], "mma") == 0;
    cuda_init(0);
    cuda_set_tf32(0);
    rng_seed(&rng, 2026);
    if (!only_mma) {
        test_dense_layers();
        test_router();
        test_attention(32, 0);
        test_attention(64, 0);
        test_hard(2, 1000, 8, 1, 64, 64, 0, 0);
        test_hard(1, 700, 4, 2, 16, 32, 0, 0);
        test_hard(2, 333, 5, 3, 40, 16, 0, 0);
        test_hard(2, 1000, 8, 1, 64, 64, 0, 4);
        test_hard(2, 1000, 8, 1, 64, 64, 1, 0);
        test_hard(1, 777, 4, 2, 16, 64, 1, 0);
        test_hard(1, 777, 8, 1, 64, 64, 1, 4);
        test_adamw();
        test_objectives();
        test_model("tiny-llama", ROUTE_SINKHORN, 0, 0);
        test_model("tiny-gpt2", ROUTE_PREFIX, 0, 0);
        test_model("tiny-llama", ROUTE_CAUSAL, 0, 0);
        test_model("tiny-llama", ROUTE_SINKHORN, 0, 1);
        cuda_set_attention_mma(0);
        test_model("tiny-llama", ROUTE_SINKHORN, 1, 0); /* head size 64 on the fp32 kernels */
        cuda_sync();
    }
    test_attention(64, 1);
    cuda_set_attention_mma(1); /* the model trains on the tensor-core kernels from here */
    test_model("tiny-llama", ROUTE_SINKHORN, 1, 0);
    test_model("tiny-gpt2", ROUTE_SINKHORN, 1, 0);
    test_model("tiny-llama", ROUTE_SINKHORN, 1, 1);
    cuda_sync();
    return tu_finish("test_cuda");
}
