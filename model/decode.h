/* decode.h: token-by-token generation with a KV cache organised by group.
 *
 * Each layer caches every token's key and value and, per group, the ascending list of cached
 * positions in that group. A new token (routing must be causal) attends to its window of the w
 * previous tokens plus the cached tokens of its top-k groups, a pair shared by several groups
 * taken once, exactly the pairs hard top-k attention keeps in a full-sequence pass. With the
 * router off (attn = dense) it attends to every cached token. Tested by tests/test_decode.c. */
#ifndef FOCUS_DECODE_H
#define FOCUS_DECODE_H

#include "model.h"

/* The parts of a decode step that KVCache.prof times, in order; the last three are the parts of
 * the attention that a sparse pattern splits it into (PART_BAND ..): the window and the sinks,
 * the choice of the distant keys (block scores, the router's groups), the distant keys. */
#define DECODE_PARTS                                                                          \
    "q k v", "attention", "output projection", "gate + up", "down", "norms, rope, residuals", \
        "head (logits)", "embedding", "window and sinks", "selection", "distant keys"
#define DECODE_NPARTS 11
enum { PART_ATTENTION = 1, PART_BAND = 8, PART_SELECT = 9, PART_DISTANT = 10 };

/* The thread governor (governor.c): on a machine busy with other work two threads can decode
 * slower than one, so the thread count of each step is chosen by measurement among max, max / 2,
 * ..., 1 (fewer threads are tried only while the steps stall). Off (on = 0), every step runs on
 * OpenMP's threads as set. */
typedef struct {
    int on, max, cur, best, next, probe, since, seen[32]; /* seen: steps run on max >> i */
    unsigned known;
    double time[32], fastest[32], sum; /* per count: the moving average, the fastest step */
} Governor;

/* A governor for OpenMP's current maximum thread count, on when that is more than one. */
void governor_init(Governor* g);
/* The threads the next step will run on, and the update after a step of dt seconds on them. */
int governor_threads(const Governor* g);
void governor_update(Governor* g, double dt);

/* The parts a decoded token's keys are split into for the threads (a fixed count, so that the
 * arithmetic does not depend on how many threads run). */
enum { DECODE_KEY_PARTS = 8 };

typedef struct {
    int cap, n;     /* capacity and cached tokens */
    int L, K;       /* the model's layers and groups */
    int half;       /* keys and values stored in IEEE half precision (else real) */
    void* k;        /* (L, NKV, cap, hs) keys after RoPE: a head's keys in one run (CachedKV) */
    void* v;        /* (L, NKV, cap, hs) */
    uint32_t* mask; /* (L, cap) top-k group masks */
    int* gpos;      /* (L, K, cap) positions of each group's tokens */
    int* gn;        /* (L, K) group list lengths */
    /* each group's keys and values copied in runs, so that a query reads them as runs (the
     * grouped layers, made at their first token; kvcache.c) */
    void **pk, **pv; /* (L) layer l's (NKV, prow[l], hs) copies, or NULL */
    int *prow, *pch; /* (L) rows each head's copies hold, runs handed out */
    int* gidx;       /* (L, K, cap) the row of each group list entry in its layer's copies */
    int* gres;       /* (L, K) list entries that have a row (kept when the cache is truncated) */
    int* pjoin;      /* (L) the most groups a token (not a sink) has joined */
    int run;         /* rows a run holds */
    int* keys;       /* (cap) the positions one query attends to */
    real* scores;    /* (NH, cap) one token's attention scores */
    real* part;      /* (nparts + 1, NH, hs + 2) the threads' partial softmax sums (+ the band's) */
    int nparts;      /* parts a token's keys are split into (DECODE_KEY_PARTS) ... */
    int split_min;   /* ... when it has at least this many keys (256; fewer: one thread) */
    Governor gov;    /* the decode steps' thread count (on by default with more than one thread) */
    /* decode steps attend as the dense model does (every cached key; a layer with a window of
     * its own, its window), the method's upkeep (block statistics, group lists) still done: its
     * steps and dense ones interleaved over one cache (bench decode --against dense). A prompt
     * fed with it set is the dense model's, without the method's upkeep (a cache of its own). */
    int dense_steps;
    long pairs; /* attention pairs evaluated so far, summed over layers */
    /* the block patterns (blocks, blocks_mean, blocks_learned), made on first use: */
    int bs, nbcap; /* key block size, blocks held per layer and key/value head */
    int8_t* bstat; /* (L, NKV, nbcap, BLOCKGATE_STAT_BYTES(hs)): each complete block's key
                    * statistics, in bytes (blockgate_key_stats8) */
    int* bkeys;    /* (NKV, cap) the positions each key/value head's queries attend to */
    /* FOCUS_PROFILE=1: seconds of the decode steps (prof) and of the prompts' rows (pprof) by
     * part (DECODE_PARTS), summed */
    int profile;
    double prof[DECODE_NPARTS], pprof[DECODE_NPARTS];
} KVCache;

