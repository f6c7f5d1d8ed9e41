/* test_router.c: properties of the routing modes (METHOD.md sections 2 and 4).
 * - Sinkhorn: rows of G sum to 1, columns to T/K (within 30 % after 10 iterations on
 *   realistic router scores, within 1 % after 60).
 * - Causal routing with beta set to a sequence's own Sinkhorn offsets reproduces that
 *   sequence's Sinkhorn G: the causal mode is Sinkhorn with the balancing frozen.
 * - Fewer iterations balance worse (the paper's collapse with 3 iterations is a tendency).
 * - Top-k masks have exactly k bits and contain the argmax. */
#include <math.h>
#include <string.h>

#include "../kernels/router.h"
#include "testutil.h"

enum { B = 3, T = 512, C = 64, DG = 16, K = 8 };

static void router_scores_random(real* S, Rng* rng) {
    real* h = mallocCheck(sizeof(real) * B * T * C);
    real* wg = mallocCheck(sizeof(real) * C * DG);
    real* cent = mallocCheck(sizeof(real) * K * DG);
    real* proj = mallocCheck(sizeof(real) * B * T * DG);
    tu_randn(h, (size_t)B * T * C, 1, rng);
    tu_randn(wg, C * DG, 1 / sqrt(C), rng);
    tu_randn(cent, K * DG, 1 / sqrt(DG), rng);
    router_scores_forward(proj, S, h, wg, cent, (size_t)B * T, C, DG, K);
    free(h), free(wg), free(cent), free(proj);
}

static void marginals(const real* G, double* row_err, double* col_err) {
    *row_err = *col_err = 0;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += G[((size_t)b * T + t) * K + k];
            *row_err = fmax(*row_err, fabs(s - 1));
        }
        for (int k = 0; k < K; k++) {
            double s = 0;
            for (int t = 0; t < T; t++) s += G[((size_t)b * T + t) * K + k];
            *col_err = fmax(*col_err, fabs(s - (double)T / K) / ((double)T / K));
        }
    }
}

/* G from S by a routing mode (tau 0.1), and its marginals' errors */
static void route(real* G, const real* S, Routing mode, int iters, double* row, double* col) {
    routing_forward(G, NULL, S, NULL, mode, B, T, K, 0.1f, iters);
    marginals(G, row, col);
}

/* The random-groups control: k distinct groups per token, sinks in every group, a position's
 * groups the same wherever its window starts (so decoding and every window agree), and about
 * balanced. */
static void check_random_mask(void) {
    enum { RT = 4000, RK = 8 };
    uint32_t* a = mallocCheck(sizeof(uint32_t) * 2 * RT);
    uint32_t* b = mallocCheck(sizeof(uint32_t) * RT);
    for (int k = 1; k <= 3; k++) {
        routing_random_mask(a, 2, RT, RK, k, 4, 0, 77);
        routing_random_mask(b, 1, RT - 100, RK, k, 4, 100, 77);
        int ok = 1, count[RK] = {0};
        for (int t = 0; t < RT; t++) {
            ok &= a[t] == a[RT + t]; /* every row of the batch alike */
            ok &= t < 4 ? a[t] == (1u << RK) - 1 : __builtin_popcount(a[t]) == k;
            if (t >= 100) ok &= b[t - 100] == a[t];
            for (int c = 0; c < RK; c++) count[c] += (a[t] >> c) & 1;
        }
        int lo = RT, hi = 0;
        for (int c = 0; c < RK; c++)
            lo = count[c] < lo ? count[c] : lo, hi = count[c] > hi ? count[c] : hi;
        CHECK(ok, "random groups (k=%d): wrong count, sinks or positions", k);
        CHECK(hi < 1.2 * lo, "random groups (k=%d) unbalanced: %d .. %d tokens a group", k, lo, hi);
    }
    routing_random_mask(a, 1, 100, RK, 1, 0, 0, 77);
    routing_random_mask(b, 1, 100, RK, 1, 0, 0, 78);
    CHECK(memcmp(a + 4, b + 4, sizeof(uint32_t) * 96) != 0, "random groups ignore the seed");
    free(a), free(b);
}

