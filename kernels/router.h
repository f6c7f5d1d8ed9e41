/* router.h: the Focus router (METHOD.md sections 1, 2 and 4), forward and backward.
 *
 *   scores  S = (h W_g) C^T                       h: (N, C) normalised hidden state
 *   routing G = sinkhorn(S / tau)                 full sequence, log space (paper mode)
 *           G = softmax(S / tau + beta)           causal, beta frozen from training (default)
 *           G = prefix_sinkhorn(S / tau)          column step over t' <= t only (causal)
 * Tested by tests/test_router.c (marginals) and tests/test_gradcheck.c (gradients). */
#ifndef FOCUS_ROUTER_H
#define FOCUS_ROUTER_H

#include "common.h"

typedef enum { ROUTE_SINKHORN = 0, ROUTE_CAUSAL = 1, ROUTE_PREFIX = 2 } Routing;

/* proj (N, dg) = h @ wg (C, dg); S (N, K) = proj @ cent (K, dg)^T. */
void router_scores_forward(real* proj, real* S, const real* h, const real* wg, const real* cent,
                           size_t N, int C, int dg, int K);

/* router_scores_forward for one row, without the BLAS: each value one chain of products in a
 * fixed order, so that a row's scores are the same bits whatever rows are computed beside it
 * (the rows of a prompt on the threads, or one decoded row). proj: dg scratch. */
void router_row_scores(real* proj, real* S, const real* h, const real* wg, const real* cent, int C,
                       int dg, int K);
/* dh += dS cent wg^T unless NULL; dwg += h^T dproj and dcent += dS^T proj unless NULL. dproj:
 * (N, dg) scratch. */
void router_scores_backward(real* dh, real* dwg, real* dcent, real* dproj, const real* dS,
                            const real* h, const real* proj, const real* wg, const real* cent,
                            size_t N, int C, int dg, int K);

/* G (B, T, K) from S (B, T, K). beta (K) is used by ROUTE_CAUSAL. If colofs (B, K) is non-NULL,
 * the Sinkhorn modes write there each sequence's total per-group log-scaling (centred), the
 * quantity whose running average becomes beta. */
void routing_forward(real* G, real* colofs, const real* S, const real* beta, Routing mode, int B,
                     int T, int K, real tau, int iters);
/* dS += dL/dS given dG. Sinkhorn iterates are recomputed, not stored. */
void routing_backward(real* dS, const real* dG, const real* S, const real* G, const real* beta,
                      Routing mode, int B, int T, int K, real tau, int iters);

/* The causal bias that balances the groups (beta_balance, METHOD.md section 9), in two parts so
 * that callers can add the sums up across processes between them: col (K + 1) receives, over
 * every step-th of the N score rows S (N, K) from row first, the sums of softmax(S / tau + beta)
 * and (col[K]) their count; routing_beta_step then moves beta (K) by one fixed-point step
 * beta_k -= log(K share_k) (an empty group by at most log(K)), centred. */
void routing_shares(double* col, const real* S, size_t first, size_t N, size_t step, int K,
                    real tau, const double* beta);
void routing_beta_step(double* beta, const double* col, int K);

/* mask (B, T): bitmask of the groups each token keeps in hard mode, from G (B, T, K): its topk
 * largest entries (ties to the lower index), or with topp > 0 the largest entries until their sum
 * reaches topp (adaptive budget; at most topk groups, topk = 0: up to K). A token at position
 * pos0 + t < sinks keeps every group: attention sinks are members of all groups, so every query
 * keeps them and the executor computes each sink pair once, in the query's lowest group. */
void routing_topk_mask(uint32_t* mask, const real* G, int B, int T, int K, int topk, real topp,
                       int sinks, int pos0);
/* One token of routing_topk_mask (position p = pos0 + t, group distribution g): shared by the CPU
 * loop and the GPU kernel (kernels/cuda/router.cu), which compile it for their own side. */
#ifdef __CUDACC__
#define FOCUS_HOST_DEVICE __host__ __device__
#else
#define FOCUS_HOST_DEVICE
#endif
static inline FOCUS_HOST_DEVICE uint32_t topk_mask_row(const real* g, int K, int topk, real topp,
                                                       int p, int sinks) {
    if (p < sinks) return K >= 32 ? 0xffffffffu : (1u << K) - 1u;
    const int cap = topk > 0 && topk < K ? topk : K;
    uint32_t m = 0;
    double mass = 0;
    for (int r = 0; r < cap; r++) {
        int best = -1;
        for (int k = 0; k < K; k++) {
            if (m & (1u << k)) continue;
            if (best < 0 || g[k] > g[best]) best = k;
        }
        m |= 1u << best;
        mass += g[best];
        if (topp > 0 && mass >= topp) break;
    }
    return m;
}

/* The random-groups control of a router (`--attn random`): each token at position p = pos0 + t
 * keeps topk distinct groups of K drawn from a hash of (seed, p), so a position's groups are the
 * same in every window and in decoding, and depend on nothing after it; sinks keep every group,
 * as in routing_topk_mask. */
void routing_random_mask(uint32_t* mask, int B, int T, int K, int topk, int sinks, int pos0,
                         uint64_t seed);

/* Share of the N tokens whose most likely group is the most popular group (ideal 1/K). */
double routing_largest_share(const real* G, size_t N, int K);

const char* routing_name(Routing r);
int routing_parse(const char* s, Routing* out); /* 0 on success */

#endif
