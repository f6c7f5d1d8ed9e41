/* sparse.h: exact attention that does only the work of the pairs it keeps.
 *
 * attention_flash_forward: causal dense attention, tiled with an online softmax (blocks of 64
 * queries x 256 keys, BLAS products inside a block), O(T) memory, OpenMP over (sequence, head,
 * query block), grouped-query aware; returns each row's log-sum-exp like attention_forward.
 *
 * attention_hard_forward: the hard top-k executor of METHOD.md section 5. Tokens are sorted
 * (stably) by group; causal attention runs inside each group (set A), a pair shared by several
 * groups only in the lowest one; the local band of other-group keys is set B; the partial results
 * are merged through their log-sum-exps. Equals masked dense attention (GATE_HARD in
 * attention.h) to float round-off, with memory O(T k). Tested by tests/test_sparse.c. */
#ifndef FOCUS_SPARSE_H
#define FOCUS_SPARSE_H

#include "common.h"

void attention_flash_forward(real* out, real* lse, const real* qkv, int B, int T, int NH, int NKV,
                             int hs);

/* mask (B, T): each token's top-k group bitmask; w: local window; K: number of groups. */
void attention_hard_forward(real* out, real* lse, const real* qkv, const uint32_t* mask, int K,
                            int w, int B, int T, int NH, int NKV, int hs);

/* Pair evaluations the hard executor does for the masks of one sequence (set A, including pairs
 * computed and then left out by the lowest-shared-group rule when k > 1, plus set B); dense causal
 * attention does T (T + 1) / 2. */
double hard_pair_count(const uint32_t* mask, int K, int w, int T);

#endif
