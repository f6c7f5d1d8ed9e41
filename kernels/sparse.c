/* sparse.c: flash-style dense attention and the hard top-k executor (see sparse.h). */
#include "sparse.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include <omp.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "cpu.h"
#include "quant.h"
#include "tile.h"

#define BQ 64
#define BK 256
/* the key tiles of a band over the cache (attention_cached_forward) */
#define BW 128

/* Attention of the query rows [i0, i1) of one head over a sequence stored with row strides ldq /
 * ldk / ldv (keys and values of the same positions), with an online softmax over key tiles. Query
 * i keeps the keys j <= i that are
 *   - all of them when w < 0 (causal dense), or
 *   - its band when w >= 0: i - j <= w, or j < sinks (attention sinks);
 * less the pairs with (qm[i] & km[j] & skip) != 0 (qm, km: the rows' and the keys' masks, or both
 * NULL): the executor's lowest-shared-group de-duplication inside a group (skip = the lower
 * groups' bits), or in the band the keys that a shared group already covers (skip = ~0). Each key
 * range is walked in tiles of BK keys, so a band costs about (w + BQ) keys per query whatever w is.
 * o rows have stride ldo, lse entries stride ldl (a row that keeps no key gets o = 0, lse = -inf).
 * S, acc: scratch of BQ x BK and BQ x hs floats. */
static void flash_span(real* o, int ldo, real* lse, int ldl, const real* q, int ldq, const real* k,
                       int ldk, const real* v, int ldv, int i0, int i1, int hs, real scale,
                       const uint32_t* qm, const uint32_t* km, uint32_t skip, int w, int sinks,
                       real* S, real* acc) {
    int nq = i1 - i0;
    real m[BQ], l[BQ];
    for (int r = 0; r < nq; r++) m[r] = -INFINITY, l[r] = 0;
    memset(acc, 0, sizeof(real) * nq * hs);
    /* the key ranges: [0, i1) for dense; the sinks [0, s) and the band [max(s, i0 - w), i1) */
    int lo_key[2], hi_key[2], nr = 0;
    if (w < 0) {
        lo_key[0] = 0, hi_key[0] = i1, nr = 1;
    } else {
        const int s = sinks < i1 ? sinks : i1, b0 = i0 - w > s ? i0 - w : s;
        if (s > 0) lo_key[nr] = 0, hi_key[nr++] = s;
        if (b0 < i1) lo_key[nr] = b0, hi_key[nr++] = i1;
    }
    for (int rg = 0; rg < nr; rg++)
        for (int j0 = lo_key[rg]; j0 < hi_key[rg]; j0 += BK) {
            const int nk = hi_key[rg] - j0 < BK ? hi_key[rg] - j0 : BK;
            const int in_sinks = w >= 0 && j0 + nk <= sinks; /* a tile of sinks: no band limit */
            gemm(0, 1, nq, nk, hs, scale, q + (size_t)i0 * ldq, ldq, k + (size_t)j0 * ldk, ldk, 0,
                 S, BK);
            for (int r = 0; r < nq; r++) {
                real* s = S + (size_t)r * BK;
                const int i = i0 + r;
                /* the row's keys in this tile: [lo, hi) */
                const int hi = i - j0 + 1 < nk ? i - j0 + 1 : nk;
                const int lo = w < 0 || in_sinks ? 0 : (i - w - j0 > 0 ? i - w - j0 : 0);
                if (hi <= lo) {
                    for (int c = 0; c < nk; c++) s[c] = 0;
                    continue;
                }
                if (qm && skip) {
                    const uint32_t mi = qm[i] & skip;
                    if (mi)
                        for (int c = lo; c < hi; c++)
                            if (mi & km[j0 + c]) s[c] = -INFINITY;
                }
                real mx = m[r];
                for (int c = lo; c < hi; c++) mx = s[c] > mx ? s[c] : mx;
                if (mx == -INFINITY) {
                    for (int c = 0; c < nk; c++) s[c] = 0;
                    continue;
                }
                const real alpha = exp_f(m[r] - mx);
                real sum = 0;
                for (int c = 0; c < lo; c++) s[c] = 0;
#pragma omp simd reduction(+ : sum)
                for (int c = lo; c < hi; c++) {
                    s[c] = exp_f(s[c] - mx);
                    sum += s[c];
                }
                for (int c = hi; c < nk; c++) s[c] = 0;
                l[r] = l[r] * alpha + sum;
                m[r] = mx;
                if (alpha != 1) {
                    real* a = acc + (size_t)r * hs;
                    for (int e = 0; e < hs; e++) a[e] *= alpha;
                }
            }
            gemm(0, 0, nq, hs, nk, 1, S, BK, v + (size_t)j0 * ldv, ldv, 1, acc, hs);
        }
    for (int r = 0; r < nq; r++) {
        real inv = l[r] > 0 ? 1 / l[r] : 0;
        real* out = o + (size_t)(i0 + r) * ldo;
        for (int e = 0; e < hs; e++) out[e] = acc[(size_t)r * hs + e] * inv;
        lse[(size_t)(i0 + r) * ldl] = l[r] > 0 ? m[r] + logf(l[r]) : -INFINITY;
    }
}

/* One call of flash_span for every (sequence, head, query block) task, threads over the tasks
 * (the longest blocks first). out (B, T, NH hs), lse (B, NH, T); qm, km (B, T) or NULL. */
static void flash_all(real* out, real* lse, const real* qkv, const uint32_t* qm, const uint32_t* km,
                      uint32_t skip, int w, int sinks, int B, int T, int NH, int NKV, int hs) {
    const int C = NH * hs, QKV = (NH + 2 * NKV) * hs, rep = NH / NKV, nblk = (T + BQ - 1) / BQ;
    const real scale = (real)(1.0 / sqrt((double)hs));
#pragma omp parallel
    {
        real* S = mallocCheck(sizeof(real) * BQ * BK);
        real* acc = mallocCheck(sizeof(real) * BQ * hs);
#pragma omp for schedule(dynamic, 1)
        for (long task = 0; task < (long)B * NH * nblk; task++) {
            int blk = nblk - 1 - (int)(task % nblk), h = (int)(task / nblk % NH),
                b = (int)(task / nblk / NH);
            const real* base = qkv + (size_t)b * T * QKV;
            int kvh = h / rep, i0 = blk * BQ, i1 = i0 + BQ < T ? i0 + BQ : T;
            flash_span(out + (size_t)b * T * C + h * hs, C, lse + ((size_t)b * NH + h) * T, 1,
                       base + h * hs, QKV, base + C + kvh * hs, QKV, base + C + NKV * hs + kvh * hs,
                       QKV, i0, i1, hs, scale, qm ? qm + (size_t)b * T : NULL,
                       km ? km + (size_t)b * T : NULL, skip, w, sinks, S, acc);
        }
        free(S);
        free(acc);
    }
}

/* A row of a BLAS product can get other bits in a product of another row count (OpenBLAS picks
 * other kernels for small ones: measured), never in one of the same count: every product of the
 * cached rows has CQ rows, zeros below a short block's. 32 rows, not 64: a server evaluates a
 * prompt in chunks of a few tenths of a second, at 8K tokens of depth 64 rows took 0.6 s. */
#define CQ 32

/* rows of head g of a cache's keys (vals 0) or values (1) into t (rows, hs): row c from
 * position pos[c] (pos NULL: j0 + c), zeros from cnt on */
static void cached_rows(real* t, const CachedKV* kv, int vals, int g, int hs, const int* pos,
                        int j0, int cnt, int rows) {
    const void* src = vals ? kv->v : kv->k;
    const int half = kv->half;
    for (int c = 0; c < rows; c++) {
        real* row = t + (size_t)c * hs;
        if (c >= cnt) {
            memset(row, 0, sizeof(real) * hs);
            continue;
        }
        const size_t at = ((size_t)g * kv->cap + (size_t)(pos ? pos[c] : j0 + c)) * hs;
        if (half) {
#ifdef FOCUS_DOUBLE
            for (int e = 0; e < hs; e++) row[e] = f16_to_f32(((const uint16_t*)src)[at + e]);
#else
            f16_row_get(row, (const uint16_t*)src + at, hs);
#endif
        } else {
            memcpy(row, (const real*)src + at, sizeof(real) * hs);
        }
    }
}

/* The largest of s[c0 .. c1) and *mx into *mx (a vector max: the same value as any order). */
static inline void keep_range(const real* s, int c0, int c1, real* mx) {
    real mt = *mx;
#pragma omp simd reduction(max : mt)
    for (int c = c0; c < c1; c++) mt = s[c] > mt ? s[c] : mt;
    *mx = mt;
}

void attention_cached_forward(real* out, int ldo, real* lse, const real* q, int ldq, int p0, int n,
                              const CachedKV* kv, int w, int sinks, int NH, int NKV, int hs) {
    const int rep = NH / NKV, nblk = (n + CQ - 1) / CQ, have = p0 + n;
    const int mq = rep * CQ; /* the rep query heads of a key/value head stacked: one product */
    const real scale = (real)(1.0 / sqrt((double)hs));
#pragma omp parallel
    {
        real* S = mallocCheck(sizeof(real) * (size_t)mq * BK);
        real* acc = mallocCheck(sizeof(real) * (size_t)mq * hs);
        real* kt = mallocCheck(sizeof(real) * BK * hs);
        real* bt = mallocCheck(sizeof(real) * BK * hs);
        int* used = mallocCheck(sizeof(int) * (size_t)mq);
        int* cab = mallocCheck(sizeof(int) * 2 * CQ);
        real* vt = mallocCheck(sizeof(real) * BK * hs);
        real* qs = mallocCheck(sizeof(real) * (size_t)mq * hs);
        real* m = mallocCheck(sizeof(real) * (size_t)mq);
        real* l = mallocCheck(sizeof(real) * (size_t)mq);
#pragma omp for schedule(dynamic, 1)
        for (long task = 0; task < (long)NKV * nblk; task++) {
            const int blk = nblk - 1 - (int)(task % nblk), g = (int)(task / nblk);
            const int r0 = blk * CQ, nq = n - r0 < CQ ? n - r0 : CQ, i0 = p0 + r0, i1 = i0 + nq;
            /* row R = hr CQ + r: query head g rep + hr of row r0 + r (zeros past nq) */
            memset(qs, 0, sizeof(real) * (size_t)mq * hs);
            for (int hr = 0; hr < rep; hr++)
                for (int r = 0; r < nq; r++)
                    memcpy(qs + ((size_t)hr * CQ + r) * hs,
                           q + (size_t)(r0 + r) * ldq + (size_t)(g * rep + hr) * hs,
                           sizeof(real) * hs);
            for (int R = 0; R < mq; R++) m[R] = -INFINITY, l[R] = 0;
            memset(acc, 0, sizeof(real) * (size_t)mq * hs);
            const int band_lo = w < 0 || i0 - w < 0 ? 0 : i0 - w; /* the block's lowest band key */
            /* key tiles at fixed positions (a row's tiles, and so its bits, whatever rows are
             * beside it): dense, BK keys from 0; a band, the sinks [0, ns) in a tile of their
             * own, then BW keys from ns on */
            const int ns = w < 0 ? 0 : sinks, bk = w < 0 ? BK : BW;
            for (int j0 = 0, nk; j0 < i1; j0 += nk) {
                nk = j0 < ns ? (ns - j0 < BK ? ns - j0 : BK) : bk;
                if (j0 >= ns && j0 + nk <= band_lo) { /* no key of any row: on to the band */
                    nk = (band_lo - j0) / bk * bk;
                    continue;
                }
                const int sink_tile = j0 < ns;
                const int cnt = have - j0 < 0 ? 0 : have - j0 > nk ? nk : have - j0;
                /* the row's keys in the tile: [ca, cb) (every key up to the row's in dense and
                 * sink tiles, its band's in the others); only the rows with keys here */
                int nu = 0;
                for (int r = 0; r < nq; r++) {
                    const int i = i0 + r;
                    cab[2 * r + 1] = i - j0 + 1 < nk ? i - j0 + 1 : nk;
                    cab[2 * r] = w < 0 || sink_tile || i - w <= j0 ? 0
                                 : i - w - j0 < nk                 ? i - w - j0
                                                                   : nk;
                }
                int cs = nk, ce = 0; /* the keys any row keeps, [cs, ce) in 16s */
                for (int R = 0; R < mq; R++)
                    if (R % CQ < nq && cab[2 * (R % CQ) + 1] > cab[2 * (R % CQ)]) {
                        const int r = R % CQ;
                        used[nu++] = R;
                        cs = cab[2 * r] < cs ? cab[2 * r] : cs;
                        ce = cab[2 * r + 1] > ce ? cab[2 * r + 1] : ce;
                    }
                if (!nu) continue;
                /* only the tile's columns [cs, ce) in 16s, the keys its rows keep (the diagonal's
                 * tile and the band's first are cut to them): each product element is its own
                 * chain from zero, so the cut changes none. A tile of fewer than 16 keys (the
                 * sinks') is widened to 16 with zero keys and values, for vector products; its
                 * rows keep only its keys. */
                cs = cs / 16 * 16, ce = (ce + 15) / 16 * 16 < nk ? (ce + 15) / 16 * 16 : nk;
                ce = ce < 16 ? 16 : ce;
                const int ne = ce - cs;
                cached_rows(kt + (size_t)cs * hs, kv, 0, g, hs, NULL, j0 + cs, cnt - cs, ne);
                cached_rows(vt + (size_t)cs * hs, kv, 1, g, hs, NULL, j0 + cs, cnt - cs, ne);
                tile_abt(S + cs, BK, qs, hs, kt + (size_t)cs * hs, hs, mq, ne, hs, scale, used, nu,
                         bt);
                for (int u = 0; u < nu; u++) {
                    const int R = used[u], r = R % CQ;
                    real* s = S + (size_t)R * BK;
                    const int ca = cab[2 * r], cb = cab[2 * r + 1];
                    real mx = m[R];
                    keep_range(s, ca, cb, &mx);
                    const real alpha = exp_f(m[R] - mx);
                    /* the exponentials over [va, vb), the row's keys widened to 16s (whole
                     * vectors, no scalar tail), zeros outside its keys: the row's sum the same
                     * whatever rows are beside it */
                    const int va = ca / 16 * 16,
                              vb = (cb + 15) / 16 * 16 < ce ? (cb + 15) / 16 * 16 : ce;
                    real sum = 0;
                    for (int c = cs; c < va; c++) s[c] = 0;
#pragma omp simd reduction(+ : sum)
                    for (int c = va; c < vb; c++) {
                        const real e = exp_f(s[c] - mx);
                        s[c] = c >= ca && c < cb ? e : 0;
                        sum += s[c];
                    }
                    for (int c = vb; c < ce; c++) s[c] = 0;
                    l[R] = l[R] * alpha + sum;
                    m[R] = mx;
                    if (alpha != 1) {
                        real* a = acc + (size_t)R * hs;
                        for (int e = 0; e < hs; e++) a[e] *= alpha;
                    }
                }
                tile_ab(acc, hs, S + cs, BK, vt + (size_t)cs * hs, hs, mq, hs, ne, 1, used, nu);
            }
            for (int hr = 0; hr < rep; hr++)
                for (int r = 0; r < nq; r++) {
                    const int R = hr * CQ + r, h = g * rep + hr;
                    const real inv = l[R] > 0 ? 1 / l[R] : 0;
                    real* o = out + (size_t)(r0 + r) * ldo + h * hs;
                    for (int e = 0; e < hs; e++) o[e] = acc[(size_t)R * hs + e] * inv;
                    if (lse)
                        lse[(size_t)(r0 + r) * NH + h] =
                            l[R] > 0 ? m[R] + (real)log((double)l[R]) : -INFINITY;
                }
        }
        free(S), free(acc), free(kt), free(vt), free(qs), free(m), free(l), free(bt), free(used);
        free(cab);
    }
}

