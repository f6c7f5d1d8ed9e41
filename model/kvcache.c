/* kvcache.c: the KV cache's side of the cached rows (see decode.h): the cache itself, each
 * position's groups and key lists, the keys of a decoded row or of a prompt's rows and their
 * attention (kvcache_attend_rows), and the products with the file's blocks (rows_project).
 * cpu_layer (model_cpu.c) calls into it; decode.c runs the layers over the cached rows. */
#include "layer_cpu.h"

#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "../kernels/cpu.h"
#include "../kernels/sparse.h"

static int run_rows(int cap, int K);

void kvcache_init(KVCache* c, const Model* m, int cap, int half) {
    if (m->tp) fatal("decoding runs in one process: this model is a tensor-parallel slice");
    if (m->wbf16) fatal("decoding reads the file's or fp32 weights, not the bf16 store");
    const ModelConfig* mc = &m->cfg;
    int hs = model_head_size(mc), K = m->fc.K;
    memset(c, 0, sizeof(*c));
    c->cap = cap;
    c->half = half;
    c->L = mc->L, c->K = K;
    size_t kv = (size_t)mc->L * cap * mc->NKV * hs;
    c->k = mallocPages((half ? 2 : sizeof(real)) * kv);
    c->v = mallocPages((half ? 2 : sizeof(real)) * kv);
    c->mask = mallocCheck(sizeof(uint32_t) * (size_t)mc->L * cap);
    c->gpos = mallocCheck(sizeof(int) * (size_t)mc->L * K * cap);
    c->gn = callocCheck((size_t)mc->L * K, sizeof(int));
    c->pk = callocCheck((size_t)mc->L, sizeof(void*));
    c->pv = callocCheck((size_t)mc->L, sizeof(void*));
    c->prow = callocCheck((size_t)mc->L, sizeof(int));
    c->pch = callocCheck((size_t)mc->L, sizeof(int));
    c->gidx = mallocCheck(sizeof(int) * (size_t)mc->L * K * cap);
    c->gres = callocCheck((size_t)mc->L * K, sizeof(int));
    c->pjoin = callocCheck((size_t)mc->L, sizeof(int));
    c->run = run_rows(cap, K);
    c->keys = mallocCheck(sizeof(int) * cap);
    c->scores = mallocCheck(sizeof(real) * (size_t)mc->NH * cap);
    c->nparts = DECODE_KEY_PARTS;
    c->split_min = 256;
    governor_init(&c->gov);
    const char* prof = getenv("FOCUS_PROFILE");
    c->profile = prof && !strcmp(prof, "1");
    c->part = mallocCheck(sizeof(real) * (size_t)(c->nparts + 1) * mc->NH * (hs + 2));
}

size_t kvcache_bytes(const KVCache* c, const ModelConfig* mc, size_t* runs) {
    const int hs = model_head_size(mc);
    const size_t row = (c->half ? 2 : sizeof(real)) * hs * mc->NKV; /* a position's heads */
    size_t r = 0;
    for (int l = 0; l < c->L; l++) r += 2 * row * c->prow[l];
    if (runs) *runs = r;
    const size_t kv = 2 * row * c->L * c->cap;
    const size_t lists = sizeof(int) * ((size_t)c->L * c->K * (2 * c->cap + 2) + 3 * (size_t)c->L) +
                         sizeof(uint32_t) * (size_t)c->L * c->cap; /* and the masks */
    const size_t stats =
        c->bstat ? (size_t)c->L * mc->NKV * c->nbcap * BLOCKGATE_STAT_BYTES(hs) : 0;
    return kv + r + lists + stats;
}

void kvcache_free(KVCache* c) {
    for (int l = 0; l < c->L && c->pk; l++) free(c->pk[l]), free(c->pv[l]);
    free(c->pk), free(c->pv), free(c->prow), free(c->pch), free(c->gidx), free(c->gres);
    free(c->pjoin);
    free(c->k), free(c->v), free(c->mask), free(c->gpos), free(c->gn), free(c->keys),
        free(c->scores), free(c->part), free(c->bstat), free(c->bkeys);
    memset(c, 0, sizeof(*c));
}

/* y (n rows of ldy; columns 0 .. out - 1) = x (n, in) W^T + b: from the file's blocks when the
 * model has native weights (nw; exact: fp32 products, qmatmul), else the fp32 parameters w
 * (then ldy = out). */
static void project_rows(real* y, int ldy, const real* x, int n, const real* w, const real* b,
                         int in, int out, const QMatrix* nw, int exact) {
#ifndef FOCUS_DOUBLE
    if (nw) {
        qmatmul(y, ldy, nw, x, n, b, exact);
        return;
    }
#endif
    (void)nw, (void)ldy, (void)exact;
    matmul_forward(y, x, w, b, (size_t)n, in, out);
}

/* How layer l attends while decoding (its method's row, model/methods.c): everything, the
 * token's groups and window (the router's or random groups), sinks and window only, or the
 * chosen key blocks. */
enum {
    KEYS_DENSE = CACHE_ALL,
    KEYS_GROUPS = CACHE_GROUPS,
    KEYS_WINDOW = CACHE_WINDOW,
    KEYS_BLOCKS = CACHE_BLOCKS
};
static int layer_keys(const Model* m, int l) { return attn_methods[model_layer_attn(m, l)]->cache; }

/* The keys a decode step of c attends to on layer l: the layer's method's, or in a dense step
 * (c->dense_steps) the dense model's: a layer with a window of its own, that window, else every
 * key. */
static int step_keys(const KVCache* c, const Model* m, int l) {
    if (!c->dense_steps) return layer_keys(m, l);
    return model_layer_spec(&m->cfg, l).window >= 0 ? KEYS_WINDOW : KEYS_DENSE;
}

/* The band of KEYS_WINDOW on layer l: the window pattern's w and sinks, or a sliding-window
 * layer's own window without sinks (as in c's dense steps). */
static void layer_band(const KVCache* c, const Model* m, int l, int* w, int* sinks) {
    if (attn_methods[model_layer_attn(m, l)]->own_window ||
        (c->dense_steps && model_layer_spec(&m->cfg, l).window >= 0)) {
        *w = model_layer_spec(&m->cfg, l).window, *sinks = 0;
        return;
    }
    *w = m->fc.w, *sinks = m->fc.sinks;
}

/* The group mask of the token at position n of layer l (KEYS_GROUPS): the router's top-k of
 * its causal group distribution G, or a pattern's groups (its row's pattern_mask); a router with a
 * query projection: the top-1 group of G (as a key, key = 1), the top-k of its query groups G (as a
 * query, key = 0). */
static uint32_t token_mask(const Model* m, int l, int n, const real* G, int key) {
    const FocusConfig* f = &m->fc;
    uint32_t mi = 0;
    const AttnMethod* t = model_method(m);
    if (t->masks == MASKS_PATTERN)
        t->pattern_mask(&mi, 1, 1, m, l, n);
    else if (key && m->router.wq)
        routing_topk_mask(&mi, G, 1, 1, f->K, 1, 0, f->sinks, n);
    else
        routing_topk_mask(&mi, G, 1, 1, f->K, f->topk, f->topp, f->sinks, n);
    return mi;
}

/* The keys token n of layer l attends to (it joined its groups already, mask mi), into keys:
 * its groups' earlier tokens before the window, each taken in the lowest group it shares (as
 * rows of the layer's group runs, *ng of them), then the window (everything when dense;
 * KEYS_WINDOW: the sinks before the window, then the window) as positions. Tokens after n in
 * the lists (a prompt's later rows) are not read. Returns their number. */
