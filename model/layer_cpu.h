/* layer_cpu.h: the one CPU transformer layer, over a block of rows, that every CPU pass runs
 * (for model/ only): the full forward pass of training and evaluation (model_cpu.c), a
 * prompt's rows and the decode step over a KV cache (decode.c). The layer reads its
 * structure from the LayerSpec (model.h) only; the rows say where its keys come from and go:
 *
 *   ROWS_SEQUENCES  B sequences of T rows from position 0, no cache: the full-sequence
 *                   attention kernel of each layer's mode (model_attn_kernel)
 *   ROWS_CACHED     row i at position pos[i] of cache cs[i] (a prompt's rows, after cached ones
 *                   or not, or the decode step of one or several caches): attention over its
 *                   cache (per_row 0, a prompt's rows: every row's arithmetic independent of the
 *                   rows beside it, so that a prompt gives the same bits in any chunks)
 *
 * The cache's side of attention (kvcache_attend_rows) and the products with the
 * file's quantised blocks (rows_project) are kvcache.c's: model_cpu.c and decode.c call into
 * it, it calls back into neither. */
#ifndef FOCUS_LAYER_CPU_H
#define FOCUS_LAYER_CPU_H

#include "backend.h"
#include "decode.h"

typedef enum { ROWS_SEQUENCES = 0, ROWS_CACHED = 2 } RowsKind;

/* the cached rows' per-row scratch (decode.c allocates it, kvcache.c uses it) */
typedef struct RowScratch {
    int **kl, *nkg; /* each key/value head's key list and its length */
    int* bsel; /* the block patterns' scratch: nbmax each per key/value head, bp per query head */
    real *bsc, *bp;
    int* npre;      /* (NKV) the band scores the block selector made */
    int *rlo, *rhi; /* (NKV) which keys of a head's list are rows of the group runs */
} RowScratch;

/* the width of a cached row's q k v (every head: the cached rows run unsliced) */
static inline int cached_qkv_width(const ModelConfig* c) {
    return (c->NH + 2 * c->NKV) * model_head_size(c);
}

typedef struct {
    RowsKind kind;
    int B, T;           /* n = B T rows (ROWS_CACHED: B = 1) */
    int keep;           /* ROWS_SEQUENCES: the pass's keep (which kernel a mode runs) */
    KVCache* const* cs; /* ROWS_CACHED: each row's cache (a prompt's rows: one) */
    const int* pos;     /* ROWS_CACHED: each row's position in its cache */
    /* the products with the file's blocks (cached rows only; rows_project): exact fp32
     * products; per_row: each row's arithmetic that of a single row (decode steps), else a
     * prompt's rows */
    int exact, per_row;
    RowScratch* scratch; /* ROWS_CACHED */
    /* ROWS_CACHED: the rows' RoPE cosines and sines (rope_rows_table), made once for every layer
     * of rotary base rope_base[k] (nrope tables, at most 2; a layer of another base makes its
     * own) */
    const real* rope_cs[2];
    float rope_base[2];
    int nrope;
    double *prof, *mark; /* FOCUS_PROFILE: seconds by part (DECODE_PARTS), the last tick */
} LayerRows;

/* Layer l over the rows: from the residual stream x (n, C) to la->res3 (n, C) through la's
 * tensors (backend.h). la->res2 and la->res3 may be x itself (the stream updated in place);
 * then la->attp and la->mlpp must be scratch of (n, C), for the branch outputs. */
void cpu_layer(Model* m, int l, const real* x, const LayerActs* la, const LayerRows* r);

/* y (n rows of ldy) = x (n, in) W^T + b: from the file's blocks nw when given (exact: fp32
 * products), else the fp32 weights w (then ldy = out); per_row: each row's arithmetic that of a
 * single row (decode steps, batched or not); slot0: the first row's position (a row's place in
 * the fp32 products). */
void rows_project(real* y, int ldy, const real* x, int n, const real* w, const real* b, int in,
                  int out, const QMatrix* nw, int exact, int per_row, int slot0);
/* ROWS_CACHED attention of layer l: each row's key and value (qkv: n rows after RoPE) cached at
 * its position, its group lists grown (h: the rows' normed input, which the router reads), and
 * att (n, NH hs) attending over its cache. */
void kvcache_attend_rows(Model* m, int l, const LayerRows* r, const real* h, const real* qkv,
                         real* att);
/* The norm of a layer spec S (LayerNorm or RMSNorm) over n rows: out, and its statistics (mean
 * only for LayerNorm; either may be NULL where nothing reads them). */
void cpu_norm(const Model* m, const LayerSpec* S, real* out, real* mean, real* rstd, const real* in,
              const real* w, const real* b, size_t n);
/* FOCUS_PROFILE: the seconds since *mark to part i of prof (NULL: not profiling) */
static inline void profile_tick(double* prof, double* mark, int i) {
    if (!prof) return;
    const double now = now_seconds();
    prof[i] += now - *mark;
    *mark = now;
}
/* the activations after layer l must be finite (model_cpu.c; -1: the embedding, L: the head) */
void check_finite_acts(const Model* m, const real* x, size_t n, int l);

#endif