int main(void) {
    check_random_mask();
    Rng rng;
    rng_seed(&rng, 3);
    size_t n = (size_t)B * T * K;
    real* S = mallocCheck(sizeof(real) * n);
    real* G = mallocCheck(sizeof(real) * n);
    real* G2 = mallocCheck(sizeof(real) * n);
    real colofs[B * K];
    router_scores_random(S, &rng);

    double row_err, col_err;
    routing_forward(G, colofs, S, NULL, ROUTE_SINKHORN, B, T, K, 0.1f, 10);
    marginals(G, &row_err, &col_err);
    printf(
        "sinkhorn, 10 iterations: max |row sum - 1| = %.2e, max column deviation from T/K = %.2f "
        "%%\n",
        row_err, 100 * col_err);
    CHECK(row_err < 1e-5, "rows must sum to 1 (error %g)", row_err);
    /* With tau = 0.1 the scaled scores spread over ~10 nats and 10 iterations leave columns
     * only roughly balanced; more iterations converge to T/K exactly. */
    CHECK(col_err < 0.3, "columns must sum to T/K within 30%% after 10 iterations (deviation %g)",
          col_err);
    double row60, col60;
    route(G2, S, ROUTE_SINKHORN, 60, &row60, &col60);
    printf("sinkhorn, 60 iterations: max |row sum - 1| = %.2e, column deviation %.3f %%\n", row60,
           100 * col60);
    CHECK(col60 < 0.01, "columns must converge to T/K within 1%% after 60 iterations (%g)", col60);

    double row1, col1;
    route(G2, S, ROUTE_SINKHORN, 1, &row1, &col1);
    printf("sinkhorn, 1 iteration: column deviation %.2f %%\n", 100 * col1);
    CHECK(col1 > col_err, "more iterations must balance better (1: %g, 10: %g)", col1, col_err);

    /* Causal routing with each sequence's own offsets equals its Sinkhorn output. */
    double worst = 0;
    for (int b = 0; b < B; b++) {
        routing_forward(G2 + (size_t)b * T * K, NULL, S + (size_t)b * T * K, colofs + b * K,
                        ROUTE_CAUSAL, 1, T, K, 0.1f, 10);
    }
    worst = tu_max_abs_diff(G, G2, n);
    printf("causal(beta = sinkhorn offsets) vs sinkhorn: max |dG| = %.2e\n", worst);
    CHECK(worst < 1e-4, "causal routing with the Sinkhorn offsets must reproduce Sinkhorn (%g)",
          worst);

    /* Prefix Sinkhorn: rows sum to 1 and the last token's prefix is the whole sequence. */
    double prow, pcol;
    route(G2, S, ROUTE_PREFIX, 10, &prow, &pcol);
    printf("prefix_sinkhorn: max |row sum - 1| = %.2e, column deviation %.2f %%\n", prow,
           100 * pcol);
    CHECK(prow < 1e-5, "prefix rows must sum to 1 (%g)", prow);
    CHECK(pcol < 0.5, "prefix columns should be roughly balanced (%g)", pcol);

    /* Top-k masks. */
    uint32_t mask[B * T];
    for (int k = 1; k <= 3; k++) {
        routing_topk_mask(mask, G, B, T, K, k, 0, 0, 0);
        int ok = 1;
        for (int i = 0; i < B * T; i++) {
            int best = 0;
            for (int j = 1; j < K; j++)
                best = G[(size_t)i * K + j] > G[(size_t)i * K + best] ? j : best;
            if (__builtin_popcount(mask[i]) != k || !(mask[i] & (1u << best))) ok = 0;
        }
        CHECK(ok, "top-%d masks must have %d bits including the argmax", k, k);
    }
    /* Adaptive budget: the fewest groups (largest first) whose mass reaches p; sinks keep all. */
    {
        const real p = 0.6;
        const int sinks = 2;
        routing_topk_mask(mask, G, B, T, K, 0, p, sinks, 0);
        int ok = 1;
        for (int i = 0; i < B * T; i++) {
            const real* g = G + (size_t)i * K;
            if (i % T < sinks) {
                ok &= mask[i] == (1u << K) - 1;
                continue;
            }
            double in = 0, out_max = 0, in_min = 1;
            for (int j = 0; j < K; j++) {
                if (mask[i] >> j & 1) {
                    in += g[j];
                    in_min = g[j] < in_min ? g[j] : in_min;
                } else {
                    out_max = g[j] > out_max ? g[j] : out_max;
                }
            }
            /* covers p, holds the largest groups, and is minimal */
            ok &= in >= p - 1e-6 && in_min >= out_max && in - in_min < p;
        }
        CHECK(ok, "p=%.1f masks must be the smallest top set covering p; sink rows all groups",
              (double)p);
        routing_topk_mask(mask, G, B, T, K, 1, p, 0, 0);
        ok = 1;
        for (int i = 0; i < B * T; i++) ok &= __builtin_popcount(mask[i]) == 1;
        CHECK(ok, "p=%.1f with a cap of 1 group must keep exactly one", (double)p);
    }
    double share = routing_largest_share(G, (size_t)B * T, K);
    printf("largest group share after sinkhorn: %.3f (1/K = %.3f)\n", share, 1.0 / K);
    CHECK(share < 2.0 / K, "Sinkhorn must balance the groups (largest share %g)", share);
    free(S), free(G), free(G2);
    return tu_finish("test_router");
}