static int token_keys(const KVCache* c, const Model* m, int l, int n, uint32_t mi, int kind,
                      int* keys, int* ng) {
    const FocusConfig* f = &m->fc;
    int bw, bsinks; /* KEYS_WINDOW's band */
    layer_band(c, m, l, &bw, &bsinks);
    const int K = f->K;
    const uint32_t* cm = c->mask + (size_t)l * c->cap;
    const int* gn = c->gn + (size_t)l * K;
    const int* gpos = c->gpos + (size_t)l * K * c->cap;
    const int* gidx = c->gidx + (size_t)l * K * c->cap;
    int lo = 0, nk = 0;
    if (kind == KEYS_GROUPS) {
        lo = n - f->w < 0 ? 0 : n - f->w;
        for (int g = 0; g < K; g++) {
            if (!((mi >> g) & 1)) continue;
            const int* gp = gpos + (size_t)g * c->cap;
            const int* gi = gidx + (size_t)g * c->cap;
            const int len = first_at(gp, gn[g], lo); /* the entries before the window */
            if (!(mi & ((1u << g) - 1))) {           /* the row's lowest group: every entry */
                memcpy(keys + nk, gi, sizeof(int) * (size_t)len);
                nk += len;
                continue;
            }
            for (int t = 0; t < len; t++)
                if (!(cm[gp[t]] & mi & ((1u << g) - 1))) keys[nk++] = gi[t];
        }
    }
    *ng = nk;
    if (kind == KEYS_WINDOW) {
        lo = n - bw < 0 ? 0 : n - bw;
        for (int j = 0; j < bsinks && j < lo; j++) keys[nk++] = j;
    }
    for (int j = lo; j <= n; j++) keys[nk++] = j;
    return nk;
}

/* ---- the cache's rows: real, or IEEE half precision (c->half: half the bytes a token reads;
 * the row kernels are kernels/quant.c's, float only, so the double build converts here) */

/* Where the row of key/value head g at position j of layer l starts, in values from c->k (c->v):
 * by layer, then by head (CachedKV in kernels/sparse.h), so that a head's keys are one run */
static size_t kv_at(const KVCache* c, int l, int g, int j, int NKV, int hs) {
    return (((size_t)l * NKV + g) * c->cap + j) * hs;
}

/* layer l of the cache, as the prompt kernels read it */
static CachedKV layer_kv(const KVCache* c, int l, int NKV, int hs) {
    const size_t es = c->half ? 2 : sizeof(real), at = kv_at(c, l, 0, 0, NKV, hs) * es;
    return (CachedKV){(const char*)c->k + at, (const char*)c->v + at, c->half, c->cap};
}

/* position `row` of layer l's keys (vals = 0) or values (1), head g := src (hs values) */
static void kv_put(KVCache* c, int vals, int l, int row, const real* src, int g, int NKV, int hs) {
    const size_t at = kv_at(c, l, g, row, NKV, hs);
    if (!c->half) {
        memcpy((real*)(vals ? c->v : c->k) + at, src, sizeof(real) * hs);
        return;
    }
    uint16_t* dst = (uint16_t*)(vals ? c->v : c->k) + at;
#ifdef FOCUS_DOUBLE
    for (int e = 0; e < hs; e++) dst[e] = f32_to_f16((float)src[e], 1);
#else
    f16_row_put(dst, src, hs);
#endif
}

/* row i of the n rows qkv (stride Q) into cache cs[i] at position pos[i] of layer l: its key and
 * value heads (after its A query values). A prompt's rows go on the threads, a task a head's keys
 * or values (the keys' tasks first: with two threads one writes the keys, the other the values).
 * Most of this time is the kernel's zeroing of the cache's pages at their first write (measured,
 * SmolLM2 at 8K on 2 cores: 54 us of 65 a prompt token), and the tasks write apart. */
static void kv_put_rows(KVCache* const* cs, int l, const int* pos, const real* qkv, int n, int Q,
                        int A, int NKV, int hs) {
    if (n < 64) { /* a decode step's rows: no threads to wake (kernels/cpu.h) */
        for (int i = 0; i < n; i++)
            for (int t = 0; t < 2 * NKV; t++)
                kv_put(cs[i], t / NKV, l, pos[i], qkv + (size_t)i * Q + A + (size_t)t * hs, t % NKV,
                       NKV, hs);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int t = 0; t < 2 * NKV; t++) {
        const int vals = t / NKV, g = t % NKV;
        const size_t from = (size_t)A + ((size_t)vals * NKV + g) * hs;
        for (int i = 0; i < n; i++)
            kv_put(cs[i], vals, l, pos[i], qkv + (size_t)i * Q + from, g, NKV, hs);
    }
}

/* ---- the group runs: each group's keys and values copied, in list order, into runs of c->run
 * rows of the layer's own arrays, so that a query reads its groups' keys as runs of memory, not
 * single rows scattered over the context (measured: 2.4x a dense key's time, the prefetchers
 * fetching what lies between them; runs of 64 rows 1.3x a contiguous list's, of 256 1.15x). The
 * copies are the cached bits, so attention over them is the same arithmetic. An entry keeps its
 * row when the cache is truncated (a list that grows again over the same entries reuses it); the
 * arrays grow, or are compacted to the lists as they are, when a list needs a new run (run_new). */

/* The rows of a run: the largest power of two from 16 to 256 with a run per group at most a
 * quarter of the cache (the rows no entry holds yet: at most a run a group) */
static int run_rows(int cap, int K) {
    int run = 256;
    while (run > 16 && (long)run * 4 * (K > 0 ? K : 1) > cap) run /= 2;
    return run;
}

/* Where the row of key/value head g at run row j of layer l's group runs starts (values) */
static size_t run_at(const KVCache* c, int l, int g, int j, int hs) {
    return ((size_t)g * c->prow[l] + j) * hs;
}

/* Run row j of layer l := the cached row of position n (every key/value head) */
static void run_put(KVCache* c, int l, int j, int n, int NKV, int hs) {
    const size_t es = c->half ? 2 : sizeof(real), row = es * hs;
    for (int g = 0; g < NKV; g++) {
        memcpy((char*)c->pk[l] + run_at(c, l, g, j, hs) * es,
               (const char*)c->k + kv_at(c, l, g, n, NKV, hs) * es, row);
        memcpy((char*)c->pv[l] + run_at(c, l, g, j, hs) * es,
               (const char*)c->v + kv_at(c, l, g, n, NKV, hs) * es, row);
    }
}

/* Layer l's group runs, as the prompt kernels read them */
static CachedKV layer_runs(const KVCache* c, int l) {
    return (CachedKV){c->pk[l], c->pv[l], c->half, c->prow[l]};
}

/* Layer l's group lists, their entries read from runs (NULL: at their positions) */
static GroupLists layer_lists(const KVCache* c, int l, const CachedKV* runs) {
    const size_t at = (size_t)l * c->K * c->cap;
    return (GroupLists){c->gpos + at, c->gn + (size_t)l * c->K,      c->cap,
                        c->K,         runs && runs->k ? runs : NULL, c->gidx + at};
}

/* Layer l's group runs to hold rows rows a head (the runs handed out kept) */
static void runs_resize(KVCache* c, int l, int rows, int NKV, int hs) {
    const size_t es = c->half ? 2 : sizeof(real), bytes = es * (size_t)NKV * rows * hs,
                 used = es * (size_t)c->pch[l] * c->run * hs;
    void* k = mallocPages(bytes);
    void* v = mallocPages(bytes);
    for (int g = 0; g < NKV && c->pk[l]; g++) {
        const size_t from = es * run_at(c, l, g, 0, hs), to = es * (size_t)g * rows * hs;
        memcpy((char*)k + to, (const char*)c->pk[l] + from, used);
        memcpy((char*)v + to, (const char*)c->pv[l] + from, used);
    }
    free(c->pk[l]), free(c->pv[l]);
    c->pk[l] = k, c->pv[l] = v, c->prow[l] = rows;
}

/* Layer l's lists, each put again in runs of its own from the first: the cached rows copied */
static void runs_compact(KVCache* c, int l, int NKV, int hs) {
    const int K = c->K, R = c->run;
    int runs = 0;
    for (int grp = 0; grp < K; grp++) {
        const size_t at = ((size_t)l * K + grp) * c->cap;
        const int len = c->gn[(size_t)l * K + grp];
        for (int t = 0; t < len; t++) {
            if (t % R == 0) runs++;
            c->gidx[at + t] = (runs - 1) * R + t % R;
            run_put(c, l, c->gidx[at + t], c->gpos[at + t], NKV, hs);
        }
        c->gres[(size_t)l * K + grp] = len;
    }
    c->pch[l] = runs;
}

/* The rows layer l's lists can hold in runs, the sinks' entries aside: the most groups a token
 * has joined times the capacity, a run each group partly filled, and a new one */
int kvcache_runs_most(const KVCache* c, int l) {
    const int R = c->run;
    return (int)(((long)c->pjoin[l] * c->cap + R - 1) / R + c->K + 1) * R;
}