/* A thread's state for the distant keys of one 32-row tile and key/value head, added to the
 * rows' band (attention_cached_blocks, _groups): row R = hr CQ + r is query head g rep + hr of
 * row r0 + r (the rep heads stacked, as attention_cached_forward), with its online softmax (m,
 * l, acc) started from the band's (lse, 1, out); key tiles of up to ne keys, each row merging only
 * the keys [ca[r], cb[r]) of the tile (use[r]: any), and of those with `masked` only the ones
 * ok[r ne + c] marks. */
typedef struct {
    int rep, mq, ne, hs, nq, r0, g, masked;
    const int* rows; /* the tile's rows (NULL: r0 .. r0 + nq - 1) */
    real *S, *pv, *kt, *vt, *qs, *m, *l, *acc, *alpha, *bt;
    unsigned char *ok, *use;
    int *ca, *cb, *used;
} Stacked;

/* row r of the tile */
static inline int stacked_row(const Stacked* t, int r) { return t->rows ? t->rows[r] : t->r0 + r; }

static Stacked stacked_new(int rep, int ne, int hs) {
    const int mq = rep * CQ;
    Stacked t = {.rep = rep, .mq = mq, .ne = ne, .hs = hs};
    t.S = mallocCheck(sizeof(real) * (size_t)mq * ne);
    t.pv = mallocCheck(sizeof(real) * (size_t)mq * hs);
    t.kt = mallocCheck(sizeof(real) * (size_t)ne * hs);
    t.vt = mallocCheck(sizeof(real) * (size_t)ne * hs);
    t.qs = mallocCheck(sizeof(real) * (size_t)mq * hs);
    t.m = mallocCheck(sizeof(real) * (size_t)mq);
    t.l = mallocCheck(sizeof(real) * (size_t)mq);
    t.acc = mallocCheck(sizeof(real) * (size_t)mq * hs);
    t.alpha = mallocCheck(sizeof(real) * (size_t)mq);
    t.ok = mallocCheck((size_t)CQ * ne);
    t.use = mallocCheck(CQ);
    t.ca = mallocCheck(sizeof(int) * CQ);
    t.cb = mallocCheck(sizeof(int) * CQ);
    t.bt = mallocCheck(sizeof(real) * (size_t)ne * hs);
    t.used = mallocCheck(sizeof(int) * (size_t)mq);
    return t;
}

static void stacked_free(Stacked* t) {
    free(t->S), free(t->pv), free(t->kt), free(t->vt), free(t->qs), free(t->m), free(t->l);
    free(t->acc), free(t->alpha), free(t->ok), free(t->use), free(t->ca), free(t->cb);
    free(t->bt), free(t->used);
}

/* the tile of rows r0 .. r0 + nq - 1 and key/value head g: queries stacked, the band's state */
static void stacked_start(Stacked* t, const real* out, int ldo, const real* lse, const real* q,
                          int ldq, int r0, const int* rows, int nq, int g, int NH) {
    const int hs = t->hs;
    t->r0 = r0, t->rows = rows, t->nq = nq, t->g = g;
    memset(t->qs, 0, sizeof(real) * (size_t)t->mq * hs);
    for (int hr = 0; hr < t->rep; hr++)
        for (int r = 0; r < nq; r++) {
            const int R = hr * CQ + r, h = g * t->rep + hr, row = stacked_row(t, r);
            memcpy(t->qs + (size_t)R * hs, q + (size_t)row * ldq + (size_t)h * hs,
                   sizeof(real) * hs);
            t->m[R] = lse[(size_t)row * NH + h];
            t->l[R] = t->m[R] == -INFINITY ? 0 : 1;
            memcpy(t->acc + (size_t)R * hs, out + (size_t)row * ldo + (size_t)h * hs,
                   sizeof(real) * hs);
        }
}

/* the key tile in t->kt, t->vt into the rows that use it (t->use, ca, cb and with t->masked
 * t->ok filled): the products of those rows only (tile.h: a row's bits do not depend on the rows
 * beside it). */
static void stacked_merge(Stacked* t, real scale) {
    const int mq = t->mq, ne = t->ne, hs = t->hs;
    int nu = 0; /* the products for the rows that use the tile only */
    for (int R = 0; R < mq; R++)
        if (R % CQ < t->nq && t->use[R % CQ]) t->used[nu++] = R;
    tile_abt(t->S, ne, t->qs, hs, t->kt, hs, mq, ne, hs, scale, t->used, nu, t->bt);
    for (int u = 0; u < nu; u++) {
        const int R = t->used[u], r = R % CQ;
        real* s = t->S + (size_t)R * ne;
        const int ca = t->ca[r], cb = t->cb[r];
        for (int c = 0; c < ca; c++) s[c] = -INFINITY;
        for (int c = cb; c < ne; c++) s[c] = -INFINITY;
        if (t->masked) {
            const unsigned char* o = t->ok + (size_t)r * ne;
            for (int c = ca; c < cb; c++) s[c] = o[c] ? s[c] : -INFINITY;
        }
        real mx = t->m[R];
        keep_range(s, ca, cb, &mx);
        const real alpha = t->m[R] == -INFINITY ? 0 : exp_f(t->m[R] - mx);
        real sum = 0; /* (mx is finite: a row here keeps a key; exp_f(-inf) = 0) */
#pragma omp simd reduction(+ : sum)
        for (int c = 0; c < ne; c++) {
            s[c] = exp_f(s[c] - mx);
            sum += s[c];
        }
        t->l[R] = t->l[R] * alpha + sum;
        t->m[R] = mx;
        t->alpha[R] = alpha;
    }
    tile_ab(t->pv, hs, t->S, ne, t->vt, hs, mq, hs, ne, 0, t->used, nu);
    for (int u = 0; u < nu; u++) {
        const int R = t->used[u];
        real* a = t->acc + (size_t)R * hs;
        const real* pr = t->pv + (size_t)R * hs;
        const real alpha = t->alpha[R];
        for (int e = 0; e < hs; e++) a[e] = a[e] * alpha + pr[e];
    }
}

/* the tile's rows into out and lse */
static void stacked_finish(const Stacked* t, real* out, int ldo, real* lse, int NH) {
    const int hs = t->hs;
    for (int hr = 0; hr < t->rep; hr++)
        for (int r = 0; r < t->nq; r++) {
            const int R = hr * CQ + r, h = t->g * t->rep + hr, row = stacked_row(t, r);
            const real lr = t->l[R], inv = lr > 0 ? 1 / lr : 0;
            real* o = out + (size_t)row * ldo + (size_t)h * hs;
            const real* a = t->acc + (size_t)R * hs;
            for (int e = 0; e < hs; e++) o[e] = a[e] * inv;
            lse[(size_t)row * NH + h] = lr > 0 ? t->m[R] + (real)log((double)lr) : -INFINITY;
        }
}

void attention_cached_blocks(real* out, int ldo, real* lse, const real* q, int ldq, int p0, int n,
                             const CachedKV* kv, int w, int sinks, int bs, const int* sel,
                             const int* nsel, int nbmax, int NH, int NKV, int hs) {
    const int rep = NH / NKV, nblk = (n + CQ - 1) / CQ;
    const real scale = (real)(1.0 / sqrt((double)hs));
#pragma omp parallel
    {
        Stacked t = stacked_new(rep, bs, hs);    /* key ranges, no mask */
        int* at = mallocCheck(sizeof(int) * CQ); /* each row's next entry in its sorted list */
#pragma omp for schedule(dynamic, 1)
        for (long task = 0; task < (long)NKV * nblk; task++) {
            const int blk = nblk - 1 - (int)(task % nblk), g = (int)(task / nblk);
            const int r0 = blk * CQ, nq = n - r0 < CQ ? n - r0 : CQ;
            int any = 0;
            for (int r = 0; r < nq; r++) {
                at[r] = 0;
                any |= nsel[(size_t)(r0 + r) * NKV + g] > 0;
            }
            if (!any) continue;
            stacked_start(&t, out, ldo, lse, q, ldq, r0, NULL, nq, g, NH);
            /* the rows' blocks in ascending order: each block once for the rows that chose it */
            for (;;) {
                int b = -1;
                for (int r = 0; r < nq; r++) {
                    const size_t rg = (size_t)(r0 + r) * NKV + g;
                    if (at[r] < nsel[rg]) {
                        const int cand = sel[rg * nbmax + at[r]];
                        b = b < 0 || cand < b ? cand : b;
                    }
                }
                if (b < 0) break;
                for (int r = 0; r < nq; r++) {
                    const size_t rg = (size_t)(r0 + r) * NKV + g;
                    t.use[r] = at[r] < nsel[rg] && sel[rg * nbmax + at[r]] == b;
                    at[r] += t.use[r];
                    /* the block's distant keys for this row: past the sinks, before its band */
                    const int i = p0 + r0 + r, lo = b * bs > sinks ? b * bs : sinks;
                    const int hi = (b + 1) * bs < i - w ? (b + 1) * bs : i - w;
                    t.ca[r] = lo - b * bs, t.cb[r] = hi - b * bs;
                    t.use[r] &= t.cb[r] > t.ca[r];
                }
                /* (rows past the cached ones, p0 + n on, are zeros: no row keeps them) */
                const int cnt = p0 + n - b * bs < bs ? p0 + n - b * bs : bs;
                cached_rows(t.kt, kv, 0, g, hs, NULL, b * bs, cnt, bs);
                cached_rows(t.vt, kv, 1, g, hs, NULL, b * bs, cnt, bs);
                stacked_merge(&t, scale);
            }
            stacked_finish(&t, out, ldo, lse, NH);
        }
        stacked_free(&t);
        free(at);
    }
}

/* the entries of a group's list in one tile */
#define ET 64

