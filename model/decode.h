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

typedef struct {
    int cap, n;     /* capacity and cached tokens */
    int half;       /* keys and values stored in IEEE half precision (else real) */
    void* k;        /* (L, cap, NKV*hs) keys after RoPE */
    void* v;        /* (L, cap, NKV*hs) */
    uint32_t* mask; /* (L, cap) top-k group masks */
    int* gpos;      /* (L, K, cap) positions of each group's tokens */
    int* gn;        /* (L, K) group list lengths */
    int* keys;      /* (cap) the positions one query attends to */
    real* scratch;  /* one token's activations */
    real* scores;   /* (NH, cap) one token's attention scores */
    real* part;     /* (nparts, NH, hs + 2) the threads' partial softmax sums */
    int nparts;     /* threads a token's attention is split among (OpenMP's maximum) */
    int split_min;  /* ... when it has at least this many keys (256; fewer: one thread) */
    /* the thread governor (decode.c): on by default with more than one thread; off, every
     * step runs on OpenMP's threads as set */
    int govern, th_max, th_cur, th_best, th_next, th_probe, th_since, th_seen[32];
    unsigned th_known;
    double th_time[32], th_sum;
    long pairs; /* attention pairs evaluated so far, summed over layers */
    /* FOCUS_PROFILE=1: seconds of the decode steps by part (DECODE_PARTS), summed */
    int profile;
    double prof[8];
} KVCache;

/* The parts of a decode step that KVCache.prof times, in order. */
#define DECODE_PARTS                                                                          \
    "q k v", "attention", "output projection", "gate + up", "down", "norms, rope, residuals", \
        "head (logits)", "embedding"

/* A cache for cap tokens; half: keys and values in half precision (half the memory and the
 * bytes each decoded token reads; values beyond +-65504 saturate), else exact. */
void kvcache_init(KVCache* c, const Model* m, int cap, int half);
void kvcache_free(KVCache* c);
/* Feed `token` at position c->n; logits (V) receive the next-token scores. */
void model_decode_step(Model* m, KVCache* c, int token, real* logits);
/* The threads the next decode step will run on, and the governor's update after a step of dt
 * seconds on them (model_decode_step calls both when c->govern is set). */
int kvcache_threads(const KVCache* c);
void kvcache_govern(KVCache* c, double dt);
/* Feed n tokens (a prompt) at positions c->n ..: into an empty cache in one batched pass (the
 * full-sequence kernels, the weights read once for all n tokens), else one step at a time; the
 * cache ends as n decode steps would leave it. logits: the next-token scores after the last
 * token (V), or after each token (n, V) when `all`. */
void model_prefill(Model* m, KVCache* c, const int* tokens, int n, real* logits, int all);

#endif