/* A new run of layer l: its first row. When the runs are all handed out: compacted where a
 * quarter of them or more hold no entry, else grown by half, up to kvcache_runs_most (and past
 * it a run at a time: the sinks' entries). */
static int run_new(KVCache* c, int l, int NKV, int hs) {
    const int R = c->run, K = c->K;
    if ((c->pch[l] + 1) * R > c->prow[l]) {
        int live = 1; /* the lists' runs, and the new one */
        for (int grp = 0; grp < K; grp++) live += (c->gn[(size_t)l * K + grp] + R - 1) / R;
        if (4 * live <= 3 * c->pch[l])
            runs_compact(c, l, NKV, hs);
        else {
            long rows = c->prow[l] ? c->prow[l] + c->prow[l] / 2 : 2L * K * R;
            rows = (rows + R - 1) / R * R;
            if (rows > kvcache_runs_most(c, l)) rows = kvcache_runs_most(c, l);
            if (rows < (long)(c->pch[l] + 1) * R) rows = (long)(c->pch[l] + 1) * R;
            runs_resize(c, l, (int)rows, NKV, hs);
        }
    }
    return c->pch[l]++ * R;
}

/* Token n of layer l joins its groups (mask mi; KEYS_GROUPS): the cache's lists of each group's
 * positions ascend; its cached key and value rows are copied to each group's runs. */
static void token_join(KVCache* c, const Model* m, int l, int n, uint32_t mi) {
    const ModelConfig* mc = &m->cfg;
    const int K = m->fc.K, NKV = mc->NKV, hs = model_head_size(mc);
    int* gn = c->gn + (size_t)l * K;
    c->mask[(size_t)l * c->cap + n] = mi;
    if (n >= m->fc.sinks && __builtin_popcount(mi) > c->pjoin[l])
        c->pjoin[l] = __builtin_popcount(mi); /* (a sink joins every group) */
    for (int g = 0; g < K; g++) {
        if (!((mi >> g) & 1)) continue;
        const size_t at = ((size_t)l * K + g) * c->cap;
        const int t = gn[g];
        int* gres = c->gres + (size_t)l * K + g;
        /* a row not held yet: the next of its run (entry t is row t % run of a run), or the
         * first of a new run (which may compact the runs first, this entry not among them) */
        if (t >= *gres) {
            c->gidx[at + t] = t % c->run ? c->gidx[at + t - 1] + 1 : run_new(c, l, NKV, hs);
            *gres = t + 1;
        }
        c->gpos[at + t] = n;
        gn[g]++;
        run_put(c, l, c->gidx[at + t], n, NKV, hs);
    }
}

static real dot_kv(const real* q, const void* k, int half, int n) {
    if (!half) {
        const real* kr = k;
        real s = 0;
#pragma omp simd reduction(+ : s)
        for (int e = 0; e < n; e++) s += q[e] * kr[e];
        return s;
    }
#ifdef FOCUS_DOUBLE
    const uint16_t* kh = k;
    real s = 0;
    for (int e = 0; e < n; e++) s += q[e] * f16_to_f32(kh[e]);
    return s;
#else
    return f16_row_dot(q, k, n);
#endif
}

static void axpy_kv(real* o, real p, const void* v, int half, int n) {
    if (!half) {
        const real* vr = v;
#pragma omp simd
        for (int e = 0; e < n; e++) o[e] += p * vr[e];
        return;
    }
#ifdef FOCUS_DOUBLE
    const uint16_t* vh = v;
    for (int e = 0; e < n; e++) o[e] += p * f16_to_f32(vh[e]);
#else
    f16_row_axpy(o, p, v, n);
#endif
}

/* Where part id of np starts among n keys */
static int part_bound(int n, int id, int np) { return (int)((long)n * id / np); }

/* The row of key/value head g of layer l's keys (vals = 0) or values (1): at position j of the
 * cache, or at row j of the group runs (run) */
static const void* kv_row(const KVCache* c, int vals, int run, int l, int g, int j, int NKV,
                          int hs) {
    const size_t es = c->half ? 2 : sizeof(real);
    if (run) return (const char*)(vals ? c->pv[l] : c->pk[l]) + run_at(c, l, g, j, hs) * es;
    return (const char*)(vals ? c->v : c->k) + kv_at(c, l, g, j, NKV, hs) * es;
}

#ifndef FOCUS_DOUBLE
/* [t0, t1) cut at the run rows' entries [ra, rb) into three spans, some empty: positions
 * [cut[0], cut[1]), run rows [cut[1], cut[2]), positions [cut[2], cut[3]) (the half rows' kernels
 * take one base a call) */
static void spans(int* cut, int t0, int t1, int ra, int rb) {
    cut[0] = t0, cut[3] = t1;
    cut[1] = ra < t0 ? t0 : ra > t1 ? t1 : ra;
    cut[2] = rb < cut[1] ? cut[1] : rb > t1 ? t1 : rb;
}
#endif

/* A part of key/value head g's keys from their scores: entries [t0, t1) of keys (positions, but
 * for entries [ra, rb), rows of the layer's group runs), head r's score of entry t at
 * sg[r ld + t] (made exponentials of the part's maximum here); each of the rep heads' maximum,
 * sum and output (the values mixed) into part, at g's heads (NH, hs + 2). */
static void part_from_scores(real* part, real* sg, size_t ld, const KVCache* c, int l, int g,
                             int rep, int NKV, int hs, const int* keys, int t0, int t1, int ra,
                             int rb) {
    for (int r = 0; r < rep; r++) {
        real* sh = sg + (size_t)r * ld;
        real mx = -INFINITY, sum = 0;
#pragma omp simd reduction(max : mx)
        for (int t = t0; t < t1; t++) mx = sh[t] > mx ? sh[t] : mx;
#pragma omp simd reduction(+ : sum)
        for (int t = t0; t < t1; t++) sum += sh[t] = exp_f(sh[t] - mx);
        real* ph = part + (size_t)(g * rep + r) * (hs + 2);
        ph[0] = mx, ph[1] = sum;
        for (int e = 0; e < hs; e++) ph[2 + e] = 0;
    }
    real* pg = part + (size_t)g * rep * (hs + 2) + 2;
#ifndef FOCUS_DOUBLE
    if (c->half) { /* each value row converted once for the rep heads */
        int cut[4];
        spans(cut, t0, t1, ra, rb);
        for (int sp = 0; sp < 3; sp++)
            if (cut[sp] < cut[sp + 1])
                f16_rows_mix(pg, hs + 2, sg, ld, rep, kv_row(c, 1, sp == 1, l, g, 0, NKV, hs), hs,
                             keys, cut[sp], cut[sp + 1], hs);
        return;
    }
#endif
    for (int t = t0; t < t1; t++) {
        const void* vj = kv_row(c, 1, t >= ra && t < rb, l, g, keys[t], NKV, hs);
        for (int r = 0; r < rep; r++)
            axpy_kv(pg + (size_t)r * (hs + 2), sg[(size_t)r * ld + t], vj, c->half, hs);
    }
}

/* Wait until *flag is set (acquiring what was released with it): a busy wait, the core yielded
 * after a while (a team with more threads than cores would otherwise spin out its time slices
 * while the thread it waits for is not running) */
static void wait_set(atomic_int* flag) {
    for (int k = 0; !atomic_load_explicit(flag, memory_order_acquire); k++) {
        if (k >= 4096) sched_yield();
#if defined(__x86_64__)
        else
            __builtin_ia32_pause();
#endif
    }
}

/* How many parts n keys are split into: one below least keys (c->split_min, where a part holds
 * every key/value head's keys), else one per 2 split_min keys, at least two, at most c->nparts,
 * and a power of two (the parts then share out evenly over 2, 4 .. threads; 3 parts on 2 threads
 * left one idle a third of the time, measured: a third of the steps' attention at p = 0.2 of 8K).
 * Key counts only, never the thread count, so a token's arithmetic is the same on any number of
 * threads. */
static int key_parts(const KVCache* c, int n, int least) {
    int parts = n < least ? 1 : 2;
    while (n >= least && 2 * parts * 2 * c->split_min <= n && 2 * parts <= c->nparts) parts *= 2;
    return parts;
}