long attention_cached_groups(real* out, int ldo, real* lse, const real* q, int ldq, int p0, int n,
                             const CachedKV* kv, int w, const uint32_t* rmask,
                             const uint32_t* cmask, const GroupLists* gl,
                             const ChosenBlocks* chosen, int NH, int NKV, int hs) {
    const int rep = NH / NKV, K = gl->K, cap = gl->cap;
    const int *gpos = gl->gpos, *gn = gl->gn;
    const real scale = (real)(1.0 / sqrt((double)hs));
    /* each group's rows (ascending) that have keys before their window: the tiles are made of the
     * rows of one group, so that a tile's product serves each of its rows */
    int* cnt = callocCheck((size_t)K + 1, sizeof(int));
    for (int r = 0; r < n; r++)
        for (int grp = 0; grp < K && p0 + r - w > 0; grp++) cnt[grp + 1] += (rmask[r] >> grp) & 1;
    for (int grp = 0; grp < K; grp++) cnt[grp + 1] += cnt[grp];
    int* rows = mallocCheck(sizeof(int) * (size_t)(cnt[K] > 0 ? cnt[K] : 1));
    int* fill = mallocCheck(sizeof(int) * (size_t)K);
    memcpy(fill, cnt, sizeof(int) * (size_t)K);
    for (int r = 0; r < n; r++)
        for (int grp = 0; grp < K && p0 + r - w > 0; grp++)
            if ((rmask[r] >> grp) & 1) rows[fill[grp]++] = r;
    free(fill);
    long pairs = 0;
    const int nbyte = chosen ? (chosen->nbmax + 7) / 8 : 0; /* a row's chosen blocks as bits */
#pragma omp parallel reduction(+ : pairs)
    {
        Stacked t = stacked_new(rep, ET, hs);
        uint32_t em[ET];
        int eb[ET];
        unsigned char* bits = chosen ? mallocCheck((size_t)CQ * nbyte) : NULL;
        /* the groups one after another (a row in two merges the lower first, as decoding) */
        for (int grp = 0; grp < K; grp++) {
            const int nr = cnt[grp + 1] - cnt[grp], ntile = (nr + CQ - 1) / CQ;
            const int* gp = gpos + (size_t)grp * cap;
            const uint32_t lower = (1u << grp) - 1;
#pragma omp for schedule(dynamic, 1)
            for (long task = 0; task < (long)ntile * NKV; task++) {
                const int tile = ntile - 1 - (int)(task / NKV), g = (int)(task % NKV);
                const int* tr = rows + cnt[grp] + tile * CQ;
                const int nq = nr - tile * CQ < CQ ? nr - tile * CQ : CQ;
                const int far = p0 + tr[nq - 1] - w; /* entries before it may be kept */
                int len = 0;
                while (len < gn[grp] && gp[len] < far) len++;
                stacked_start(&t, out, ldo, lse, q, ldq, 0, tr, nq, g, NH);
                for (int r = 0; chosen && r < nq; r++) {
                    unsigned char* b = bits + (size_t)r * nbyte;
                    const size_t rg = (size_t)tr[r] * NKV + g;
                    memset(b, 0, (size_t)nbyte);
                    for (int x = 0; x < chosen->nsel[rg]; x++) {
                        const int c = chosen->sel[rg * chosen->nbmax + x];
                        b[c / 8] |= (unsigned char)(1u << (c % 8));
                    }
                }
                /* the list in tiles of ET entries counted from its start: a row keeps an entry
                 * before its window (a prefix of the tile: the list ascends), not in a lower
                 * group it shares (token_keys's keys) */
                for (int t0 = 0; t0 < len; t0 += ET) {
                    const int ce = len - t0 < ET ? len - t0 : ET;
                    int anyrow = 0;
                    t.masked = 0;
                    for (int r = 0; r < nq; r++) {
                        const int row = tr[r];
                        const uint32_t mr = rmask[row];
                        const int lo = p0 + row - w;
                        unsigned char* o = t.ok + (size_t)r * ET;
                        const unsigned char* b = chosen ? bits + (size_t)r * nbyte : NULL;
                        const int cb = first_at(gp + t0, ce, lo);
                        t.ca[r] = 0, t.cb[r] = cb;
                        memset(o, 1, (size_t)cb);
                        memset(o + cb, 0, (size_t)(ET - cb));
                        if (mr & lower || b) { /* the prefix's entries one by one */
                            for (int c = 0; c < ce && !t.masked; c++) {
                                /* (the first such row: each entry's mask, and its block, -1 for
                                 * a sink, once for the rows) */
                                const int j = gp[t0 + c];
                                em[c] = cmask[j] & lower;
                                eb[c] = chosen && j >= chosen->sinks ? j / chosen->bs : -1;
                            }
                            for (int c = 0; c < cb; c++)
                                /* (with blocks: not a sink, not in a chosen block) */
                                o[c] = !(em[c] & mr) &&
                                       !(b && (eb[c] < 0 || ((b[eb[c] / 8] >> (eb[c] % 8)) & 1)));
                            t.masked = 1;
                        }
                        int kept = 0;
                        for (int c = 0; c < cb; c++) kept += o[c];
                        t.use[r] = kept > 0;
                        pairs += (long)kept * rep;
                        anyrow |= t.use[r];
                    }
                    if (!anyrow) continue;
                    if (gl->runs) { /* the entries' rows in the group's runs */
                        const int* gi = gl->gidx + (size_t)grp * cap + t0;
                        cached_rows(t.kt, gl->runs, 0, g, hs, gi, 0, ce, ET);
                        cached_rows(t.vt, gl->runs, 1, g, hs, gi, 0, ce, ET);
                    } else {
                        cached_rows(t.kt, kv, 0, g, hs, gp + t0, 0, ce, ET);
                        cached_rows(t.vt, kv, 1, g, hs, gp + t0, 0, ce, ET);
                    }
                    stacked_merge(&t, scale);
                }
                stacked_finish(&t, out, ldo, lse, NH);
            }
        }
        stacked_free(&t);
        free(bits);
    }
    free(cnt), free(rows);
    return pairs;
}

void attention_flash_forward(real* out, real* lse, const real* qkv, int B, int T, int NH, int NKV,
                             int hs) {
    flash_all(out, lse, qkv, NULL, NULL, 0, -1, 0, B, T, NH, NKV, hs);
}

void attention_band_forward(real* out, real* lse, const real* qkv, int w, int sinks, int B, int T,
                            int NH, int NKV, int hs) {
    flash_all(out, lse, qkv, NULL, NULL, 0, w, sinks, B, T, NH, NKV, hs);
}

double hard_pair_count(const uint32_t* mask, int K, int w, int T) {
    /* set A: within each group c, pairs whose lowest shared group is c; set B: local pairs that
     * share no group. Counted exactly from the masks. */
    double a = 0, bcount = 0;
    for (int c = 0; c < K; c++) {
        double n = 0;
        for (int i = 0; i < T; i++) n += (mask[i] >> c) & 1;
        a += n * (n + 1) / 2;
    }
    for (int i = 0; i < T; i++)
        for (int j = i - w < 0 ? 0 : i - w; j <= i; j++) bcount += !(mask[i] & mask[j]);
    return a + bcount; /* with k > 1, set A counts a shared pair once per shared group: an upper
                          bound */
}

/* Merge partial results (o_p, l_p) into dst: o = sum e^{l_p - L} o_p, L = logsumexp l_p. */
static void merge_into(real* o, real* l, const real* op, real lp, int hs) {
    if (lp == -INFINITY) return;
    if (*l == -INFINITY) {
        memcpy(o, op, sizeof(real) * hs);
        *l = lp;
        return;
    }
    real mx = *l > lp ? *l : lp;
    real wa = expf(*l - mx), wb = expf(lp - mx), inv = 1 / (wa + wb);
    for (int e = 0; e < hs; e++) o[e] = (o[e] * wa + op[e] * wb) * inv;
    *l = mx + logf(wa + wb);
}

void attention_hard_forward(real* out, real* lse, const real* qkv, const uint32_t* qmask,
                            const uint32_t* kmask, int K, int w, int B, int T, int NH, int NKV,
                            int hs) {
    /* rows and keys with masks of their own (a router with a query projection): a group's
     * sequence holds its queries and its keys; a position that is only a query there is kept
     * from the keys by a bit no group uses (K <= 32 leaves bit 31 out of every lower-groups
     * mask), set in its key mask and in every query mask */
    const int own = qmask != kmask;
    const uint32_t OUT = 1u << 31;
    const int C = NH * hs, QKV = (NH + 2 * NKV) * hs, rep = NH / NKV;
    const real scale = (real)(1.0 / sqrt((double)hs));
    int* count = mallocCheck(sizeof(int) * (K + 1));
    int* start = mallocCheck(sizeof(int) * (K + 1));
    /* set B first, into out and lse: each query's band keys that share no group with it (a tiled
     * kernel, so a wide window runs at the dense kernel's speed per pair) */
    flash_all(out, lse, qkv, qmask, kmask, ~0u, w, 0, B, T, NH, NKV, hs);
    for (int b = 0; b < B; b++) {
        const uint32_t *qb = qmask + (size_t)b * T, *kb = kmask + (size_t)b * T;
        const real* base = qkv + (size_t)b * T * QKV;
        real* ob = out + (size_t)b * T * C;
        /* stable sort of token indices by group (a counting sort; a token with k groups appears k
         * times) */
        for (int c = 0; c <= K; c++) count[c] = 0;
        for (int i = 0; i < T; i++)
            for (int c = 0; c < K; c++) count[c] += ((qb[i] | kb[i]) >> c) & 1;
        start[0] = 0;
        for (int c = 0; c < K; c++) start[c + 1] = start[c] + count[c];
        int total = start[K];
        int* idx = mallocCheck(sizeof(int) * (total + 1));
        /* the masks each group's sequence is filtered by: one array when queries and keys share
         * their masks */
        uint32_t* gq = mallocCheck(sizeof(uint32_t) * (total + 1) * (own ? 2 : 1));
        uint32_t* gk = own ? gq + total + 1 : gq;
        {
            int* fill = mallocCheck(sizeof(int) * (K + 1));
            memcpy(fill, start, sizeof(int) * (K + 1));
            for (int i = 0; i < T; i++)
                for (int c = 0; c < K; c++) {
                    if (!(((qb[i] | kb[i]) >> c) & 1)) continue;
                    const uint32_t lower = (1u << c) - 1;
                    idx[fill[c]] = i;
                    gq[fill[c]] = own ? (qb[i] & lower) | OUT : qb[i];
                    if (own) gk[fill[c]] = (kb[i] & lower) | ((kb[i] >> c) & 1 ? 0 : OUT);
                    fill[c]++;
                }
            free(fill);
        }
        /* gathered q/k/v rows of every group, in group order */
        real* g = mallocCheck(sizeof(real) * ((size_t)total * QKV + 1));
#pragma omp parallel for
        for (int p = 0; p < total; p++)
            memcpy(g + (size_t)p * QKV, base + (size_t)idx[p] * QKV, sizeof(real) * QKV);
        real* oA = mallocCheck(sizeof(real) * ((size_t)total * C + 1));
        real* lA = mallocCheck(sizeof(real) * ((size_t)total * NH + 1));
        /* set A: causal attention inside each group; tasks over (group, head, query block) */
        int* tstart = mallocCheck(sizeof(int) * (K + 1));
        tstart[0] = 0;
        for (int c = 0; c < K; c++) tstart[c + 1] = tstart[c] + NH * ((count[c] + BQ - 1) / BQ);
#pragma omp parallel
        {
            real* S = mallocCheck(sizeof(real) * BQ * BK);
            real* acc = mallocCheck(sizeof(real) * BQ * hs);
#pragma omp for schedule(dynamic, 1)
            for (int task = 0; task < tstart[K]; task++) {
                int c = 0;
                while (task >= tstart[c + 1]) c++;
                int local = task - tstart[c], nb = (count[c] + BQ - 1) / BQ;
                int h = local / nb, blk = local % nb, kvh = h / rep;
                const real* gc = g + (size_t)start[c] * QKV;
                int i0 = blk * BQ, i1 = i0 + BQ < count[c] ? i0 + BQ : count[c];
                flash_span(oA + (size_t)start[c] * C + h * hs, C, lA + (size_t)start[c] * NH + h,
                           NH, gc + h * hs, QKV, gc + C + kvh * hs, QKV,
                           gc + C + NKV * hs + kvh * hs, QKV, i0, i1, hs, scale, gq + start[c],
                           gk + start[c], own ? ~0u : (1u << c) - 1, -1, 0, S, acc);
            }
            free(S);
            free(acc);
        }
        /* the merge of set B (already in out and lse) with the query's groups, per query */
#pragma omp parallel
        {
            int* pos = mallocCheck(sizeof(int) * (K + 1));
#pragma omp for schedule(static)
            for (int i = 0; i < T; i++) {
                /* where token i sits in each of its groups: binary search in the sorted lists */
                int np = 0;
                for (int c = 0; c < K; c++) {
                    if (!((qb[i] >> c) & 1)) continue;
                    int lo = start[c], hi = start[c + 1] - 1;
                    while (lo < hi) {
                        int mid = (lo + hi) / 2;
                        if (idx[mid] < i)
                            lo = mid + 1;
                        else
                            hi = mid;
                    }
                    pos[np++] = lo;
                }
                for (int h = 0; h < NH; h++) {
                    real* o = ob + (size_t)i * C + h * hs;
                    real* l = lse + ((size_t)b * NH + h) * T + i;
                    for (int q = 0; q < np; q++)
                        merge_into(o, l, oA + (size_t)pos[q] * C + h * hs,
                                   lA[(size_t)pos[q] * NH + h], hs);
                }
            }
            free(pos);
        }
        free(tstart);
        free(idx);
        free(gq);
        free(g);
        free(oA);
        free(lA);
    }
    free(count);
    free(start);
}

double band_pairs_kept(int i, int w, int sinks) {
    const int local = i < w ? i + 1 : w + 1, far_sinks = sinks < i - w ? sinks : i - w;
    return (double)local + (far_sinks > 0 ? far_sinks : 0);
}

