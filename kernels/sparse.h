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

/* One layer's keys and values in a KV cache (model/decode.h), by key/value head: the row of head
 * g at position j at (g cap + j) hs values of k (v), IEEE halves when `half`, else real. A head's
 * keys lie in one run of memory, which a decode step reads as a stream. */
typedef struct {
    const void *k, *v;
    int half, cap;
} CachedKV;

/* A prompt's rows over a KV cache: the n query rows of q (row r at position p0 + r, stride ldq,
 * NH heads of hs) attend causally to the keys and values of kv at positions 0 .. p0 + n - 1,
 * NKV heads of hs: all of them (w < 0), or the band
 * (i - j <= w) and the sinks (j < sinks). out: row r at out + r ldo; lse (may be NULL): each
 * row's and head's log-sum-exp of its scores, (n, NH). The keys are walked in tiles of 256
 * positions counted from position 0, each row's online softmax over its own keys of a tile, so a
 * row's arithmetic does not depend on which other rows are in the call: a prompt evaluated in any
 * chunks gives the same bits (model/decode.c). Threads over (head, 32 rows). */
void attention_cached_forward(real* out, int ldo, real* lse, const real* q, int ldq, int p0, int n,
                              const CachedKV* kv, int w, int sinks, int NH, int NKV, int hs);

/* The distant key blocks of a prompt's rows, added to their band: out and lse hold each row's
 * band attention (attention_cached_forward with w and sinks); row r and key/value head g also
 * attend to the keys of its nsel[r NKV + g] chosen blocks sel + (r NKV + g) nbmax (ascending
 * block indices of bs keys; of block b the keys j with max(b bs, sinks) <= j < min((b + 1) bs,
 * i - w), i the row's position), and out and lse are updated. A block is read and multiplied
 * once for the 32-row tile whose rows chose it (a product of a fixed row count, each row merged
 * only with its own blocks, in ascending order): a row's bits do not depend on the other rows in
 * the call. */
void attention_cached_blocks(real* out, int ldo, real* lse, const real* q, int ldq, int p0, int n,
                             const CachedKV* kv, int w, int sinks, int bs, const int* sel,
                             const int* nsel, int nbmax, int NH, int NKV, int hs);

/* The group keys of a prompt's rows, added to their window (out and lse: each row's attention
 * over the keys i - w .. i, attention_cached_forward with sinks 0): row r (mask rmask[r] of K
 * groups) also attends to the earlier tokens of each of its groups before its window (gl's lists,
 * the prompt's rows joined already), each
 * token taken in the lowest group it shares with the row (cmask: every cached position's mask),
 * as the decode step does. A group's list is read in tiles of 64 entries counted from its start,
 * each tile gathered and multiplied once for the 32-row tile of rows in the group; each row
 * merges only its own entries, so its bits do not depend on the other rows in the call. Returns
 * the pairs of these keys (summed over the query heads). chosen (NULL: none): the rows' block
 * choices of attention_cached_blocks, whose keys (and the sinks) the groups then leave out: the
 * centroids with the blocks, as attention_blocks_forward keeps them. */
typedef struct {
    int sinks, bs;
    const int *sel, *nsel;
    int nbmax;
} ChosenBlocks;
/* The first of the n ascending values a at or after x (n where none is): where a group list's
 * entries before a position end */
static inline int first_at(const int* a, int n, int x) {
    int lo = 0;
    while (lo < n) {
        const int h = (lo + n) / 2;
        if (a[h] < x)
            lo = h + 1;
        else
            n = h;
    }
    return lo;
}

/* A layer's group lists: group g's gn[g] positions at gpos + g cap, ascending, and where the
 * cache copies each group's keys and values in runs (runs: its copies, by key/value head as a
 * CachedKV; NULL: none), the row of each entry in them, gidx + g cap: a tile of a list is then
 * read from its runs, not gathered from the positions. */
typedef struct {
    const int *gpos, *gn;
    int cap, K;
    const CachedKV* runs;
    const int* gidx;
} GroupLists;
long attention_cached_groups(real* out, int ldo, real* lse, const real* q, int ldq, int p0, int n,
                             const CachedKV* kv, int w, const uint32_t* rmask,
                             const uint32_t* cmask, const GroupLists* gl,
                             const ChosenBlocks* chosen, int NH, int NKV, int hs);

/* qmask, kmask (B, T): each token's group bitmask as a query and as a key (the same array for a
 * router without a query projection: its top-k groups); the pair (i, j) beyond the window w is
 * kept when qmask[i] & kmask[j] != 0, in the lowest group they share. K: number of groups. */
void attention_hard_forward(real* out, real* lse, const real* qkv, const uint32_t* qmask,
                            const uint32_t* kmask, int K, int w, int B, int T, int NH, int NKV,
                            int hs);