/* Part id of np (bounds by part_bound) of the nk keys keys of key/value head g, for its rep query
 * heads (queries in qkv): positions, but for entries [ra, rb), rows of the layer's group runs.
 * Each key and value row is read once for the rep heads; each head's running maximum, sum and
 * output go to part, at g's heads (NH, hs + 2); the scores to sc (NH, cap), at g's heads. */
static void attend_part(real* part, const real* qkv, int l, const KVCache* c, const int* keys,
                        int nk, int ra, int rb, int g, int id, int np, const ModelConfig* mc,
                        real* sc) {
    const int NH = mc->NH, NKV = mc->NKV, hs = model_head_size(mc), rep = NH / NKV;
    const real scale = (real)(1.0 / sqrt((double)hs));
    const int t0 = part_bound(nk, id, np), t1 = part_bound(nk, id + 1, np);
    real* sg = sc + (size_t)g * rep * c->cap;
#ifndef FOCUS_DOUBLE
    if (c->half) { /* each key and value row converted once for the rep heads */
        int cut[4];
        spans(cut, t0, t1, ra, rb);
        for (int sp = 0; sp < 3; sp++)
            if (cut[sp] < cut[sp + 1])
                f16_rows_scores(sg, c->cap, qkv + (size_t)g * rep * hs, rep,
                                kv_row(c, 0, sp == 1, l, g, 0, NKV, hs), hs, keys, cut[sp],
                                cut[sp + 1], hs, scale, kv_row(c, 1, sp == 1, l, g, 0, NKV, hs));
        part_from_scores(part, sg, c->cap, c, l, g, rep, NKV, hs, keys, t0, t1, ra, rb);
        return;
    }
#endif
    for (int r = 0; r < rep; r++) {
        const int hh = g * rep + r;
        const real* q = qkv + hh * hs;
        real* sh = sg + (size_t)r * c->cap;
        real mx = -INFINITY;
        for (int t = t0; t < t1; t++) {
            const void* kj = kv_row(c, 0, t >= ra && t < rb, l, g, keys[t], NKV, hs);
            sh[t] = dot_kv(q, kj, c->half, hs) * scale;
            mx = sh[t] > mx ? sh[t] : mx;
        }
        real* ph = part + (size_t)hh * (hs + 2);
        ph[0] = mx, ph[1] = 0;
        for (int e = 0; e < hs; e++) ph[2 + e] = 0;
    }
    for (int t = t0; t < t1; t++) { /* each value row read once for the rep heads */
        const void* vj = kv_row(c, 1, t >= ra && t < rb, l, g, keys[t], NKV, hs);
        for (int r = 0; r < rep; r++) {
            real* ph = part + (size_t)(g * rep + r) * (hs + 2);
#ifdef FOCUS_DOUBLE
            const real pj = exp(sg[(size_t)r * c->cap + t] - ph[0]);
#else
            const real pj = expf(sg[(size_t)r * c->cap + t] - ph[0]);
#endif
            ph[1] += pj;
            axpy_kv(ph + 2, pj, vj, c->half, hs);
        }
    }
}

/* Query head hh's attention (att, hs) from its parts: first (if not NULL), then parts 0 ..
 * parts - 1 of partbuf (each (NH, hs + 2): maximum, sum, output), in that order, rescaled to
 * their common maximum. */
static void merge_parts(real* att, const real* partbuf, const real* first, int parts, int hh,
                        int NH, int hs) {
    real mx = -INFINITY, sum = 0;
    for (int id = first ? -1 : 0; id < parts; id++) {
        const real* ph = (id < 0 ? first : partbuf + (size_t)id * NH * (hs + 2)) + hh * (hs + 2);
        if (ph[1] > 0 && ph[0] > mx) mx = ph[0];
    }
    for (int e = 0; e < hs; e++) att[e] = 0;
    for (int id = first ? -1 : 0; id < parts; id++) {
        const real* ph = (id < 0 ? first : partbuf + (size_t)id * NH * (hs + 2)) + hh * (hs + 2);
        if (!(ph[1] > 0)) continue; /* no keys in this part */
        const real wgt = (real)exp((double)(ph[0] - mx));
        sum += wgt * ph[1];
        for (int e = 0; e < hs; e++) att[e] += wgt * ph[2 + e];
    }
    for (int e = 0; e < hs; e++) att[e] /= sum;
}

/* att (NH * hs) = softmax(q k / sqrt(hs)) v for every head of qkv's query, over the nk[g] keys
 * keys[g] of its key/value head g (one list for every g but in the block patterns): positions,
 * but for entries rlo[g] .. rhi[g] - 1, rows of the layer's group runs (rlo NULL: none). The keys
 * are split into key_parts(the most keys of a head) parts (attend_part), which the threads
 * share; the parts are then merged in order (merge_parts). Scores go to sc (NH, cap), the parts
 * to partbuf (c->nparts, NH, hs + 2). */
static void attend_keys(real* att, const real* qkv, int l, const KVCache* c, int* const* keys,
                        const int* nk, const int* rlo, const int* rhi, const ModelConfig* mc,
                        real* sc, real* partbuf) {
    const int NH = mc->NH, NKV = mc->NKV, hs = model_head_size(mc);
    const int threads = omp_get_max_threads();
    int most = 0;
    for (int g = 0; g < NKV; g++) most = nk[g] > most ? nk[g] : most;
    const int parts = key_parts(c, most, c->split_min);
#pragma omp parallel for schedule(static, 1) \
    num_threads(threads < parts ? threads : parts) if (parts > 1 && threads > 1)
    for (int id = 0; id < parts; id++)
        for (int g = 0; g < NKV; g++)
            attend_part(partbuf + (size_t)id * NH * (hs + 2), qkv, l, c, keys[g], nk[g],
                        rlo ? rlo[g] : 0, rlo ? rhi[g] : 0, g, id, parts, mc, sc);
    for (int hh = 0; hh < NH; hh++) merge_parts(att + hh * hs, partbuf, NULL, parts, hh, NH, hs);
}

/* ---- the block patterns (blocks, blocks_mean, blocks_learned) over the cache: each layer and
 * key/value head keeps the statistics of every complete key block (kernels/sparse.h), made when
 * its last key is cached; a query chooses among the complete blocks of its distant keys through
 * block_select, as attention_blocks_forward does (w >= block - 1: a candidate block is then
 * complete). */

int kvcache_block_cap(int cap, int bs) {
    return cap / (bs > 0 ? bs : 1) + 1; /* (a partial block at the end) */
}

/* The cache's block part, made on first use. */
static void block_cache(KVCache* c, const ModelConfig* mc, int bs) {
    if (c->bstat && c->bs == bs) return;
    free(c->bstat), free(c->bkeys);
    const int hs = model_head_size(mc);
    c->bs = bs, c->nbcap = kvcache_block_cap(c->cap, bs);
    const size_t nst = (size_t)mc->L * mc->NKV * c->nbcap * BLOCKGATE_STAT_BYTES(hs);
    c->bstat = mallocPages(nst);
    memset(c->bstat, 0, nst);
    c->bkeys = mallocCheck(sizeof(int) * (size_t)mc->NKV * c->cap);
}

/* Key n of layer l is cached: the statistics of the block it completes, from the cached rows. */
static void block_complete(KVCache* c, int l, int n, const ModelConfig* mc) {
    if ((n + 1) % c->bs) return;
    const int NKV = mc->NKV, hs = model_head_size(mc), b = n / c->bs;
    const int j0 = b * c->bs;
    real* rows = mallocCheck(sizeof(real) * (size_t)c->bs * hs);
    for (int g = 0; g < NKV; g++) {
        for (int j = j0; j <= n; j++) {
            const size_t at = kv_at(c, l, g, j, NKV, hs);
            real* r = rows + (size_t)(j - j0) * hs;
            if (!c->half)
                memcpy(r, (const real*)c->k + at, sizeof(real) * hs);
            else
#ifndef FOCUS_DOUBLE
                f16_row_get(r, (const uint16_t*)c->k + at, hs);
#else
                for (int e = 0; e < hs; e++) r[e] = f16_to_f32(((const uint16_t*)c->k)[at + e]);
#endif
        }
        blockgate_key_stats8(
            c->bstat + (((size_t)l * NKV + g) * c->nbcap + b) * BLOCKGATE_STAT_BYTES(hs), rows, hs,
            0, c->bs, hs);
    }
    free(rows);
}

/* The block statistics of key/value head g on layer l, and the learned selector's weights of its
 * query heads (NULL for the other block scores). */