double mask_pairs_kept(const uint32_t* qmask, const uint32_t* kmask, int T, int w, int sinks) {
    /* the distant keys are counted through the distinct masks seen so far (at most 1 + C(K, k)
     * of them for top-k routing), each with how many distant keys carry it: O(T x masks)
     * instead of O(T^2) */
    uint32_t* val = mallocCheck(sizeof(uint32_t) * (T + 1));
    long* cnt = mallocCheck(sizeof(long) * (T + 1));
    int nv = 0;
    double kept = 0;
    for (int i = 0; i < T; i++) {
        const int j = i - w - 1; /* the key that becomes distant for query i */
        if (j >= sinks) {
            int v = 0;
            while (v < nv && val[v] != kmask[j]) v++;
            if (v == nv) val[nv] = kmask[j], cnt[nv++] = 0;
            cnt[v]++;
        }
        kept += band_pairs_kept(i, w, sinks);
        for (int v = 0; v < nv; v++) kept += (val[v] & qmask[i]) ? (double)cnt[v] : 0;
    }
    free(val);
    free(cnt);
    return kept;
}

const char* block_score_name(BlockScore s) {
    static const char* names[] = {"Quest bounds", "mean-pooled keys", "oracle (dense mass)",
                                  "learned selector"};
    return names[s];
}

void blockgate_key_stats(real* st, const real* k, int ldk, int j0, int j1, int hs) {
    real *mean = st, *var = st + hs, *lo = st + 2 * hs, *hi = st + 3 * hs;
    const real n = (real)(j1 > j0 ? j1 - j0 : 1);
    for (int e = 0; e < hs; e++) mean[e] = 0, lo[e] = INFINITY, hi[e] = -INFINITY;
    for (int j = j0; j < j1; j++) {
        const real* kj = k + (size_t)j * ldk;
        for (int e = 0; e < hs; e++) {
            mean[e] += kj[e];
            lo[e] = kj[e] < lo[e] ? kj[e] : lo[e];
            hi[e] = kj[e] > hi[e] ? kj[e] : hi[e];
        }
    }
    for (int e = 0; e < hs; e++) mean[e] /= n, var[e] = 0;
    for (int j = j0; j < j1; j++) { /* two passes: no cancellation */
        const real* kj = k + (size_t)j * ldk;
        for (int e = 0; e < hs; e++) var[e] += (kj[e] - mean[e]) * (kj[e] - mean[e]);
    }
    for (int e = 0; e < hs; e++) var[e] /= n;
}

/* x (hs values) as bytes of its largest finite magnitude over 127 into b, each rounded to the
 * nearest, ties to even (1.5 2^23 added and taken away: lrintf's values in the default rounding
 * mode, vectorisable); non-finite values saturate, not-a-number is 0. Returns that scale, and the
 * bytes' sum in *sum. A block's statistics and a query's features are rounded alike. */
static float bytes_of(int8_t* b, const real* x, int hs, int32_t* sum) {
    float m = 0;
    for (int e = 0; e < hs; e++) {
        const float y = fabsf((float)x[e]);
        m = y > m && y <= FLT_MAX ? y : m;
    }
    const float inv = m > 0 ? 127.0f / m : 0, big = 12582912.0f;
    int32_t t = 0;
    for (int e = 0; e < hs; e++) {
        float y = (float)x[e] * inv; /* (inf times 0: not a number, then 0) */
        y = y != y ? 0 : y > 127 ? 127 : y < -127 ? -127 : y;
        b[e] = (int8_t)(int)((y + big) - big);
        t += b[e];
    }
    *sum = t;
    return m / 127.0f;
}

void blockgate_key_stats8(int8_t* st, const real* k, int ldk, int j0, int j1, int hs) {
    if (hs > BLOCKGATE_MAX_HS) fatal("block selector: head size %d above %d", hs, BLOCKGATE_MAX_HS);
    real s[BLOCKGATE_STATS(BLOCKGATE_MAX_HS)];
    blockgate_key_stats(s, k, ldk, j0, j1, hs);
    float scale[4];
    int32_t sum;
    for (int a = 0; a < 4; a++)
        scale[a] = bytes_of(st + sizeof scale + (size_t)a * hs, s + (size_t)a * hs, hs, &sum);
    memcpy(st, scale, sizeof scale);
}

void blockgate_features(real* f, const real* wgt, const real* q, int hs, real scale) {
    const real *a = wgt + 1, *b = a + hs, *g = b + hs;
#pragma omp simd
    for (int e = 0; e < hs; e++) { /* (selects of values made before: it vectorises) */
        const real x = scale * q[e], gx = g[e] * x;
        f[e] = a[e] * x, f[hs + e] = b[e] * x * x;
        /* max(x lo, x hi) = x lo for x < 0, else x hi (lo <= hi) */
        f[2 * hs + e] = x < 0 ? gx : 0;
        f[3 * hs + e] = x < 0 ? 0 : gx;
    }
}

/* f . st over n reals (a fit's statistics): two vector running sums (independent chains: one sum
 * would wait on each add), added in a fixed order. */
typedef real vreal __attribute__((vector_size(32)));
enum { VL = (int)(32 / sizeof(real)) };
static real feature_dot(const real* f, const real* st, int n) {
    vreal a[2];
    memset(a, 0, sizeof a);
    int e = 0;
    for (; e + 2 * VL <= n; e += 2 * VL)
        for (int k = 0; k < 2; k++) {
            vreal x, y;
            memcpy(&x, f + e + k * VL, sizeof x);
            memcpy(&y, st + e + k * VL, sizeof y);
            a[k] += x * y;
        }
    const vreal t = a[0] + a[1];
    real s = 0;
    for (int k = 0; k < VL; k++) s += t[k];
    for (int j = e; j < n; j++) s += f[j] * st[j];
    return s;
}

/* ---- the selection's products in integers: a query's features in bytes, as the statistics are
 * (each of the four with one scale, its largest finite magnitude over 127), so that a feature
 * row's product with a block's statistic is an exact sum of products of bytes, the same on every
 * instruction set and in any order. Per head and block, with I_a that product for statistic a and
 * t_a = (feature scale_a statistic scale_a) I_a in floats, the value is (t_0 + t_2) + (t_1 + t_3):
 * the same bits on every level (a statistic a head does not use has a feature scale of 0). */

/* One query head's features in bytes: per statistic a its scale (0: unused), its bytes at q
 * (hs from a hs; the caller's BLOCKGATE_STATS(hs)) and their sum (AVX-512 VNNI's offset; below) */
typedef struct {
    float scale[4];
    int32_t sum[4];
    int8_t* q;
} ByteFeatures;

/* Statistic a of the features f (hs each, in the statistics' order) into bf, rounded as the
 * statistics are (bytes_of) */
static void features_bytes_scalar(ByteFeatures* bf, const real* f, int a, int hs) {
    bf->scale[a] = bytes_of(bf->q + (size_t)a * hs, f + (size_t)a * hs, hs, &bf->sum[a]);
}

#if defined(__x86_64__) && !defined(FOCUS_DOUBLE)
/* the same at AVX2 (hs a multiple of 8) and AVX-512 (of 16): the maximum over finite
 * magnitudes, not-a-number to 0, the clamp, then the conversion's rounding to the nearest, ties
 * to even (the default mode) */
__attribute__((target("avx2"))) static void features_bytes_avx2(ByteFeatures* bf, const float* f,
                                                                int a, int hs) {
    const float* x = f + (size_t)a * hs;
    int8_t* q = bf->q + (size_t)a * hs;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 big = _mm256_set1_ps(FLT_MAX), hi = _mm256_set1_ps(127), lo = _mm256_set1_ps(-127);
    __m256 mv = _mm256_setzero_ps();
    for (int e = 0; e < hs; e += 8) {
        const __m256 y = _mm256_and_ps(_mm256_loadu_ps(x + e), absmask);
        mv = _mm256_max_ps(mv, _mm256_and_ps(y, _mm256_cmp_ps(y, big, _CMP_LE_OQ)));
    }
    float mx[8], m = 0;
    _mm256_storeu_ps(mx, mv);
    for (int k = 0; k < 8; k++) m = mx[k] > m ? mx[k] : m;
    const float inv = m > 0 ? 127.0f / m : 0;
    const __m256 iv = _mm256_set1_ps(inv);
    __m256i sv = _mm256_setzero_si256();
    for (int e = 0; e < hs; e += 8) {
        __m256 y = _mm256_mul_ps(_mm256_loadu_ps(x + e), iv);
        y = _mm256_and_ps(y, _mm256_cmp_ps(y, y, _CMP_ORD_Q));
        const __m256i b = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(y, lo), hi));
        const __m128i h =
            _mm_packs_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
        _mm_storel_epi64((__m128i*)(q + e), _mm_packs_epi16(h, h));
        sv = _mm256_add_epi32(sv, b);
    }
    int32_t s8[8], sum = 0;
    _mm256_storeu_si256((__m256i*)s8, sv);
    for (int k = 0; k < 8; k++) sum += s8[k];
    bf->scale[a] = m / 127.0f, bf->sum[a] = sum;
}
__attribute__((target("avx512f,avx512bw"))) static void features_bytes_avx512(ByteFeatures* bf,
                                                                              const float* f, int a,
                                                                              int hs) {
    const float* x = f + (size_t)a * hs;
    int8_t* q = bf->q + (size_t)a * hs;
    const __m512 big = _mm512_set1_ps(FLT_MAX), hi = _mm512_set1_ps(127), lo = _mm512_set1_ps(-127);
    __m512 mv = _mm512_setzero_ps();
    for (int e = 0; e < hs; e += 16) {
        const __m512 y = _mm512_abs_ps(_mm512_loadu_ps(x + e));
        mv = _mm512_mask_max_ps(mv, _mm512_cmp_ps_mask(y, big, _CMP_LE_OQ), mv, y);
    }
    const float m = _mm512_reduce_max_ps(mv), inv = m > 0 ? 127.0f / m : 0;
    const __m512 iv = _mm512_set1_ps(inv);
    __m512i sv = _mm512_setzero_si512();
    for (int e = 0; e < hs; e += 16) {
        __m512 y = _mm512_mul_ps(_mm512_loadu_ps(x + e), iv);
        y = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(y, y, _CMP_ORD_Q), y);
        const __m512i b = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(y, lo), hi));
        _mm_storeu_si128((__m128i*)(q + e), _mm512_cvtsepi32_epi8(b));
        sv = _mm512_add_epi32(sv, b);
    }
    bf->scale[a] = m / 127.0f, bf->sum[a] = _mm512_reduce_add_epi32(sv);
}
#endif

static void features_bytes(ByteFeatures* bf, const real* f, int a0, int na, int hs) {
    for (int a = 0; a < 4; a++) bf->scale[a] = 0, bf->sum[a] = 0;
#if defined(__x86_64__) && !defined(FOCUS_DOUBLE)
    const int isa = quant_isa();
    if (isa >= QUANT_ISA_AVX512_VNNI && hs % 16 == 0) {
        for (int a = a0; a < a0 + na; a++) features_bytes_avx512(bf, f, a, hs);
        return;
    }
    if (isa >= QUANT_ISA_AVX2 && hs % 8 == 0) {
        for (int a = a0; a < a0 + na; a++) features_bytes_avx2(bf, f, a, hs);
        return;
    }
#endif
    for (int a = a0; a < a0 + na; a++) features_bytes_scalar(bf, f, a, hs);
}

/* sum_e a_e b_e over n bytes, in integers */
static inline int32_t byte_dot(const int8_t* a, const int8_t* b, int n) {
    int32_t d = 0;
    for (int e = 0; e < n; e++) d += (int32_t)a[e] * b[e];
    return d;
}

/* (t_0 + t_2) + (t_1 + t_3) of head h against a block's statistics (blk: its scales first) from
 * its products I (I[a]) */
static inline float byte_value(const int32_t* I, const ByteFeatures* bf, const int8_t* blk) {
    float ss[4];
    volatile float t[4]; /* (a product never fused into the sum after it, as the vectors do) */
    memcpy(ss, blk, sizeof ss);
    for (int a = 0; a < 4; a++) t[a] = (bf->scale[a] * ss[a]) * (float)I[a];
    return (t[0] + t[2]) + (t[1] + t[3]);
}

/* The values of the nh <= 4 feature rows bf against the statistics a0 .. a0 + na - 1 of each
 * block c of [c0, c1) (st: from block 0) into out[4 (c - c0) + h]; (a0, na) one of (0, 4), (2,
 * 2), (0, 1). */
static void byte_products_scalar(float* out, const ByteFeatures* bf, int nh, const int8_t* st,
                                 int c0, int c1, int a0, int na, int hs) {
    for (int c = c0; c < c1; c++) {
        const int8_t* blk = st + (size_t)c * BLOCKGATE_STAT_BYTES(hs);
        const int8_t* s = blk + 4 * sizeof(float);
        for (int h = 0; h < nh; h++) {
            int32_t I[4] = {0, 0, 0, 0};
            for (int a = a0; a < a0 + na; a++)
                I[a] = byte_dot(bf[h].q + (size_t)a * hs, s + (size_t)a * hs, hs);
            out[4 * (c - c0) + h] = byte_value(I, &bf[h], blk);
        }
    }
}