/* Pair evaluations the hard executor does for the masks of one sequence (set A, including pairs
 * computed and then left out by the lowest-shared-group rule when k > 1, plus set B); dense causal
 * attention does T (T + 1) / 2. */
double hard_pair_count(const uint32_t* mask, int K, int w, int T);

/* Sinks and window only: query i keeps j <= i with i - j <= w or j < sinks. */
void attention_band_forward(real* out, real* lse, const real* qkv, int w, int sinks, int B, int T,
                            int NH, int NKV, int hs);

typedef enum {
    BLOCKS_QUEST = 0,
    BLOCKS_MEAN = 1,
    BLOCKS_ORACLE = 2,
    BLOCKS_LEARNED = 3
} BlockScore;
const char* block_score_name(BlockScore s);

/* The learned block selector (BLOCKS_LEARNED; fitted to a frozen model's dense attention by
 * kernels/blockgate.h). Each block keeps the statistics of its keys, per dimension e: mean,
 * variance, min and max (BLOCKGATE_STATS floats). For a query q of one query head, scale =
 * 1/sqrt(hs), the selector's logit of block c is its estimate of log sum_j exp(scale q . k_j)
 * over the block's keys less log(n), the log of their count:
 *   s_c = w_0 + sum_e a_e scale q_e mean_e + b_e scale^2 q_e^2 var_e
 *             + g_e scale max(q_e min_e, q_e max_e)
 * (a = 1, b = 1/2, g = 0 is the second-order cumulant expansion of a block of Gaussian keys;
 * g = 1 alone is Quest's bound). The mass the head would give to block c is then
 * exp(s_c + log n_c - L), L the log-sum-exp of the band's exact log-partition and of every
 * candidate's s_c + log n_c; a key/value head keeps the blocks of most mass summed over its
 * query heads, the rule the oracle follows with the dense mass. Weights per layer and query
 * head: BLOCKGATE_WIDTH floats (w_0, a, b, g). */
#define BLOCKGATE_STATS(hs) (4 * (hs))
#define BLOCKGATE_WIDTH(hs) (1 + 3 * (hs))
/* The statistics of keys [j0, j1) (rows of stride ldk) into st (BLOCKGATE_STATS(hs)). */
void blockgate_key_stats(real* st, const real* k, int ldk, int j0, int j1, int hs);
/* The statistics every block selection reads (the full pass, the cache, the mass teacher), in
 * bytes: each of the four (mean, variance, min, max) as hs signed bytes and one scale, the
 * largest finite magnitude over 127 (four floats first, then the bytes; BLOCKGATE_STAT_BYTES a
 * block). Value e of statistic a is (real)byte_e * (real)scale_a, the byte x times 127 over that
 * magnitude, rounded to the nearest (non-finite values saturate). A decode step reads each
 * candidate block's statistics: at 8K about a quarter of the bytes of the chosen keys and values
 * (in halves, half). A fit (blockgate.h) keeps reals. */
#define BLOCKGATE_STAT_BYTES(hs) (4 * sizeof(float) + 4 * (size_t)(hs))
void blockgate_key_stats8(int8_t* st, const real* k, int ldk, int j0, int j1, int hs);
/* The logit s_c above is one product with the block's statistics: s_c = w_0 + f . st_c, the
 * query's features f (BLOCKGATE_STATS(hs)) being a scale q, b (scale q)^2, and g scale q in the
 * minimum's place where q_e < 0, else in the maximum's. blockgate_features fills f for query q
 * (hs) and one head's weights; blockgate_logit is s_c against the statistics st of one block (a
 * fit's reals). A selection (block_select, block_logits; Quest's and the mean keys' scores too)
 * takes the features in bytes, each part rounded as its statistic is (one scale, its largest
 * finite magnitude over 127): the product of a part with a statistic is then a sum of products of
 * bytes, exact in integers on every instruction set, and s_c = w_0 + sum_a (scale of f_a) (scale
 * of statistic a) (f_a . st_a in bytes), a in order. A head size of at most BLOCKGATE_MAX_HS. */
#define BLOCKGATE_MAX_HS 512
void blockgate_features(real* f, const real* wgt, const real* q, int hs, real scale);
real blockgate_logit(const real* wgt, const real* q, const real* st, int hs, real scale);
/* Weights of the cumulant expansion (a = 1, b = 1/2, g = 0, w_0 = 0) for n query heads. */
void blockgate_init(real* wgt, int n, int hs);