static void selector_of(const KVCache* c, const Model* m, int l, int g, const int8_t** st,
                        const real** gate) {
    const ModelConfig* mc = &m->cfg;
    const int NH = mc->NH, NKV = mc->NKV, hs = model_head_size(mc), rep = NH / NKV;
    *st = c->bstat + ((size_t)l * NKV + g) * c->nbcap * BLOCKGATE_STAT_BYTES(hs);
    *gate = attn_block_score(m->fc.attn) == BLOCKS_LEARNED
                ? m->method.selector + ((size_t)l * NH + (size_t)g * rep) * BLOCKGATE_WIDTH(hs)
                : NULL;
}

/* The distant blocks the query heads of key/value head g choose at position n of layer l (q:
 * their rep queries; lb: their band log-sum-exps, blocks_learned only) into sel; returns their
 * number. made: p holds block_logits's logits already. sc: nbcap scratch, p: rep nbcap. */
static int row_blocks(const KVCache* c, const Model* m, int l, int n, int g, const real* q,
                      const real* lb, int* sel, real* sc, real* p, int made) {
    const FocusConfig* f = &m->fc;
    const int8_t* st;
    const real* gate;
    selector_of(c, m, l, g, &st, &gate);
    return block_select_made(sel, attn_block_score(f->attn), q, m->cfg.NH / m->cfg.NKV, st, gate,
                             lb, 1, NULL, 0, n, f->w, f->sinks, f->block, model_layer_blocks(m, l),
                             f->blocks_p, model_head_size(&m->cfg), sc, p, made);
}

/* The band of the query heads of key/value head g at position n of layer l (q: their rep
 * queries) into keys: the sinks before the window, the window; returns their number. The learned
 * selector needs the band's log-sum-exp per head (into lb), so for it the band is attended here,
 * as one of attend_keys's parts (part, (NH, hs + 2), at g's heads: each head's maximum, sum and
 * output), sb (head r's score of key t at sb[r ld + t]) its scratch. */
static int band_keys(const KVCache* c, const Model* m, int l, int n, int g, const real* q,
                     int* keys, real* sb, size_t ld, real* lb, real* part) {
    const FocusConfig* f = &m->fc;
    const ModelConfig* mc = &m->cfg;
    const int NH = mc->NH, NKV = mc->NKV, hs = model_head_size(mc), rep = NH / NKV;
    const int lo = n - f->w < 0 ? 0 : n - f->w;
    int nk = 0;
    for (int j = 0; j < f->sinks && j < lo; j++) keys[nk++] = j;
    for (int j = lo; j <= n; j++) keys[nk++] = j;
    if (attn_block_score(f->attn) != BLOCKS_LEARNED) return nk;
    const real scale = (real)(1.0 / sqrt((double)hs));
    const size_t es = c->half ? 2 : sizeof(real);
    const char* kc = (const char*)c->k + kv_at(c, l, g, 0, NKV, hs) * es; /* head g's keys */
    int made = 0; /* (the scores by f16_rows_scores) */
#ifndef FOCUS_DOUBLE
    if (c->half) { /* each key row converted once for the rep heads */
        f16_rows_scores(sb, ld, q, rep, (const uint16_t*)kc, hs, keys, 0, nk, hs, scale,
                        kv_row(c, 1, 0, l, g, 0, NKV, hs));
        made = 1;
    }
#endif
    if (!made)
        for (int r = 0; r < rep; r++)
            for (int t = 0; t < nk; t++)
                sb[(size_t)r * ld + t] =
                    dot_kv(q + (size_t)r * hs, kc + (size_t)keys[t] * hs * es, c->half, hs) * scale;
    /* attended here, on the thread that read the keys and prefetched the values */
    part_from_scores(part, sb, ld, c, l, g, rep, NKV, hs, keys, 0, nk, 0, 0);
    for (int r = 0; r < rep; r++) {
        const real* ph = part + (size_t)(g * rep + r) * (hs + 2);
        lb[r] = ph[0] + (real)log((double)ph[1]);
    }
    return nk;
}

/* n distinct block numbers in ascending order: each put at its rank (comparisons without
 * branches: an insertion sort's shifts are mispredicted), an insertion sort past 64 */
static void ascending(int* s, int n) {
    if (n > 64) {
        for (int a = 1; a < n; a++)
            for (int b = a; b > 0 && s[b - 1] > s[b]; b--) {
                const int t = s[b];
                s[b] = s[b - 1], s[b - 1] = t;
            }
        return;
    }
    int t[64];
    memcpy(t, s, sizeof(int) * (size_t)n);
    for (int a = 0; a < n; a++) {
        int rank = 0;
        for (int b = 0; b < n; b++) rank += t[b] < t[a];
        s[rank] = t[a];
    }
}

/* After the nk keys of the band in keys, the distant keys of the blocks the query heads of key/
 * value head g choose at position n of layer l (row_blocks), and with the centroids beside the
 * blocks those of the row's groups (mask mi) that no chosen block holds, as rows of the layer's
 * group runs from keys[*r0] on. Returns the keys' number. sel, sc: nbcap scratch each, p: rep
 * nbcap (made: the logits in it). */
static int distant_keys(const KVCache* c, const Model* m, int l, int n, int g, const real* q,
                        uint32_t mi, int* keys, int nk, const real* lb, int* sel, real* sc, real* p,
                        int made, int* r0) {
    const FocusConfig* f = &m->fc;
    const int bs = f->block;
    const int ns = row_blocks(c, m, l, n, g, q, lb, sel, sc, p, made);
    for (int s = 0; s < ns; s++) {
        const int j0 = sel[s] * bs > f->sinks ? sel[s] * bs : f->sinks;
        const int j1 = (sel[s] + 1) * bs < n - f->w ? (sel[s] + 1) * bs : n - f->w;
        for (int j = j0; j < j1; j++) keys[nk++] = j;
    }
    /* each group key in the lowest group it shares with the row */
    const uint32_t* cm = c->mask + (size_t)l * c->cap;
    *r0 = nk;
    for (int grp = 0; m->method.with_groups && grp < f->K; grp++) {
        if (!((mi >> grp) & 1)) continue;
        const int* gp = c->gpos + ((size_t)l * f->K + grp) * c->cap;
        const int* gi = c->gidx + ((size_t)l * f->K + grp) * c->cap;
        /* the entries past the sinks and before the window */
        const int len = c->gn[(size_t)l * f->K + grp], end = first_at(gp, len, n - f->w);
        int t = first_at(gp, end, f->sinks);
        const uint32_t lower = mi & ((1u << grp) - 1); /* the row's groups below this one */
        if (!lower && ns <= 64) { /* every entry outside the chosen blocks: the stretches between */
            int sb[64];
            memcpy(sb, sel, sizeof(int) * (size_t)ns);
            ascending(sb, ns);
            for (int s = 0; s <= ns && t < end; s++) {
                const int upto = s < ns ? first_at(gp + t, end - t, sb[s] * bs) + t : end;
                memcpy(keys + nk, gi + t, sizeof(int) * (size_t)(upto - t));
                nk += upto - t;
                if (s < ns) t = upto + first_at(gp + upto, end - upto, (sb[s] + 1) * bs);
            }
            continue;
        }
        int next = -1, chosen = 0; /* the next block's first position; the entry's block chosen */
        for (; t < end; t++) {
            const int j = gp[t];
            if (cm[j] & lower) continue;
            if (j >= next) { /* (the entries ascend: each block looked up once) */
                const int b = j / bs;
                next = (b + 1) * bs, chosen = 0;
                for (int s = 0; s < ns && !chosen; s++) chosen = sel[s] == b;
            }
            if (!chosen) keys[nk++] = gi[t];
        }
    }
    return nk;
}

/* A prompt's rows (one cache, positions pos0 ..) on a block pattern's layer l: the band and the
 * sinks tiled over the cache, then each row's chosen distant blocks, a block read once for the
 * rows of a tile that chose it (kernels/sparse.c); each row's bits whatever rows are beside it.
 * Returns the pairs evaluated. */