#if defined(__x86_64__)
/* AVX2: 32 bytes at a time, q s as |q| (sign(q) s): pairs of at most 2 127 127 < 2^15 (no
 * saturation), widened to 32 bits by the pairs' sum; a tail past the last 32 bytes one by one.
 * Accumulator 4 h + a, heads two at a time: the sums of 8 lanes of the 8 accumulators of heads
 * 2 g, 2 g + 1 through a tree put accumulator 2 i + k at element 4 k + i, that is (head 2 g + i /
 * 2, statistic 2 (i % 2) + k). Whole when inlined with constant nh and na. */
__attribute__((target("avx2,fma"))) static inline __attribute__((always_inline)) void values8(
    float* out, const __m256i* v, __m256 fs, __m256 ss) {
    __m256i w[4], x[2];
    for (int i = 0; i < 4; i++)
        w[i] = _mm256_add_epi32(_mm256_permute2x128_si256(v[2 * i], v[2 * i + 1], 0x20),
                                _mm256_permute2x128_si256(v[2 * i], v[2 * i + 1], 0x31));
    for (int i = 0; i < 2; i++)
        x[i] = _mm256_add_epi32(_mm256_unpacklo_epi32(w[2 * i], w[2 * i + 1]),
                                _mm256_unpackhi_epi32(w[2 * i], w[2 * i + 1]));
    const __m256i r =
        _mm256_add_epi32(_mm256_unpacklo_epi64(x[0], x[1]), _mm256_unpackhi_epi64(x[0], x[1]));
    /* t: (head 2g, statistics 0 2), (2g + 1: 0 2), (2g: 1 3), (2g + 1: 1 3) */
    const __m256 t = _mm256_mul_ps(_mm256_mul_ps(fs, ss), _mm256_cvtepi32_ps(r));
    const __m256 u = _mm256_hadd_ps(t, t); /* t_0 + t_2 of each head, then t_1 + t_3 */
    const __m128 d = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
    out[0] = _mm_cvtss_f32(d), out[1] = _mm_cvtss_f32(_mm_shuffle_ps(d, d, 1));
}
__attribute__((target("avx2,fma"))) static inline __attribute__((always_inline)) void
byte_products_avx2_nh(float* out, const ByteFeatures* bf, const int nh, const int8_t* st, int c0,
                      int c1, const int na, int hs) {
    const int a0 = na == 2 ? 2 : 0, nv = hs / 32 * 32;
    const __m256i ones = _mm256_set1_epi16(1), perm = _mm256_setr_epi32(0, 2, 0, 2, 1, 3, 1, 3);
    __m256 fs[2]; /* the feature scales in the order of values8's elements */
    for (int g = 0; g < 2; g++) {
        float x[8];
        for (int i = 0; i < 4; i++)
            for (int k = 0; k < 2; k++) {
                const int h = 2 * g + i / 2, a = 2 * (i % 2) + k;
                x[4 * k + i] = h < nh ? bf[h].scale[a] : 0;
            }
        fs[g] = _mm256_loadu_ps(x);
    }
    for (int c = c0; c < c1; c++) {
        const int8_t* blk = st + (size_t)c * BLOCKGATE_STAT_BYTES(hs);
        const int8_t* s = blk + 4 * sizeof(float);
        __m256i acc[16];
        for (int k = 0; k < 16; k++) acc[k] = _mm256_setzero_si256();
        for (int e = 0; e < nv; e += 32)
            for (int a = a0; a < a0 + na; a++) {
                const size_t at = (size_t)a * hs + e;
                const __m256i x = _mm256_loadu_si256((const __m256i*)(s + at));
                for (int h = 0; h < nh; h++) {
                    const __m256i q = _mm256_loadu_si256((const __m256i*)(bf[h].q + at));
                    const __m256i m = _mm256_abs_epi8(q);
                    const __m256i p = _mm256_maddubs_epi16(m, _mm256_sign_epi8(x, q));
                    acc[4 * h + a] = _mm256_add_epi32(acc[4 * h + a], _mm256_madd_epi16(p, ones));
                }
            }
        if (nv < hs) /* the tail, into lane 0 */
            for (int h = 0; h < nh; h++)
                for (int a = a0; a < a0 + na; a++) {
                    const size_t at = (size_t)a * hs + nv;
                    const int32_t d = byte_dot(bf[h].q + at, s + at, hs - nv);
                    acc[4 * h + a] =
                        _mm256_add_epi32(acc[4 * h + a], _mm256_setr_epi32(d, 0, 0, 0, 0, 0, 0, 0));
                }
        const __m256 ss =
            _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps((const float*)blk)), perm);
        float* o = out + (size_t)4 * (c - c0);
        values8(o, acc, fs[0], ss);
        if (nh > 2) values8(o + 2, acc + 8, fs[1], ss);
    }
}

/* AVX-512 VNNI: 64 bytes at a time (a masked tail), as (s + 128) q, an unsigned byte times a
 * signed one, less 128 times the features' sum (off, taken from the sums). Accumulator 4 h + a:
 * the sums of 16 lanes of the 16 through a tree put accumulator 4 i + k at element 4 k + i, that
 * is statistic k of head i. */
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"))) static inline
    __attribute__((always_inline)) void
    values16(float* out, const __m512i* v, __m512i off, __m512 fs, __m512 ss) {
    __m512i s[8], t[4], u[2];
    for (int i = 0; i < 8; i++)
        s[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(v[2 * i], v[2 * i + 1], 0x44),
                                _mm512_shuffle_i32x4(v[2 * i], v[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++)
        t[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(s[2 * i], s[2 * i + 1], 0x88),
                                _mm512_shuffle_i32x4(s[2 * i], s[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; i++)
        u[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(t[2 * i], t[2 * i + 1]),
                                _mm512_unpackhi_epi32(t[2 * i], t[2 * i + 1]));
    const __m512i r = _mm512_sub_epi32(
        _mm512_add_epi32(_mm512_unpacklo_epi64(u[0], u[1]), _mm512_unpackhi_epi64(u[0], u[1])),
        off);
    const __m512 x = _mm512_mul_ps(_mm512_mul_ps(fs, ss), _mm512_cvtepi32_ps(r));
    const __m256 y = _mm256_add_ps(_mm512_castps512_ps256(x),
                                   _mm512_extractf32x8_ps(x, 1)); /* t_0 + t_2, t_1 + t_3 */
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(y), _mm256_extractf128_ps(y, 1)));
}
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"))) static inline
    __attribute__((always_inline)) void
    byte_products_vnni_nh(float* out, const ByteFeatures* bf, const int nh, const int8_t* st,
                          int c0, int c1, const int na, int hs) {
    const int a0 = na == 2 ? 2 : 0, nv = hs / 64 * 64;
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const __m512i perm = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    float x[16], tmp[4 * 4];
    int32_t o[16];
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 4; i++) {
            const int used = i < nh && k >= a0 && k < a0 + na;
            x[4 * k + i] = i < nh ? bf[i].scale[k] : 0;
            o[4 * k + i] = used ? 128 * bf[i].sum[k] : 0; /* element 4 k + i: see values16 */
        }
    const __m512 fs = _mm512_loadu_ps(x);
    const __m512i off = _mm512_loadu_si512(o);
    /* a head size of 64: each head's features held in registers across the blocks */
    __m512i fq[4][4];
    for (int h = 0; h < 4; h++)
        for (int a = 0; a < 4; a++) fq[h][a] = _mm512_setzero_si512();
    for (int h = 0; h < nh && hs == 64; h++)
        for (int a = a0; a < a0 + na; a++) fq[h][a] = _mm512_loadu_si512(bf[h].q + (size_t)a * hs);
    for (int c = c0; c < c1; c++) {
        const int8_t* blk = st + (size_t)c * BLOCKGATE_STAT_BYTES(hs);
        const int8_t* s = blk + 4 * sizeof(float);
        __m512i acc[16];
        for (int k = 0; k < 16; k++) acc[k] = _mm512_setzero_si512();
        if (hs == 64)
            for (int a = a0; a < a0 + na; a++) {
                const __m512i y = _mm512_xor_si512(_mm512_loadu_si512(s + (size_t)a * 64), flip);
                for (int h = 0; h < nh; h++)
                    acc[4 * h + a] = _mm512_dpbusd_epi32(acc[4 * h + a], y, fq[h][a]);
            }
        else
            for (int e = 0; e < nv; e += 64) /* (plain loads: a masked one is slower from memory) */
                for (int a = a0; a < a0 + na; a++) {
                    const size_t at = (size_t)a * hs + e;
                    const __m512i y = _mm512_xor_si512(_mm512_loadu_si512(s + at), flip);
                    for (int h = 0; h < nh; h++)
                        acc[4 * h + a] = _mm512_dpbusd_epi32(acc[4 * h + a], y,
                                                             _mm512_loadu_si512(bf[h].q + at));
                }
        if (nv < hs) { /* the tail; past it, 128 times a feature of 0 */
            const __mmask64 m = (1ULL << (hs - nv)) - 1;
            for (int a = a0; a < a0 + na; a++) {
                const size_t at = (size_t)a * hs + nv;
                const __m512i y = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, s + at), flip);
                for (int h = 0; h < nh; h++)
                    acc[4 * h + a] = _mm512_dpbusd_epi32(acc[4 * h + a], y,
                                                         _mm512_maskz_loadu_epi8(m, bf[h].q + at));
            }
        }
        const __m512 ss =
            _mm512_permutexvar_ps(perm, _mm512_castps128_ps512(_mm_loadu_ps((const float*)blk)));
        values16(nh == 4 ? out + (size_t)4 * (c - c0) : tmp, acc, off, fs, ss);
        if (nh < 4)
            for (int h = 0; h < nh; h++) out[(size_t)4 * (c - c0) + h] = tmp[h];
    }
}

/* the kernels with constant nh and na (the selector's four statistics, Quest's two, the mean's
 * one) */
#define BYTE_PRODUCTS_CASES(F) \
    switch (nh * 8 + na) {     \
        case 8 + 1:            \
            F(1, 1);           \
            break;             \
        case 8 + 2:            \
            F(1, 2);           \
            break;             \
        case 8 + 4:            \
            F(1, 4);           \
            break;             \
        case 16 + 1:           \
            F(2, 1);           \
            break;             \
        case 16 + 2:           \
            F(2, 2);           \
            break;             \
        case 16 + 4:           \
            F(2, 4);           \
            break;             \
        case 24 + 1:           \
            F(3, 1);           \
            break;             \
        case 24 + 2:           \
            F(3, 2);           \
            break;             \
        case 24 + 4:           \
            F(3, 4);           \
            break;             \
        case 32 + 1:           \
            F(4, 1);           \
            break;             \
        case 32 + 2:           \
            F(4, 2);           \
            break;             \
        default:               \
            F(4, 4);           \
    }
__attribute__((target("avx2,fma"))) static void byte_products_avx2(float* out,
                                                                   const ByteFeatures* bf, int nh,
                                                                   const int8_t* st, int c0, int c1,
                                                                   int na, int hs) {
#define F(NH_, NA_) byte_products_avx2_nh(out, bf, NH_, st, c0, c1, NA_, hs)
    BYTE_PRODUCTS_CASES(F)
#undef F
}
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"))) static void byte_products_vnni(
    float* out, const ByteFeatures* bf, int nh, const int8_t* st, int c0, int c1, int na, int hs) {
#define F(NH_, NA_) byte_products_vnni_nh(out, bf, NH_, st, c0, c1, NA_, hs)
    BYTE_PRODUCTS_CASES(F)
#undef F
}
#endif

/* byte_products_* at the CPU's level (quant_isa: FOCUS_ISA chooses) */
static void byte_products(float* out, const ByteFeatures* bf, int nh, const int8_t* st, int c0,
                          int c1, int a0, int na, int hs) {
    if (a0 != (na == 2 ? 2 : 0) || (na != 1 && na != 2 && na != 4) || nh < 1 || nh > 4)
        fatal("byte_products: statistics %d .. %d of %d heads", a0, a0 + na - 1, nh);
#if defined(__x86_64__)
    const int isa = quant_isa();
    if (isa >= QUANT_ISA_AVX512_VNNI) {
        byte_products_vnni(out, bf, nh, st, c0, c1, na, hs);
        return;
    }
    if (isa >= QUANT_ISA_AVX2) {
        byte_products_avx2(out, bf, nh, st, c0, c1, na, hs);
        return;
    }
#endif
    byte_products_scalar(out, bf, nh, st, c0, c1, a0, na, hs);
}

real blockgate_logit(const real* wgt, const real* q, const real* st, int hs, real scale) {
    if (hs > BLOCKGATE_MAX_HS) fatal("block selector: head size %d above %d", hs, BLOCKGATE_MAX_HS);
    real f[BLOCKGATE_STATS(BLOCKGATE_MAX_HS)];
    blockgate_features(f, wgt, q, hs, scale);
    return wgt[0] + feature_dot(f, st, BLOCKGATE_STATS(hs));
}