/* The blocks of bs positions a cache of cap tokens keeps statistics for (KVCache.nbcap): every
 * block, a partial one at the end included. */
int kvcache_block_cap(int cap, int bs);
/* A cache for cap tokens; half: keys and values in half precision (half the memory and the
 * bytes each decoded token reads; values beyond +-65504 saturate), else exact. */
void kvcache_init(KVCache* c, const Model* m, int cap, int half);
void kvcache_free(KVCache* c);
/* The bytes cache c holds now (keys and values, the group lists and their runs, the block
 * statistics); runs (NULL: not asked) receives the group runs' part. */
size_t kvcache_bytes(const KVCache* c, const ModelConfig* mc, size_t* runs);
/* Feed `token` at position c->n; logits (V) receive the next-token scores. The step's threads
 * are c->gov's. */
void model_decode_step(Model* m, KVCache* c, int token, real* logits);
/* One decode step for n caches at once (a server's slots: continuous batching): row i feeds
 * tokens[i] to caches[i] (distinct caches) and receives its next-token scores in logits + i V.
 * The weights are read once for all rows, and every row's arithmetic is exactly that of
 * model_decode_step on its cache alone, so the rows' logits are bit for bit the same. The step's
 * threads are gov's (NULL: OpenMP's). Returns 1; 0 with why written, nothing fed, when a row
 * cannot be (its cache full, a token outside the vocabulary): a server's request ends, the
 * server goes on. */
int model_decode_batch(Model* m, KVCache* const* caches, const int* tokens, int n, real* logits,
                       Governor* gov, char* why, size_t wl);
/* The rows a head's copies of layer l's group lists in runs need at most (KVCache.prow; the
 * sinks' entries aside): they grow to it, and past it by at most a third. */
int kvcache_runs_most(const KVCache* c, int l);
/* Forget all but the first n cached tokens (n <= c->n), so that a prompt sharing them goes on
 * from there: the cache ends as if only those n had been fed. */
void kvcache_truncate(KVCache* c, int n);
/* Feed n tokens (a prompt) at positions c->n ..: into an empty cache in one batched pass (the
 * full-sequence kernels, the weights read once for all n tokens), else (a cache in use) in one
 * pass of the decode step's layers over the n rows, each attending over the cache; the cache
 * ends as n decode steps would leave it. logits: the next-token scores after the last
 * token (V), or after each token (n, V) when `all`. */
void model_prefill(Model* m, KVCache* c, const int* tokens, int n, real* logits, int all);
/* model_prefill that returns 0 with why written instead of stopping the program (nothing fed)
 * when the tokens do not fit the cache or the context, or one is outside the vocabulary. */
int model_prefill_checked(Model* m, KVCache* c, const int* tokens, int n, real* logits, int all,
                          char* why, size_t wl);

/* The next token from logits (V): the largest when temperature <= 0 (greedy), else drawn from
 * softmax(logits / temperature) restricted to the smallest set of most likely tokens whose
 * probability reaches top_p (nucleus sampling; top_p = 1: the whole vocabulary). */
int decode_sample(const real* logits, int V, double temperature, double top_p, Rng* rng);

#endif
