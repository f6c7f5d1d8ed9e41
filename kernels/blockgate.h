/* blockgate.h: fitting the learned block selector (BLOCKS_LEARNED, kernels/sparse.h) to a frozen
 * model's own dense attention, with no backward pass through the model: a step of data costs one
 * dense forward pass.
 *
 * From each sequence and layer (its q and k after RoPE) a sample of queries is kept with, per
 * query head, the exact log-partition of its band (sinks and window) and of each candidate
 * block's distant keys, and the statistics of every key block. The selector's weights of each
 * (layer, query head) then minimise the mean KL divergence from the dense attention mass over
 * {band, candidate blocks} to the selector's estimate of it (sparse.h: the band's log-partition
 * is exact, each block's is the logit s_c + log n_c), by full-batch Adam from the cumulant
 * expansion; the problem is convex in the weights (a log-sum-exp of linear functions). Every
 * (layer, head) is fitted on its own.
 *
 * This deviates from METHOD.md: METHOD's router assigns each token to K groups once per layer;
 * the selector chooses key blocks per query and key/value head, as Quest and SeerAttention do.
 * Both are trained on the frozen model; the data (docs/RESULTS.md, "Earning its keep") showed
 * that at ctx 8192 query-aware block choice is where the headroom is. Tested by
 * tests/test_blockgate.c. */
#ifndef FOCUS_BLOCKGATE_H
#define FOCUS_BLOCKGATE_H

#include "common.h"
#include "sparse.h"

/* One sequence's samples of one layer. */
typedef struct {
    int T, nq, nb;
    int* pos;    /* (nq) query positions */
    real* q;     /* (nq, NH, hs) the queries */
    real* lband; /* (nq, NH) log-partition of each head over the query's band */
    real* lz;    /* (nq, NH, nb) over each candidate block's distant keys; -inf elsewhere */
    real* logn;  /* (nq, nb) log of each candidate block's distant key count; -inf elsewhere */
    real* st;    /* (NKV, nb, BLOCKGATE_STATS(hs)) statistics of each block's keys */
} BlockFitWindow;

typedef struct {
    int L, NH, NKV, hs, bs, w, sinks;
    int* nwin;           /* (L) windows held per layer */
    int cap;             /* windows allotted per layer */
    BlockFitWindow* win; /* (L, cap) */
} BlockFit;

void blockfit_init(BlockFit* f, int L, int NH, int NKV, int hs, int bs, int w, int sinks);
void blockfit_free(BlockFit* f);
/* Samples of layer l from one sequence's rows qkv (T, (NH + 2 NKV) hs), RoPE applied: nq
 * queries, stratified over the positions with at least two candidate blocks (seeded); none when
 * the sequence has no such position. */
void blockfit_add(BlockFit* f, int l, const real* qkv, int T, int nq, uint64_t seed);
/* Samples held for layer l (queries over all windows). */
long blockfit_samples(const BlockFit* f, int l);
/* The mean KL divergence (nats) over layer l's samples of query head h for the weights wgt
 * (BLOCKGATE_WIDTH(hs)); its gradient into grad unless NULL. */
double blockfit_loss(const BlockFit* f, int l, int h, const real* wgt, real* grad);
/* Fit every (layer, query head) of wgt (L, NH, BLOCKGATE_WIDTH(hs)), from its values, by iters
 * steps of full-batch Adam with learning rate lr; before / after (L, NH) receive the mean KL
 * divergences unless NULL. */
void blockfit_solve(const BlockFit* f, real* wgt, int iters, real lr, double* before,
                    double* after);
/* The mean share of the dense attention mass that block selection `how` keeps in layer l: band
 * plus the nsel chosen blocks, per key/value head from the mass summed over its query heads
 * (1 = every key's mass; the oracle is the most any choice of nsel blocks keeps). wgt: the
 * layer's weights (NH, BLOCKGATE_WIDTH(hs)) for BLOCKS_LEARNED. */
double blockfit_kept(const BlockFit* f, int l, BlockScore how, const real* wgt, int nsel);
/* The same for every budget 0..nmax at once: kept[n] (nmax + 1 values). */
void blockfit_kept_curve(const BlockFit* f, int l, BlockScore how, const real* wgt, int nmax,
                         double* kept);
/* Per-layer budgets from the data: the blocks per query of each layer, L x n0 in all, at least
 * floor and at most nmax in a layer; beyond the floor given one at a time to the layer whose
 * held-out mass kept (curves: L rows of nmax + 1, from blockfit_kept_curve) gains most. */
void blockfit_allocate(const double* curves, int L, int nmax, int n0, int floor, int* blocks);

#endif
