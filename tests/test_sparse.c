/* test_sparse.c: the flash-style dense kernel and the hard top-k executor against the masked
 * dense reference (attention_forward), to float round-off: K in {4, 8}, k in {1, 2, 3}, grouped-
 * query attention, T not a multiple of the tile sizes, empty groups; k = K equals dense. */
#include <math.h>
#include <string.h>

#include "../kernels/attention.h"
#include "../kernels/sparse.h"
#include "testutil.h"

enum { NH = 4, NKV = 2, HS = 32 };

static double rel_err(const real* a, const real* b, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs(a[i] - b[i])), s = fmax(s, fabs(b[i]));
    return d / (s > 0 ? s : 1);
}

static void run(int B, int T, int K, int topk, int w, int empty_group, int sinks, Rng* rng) {
    size_t nqkv = (size_t)B * T * (NH + 2 * NKV) * HS, nout = (size_t)B * T * NH * HS,
           nl = (size_t)B * NH * T;
    real* qkv = mallocCheck(sizeof(real) * nqkv);
    real *ref = mallocCheck(sizeof(real) * nout), *got = mallocCheck(sizeof(real) * nout);
    real *lref = mallocCheck(sizeof(real) * nl), *lgot = mallocCheck(sizeof(real) * nl);
    uint32_t* mask = mallocCheck(sizeof(uint32_t) * B * T);
    tu_randn(qkv, nqkv, 1.5, rng);
    int avail = empty_group ? K - 1 : K;
    for (int i = 0; i < B * T; i++) {
        uint32_t m = 0;
        while (__builtin_popcount(m) < (topk < avail ? topk : avail))
            m |= 1u << (rng_u64(rng) % (uint64_t)avail);
        mask[i] = i % T < sinks ? (1u << K) - 1 : m; /* sinks: members of every group */
    }
    AttnGate g = {GATE_HARD, K, w, NULL, mask, 0, 0, sinks};
    attention_forward(ref, lref, qkv, &g, B, T, NH, NKV, HS);
    attention_hard_forward(got, lgot, qkv, mask, K, w, B, T, NH, NKV, HS);
    double eo = rel_err(got, ref, nout), el = rel_err(lgot, lref, nl);
    printf(
        "  executor vs masked dense: B=%d T=%5d K=%d k=%d w=%3d sinks=%d%s  out %.1e  lse %.1e\n",
        B, T, K, topk, w, sinks, empty_group ? " (empty group)" : "", eo, el);
    CHECK(eo < 2e-5 && el < 2e-5, "executor differs (out %g, lse %g) at T=%d K=%d k=%d", eo, el, T,
          K, topk);
    free(qkv), free(ref), free(got), free(lref), free(lgot), free(mask);
}

int main(void) {
    Rng rng;
    rng_seed(&rng, 5);
    /* flash dense == reference dense */
    int Ts[] = {1, 63, 300, 1000};
    for (int t = 0; t < 4; t++) {
        int B = 2, T = Ts[t];
        size_t nqkv = (size_t)B * T * (NH + 2 * NKV) * HS, nout = (size_t)B * T * NH * HS,
               nl = (size_t)B * NH * T;
        real* qkv = mallocCheck(sizeof(real) * nqkv);
        real *ref = mallocCheck(sizeof(real) * nout), *got = mallocCheck(sizeof(real) * nout);
        real *lref = mallocCheck(sizeof(real) * nl), *lgot = mallocCheck(sizeof(real) * nl);
        tu_randn(qkv, nqkv, 1.5, &rng);
        attention_forward(ref, lref, qkv, NULL, B, T, NH, NKV, HS);
        attention_flash_forward(got, lgot, qkv, B, T, NH, NKV, HS);
        double eo = rel_err(got, ref, nout), el = rel_err(lgot, lref, nl);
        printf("  flash dense vs reference dense, T=%4d: out %.1e  lse %.1e\n", T, eo, el);
        CHECK(eo < 2e-5 && el < 2e-5, "flash attention differs at T=%d (%g, %g)", T, eo, el);
        free(qkv), free(ref), free(got), free(lref), free(lgot);
    }
    for (int K = 4; K <= 8; K += 4)
        for (int k = 1; k <= 3; k++) run(2, 700, K, k, 40, 0, 0, &rng);
    run(1, 1031, 8, 1, 128, 1, 0, &rng);
    run(1, 1031, 4, 2, 128, 1, 0, &rng);
    run(2, 517, 4, 4, 16, 0, 0, &rng); /* k = K: every pair kept */
    run(1, 50, 8, 1, 0, 0, 0, &rng);   /* no window at all */
    /* attention sinks: each sink pair computed once (in the query's lowest group) */
    run(2, 700, 8, 1, 40, 0, 4, &rng);
    run(1, 1031, 4, 2, 128, 1, 1, &rng);
    run(1, 300, 8, 1, 0, 0, 300, &rng); /* every token a sink: dense */
    return tu_finish("test_sparse");
}
