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

/* Sinks and window only: query i keeps j <= i with i - j <= w or j < sinks. */
void attention_band_forward(real* out, real* lse, const real* qkv, int w, int sinks, int B, int T,
                            int NH, int NKV, int hs);

typedef enum { BLOCKS_QUEST = 0, BLOCKS_MEAN = 1, BLOCKS_ORACLE = 2 } BlockScore;
const char* block_score_name(BlockScore s);

/* Sinks, window and the nsel best key blocks (of bs positions, block c = [c bs, (c + 1) bs))
 * among each query's distant keys [sinks, i - w), chosen per key/value head from the scores of
 * its query heads summed; a query with at most nsel candidate blocks keeps them all. Returns the
 * pairs kept, summed over the queries of all B sequences (a query's pairs averaged over its
 * heads). */
double attention_blocks_forward(real* out, real* lse, const real* qkv, int w, int sinks, int bs,
                                int nsel, BlockScore score, int B, int T, int NH, int NKV, int hs);

/* Pairs that query i keeps from its band (window and sinks). */
double band_pairs_kept(int i, int w, int sinks);
/* Pairs kept by the queries of one sequence with group masks mask (T): the band, and the distant
 * keys [sinks, i - w) that share a group with the query. */
double mask_pairs_kept(const uint32_t* mask, int T, int w, int sinks);

#endif