static long blocks_prompt_rows(Model* m, int l, KVCache* c, int pos0, int n, const real* qkv,
                               const uint32_t* mi, real* att, const LayerRows* r) {
    const ModelConfig* mc = &m->cfg;
    const FocusConfig* f = &m->fc;
    const int NH = mc->NH, NKV = mc->NKV, hs = model_head_size(mc), rep = NH / NKV,
              Q = cached_qkv_width(mc), A = NH * hs, bs = f->block, nbmax = c->nbcap;
    if (rep > 64) fatal("blocks_learned decodes at most 64 query heads per key/value head");
    const CachedKV kv = layer_kv(c, l, NKV, hs);
    real* lse = mallocCheck(sizeof(real) * (size_t)n * NH);
    attention_cached_forward(att, A, lse, qkv, Q, pos0, n, &kv, f->w, f->sinks, NH, NKV, hs);
    profile_tick(r->prof, r->mark, PART_BAND);
    int* sel = mallocCheck(sizeof(int) * (size_t)n * NKV * nbmax);
    int* nsel = mallocCheck(sizeof(int) * (size_t)n * NKV);
    long pairs = 0;
    /* each task: a tile of rows and one key/value head: the learned selector's logits for the
     * tile at once (block_logits_tile: the values a decode step makes), then each row's choice */
    const int learned = attn_block_score(f->attn) == BLOCKS_LEARNED, TR = BLOCK_TILE_ROWS;
    const int ntile = (n + TR - 1) / TR;
    const size_t ldp = (size_t)rep * nbmax; /* a row's logits */
#pragma omp parallel reduction(+ : pairs)
    {
        real* sc = mallocCheck(sizeof(real) * (size_t)(nbmax > c->cap + 1 ? nbmax : c->cap + 1));
        const size_t np = TR * ldp > (size_t)c->cap + 1 ? TR * ldp : (size_t)c->cap + 1;
        real* p = mallocCheck(sizeof(real) * np);
#pragma omp for schedule(dynamic, 1)
        for (long task = 0; task < (long)ntile * NKV; task++) {
            const int g = (int)(task % NKV), r0 = (int)(task / NKV) * TR;
            const int nq = n - r0 < TR ? n - r0 : TR;
            const real* qg = qkv + (size_t)r0 * Q + (size_t)g * rep * hs;
            if (learned) {
                const int8_t* st;
                const real* gate;
                selector_of(c, m, l, g, &st, &gate);
                block_logits_tile(p, ldp, qg, Q, pos0 + r0, nq, st, gate, f->w, f->sinks, bs, rep,
                                  hs);
            }
            for (int r = r0; r < r0 + nq; r++) {
                const int i = pos0 + r, lo = i - f->w < 0 ? 0 : i - f->w;
                if (g == 0) /* the band */
                    pairs += (long)(i + 1 - lo + (f->sinks < lo ? f->sinks : lo)) * NH;
                int* sg = sel + ((size_t)r * NKV + g) * nbmax;
                const int ns = row_blocks(c, m, l, i, g, qg + (size_t)(r - r0) * Q,
                                          lse + (size_t)r * NH + g * rep, sg, sc,
                                          learned ? p + (size_t)(r - r0) * ldp : p, learned);
                ascending(sg, ns); /* as the merge reads them */
                nsel[(size_t)r * NKV + g] = ns;
                for (int s = 0; s < ns; s++) {
                    const int j0 = sg[s] * bs > f->sinks ? sg[s] * bs : f->sinks;
                    const int j1 = (sg[s] + 1) * bs < i - f->w ? (sg[s] + 1) * bs : i - f->w;
                    pairs += (long)(j1 > j0 ? j1 - j0 : 0) * rep;
                }
            }
        }
        free(sc), free(p);
    }
    profile_tick(r->prof, r->mark, PART_SELECT);
    attention_cached_blocks(att, A, lse, qkv, Q, pos0, n, &kv, f->w, f->sinks, bs, sel, nsel, nbmax,
                            NH, NKV, hs);
    if (m->method.with_groups) { /* the rows' groups, less the chosen blocks and the sinks */
        const ChosenBlocks chosen = {f->sinks, bs, sel, nsel, nbmax};
        const CachedKV runs = layer_runs(c, l);
        const GroupLists gl = layer_lists(c, l, &runs);
        pairs += attention_cached_groups(att, A, lse, qkv, Q, pos0, n, &kv, f->w, mi,
                                         c->mask + (size_t)l * c->cap, &gl, &chosen, NH, NKV, hs);
    }
    profile_tick(r->prof, r->mark, PART_DISTANT);
    free(lse), free(sel), free(nsel);
    return pairs;
}

void kvcache_truncate(KVCache* c, int n) {
    if (n < 0 || n > c->n) fatal("kvcache_truncate: %d tokens of %d cached", n, c->n);
    /* each group's positions ascend: drop the tail at or after n */
    for (int l = 0; l < c->L; l++)
        for (int g = 0; g < c->K; g++) {
            int* gn = c->gn + (size_t)l * c->K + g;
            const int* gp = c->gpos + ((size_t)l * c->K + g) * c->cap;
            while (*gn > 0 && gp[*gn - 1] >= n) (*gn)--;
        }
    c->n = n;
}
enum { PROMPT_ROWS = 64 };

void rows_project(real* y, int ldy, const real* x, int n, const real* w, const real* b, int in,
                  int out, const QMatrix* nw, int exact, int per_row, int slot0) {
#ifndef FOCUS_DOUBLE
    if (nw && per_row) {
        qmatvec_rows(y, ldy, nw, x, n, b);
        return;
    }
#endif
    if (!nw && per_row) {
        for (int i = 0; i < n; i++)
            project_rows(y + (size_t)i * ldy, ldy, x + (size_t)i * in, 1, w, b, in, out, NULL, 0);
        return;
    }
    if (nw && qmatmul_rows_alike(nw, exact)) { /* int8 products: rows independent already */
        project_rows(y, ldy, x, n, w, b, in, out, nw, exact);
        return;
    }
    /* the BLAS: products of PROMPT_ROWS rows each, zeros beside the rows, a row at the place its
     * position gives it (slot0: the first row's), as a row can get other bits in a product of
     * another row count (OpenBLAS's small-matrix kernels) or at another place among the rows
     * (its Haswell kernels; measured, kernels/tile.h) */
    real* xp = mallocCheck(sizeof(real) * PROMPT_ROWS * in);
    real* yp = mallocCheck(sizeof(real) * PROMPT_ROWS * out);
    for (int i0 = 0, s0 = (slot0 % PROMPT_ROWS + PROMPT_ROWS) % PROMPT_ROWS, k; i0 < n;
         i0 += k, s0 = 0) {
        k = n - i0 < PROMPT_ROWS - s0 ? n - i0 : PROMPT_ROWS - s0;
        memset(xp, 0, sizeof(real) * (size_t)s0 * in); /* zeros beside the rows */
        memcpy(xp + (size_t)s0 * in, x + (size_t)i0 * in, sizeof(real) * (size_t)k * in);
        memset(xp + (size_t)(s0 + k) * in, 0, sizeof(real) * (size_t)(PROMPT_ROWS - s0 - k) * in);
        project_rows(yp, out, xp, PROMPT_ROWS, w, b, in, out, nw, exact);
        for (int i = 0; i < k; i++)
            memcpy(y + (size_t)(i0 + i) * ldy, yp + (size_t)(s0 + i) * out, sizeof(real) * out);
    }
    free(xp), free(yp);
}

/* One row's scratch for row_attend: each key/value head's key list and length, the key lists
 * (keys; bkeys: NKV of cap for the block patterns), the scores (NH, cap), attend_keys's parts,
 * the block patterns' scratch. */
typedef struct {
    int** kl;
    int* nkg;
    int* keys;
    int* bkeys;
    real *scores, *part;
    int* bsel; /* the block patterns' scratch: (NKV, nbcap) each, bp (NH, nbcap) */
    real *bsc, *bp;
    int* npre;      /* (NKV) the band's keys (blocks_learned: band_keys attends them) */
    int *rlo, *rhi; /* (NKV) the keys that are rows of the group runs */
} RowWork;