void blockgate_init(real* wgt, int n, int hs) {
    for (int h = 0; h < n; h++) {
        real* w = wgt + (size_t)h * BLOCKGATE_WIDTH(hs);
        w[0] = 0;
        for (int e = 0; e < hs; e++) w[1 + e] = 1, w[1 + hs + e] = 0.5f, w[1 + 2 * hs + e] = 0;
    }
}

/* Distant keys [j0, j1) of block c for query i: the block less the sinks and the band. */
static inline void distant_range(int c, int bs, int sinks, int far_end, int* j0, int* j1) {
    *j0 = c * bs > sinks ? c * bs : sinks;
    *j1 = (c + 1) * bs < far_end ? (c + 1) * bs : far_end;
}

/* log n_c, the log of block c's count of distant keys for query i (lfull: log bs) */
static inline real block_logn(int c, int bs, int sinks, int i, int w, real lfull) {
    int j0, j1;
    distant_range(c, bs, sinks, i - w, &j0, &j1);
    return j1 - j0 == bs ? lfull : logf((real)(j1 - j0));
}

/* The candidate blocks [c0, c1) of query i: those holding distant keys [sinks, i - w). */
static inline void candidate_blocks(int i, int w, int sinks, int bs, int* c0, int* c1) {
    const int far_end = i - w;
    *c0 = sinks / bs, *c1 = far_end > sinks ? (far_end - 1) / bs + 1 : *c0;
}

/* blocks a call of byte_products takes (out on the stack) */
enum { BYTE_CHUNK = 32 };

void block_logits(real* p, const real* q, int rep, const int8_t* st, const real* gate, int i, int w,
                  int sinks, int bs, int hs) {
    if (hs > BLOCKGATE_MAX_HS) fatal("block selector: head size %d above %d", hs, BLOCKGATE_MAX_HS);
    int c0, c1;
    candidate_blocks(i, w, sinks, bs, &c0, &c1);
    const int nc = c1 - c0, W = BLOCKGATE_WIDTH(hs);
    const real scale = (real)(1.0 / sqrt((double)hs)), lfull = logf((real)bs);
    real f[BLOCKGATE_STATS(BLOCKGATE_MAX_HS)];
    ByteFeatures bf[4];
    int8_t qb[4][BLOCKGATE_STATS(BLOCKGATE_MAX_HS)];
    for (int h = 0; h < 4; h++) bf[h].q = qb[h];
    float o[4 * BYTE_CHUNK];
    for (int r0 = 0; r0 < rep; r0 += 4) { /* four heads at a time against each block */
        const int nh = rep - r0 < 4 ? rep - r0 : 4;
        for (int h = 0; h < nh; h++) {
            blockgate_features(f, gate + (size_t)(r0 + h) * W, q + (size_t)(r0 + h) * hs, hs,
                               scale);
            features_bytes(&bf[h], f, 0, 4, hs);
        }
        for (int b0 = c0; b0 < c1; b0 += BYTE_CHUNK) {
            const int b1 = c1 - b0 < BYTE_CHUNK ? c1 : b0 + BYTE_CHUNK;
            byte_products(o, bf, nh, st, b0, b1, 0, 4, hs);
            for (int c = b0; c < b1; c++) {
                const real logn = block_logn(c, bs, sinks, i, w, lfull);
                for (int h = 0; h < nh; h++)
                    p[(size_t)(r0 + h) * nc + (c - c0)] =
                        gate[(size_t)(r0 + h) * W] + (real)o[4 * (c - b0) + h] + logn;
            }
        }
    }
}

#if defined(__x86_64__) && !defined(FOCUS_DOUBLE)
/* The statistics of blocks b0 .. b0 + nb - 1 (nb <= 16) of st packed for a tile: their scales
 * S[a][b] and their bytes as words P[a][j][b] (word j of statistic a of block b0 + b, xored with
 * flip); past the last block, statistics of 0 */
static void tile_pack(int32_t* P, float S[4][16], const int8_t* st, int b0, int nb, int hs,
                      uint32_t flip) {
    const size_t sb = BLOCKGATE_STAT_BYTES(hs);
    const int nw = hs / 4;
    for (int b = 0; b < 16; b++) {
        const int8_t* blk = st + (size_t)(b0 + b) * sb;
        for (int a = 0; a < 4; a++) S[a][b] = 0;
        if (b < nb)
            for (int a = 0; a < 4; a++) memcpy(&S[a][b], blk + 4 * a, sizeof(float));
        for (int a = 0; a < 4; a++)
            for (int j = 0; j < nw; j++) {
                uint32_t x = 0;
                if (b < nb) memcpy(&x, blk + 4 * sizeof(float) + (size_t)a * hs + 4 * j, 4);
                P[((size_t)a * nw + j) * 16 + b] = (int32_t)(x ^ flip);
            }
    }
}

/* block_logits_tile at AVX-512 VNNI: 16 blocks at a time, their statistics packed as words of 4
 * bytes (s + 128 each: unsigned), P[a][j] holding word j of statistic a of the 16 blocks; then for
 * 4 feature rows (a row's head) at a time and each statistic, a sum over the words of P[a][j]
 * times the row's word j broadcast: 16 blocks' products in one accumulator, no sums across
 * lanes. The products are the same integers as byte_products', the values the same floats. */
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"))) static void logits_tile_vnni(
    real* p, size_t ldp, const ByteFeatures* bf, int nq, int rep, int i0, const int8_t* st,
    const real* gate, int w, int sinks, int bs, int hs, int c0, int c1max) {
    const int nw = hs / 4, nr = nq * rep, W = BLOCKGATE_WIDTH(hs);
    const real lfull = logf((real)bs);
    int32_t* P = mallocPages(sizeof(int32_t) * 16 * 4 * (size_t)nw);
    int32_t* I = mallocPages(sizeof(int32_t) * 16 * 4 * (size_t)(nr + 8)); /* [row][a][16] */
    for (int b0 = c0; b0 < c1max; b0 += 16) {
        const int nb = c1max - b0 < 16 ? c1max - b0 : 16;
        float S[4][16];
        tile_pack(P, S, st, b0, nb, hs, 0x80808080u);
        /* the products: 8 rows at a time and one statistic (rows past nr repeat row 0) */
        for (int a = 0; a < 4; a++)
            for (int r0 = 0; r0 < nr; r0 += 8) {
                const int8_t* fr[8];
                for (int k = 0; k < 8; k++) fr[k] = bf[r0 + k < nr ? r0 + k : 0].q + (size_t)a * hs;
                __m512i acc[8];
                for (int k = 0; k < 8; k++) acc[k] = _mm512_setzero_si512();
                for (int j = 0; j < nw; j++) {
                    const __m512i x = _mm512_load_si512(P + ((size_t)a * nw + j) * 16);
                    for (int k = 0; k < 8; k++) {
                        int32_t f;
                        memcpy(&f, fr[k] + 4 * j, 4);
                        acc[k] = _mm512_dpbusd_epi32(acc[k], x, _mm512_set1_epi32(f));
                    }
                }
                for (int k = 0; k < 8; k++)
                    _mm512_store_si512(I + ((size_t)(r0 + k) * 4 + a) * 16, acc[k]);
            }
        /* the values, a row's log counts shared by its heads */
        for (int r = 0; r < nq; r++) {
            const int i = i0 + r;
            int a0, c1;
            candidate_blocks(i, w, sinks, bs, &a0, &c1);
            const int nc = c1 - c0, m = c1 - b0 < nb ? c1 - b0 : nb;
            if (m <= 0) continue;
            float logn[16];
            for (int b = 0; b < 16; b++)
                logn[b] = b < m ? (float)block_logn(b0 + b, bs, sinks, i, w, lfull) : 0;
            const __m512 lv = _mm512_loadu_ps(logn);
            for (int h = 0; h < rep; h++) {
                const ByteFeatures* g = &bf[r * rep + h];
                const int32_t* Ir = I + (size_t)(r * rep + h) * 4 * 16;
                __m512 t[4];
                for (int a = 0; a < 4; a++) {
                    const __m512i x = _mm512_sub_epi32(_mm512_load_si512(Ir + a * 16),
                                                       _mm512_set1_epi32(128 * g->sum[a]));
                    t[a] = _mm512_mul_ps(
                        _mm512_mul_ps(_mm512_set1_ps(g->scale[a]), _mm512_loadu_ps(S[a])),
                        _mm512_cvtepi32_ps(x));
                }
                /* (w_0 + (t_0 + t_2) + (t_1 + t_3)) + log n, as block_logits adds them; adds
                 * that are not fused with the products before them, as values16's */
#define RN (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                const __m512 d = _mm512_add_round_ps(_mm512_add_round_ps(t[0], t[2], RN),
                                                     _mm512_add_round_ps(t[1], t[3], RN), RN);
                const __m512 v = _mm512_add_round_ps(
                    _mm512_add_round_ps(_mm512_set1_ps(gate[(size_t)h * W]), d, RN), lv, RN);
#undef RN
                _mm512_mask_storeu_ps(p + (size_t)r * ldp + (size_t)h * nc + (b0 - c0),
                                      (__mmask16)((1u << m) - 1), v);
            }
        }
    }
    free(P), free(I);
}

/* d = |s| over n bytes (a multiple of 16) of at most 127 in magnitude (a branch on the sign was
 * mispredicted every other byte) */
__attribute__((target("avx2"))) static void bytes_abs(int8_t* d, const int8_t* s, int n) {
    for (int e = 0; e < n; e += 16)
        _mm_storeu_si128((__m128i*)(d + e), _mm_abs_epi8(_mm_loadu_si128((const __m128i*)(s + e))));
}

/* block_logits_tile at AVX2: the statistics of 16 blocks packed as logits_tile_vnni packs them
 * (the bytes signed), then for 4 feature rows at a time each statistic's sums over the words,
 * 8 blocks in the lanes of a sum: s q as |q| (sign(q) s), pairs of at most 2 127 127 (no
 * saturation) widened by the pairs' sum (byte_products_avx2's products, without its sums across
 * lanes); the values as block_logits makes them. aq: each feature row's magnitudes. */
__attribute__((target("avx2"))) static inline __attribute__((always_inline)) void
tile_products_avx2(int32_t* I, const int8_t* const* fq, const int8_t* const* aq, const int NR,
                   const int32_t* P, int nw, int hs) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int a = 0; a < 4; a++) { /* both halves' 8 blocks at once: a row's words broadcast once */
        __m256i acc[2][4];
        for (int k = 0; k < NR; k++) acc[0][k] = acc[1][k] = _mm256_setzero_si256();
        for (int j = 0; j < nw; j++) {
            const int32_t* Pj = P + ((size_t)a * nw + j) * 16;
            const __m256i y0 = _mm256_loadu_si256((const __m256i*)Pj),
                          y1 = _mm256_loadu_si256((const __m256i*)(Pj + 8));
            for (int k = 0; k < NR; k++) {
                int32_t f, m;
                memcpy(&f, fq[k] + (size_t)a * hs + 4 * j, 4);
                memcpy(&m, aq[k] + (size_t)a * hs + 4 * j, 4);
                const __m256i fv = _mm256_set1_epi32(f), mv = _mm256_set1_epi32(m);
                acc[0][k] = _mm256_add_epi32(
                    acc[0][k],
                    _mm256_madd_epi16(_mm256_maddubs_epi16(mv, _mm256_sign_epi8(y0, fv)), ones));
                acc[1][k] = _mm256_add_epi32(
                    acc[1][k],
                    _mm256_madd_epi16(_mm256_maddubs_epi16(mv, _mm256_sign_epi8(y1, fv)), ones));
            }
        }
        for (int k = 0; k < NR; k++)
            for (int half = 0; half < 2; half++)
                _mm256_storeu_si256((__m256i*)(I + ((size_t)k * 4 + a) * 16 + 8 * half),
                                    acc[half][k]);
    }
}
__attribute__((target("avx2"))) static void logits_tile_avx2(
    real* p, size_t ldp, const ByteFeatures* bf, const int8_t* aq0, int nq, int rep, int i0,
    const int8_t* st, const real* gate, int w, int sinks, int bs, int hs, int c0, int c1max) {
    const int nw = hs / 4, nr = nq * rep, W = BLOCKGATE_WIDTH(hs), S4 = BLOCKGATE_STATS(hs);
    const real lfull = logf((real)bs);
    int32_t* P = mallocCheck(sizeof(int32_t) * 16 * 4 * (size_t)nw);
    int32_t I[4 * 4 * 16];
    for (int b0 = c0; b0 < c1max; b0 += 16) {
        const int nb = c1max - b0 < 16 ? c1max - b0 : 16;
        float S[4][16];
        tile_pack(P, S, st, b0, nb, hs, 0); /* (the bytes signed) */
        for (int x0 = 0; x0 < nr; x0 += 4) {
            const int n = nr - x0 < 4 ? nr - x0 : 4;
            const int8_t *fq[4], *aq[4];
            for (int k = 0; k < n; k++) fq[k] = bf[x0 + k].q, aq[k] = aq0 + (size_t)(x0 + k) * S4;
            switch (n) { /* (the rows' count a constant: the sums in registers) */
                case 1:
                    tile_products_avx2(I, fq, aq, 1, P, nw, hs);
                    break;
                case 2:
                    tile_products_avx2(I, fq, aq, 2, P, nw, hs);
                    break;
                case 3:
                    tile_products_avx2(I, fq, aq, 3, P, nw, hs);
                    break;
                default:
                    tile_products_avx2(I, fq, aq, 4, P, nw, hs);
            }
            for (int k = 0; k < n; k++) { /* the values, 8 blocks at a time */
                const int x = x0 + k, r = x / rep, h = x % rep, i = i0 + r;
                const ByteFeatures* g = &bf[x];
                int a0, c1;
                candidate_blocks(i, w, sinks, bs, &a0, &c1);
                const int nc = c1 - c0, m = c1 - b0 < nb ? c1 - b0 : nb;
                if (m <= 0) continue;
                float logn[16], v[16];
                for (int b = 0; b < 16; b++)
                    logn[b] = b < m ? (float)block_logn(b0 + b, bs, sinks, i, w, lfull) : 0;
                for (int half = 0; half < 2; half++) {
                    __m256 t[4];
                    for (int a = 0; a < 4; a++) {
                        t[a] = _mm256_mul_ps(
                            _mm256_mul_ps(_mm256_set1_ps(g->scale[a]),
                                          _mm256_loadu_ps(S[a] + 8 * half)),
                            _mm256_cvtepi32_ps(_mm256_loadu_si256(
                                (const __m256i*)(I + ((size_t)k * 4 + a) * 16 + 8 * half))));
                        __asm__("" : "+x"(t[a])); /* (a product never fused into the sums) */
                    }
                    /* (w_0 + (t_0 + t_2) + (t_1 + t_3)) + log n, as block_logits adds them */
                    const __m256 d =
                        _mm256_add_ps(_mm256_add_ps(t[0], t[2]), _mm256_add_ps(t[1], t[3]));
                    _mm256_storeu_ps(
                        v + 8 * half,
                        _mm256_add_ps(_mm256_add_ps(_mm256_set1_ps(gate[(size_t)h * W]), d),
                                      _mm256_loadu_ps(logn + 8 * half)));
                }
                memcpy(p + (size_t)r * ldp + (size_t)h * nc + (b0 - c0), v,
                       sizeof(float) * (size_t)m);
            }
        }
    }
    free(P);
}
#endif