/* Sinks, window and the nsel best key blocks (of bs positions, block c = [c bs, (c + 1) bs))
 * among each query's distant keys [sinks, i - w), chosen per key/value head from the scores of
 * its query heads summed; a query with at most nsel candidate blocks keeps them all. cover > 0:
 * instead the best blocks until they hold a share cover of the estimated attention mass (at most
 * nsel of them; nsel <= 0: no limit), as block_select says. gate: the
 * learned selector's weights of this layer (NH x BLOCKGATE_WIDTH(hs)) for BLOCKS_LEARNED, else
 * unused. Returns the pairs kept, summed over the queries of all B sequences (a query's pairs
 * averaged over its heads). qmask, kmask (B, T; NULL: none): token groups (K of them) as in
 * attention_hard_forward; a query also keeps the distant keys [sinks, i - w) that share a group
 * with it and lie in no block it chose (the centroids with blocks: a key is taken once, in the
 * lowest group it shares with the query). */
double attention_blocks_forward(real* out, real* lse, const real* qkv, int w, int sinks, int bs,
                                int nsel, real cover, BlockScore score, const real* gate,
                                const uint32_t* qmask, const uint32_t* kmask, int K, int B, int T,
                                int NH, int NKV, int hs);

/* The key blocks that query i keeps beyond its band for one key/value head, into sel (in the
 * order chosen); returns their number. The candidates are the blocks holding distant keys
 * [sinks, i - w): all of them when at most nsel, else the nsel of highest score (ties to the
 * earlier block) for the rep query heads q (stride hs) from the blocks' statistics st (from
 * block 0); gate, lband (stride ldl): BLOCKS_LEARNED's weights of the
 * rep heads and their band log-sum-exps; k (stride ldk): every key up to i, BLOCKS_ORACLE only
 * (else unused). cover > 0 (a mass-adaptive budget, Twilight's top-p): the best blocks until
 * their estimated share of the attention mass reaches cover, at most nsel (nsel <= 0: any
 * number): the learned selector's and the oracle's scores are shares of each head's whole
 * attention (the band and sinks count as covered), Quest's and the mean keys' become shares of
 * the distant mass by a softmax of the heads' mean score weighted by each block's key count.
 * Scratch: sc (a score per block), p (max(i + 1, rep x blocks) values). The forward
 * kernel above and the decode step (model/decode.c) choose through it. st: bytes
 * (blockgate_key_stats8, BLOCKGATE_STAT_BYTES(hs) a block). */
int block_select(int* sel, BlockScore score, const real* q, int rep, const int8_t* st,
                 const real* gate, const real* lband, size_t ldl, const real* k, int ldk, int i,
                 int w, int sinks, int bs, int nsel, real cover, int hs, real* sc, real* p);
/* The learned selector's logits of query i's candidate blocks (rep heads, the blocks' order) into
 * p, as block_select makes them: a decode step makes them beside the band's scores, then
 * block_select_made(..., made = 1) chooses from them, overwriting them (made = 0: block_select;
 * for Quest's and the mean keys' scores, made = 1: sc holds them, block_bounds). */
void block_logits(real* p, const real* q, int rep, const int8_t* st, const real* gate, int i, int w,
                  int sinks, int bs, int hs);
/* Quest's bounds or the mean keys' products (score) of part `part` of nparts of query i's
 * candidate blocks (split by their count) into sc, as block_select makes them: a decode step
 * makes the parts beside each other, then block_select_made(..., made = 1) chooses from sc. */
void block_bounds(real* sc, BlockScore score, const real* q, int rep, const int8_t* st, int i,
                  int w, int sinks, int bs, int hs, int part, int nparts);
/* block_logits for the nq rows at positions i0 .. of a prompt's tile (queries q, row stride
 * ldq: the rep heads of one key/value head), row r's into p + r ldp: the same values, made at
 * AVX-512 VNNI and AVX2 16 blocks at a time against every row (the statistics read once for the
 * rows; sums of bytes in the blocks' lanes; at AVX2 a head size that is a multiple of 4), else
 * row by row. */
enum { BLOCK_TILE_ROWS = 32 };
void block_logits_tile(real* p, size_t ldp, const real* q, int ldq, int i0, int nq,
                       const int8_t* st, const real* gate, int w, int sinks, int bs, int rep,
                       int hs);
int block_select_made(int* sel, BlockScore score, const real* q, int rep, const int8_t* st,
                      const real* gate, const real* lband, size_t ldl, const real* k, int ldk,
                      int i, int w, int sinks, int bs, int nsel, real cover, int hs, real* sc,
                      real* p, int made);

/* Pairs that query i keeps from its band (window and sinks). */
double band_pairs_kept(int i, int w, int sinks);
/* Pairs kept by the queries of one sequence with group masks qmask (as queries) and kmask (as keys;
 * the same array for a router without a query projection), T each: the band, and the distant keys
 * [sinks, i - w) that share a group with the query. */
double mask_pairs_kept(const uint32_t* qmask, const uint32_t* kmask, int T, int w, int sinks);

#endif