/* Row p of layer l attends to its chosen key blocks (KEYS_BLOCKS) through the cache: one parallel
 * region (a decode step's; nested in a prompt's parallel rows, it runs on one thread), its tasks
 * handed out in order to the threads as they free up, each with its own scratch, the same
 * arithmetic on any number of threads. Returns the pairs attended.
 * - First, one or two tasks for each key/value head; the one that completes a head makes its
 *   choice (distant_keys).
 *   - The learned selector: every head's logits of its blocks, then every head's band (the
 *     threads then end closer together). The band is attended where its scores are made, as a
 *     part of its own: their softmax gives the log-sum-exp the choice needs, and its values are
 *     mixed by the thread that prefetched them with the keys.
 *   - Quest's bounds and the mean keys' products: the band's list with the blocks' scores, in
 *     one task a head (each reads its statistics from memory). With fewer heads than threads
 *     (Gemma 3's one) two tasks, each with half the blocks' scores.
 * - Then each head's two halves of its chosen keys' parts, each waiting for the head's choice: a
 *   thread free before the last choice starts on a head already chosen, with no barrier between
 *   choosing and attending. A list is split into parts only from 4 split_min keys (the heads
 *   share the threads already, and each part starts its rows from memory). Where the band is in
 *   the list (Quest's), every head's second half (its chosen blocks, slower a key than the
 *   band's run) comes before the first halves.
 * Each of these orders was measured against the one it replaced: docs/RESULTS.md, issue 41's
 * sections of 2026-12-07. */
static long blocks_decode_row(Model* m, int l, const KVCache* c, int p, uint32_t mi,
                              const real* qrow, real* att, RowWork* w, double* prof, double* mark) {
    const ModelConfig* mc = &m->cfg;
    const FocusConfig* f = &m->fc;
    const int NH = mc->NH, NKV = mc->NKV, hs = model_head_size(mc), rep = NH / NKV;
    const int threads = omp_get_max_threads(), nb = c->nbcap;
    const BlockScore score = attn_block_score(f->attn);
    const int learned = score == BLOCKS_LEARNED,
              bounds = score == BLOCKS_QUEST || score == BLOCKS_MEAN;
    const int halves = bounds && NKV < threads; /* (the bounds in two tasks a head) */
    const int made = learned || bounds, need = learned || halves ? 2 : 1, tasks = need * NKV;
    const int total = tasks + 2 * NKV;
    if (NH > 1024) fatal("the block patterns decode at most 1024 query heads");
    real lb[1024];
    atomic_int ready[1024];  /* each key/value head's parts done */
    atomic_int chosen[1024]; /* each key/value head's keys chosen */
    int parts[1024];         /* and the parts of its list past the band */
    int nkeys[1024];         /* its keys, the band's included */
    for (int g = 0; g < NKV; g++) atomic_init(&ready[g], 0), atomic_init(&chosen[g], 0);
    real* band = learned ? w->part + (size_t)c->nparts * NH * (hs + 2) : NULL;
#pragma omp parallel for schedule(dynamic, 1) \
    num_threads(threads < total ? threads : total) if (threads > 1)
    for (int t = 0; t < total; t++) {
        if (t >= tasks) { /* half of a head's parts, once its keys are chosen */
            /* (the learned selector's band apart: a head's halves in turn; else every head's
             * second half first: the chosen blocks, slower than the band's run) */
            const int u = t - tasks, g = learned ? u / 2 : u % NKV,
                      half = learned ? u % 2 : 1 - u / NKV;
            wait_set(&chosen[g]);
            const int np = parts[g];
            for (int id = part_bound(np, half, 2); id < part_bound(np, half + 1, 2); id++)
                attend_part(w->part + (size_t)id * NH * (hs + 2), qrow, l, c, w->kl[g], w->nkg[g],
                            w->rlo[g], w->rhi[g], g, id, np, mc, w->scores);
            continue;
        }
        const int g = t % NKV;
        const real* qg = qrow + (size_t)g * rep * hs;
        const int8_t* st;
        const real* gate;
        selector_of(c, m, l, g, &st, &gate);
        const int isband = learned ? t >= NKV : t < NKV; /* (else the head's second task) */
        if (isband) {
            w->kl[g] = w->bkeys + (size_t)g * c->cap;
            w->nkg[g] = band_keys(c, m, l, p, g, qg, w->kl[g], w->scores + (size_t)g * rep * c->cap,
                                  c->cap, lb + g * rep, band);
            w->npre[g] = learned ? w->nkg[g] : 0;
        }
        if (learned && !isband)
            block_logits(w->bp + (size_t)g * rep * nb, qg, rep, st, gate, p, f->w, f->sinks,
                         f->block, hs);
        if (bounds)
            block_bounds(w->bsc + (size_t)g * nb, score, qg, rep, st, p, f->w, f->sinks, f->block,
                         hs, halves && t >= NKV, halves ? 2 : 1);
        /* acquire the other part's writes, release this one's */
        if (atomic_fetch_add_explicit(&ready[g], 1, memory_order_acq_rel) < need - 1) continue;
        const int nk = distant_keys(c, m, l, p, g, qg, mi, w->kl[g], w->nkg[g], lb + g * rep,
                                    w->bsel + (size_t)g * nb, w->bsc + (size_t)g * nb,
                                    w->bp + (size_t)g * rep * nb, made, &w->rlo[g]);
        const int b = w->npre[g]; /* the list past the band band_keys attended */
        nkeys[g] = nk;
        w->kl[g] += b, w->nkg[g] = nk - b, w->rlo[g] -= b, w->rhi[g] = nk - b;
        parts[g] = key_parts(c, w->nkg[g], 4 * c->split_min);
        atomic_store_explicit(&chosen[g], 1, memory_order_release);
    }
    long pairs = 0;
    for (int g = 0; g < NKV; g++) pairs += (long)nkeys[g] * rep;
    for (int hh = 0; hh < NH; hh++)
        merge_parts(att + hh * hs, w->part, band, parts[hh / rep], hh, NH, hs);
    profile_tick(prof, mark, PART_ATTENTION);
    return pairs;
}

/* The keys of the row at position p of cache c on layer l (mask mi: its groups, joined already)
 * and its attention into att; returns the pairs it evaluated. prof, mark: FOCUS_PROFILE's
 * (choosing the keys, then attending), or NULL. */
static long row_attend(Model* m, int l, int kind, const KVCache* c, int p, uint32_t mi,
                       const real* qrow, real* att, RowWork* w, double* prof, double* mark) {
    if (kind == KEYS_BLOCKS) return blocks_decode_row(m, l, c, p, mi, qrow, att, w, prof, mark);
    const ModelConfig* mc = &m->cfg;
    int ng;
    const int nk = token_keys(c, m, l, p, mi, kind, w->keys, &ng);
    for (int g = 0; g < mc->NKV; g++)
        w->kl[g] = w->keys, w->nkg[g] = nk, w->rlo[g] = 0, w->rhi[g] = ng;
    profile_tick(prof, mark, PART_SELECT);
    attend_keys(att, qrow, l, c, w->kl, w->nkg, w->rlo, w->rhi, mc, w->scores, w->part);
    profile_tick(prof, mark, PART_ATTENTION);
    return (long)nk * mc->NH;
}

/* The router's distributions over the groups of rows [i0, i1) of h on layer l, as a key (into
 * Gk) and, with a query projection, as a query (into Gq) */
static void router_groups_rows(const Model* m, int l, const real* h, real* Gk, real* Gq, int i0,
                               int i1) {
    const FocusConfig* f = &m->fc;
    const int C = m->cfg.C, K = f->K;
    const size_t lC = (size_t)l * C;
    const real* cent = m->router.cent + (size_t)l * K * f->dg;
    const real* beta = m->beta + (size_t)l * K;
    real* proj = mallocCheck(sizeof(real) * (size_t)f->dg);
    real* S = mallocCheck(sizeof(real) * (size_t)K);
    for (int i = i0; i < i1; i++) {
        const real* hi = h + (size_t)i * C;
        router_row_scores(proj, S, hi, m->router.wg + lC * f->dg, cent, C, f->dg, K);
        routing_forward(Gk + (size_t)i * K, NULL, S, beta, ROUTE_CAUSAL, 1, 1, K, f->tau, f->iters);
        if (!Gq) continue; /* the row's own groups as a query (model_cpu.c) */
        router_row_scores(proj, S, hi, m->router.wq + lC * f->dg, cent, C, f->dg, K);
        routing_forward(Gq + (size_t)i * K, NULL, S, beta, ROUTE_CAUSAL, 1, 1, K, f->tau, f->iters);
    }
    free(proj), free(S);
}