void block_logits_tile(real* p, size_t ldp, const real* q, int ldq, int i0, int nq,
                       const int8_t* st, const real* gate, int w, int sinks, int bs, int rep,
                       int hs) {
#if defined(__x86_64__) && !defined(FOCUS_DOUBLE)
    const int isa = quant_isa();
    if (isa >= QUANT_ISA_AVX2 && hs % 4 == 0 && hs <= BLOCKGATE_MAX_HS) {
        /* every row's features in bytes (and at AVX2 their magnitudes after them) */
        const int W = BLOCKGATE_WIDTH(hs), S4 = BLOCKGATE_STATS(hs), nr = nq * rep;
        const int vnni = isa >= QUANT_ISA_AVX512_VNNI;
        const real scale = (real)(1.0 / sqrt((double)hs));
        real f[BLOCKGATE_STATS(BLOCKGATE_MAX_HS)];
        ByteFeatures* bf = mallocCheck(sizeof *bf * (size_t)nr);
        int8_t* qb = mallocCheck((size_t)nr * (vnni ? 1 : 2) * S4);
        int8_t* aq = qb + (size_t)nr * S4;
        for (int r = 0; r < nq; r++)
            for (int h = 0; h < rep; h++) {
                const int x = r * rep + h;
                bf[x].q = qb + (size_t)x * S4;
                blockgate_features(f, gate + (size_t)h * W, q + (size_t)r * ldq + (size_t)h * hs,
                                   hs, scale);
                features_bytes(&bf[x], f, 0, 4, hs);
                if (!vnni) bytes_abs(aq + (size_t)x * S4, bf[x].q, S4);
            }
        int c0, c1max;
        candidate_blocks(i0 + nq - 1, w, sinks, bs, &c0, &c1max);
        if (vnni)
            logits_tile_vnni(p, ldp, bf, nq, rep, i0, st, gate, w, sinks, bs, hs, c0, c1max);
        else
            logits_tile_avx2(p, ldp, bf, aq, nq, rep, i0, st, gate, w, sinks, bs, hs, c0, c1max);
        free(bf), free(qb);
        return;
    }
#endif
    for (int r = 0; r < nq; r++)
        block_logits(p + (size_t)r * ldp, q + (size_t)r * ldq, rep, st, gate, i0 + r, w, sinks, bs,
                     hs);
}

/* block_scores of the learned selector from its logits p (block_logits): each head's share of
 * its attention, exp(p - max) over the sum (with the band's), summed over the heads into sc. The
 * logits are overwritten with their exponentials (one pass of them a head). */
static void learned_shares(real* sc, real* p, int rep, const real* lband, size_t ldl, int c0,
                           int c1) {
    const int nc = c1 - c0;
    for (int r = 0; r < rep; r++) {
        real* pr = p + (size_t)r * nc;
        const real lb = lband[(size_t)r * ldl];
        real mx = lb, sum = 0;
#pragma omp simd reduction(max : mx)
        for (int c = 0; c < nc; c++) mx = pr[c] > mx ? pr[c] : mx;
#pragma omp simd reduction(+ : sum)
        for (int c = 0; c < nc; c++) sum += pr[c] = exp_f(pr[c] - mx);
        sum += lb > -INFINITY ? exp_f(lb - mx) : 0;
        const real inv = 1 / sum;
#pragma omp simd
        for (int c = 0; c < nc; c++) sc[c0 + c] += pr[c] * inv;
    }
}

/* Quest's bounds or the mean keys' products of blocks [c0, c1) into sc (block_scores) */
static void bound_scores(real* sc, BlockScore score, const real* q, int rep, const int8_t* st,
                         int c0, int c1, int hs) {
    if (hs > BLOCKGATE_MAX_HS) fatal("block selector: head size %d above %d", hs, BLOCKGATE_MAX_HS);
    real f[BLOCKGATE_STATS(BLOCKGATE_MAX_HS)];
    for (int c = c0; c < c1; c++) sc[c] = 0;
    /* Quest's bound sum_e max(q_e min_e, q_e max_e) and the mean key's product, as products with
     * the statistics too, in bytes: q_e min_e where q_e < 0, q_e max_e elsewhere; four heads
     * against each block at once, added to its score head by head in order */
    const int quest = score == BLOCKS_QUEST, a0 = quest ? 2 : 0, na = quest ? 2 : 1;
    ByteFeatures bf[4];
    int8_t qb[4][BLOCKGATE_STATS(BLOCKGATE_MAX_HS)];
    for (int h = 0; h < 4; h++) bf[h].q = qb[h];
    float o[4 * BYTE_CHUNK];
    for (int r0 = 0; r0 < rep; r0 += 4) {
        const int nh = rep - r0 < 4 ? rep - r0 : 4;
        for (int h = 0; h < nh; h++) {
            const real* qh = q + (size_t)(r0 + h) * hs;
            for (int e = 0; e < hs; e++)
                if (quest)
                    f[2 * hs + e] = qh[e] < 0 ? qh[e] : 0, f[3 * hs + e] = qh[e] < 0 ? 0 : qh[e];
                else
                    f[e] = qh[e];
            features_bytes(&bf[h], f, a0, na, hs);
        }
        for (int b0 = c0; b0 < c1; b0 += BYTE_CHUNK) {
            const int b1 = c1 - b0 < BYTE_CHUNK ? c1 : b0 + BYTE_CHUNK;
            byte_products(o, bf, nh, st, b0, b1, a0, na, hs);
            for (int c = b0; c < b1; c++)
                for (int h = 0; h < nh; h++) sc[c] += (real)o[4 * (c - b0) + h];
        }
    }
}

void block_bounds(real* sc, BlockScore score, const real* q, int rep, const int8_t* st, int i,
                  int w, int sinks, int bs, int hs, int part, int nparts) {
    int c0, c1;
    candidate_blocks(i, w, sinks, bs, &c0, &c1);
    const int n = c1 - c0;
    bound_scores(sc, score, q, rep, st, c0 + (int)((long)n * part / nparts),
                 c0 + (int)((long)n * (part + 1) / nparts), hs);
}

/* Scores of the candidate key blocks [c0, c1) for the rep query heads q (stride hs) of one key/
 * value head, query position i (keys k with stride ldk), from each block's statistics st
 * (blockgate_key_stats8: mean, variance, min, max): Quest's upper bound of q . k over the
 * block from its keys' elementwise min and max, the dot product with the block's mean key, the
 * oracle's share of each head's dense attention mass that falls on the block's distant keys
 * [sinks, i - w), or the learned selector's estimate of that share (gate: the rep heads'
 * weights; lband: their band log-sum-exps, stride ldl). p: scratch of max(i + 1, rep c1). */
static void block_scores(real* sc, BlockScore score, const real* q, int rep, const int8_t* st,
                         const real* gate, const real* lband, size_t ldl, const real* k, int ldk,
                         int i, int w, int sinks, int bs, int c0, int c1, int hs, real scale,
                         real* p, int made) {
    if (hs > BLOCKGATE_MAX_HS) fatal("block selector: head size %d above %d", hs, BLOCKGATE_MAX_HS);
    if (score != BLOCKS_LEARNED && score != BLOCKS_ORACLE) { /* sc: made already when made */
        if (!made) bound_scores(sc, score, q, rep, st, c0, c1, hs);
        return;
    }
    for (int c = c0; c < c1; c++) sc[c] = 0;
    if (score == BLOCKS_LEARNED) { /* p: the logits, made already when made is set */
        if (!made) block_logits(p, q, rep, st, gate, i, w, sinks, bs, hs);
        learned_shares(sc, p, rep, lband, ldl, c0, c1);
        return;
    }
    if (score == BLOCKS_ORACLE) {
        for (int r = 0; r < rep; r++) {
            const real* qh = q + (size_t)r * hs;
            real mx = -INFINITY;
            for (int j = 0; j <= i; j++) {
                const real* kj = k + (size_t)j * ldk;
                real s = 0;
#pragma omp simd reduction(+ : s)
                for (int e = 0; e < hs; e++) s += qh[e] * kj[e];
                p[j] = s * scale;
                mx = p[j] > mx ? p[j] : mx;
            }
            double sum = 0;
            for (int j = 0; j <= i; j++) sum += exp_f(p[j] - mx);
            const real lse = mx + (real)log(sum);
            for (int c = c0; c < c1; c++) {
                int j0, j1;
                distant_range(c, bs, sinks, i - w, &j0, &j1);
                real m = 0;
                for (int j = j0; j < j1; j++) m += exp_f(p[j] - lse);
                sc[c] += m;
            }
        }
        return;
    }
}

#if defined(__x86_64__) && !defined(FOCUS_DOUBLE)
/* block_select_made's best cap <= 16 of the scores sc[c0 .. c1), the same blocks in the same
 * order, kept in two vectors (lanes 0-7 the best, 8-15 the next; the high one's lane 0 shifted in
 * from the low one's lane 7): a block above the last kept goes in without branches (the
 * mispredicted shifts of the insertion were most of a prompt's choice) */
__attribute__((target("avx2"))) static int best16_avx2(int* sel, const real* sc, int c0, int c1,
                                                       int cap) {
    const __m256i back = _mm256_setr_epi32(0, 0, 1, 2, 3, 4, 5, 6); /* lane k from k - 1 */
    const __m256i seven = _mm256_set1_epi32(7);
    const __m256 none = _mm256_set1_ps(-INFINITY);
    const __m256 notfirst = _mm256_castsi256_ps(_mm256_setr_epi32(0, -1, -1, -1, -1, -1, -1, -1));
    const __m256 lane0 = _mm256_castsi256_ps(_mm256_setr_epi32(-1, 0, 0, 0, 0, 0, 0, 0));
    __m256 v0 = none, v1 = none; /* the kept scores, best first, -inf past them */
    __m256 i0 = _mm256_castsi256_ps(_mm256_set1_epi32(-1)), i1 = i0;
    int ns = 0;
    float last = -INFINITY; /* the cap-th kept score (-inf while fewer) */
    for (int c = c0; c < c1; c++) {
        const float x = sc[c];
        if (!(x > -INFINITY) || !(x > last)) continue;
        const __m256 xb = _mm256_set1_ps(x), cb = _mm256_castsi256_ps(_mm256_set1_epi32(c));
        /* lanes below the new one (a suffix of the 16), and past it: each lane takes the one
         * before it */
        const __m256 g0 = _mm256_cmp_ps(xb, v0, _CMP_GT_OQ), g1 = _mm256_cmp_ps(xb, v1, _CMP_GT_OQ);
        const __m256 p0 = _mm256_and_ps(_mm256_permutevar8x32_ps(g0, back), notfirst);
        const __m256 p1 = _mm256_blendv_ps(_mm256_permutevar8x32_ps(g1, back),
                                           _mm256_permutevar8x32_ps(g0, seven), lane0);
        const __m256 s0 = _mm256_permutevar8x32_ps(v0, back);
        const __m256 s1 = _mm256_blendv_ps(_mm256_permutevar8x32_ps(v1, back),
                                           _mm256_permutevar8x32_ps(v0, seven), lane0);
        const __m256 t0 = _mm256_permutevar8x32_ps(i0, back);
        const __m256 t1 = _mm256_blendv_ps(_mm256_permutevar8x32_ps(i1, back),
                                           _mm256_permutevar8x32_ps(i0, seven), lane0);
        v1 = _mm256_blendv_ps(_mm256_blendv_ps(v1, xb, g1), s1, p1);
        i1 = _mm256_blendv_ps(_mm256_blendv_ps(i1, cb, g1), t1, p1);
        v0 = _mm256_blendv_ps(_mm256_blendv_ps(v0, xb, g0), s0, p0);
        i0 = _mm256_blendv_ps(_mm256_blendv_ps(i0, cb, g0), t0, p0);
        ns += ns < cap;
        if (ns == cap) {
            float vs[16];
            _mm256_storeu_ps(vs, v0);
            _mm256_storeu_ps(vs + 8, v1);
            last = vs[cap - 1];
        }
    }
    int ids[16];
    _mm256_storeu_si256((__m256i*)ids, _mm256_castps_si256(i0));
    _mm256_storeu_si256((__m256i*)(ids + 8), _mm256_castps_si256(i1));
    for (int k = 0; k < ns; k++) sel[k] = ids[k];
    return ns;
}
#endif