void kvcache_attend_rows(Model* m, int l, const LayerRows* r, const real* h, const real* qkv,
                         real* att) {
    const ModelConfig* mc = &m->cfg;
    const FocusConfig* f = &m->fc;
    const int n = r->T, NH = mc->NH, NKV = mc->NKV, hs = model_head_size(mc),
              Q = cached_qkv_width(mc), K = f->K, A = NH * hs;
    KVCache* const* cs = r->cs;
    const int* pos = r->pos;
    RowScratch* s = r->scratch;
    kv_put_rows(cs, l, pos, qkv, n, Q, A, NKV, hs);
    /* a prompt into a cache with dense_steps set is the dense model's, and keeps none of the
     * method's state (bench decode --against dense: a cache of its own) */
    const int kind = r->per_row ? layer_keys(m, l) : step_keys(cs[0], m, l);
    if (!r->per_row && (kind == KEYS_DENSE || kind == KEYS_WINDOW)) {
        /* a prompt's rows (one cache, positions pos[0] ..): tiled over the cached keys, each
         * row's arithmetic independent of the chunk it is in */
        KVCache* c = cs[0];
        int bw = -1, bsinks = 0;
        if (kind == KEYS_WINDOW) layer_band(c, m, l, &bw, &bsinks);
        const CachedKV kv = layer_kv(c, l, NKV, hs);
        attention_cached_forward(att, A, NULL, qkv, Q, pos[0], n, &kv, bw, bsinks, NH, NKV, hs);
        profile_tick(r->prof, r->mark, kind == KEYS_WINDOW ? PART_BAND : PART_ATTENTION);
        for (int i = 0; i < n; i++) {
            const int lo = bw < 0 || pos[i] - bw < 0 ? 0 : pos[i] - bw;
            c->pairs += (long)(pos[i] + 1 - lo + (bsinks < lo ? bsinks : lo)) * NH;
        }
        return;
    }
    if (kind == KEYS_BLOCKS) { /* the statistics of the blocks the rows complete, on the threads
                                * (each block's its own) */
        for (int i = 0; i < n; i++) block_cache(cs[i], mc, f->block);
        if (n >= 2 * f->block) {
#pragma omp parallel for schedule(static)
            for (int i = 0; i < n; i++) block_complete(cs[i], l, pos[i], mc);
        } else { /* (a decode step: kernels/cpu.h) */
            for (int i = 0; i < n; i++) block_complete(cs[i], l, pos[i], mc);
        }
    }
    profile_tick(r->prof, r->mark, PART_ATTENTION);
    /* each row's groups (mi: those it keeps as a query). The router's groups: hard mode, or
     * beside the blocks; a pattern's come from its row. */
    uint32_t* mi = callocCheck((size_t)n, sizeof(uint32_t));
    const int grouped = kind == KEYS_GROUPS || (kind == KEYS_BLOCKS && m->method.with_groups);
    const int hard = grouped && model_method(m)->masks != MASKS_PATTERN;
    /* the router's distributions over the groups, as a key (Gk) and, with a query projection,
     * as a query (Gq): the rows on the threads, each row's bits its own (router_row_scores) */
    real* Gk = hard ? mallocCheck(sizeof(real) * (size_t)n * K) : NULL;
    real* Gq = hard && m->router.wq ? mallocCheck(sizeof(real) * (size_t)n * K) : NULL;
    if (hard && n == 1) { /* a decode step: no threads to wake (kernels/cpu.h) */
        router_groups_rows(m, l, h, Gk, Gq, 0, 1);
    } else if (hard) {
#pragma omp parallel
        {
            const int nt = omp_get_num_threads(), id = omp_get_thread_num();
            router_groups_rows(m, l, h, Gk, Gq, (int)((long)n * id / nt),
                               (int)((long)n * (id + 1) / nt));
        }
    }
    /* in order: each row joins its groups (a cache's group lists grow row by row); a sink
     * position (n < sinks) joins every group, so every later query keeps it */
    for (int i = 0; i < n && grouped; i++) {
        mi[i] = token_mask(m, l, pos[i], hard ? Gk + (size_t)i * K : NULL, 1);
        token_join(cs[i], m, l, pos[i], mi[i]);
        if (Gq) mi[i] = token_mask(m, l, pos[i], Gq + (size_t)i * K, 0);
    }
    free(Gk), free(Gq);
    profile_tick(r->prof, r->mark, PART_SELECT);
    if (!r->per_row && kind == KEYS_BLOCKS) {
        cs[0]->pairs += blocks_prompt_rows(m, l, cs[0], pos[0], n, qkv, mi, att, r);
        free(mi);
        return;
    }
    if (!r->per_row && kind == KEYS_GROUPS) {
        /* a prompt's rows (one cache): the window tiled over the cache, then each row's groups'
         * earlier tokens, a list tile gathered once for the rows in the group (kernels/sparse.c);
         * each row's bits whatever rows are beside it */
        KVCache* c = cs[0];
        const CachedKV kv = layer_kv(c, l, NKV, hs);
        real* lse = mallocCheck(sizeof(real) * (size_t)n * NH);
        attention_cached_forward(att, A, lse, qkv, Q, pos[0], n, &kv, f->w, 0, NH, NKV, hs);
        profile_tick(r->prof, r->mark, PART_BAND);
        long pairs = 0;
        for (int i = 0; i < n; i++) {
            const int lo = pos[i] - f->w < 0 ? 0 : pos[i] - f->w;
            pairs += (long)(pos[i] + 1 - lo) * NH;
        }
        const CachedKV runs = layer_runs(c, l);
        const GroupLists gl = layer_lists(c, l, &runs);
        pairs += attention_cached_groups(att, A, lse, qkv, Q, pos[0], n, &kv, f->w, mi,
                                         c->mask + (size_t)l * c->cap, &gl, NULL, NH, NKV, hs);
        profile_tick(r->prof, r->mark, PART_DISTANT);
        c->pairs += pairs;
        free(lse);
        free(mi);
        return;
    }
    if (r->per_row) { /* decode: each row's cache's own scratch, the rows one after another */
        for (int i = 0; i < n; i++) {
            KVCache* c = cs[i];
            RowWork w = {s->kl,   s->nkg, c->keys, c->bkeys, c->scores, c->part,
                         s->bsel, s->bsc, s->bp,   s->npre,  s->rlo,    s->rhi};
            c->pairs += row_attend(m, l, step_keys(c, m, l), c, pos[i], mi[i], qkv + (size_t)i * Q,
                                   att + (size_t)i * A, &w, r->prof, r->mark);
        }
        free(mi);
        return;
    }
    /* a prompt's rows (one cache): in parallel, each thread with its own scratch (a row's parts
     * then run on its thread: the same arithmetic) */
    KVCache* c = cs[0];
    const int nbmax = kvcache_block_cap(c->cap, f->block);
    long pairs = 0;
#pragma omp parallel reduction(+ : pairs)
    {
        RowWork w = {mallocCheck(sizeof(int*) * (size_t)NKV),
                     mallocCheck(sizeof(int) * (size_t)NKV),
                     mallocCheck(sizeof(int) * (size_t)c->cap),
                     kind == KEYS_BLOCKS ? mallocCheck(sizeof(int) * (size_t)NKV * c->cap) : NULL,
                     mallocCheck(sizeof(real) * (size_t)NH * c->cap),
                     mallocCheck(sizeof(real) * (size_t)(c->nparts + 1) * NH * (hs + 2)),
                     mallocCheck(sizeof(int) * (size_t)NKV * nbmax),
                     mallocCheck(sizeof(real) * (size_t)NKV * nbmax),
                     mallocCheck(sizeof(real) * (size_t)NH * nbmax),
                     mallocCheck(sizeof(int) * (size_t)NKV),
                     mallocCheck(sizeof(int) * (size_t)NKV),
                     mallocCheck(sizeof(int) * (size_t)NKV)};
#pragma omp for schedule(dynamic, 4)
        for (int i = 0; i < n; i++)
            pairs += row_attend(m, l, kind, c, pos[i], mi[i], qkv + (size_t)i * Q,
                                att + (size_t)i * A, &w, NULL, NULL);
        free(w.kl), free(w.nkg), free(w.keys), free(w.bkeys), free(w.scores), free(w.part);
        free(w.bsel), free(w.bsc), free(w.bp), free(w.npre), free(w.rlo), free(w.rhi);
    }
    c->pairs += pairs;
    free(mi);
}