int block_select(int* sel, BlockScore score, const real* q, int rep, const int8_t* st,
                 const real* gate, const real* lband, size_t ldl, const real* k, int ldk, int i,
                 int w, int sinks, int bs, int nsel, real cover, int hs, real* sc, real* p) {
    return block_select_made(sel, score, q, rep, st, gate, lband, ldl, k, ldk, i, w, sinks, bs,
                             nsel, cover, hs, sc, p, 0);
}

int block_select_made(int* sel, BlockScore score, const real* q, int rep, const int8_t* st,
                      const real* gate, const real* lband, size_t ldl, const real* k, int ldk,
                      int i, int w, int sinks, int bs, int nsel, real cover, int hs, real* sc,
                      real* p, int made) {
    const int far_end = i - w;
    int c0, c1;
    candidate_blocks(i, w, sinks, bs, &c0, &c1);
    /* a fixed count, or with cover at most nsel blocks (nsel <= 0: any number) */
    const int cap = cover > 0 && nsel <= 0 ? c1 - c0 : nsel;
    int ns = 0;
    if (cover <= 0 && c1 - c0 <= nsel) {
        for (int c = c0; c < c1; c++) sel[ns++] = c;
        return ns;
    }
    if (cap <= 0 || c1 <= c0) return 0;
    const real scale = (real)(1.0 / sqrt((double)hs));
    block_scores(sc, score, q, rep, st, gate, lband, ldl, k, ldk, i, w, sinks, bs, c0, c1, hs,
                 scale, p, made);
    /* cover (Twilight's top-p): blocks in order of score until their estimated share of the
     * attention mass reaches cover. The learned selector's and the oracle's scores are shares of
     * each head's whole attention already (summed over the rep heads; what the blocks do not
     * hold, the band and the sinks, counts as covered); Quest's bounds and the mean keys'
     * products become shares of the distant mass by a softmax of the heads' mean score, each
     * block weighted by its count of distant keys (into p) */
    double covered = 0, target = cover;
    const int shares = score == BLOCKS_LEARNED || score == BLOCKS_ORACLE;
    if (cover > 0 && shares) {
        double tot = 0;
        for (int c = c0; c < c1; c++) tot += sc[c];
        covered = rep - tot, target = (double)cover * rep;
    } else if (cover > 0) {
        real mx = -INFINITY;
        for (int c = c0; c < c1; c++) {
            int j0, j1;
            distant_range(c, bs, sinks, far_end, &j0, &j1);
            p[c] = scale * sc[c] / rep + logf((real)(j1 - j0));
            mx = p[c] > mx ? p[c] : mx;
        }
        double z = 0;
        for (int c = c0; c < c1; c++) z += exp_f(p[c] - mx);
        for (int c = c0; c < c1; c++) p[c] = (real)(exp_f(p[c] - mx) / z);
    }
    if (cover <= 0) { /* the best cap in one pass, kept in order: the best first, ties to the
                       * earlier block (a block enters only above the last one kept) */
#if defined(__x86_64__) && !defined(FOCUS_DOUBLE)
        if (cap <= 16 && quant_isa() >= QUANT_ISA_AVX2) return best16_avx2(sel, sc, c0, c1, cap);
#endif
        for (int c = c0; c < c1; c++) {
            const real s = sc[c];
            if (!(s > -INFINITY) || (ns == cap && !(s > sc[sel[cap - 1]]))) continue;
            int at = ns < cap ? ns++ : cap - 1;
            for (; at > 0 && s > sc[sel[at - 1]]; at--) sel[at] = sel[at - 1];
            sel[at] = c;
        }
        return ns;
    }
    for (; ns < cap; ns++) { /* the best first, ties to the earlier block */
        if (covered >= target) break;
        int best = -1;
        for (int c = c0; c < c1; c++)
            if (sc[c] > -INFINITY && (best < 0 || sc[c] > sc[best])) best = c;
        if (best < 0) break; /* only non-finite scores left */
        sel[ns] = best;
        covered += shares ? sc[best] : p[best];
        sc[best] = -INFINITY;
    }
    return ns;
}

double attention_blocks_forward(real* out, real* lse, const real* qkv, int w, int sinks, int bs,
                                int nsel, real cover, BlockScore score, const real* gate,
                                const uint32_t* qmask, const uint32_t* kmask, int K, int B, int T,
                                int NH, int NKV, int hs) {
    const int C = NH * hs, QKV = (NH + 2 * NKV) * hs, rep = NH / NKV, nb = (T + bs - 1) / bs;
    const real scale = (real)(1.0 / sqrt((double)hs));
    /* sinks and window: the band kernel, into out and lse */
    flash_all(out, lse, qkv, NULL, NULL, 0, w, sinks, B, T, NH, NKV, hs);
    double kept = 0;
    const size_t sbytes = BLOCKGATE_STAT_BYTES(hs); /* a block's statistics */
    int8_t* st = mallocCheck(sbytes * ((size_t)NKV * nb + 1));
    /* the group keys (qmask given): each group's distant keys, ascending, per sequence */
    int* gpos = qmask ? mallocCheck(sizeof(int) * ((size_t)K * T + 1)) : NULL;
    int gn[32] = {0};
    for (int b = 0; b < B; b++) {
        const real* base = qkv + (size_t)b * T * QKV;
        real* ob = out + (size_t)b * T * C;
        if (qmask) {
            for (int c = 0; c < K; c++) gn[c] = 0;
            for (int j = sinks; j < T; j++)
                for (int c = 0; c < K; c++)
                    if ((kmask[(size_t)b * T + j] >> c) & 1) gpos[(size_t)c * T + gn[c]++] = j;
        }
        if (score != BLOCKS_ORACLE) {
#pragma omp parallel for schedule(static)
            for (int t = 0; t < NKV * nb; t++) {
                const int kvh = t / nb, c = t % nb, j1 = (c + 1) * bs < T ? (c + 1) * bs : T;
                blockgate_key_stats8(st + (size_t)t * sbytes, base + C + kvh * hs, QKV, c * bs, j1,
                                     hs);
            }
        }
#pragma omp parallel reduction(+ : kept)
        {
            real* sc = mallocCheck(sizeof(real) * (nb + 1));
            int* sel = mallocCheck(sizeof(int) * (nb + 1));
            real* p = mallocCheck(sizeof(real) * (T + 1 > rep * nb ? T + 1 : rep * nb));
            /* the chosen keys' scores and the outputs of the rep heads */
            const int most = cover > 0 && nsel <= 0 ? nb : nsel; /* blocks a query may keep */
            const int ldS = (most < 1    ? 1
                             : most < nb ? most
                                         : nb) *
                                bs             /* at most every block */
                            + (qmask ? T : 0); /* and the group keys */
            real* S = mallocCheck(sizeof(real) * (size_t)rep * ldS);
            /* the group keys outside the chosen blocks: their keys and values */
            real* kx = qmask ? mallocCheck(sizeof(real) * ((size_t)T * hs + 1)) : NULL;
            real* vx = qmask ? mallocCheck(sizeof(real) * ((size_t)T * hs + 1)) : NULL;
            unsigned char* chosen = qmask ? callocCheck(nb + 1, 1) : NULL;
            real* ot = mallocCheck(sizeof(real) * (size_t)rep * hs);
            real* rmax = mallocCheck(sizeof(real) * (size_t)rep * 2);
            real* rsum = rmax + rep;
#pragma omp for schedule(dynamic, 8)
            for (long t = 0; t < (long)NKV * T; t++) {
                const int kvh = (int)(t / T), i = T - 1 - (int)(t % T), far_end = i - w;
                double keys = band_pairs_kept(i, w, sinks) * rep;
                const int ns =
                    block_select(sel, score, base + (size_t)i * QKV + kvh * rep * hs, rep,
                                 st + (size_t)kvh * nb * sbytes,
                                 gate ? gate + (size_t)kvh * rep * BLOCKGATE_WIDTH(hs) : NULL,
                                 lse + ((size_t)b * NH + kvh * rep) * T + i, (size_t)T,
                                 base + C + kvh * hs, QKV, i, w, sinks, bs, nsel, cover, hs, sc, p);
                /* the distant keys of the query's groups that no chosen block holds, each in the
                 * lowest group it shares with the query */
                int nx = 0;
                if (qmask) {
                    const uint32_t mq = qmask[(size_t)b * T + i];
                    for (int t2 = 0; t2 < ns; t2++) chosen[sel[t2]] = 1;
                    for (int c = 0; c < K; c++) {
                        if (!((mq >> c) & 1)) continue;
                        const int* gp = gpos + (size_t)c * T;
                        const uint32_t lower = (1u << c) - 1;
                        for (int e = 0; e < gn[c] && gp[e] < far_end; e++) {
                            const int j = gp[e];
                            if (chosen[j / bs] || (kmask[(size_t)b * T + j] & mq & lower)) continue;
                            memcpy(kx + (size_t)nx * hs, base + (size_t)j * QKV + C + kvh * hs,
                                   sizeof(real) * hs);
                            memcpy(vx + (size_t)nx * hs,
                                   base + (size_t)j * QKV + C + NKV * hs + kvh * hs,
                                   sizeof(real) * hs);
                            nx++;
                        }
                    }
                    for (int t2 = 0; t2 < ns; t2++) chosen[sel[t2]] = 0;
                }
                if (ns || nx) { /* the rep query heads against the chosen blocks' distant keys */
                    const real* q = base + (size_t)i * QKV + kvh * rep * hs;
                    int nk = 0;
                    for (int t2 = 0; t2 < ns; t2++) { /* S (rep, nk) = scale q k^T, by block */
                        const int c = sel[t2];
                        const int j0 = c * bs > sinks ? c * bs : sinks,
                                  j1 = (c + 1) * bs < far_end ? (c + 1) * bs : far_end;
                        gemm(0, 1, rep, j1 - j0, hs, scale, q, hs,
                             base + (size_t)j0 * QKV + C + kvh * hs, QKV, 0, S + nk, ldS);
                        nk += j1 - j0;
                    }
                    if (nx) gemm(0, 1, rep, nx, hs, scale, q, hs, kx, hs, 0, S + nk, ldS);
                    nk += nx;
                    keys += (double)nk * rep;
                    for (int r = 0; r < rep; r++) {
                        real* sr = S + (size_t)r * ldS;
                        real mx = -INFINITY, sum = 0;
                        for (int t2 = 0; t2 < nk; t2++) mx = sr[t2] > mx ? sr[t2] : mx;
#pragma omp simd reduction(+ : sum)
                        for (int t2 = 0; t2 < nk; t2++) {
                            sr[t2] = exp_f(sr[t2] - mx);
                            sum += sr[t2];
                        }
                        rmax[r] = mx, rsum[r] = sum;
                    }
                    nk = 0;
                    for (int t2 = 0; t2 < ns; t2++) { /* O (rep, hs) = P v, by block */
                        const int c = sel[t2];
                        const int j0 = c * bs > sinks ? c * bs : sinks,
                                  j1 = (c + 1) * bs < far_end ? (c + 1) * bs : far_end;
                        gemm(0, 0, rep, hs, j1 - j0, 1, S + nk, ldS,
                             base + (size_t)j0 * QKV + C + NKV * hs + kvh * hs, QKV, t2 ? 1 : 0, ot,
                             hs);
                        nk += j1 - j0;
                    }
                    if (nx) gemm(0, 0, rep, hs, nx, 1, S + nk, ldS, vx, hs, ns ? 1 : 0, ot, hs);
                    for (int r = 0; r < rep; r++) {
                        const int h = kvh * rep + r;
                        real* o = ot + (size_t)r * hs;
                        for (int e = 0; e < hs; e++) o[e] /= rsum[r];
                        merge_into(ob + (size_t)i * C + h * hs, lse + ((size_t)b * NH + h) * T + i,
                                   o, rmax[r] + logf(rsum[r]), hs);
                    }
                }
                kept += keys / NH;
            }
            free(sc);
            free(sel);
            free(p);
            free(ot);
            free(S);
            free(rmax);
            free(kx);
            free(vx);
            free(chosen);
        }
    }
    free(st);
    free(gpos);
    return kept;
}
