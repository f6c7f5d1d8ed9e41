/* sparse.c: flash-style dense attention and the hard top-k executor (see sparse.h). */
#include "sparse.h"

#include <math.h>
#include <string.h>

#include <omp.h>

#include "cpu.h"

#define BQ 64
#define BK 256

/* exp for floats, vectorisable: 2^n * p(r) with r = x - n ln2 in [-ln2/2, ln2/2] and a degree-6
 * polynomial (Cephes coefficients); about 1 ulp. Returns 0 below -87.3 (and for -inf), NaN for
 * NaN. */
static inline float exp_f(float x) {
    if (x != x) return x; /* NaN stays NaN (and is never converted to an integer below) */
    if (x < -87.3f) return 0.0f;
    if (x > 88.7f) x = 88.7f;
    float n = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union {
        uint32_t u;
        float f;
    } s = {(uint32_t)((int32_t)n + 127) << 23};
    return p * s.f;
}

/* Causal attention for the query rows [i0, i1) of one head over a sequence of n tokens stored
 * with row strides ldq / ldk / ldv (keys and values of the same positions). Pairs with
 * (gm[i] & gm[j] & skip) != 0 are left out (lowest-shared-group de-duplication); gm may be NULL.
 * o rows have stride ldo, lse entries stride ldl. S, acc: scratch of BQ x BK and BQ x hs floats. */
static void flash_rows(real* o, int ldo, real* lse, int ldl, const real* q, int ldq, const real* k,
                       int ldk, const real* v, int ldv, int i0, int i1, int hs, real scale,
                       const uint32_t* gm, uint32_t skip, real* S, real* acc) {
    int nq = i1 - i0;
    real m[BQ], l[BQ];
    for (int r = 0; r < nq; r++) m[r] = -INFINITY, l[r] = 0;
    memset(acc, 0, sizeof(real) * nq * hs);
    for (int j0 = 0; j0 < i1; j0 += BK) {
        int nk = i1 - j0 < BK ? i1 - j0 : BK;
        gemm(0, 1, nq, nk, hs, scale, q + (size_t)i0 * ldq, ldq, k + (size_t)j0 * ldk, ldk, 0, S,
             BK);
        int diag = j0 + nk > i0; /* block reaches the causal boundary */
        for (int r = 0; r < nq; r++) {
            real* s = S + (size_t)r * BK;
            int i = i0 + r;
            int lim = diag ? (i - j0 + 1 < nk ? i - j0 + 1 : nk) : nk;
            if (lim <= 0) {
                for (int c = 0; c < nk; c++) s[c] = 0;
                continue;
            }
            if (gm && skip) {
                uint32_t mi = gm[i] & skip;
                for (int c = 0; c < lim; c++)
                    if (mi & gm[j0 + c]) s[c] = -INFINITY;
            }
            real mx = m[r];
            for (int c = 0; c < lim; c++) mx = s[c] > mx ? s[c] : mx;
            if (mx == -INFINITY) {
                for (int c = 0; c < nk; c++) s[c] = 0;
                continue;
            }
            real alpha = exp_f(m[r] - mx);
            real sum = 0;
#pragma omp simd reduction(+ : sum)
            for (int c = 0; c < lim; c++) {
                s[c] = exp_f(s[c] - mx);
                sum += s[c];
            }
            for (int c = lim; c < nk; c++) s[c] = 0;
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

void attention_flash_forward(real* out, real* lse, const real* qkv, int B, int T, int NH, int NKV,
                             int hs) {
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
            flash_rows(out + (size_t)b * T * C + h * hs, C, lse + ((size_t)b * NH + h) * T, 1,
                       base + h * hs, QKV, base + C + kvh * hs, QKV, base + C + NKV * hs + kvh * hs,
                       QKV, i0, i1, hs, scale, NULL, 0, S, acc);
        }
        free(S);
        free(acc);
    }
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

void attention_hard_forward(real* out, real* lse, const real* qkv, const uint32_t* mask, int K,
                            int w, int B, int T, int NH, int NKV, int hs) {
    const int C = NH * hs, QKV = (NH + 2 * NKV) * hs, rep = NH / NKV;
    const real scale = (real)(1.0 / sqrt((double)hs));
    int* count = mallocCheck(sizeof(int) * (K + 1));
    int* start = mallocCheck(sizeof(int) * (K + 1));
    for (int b = 0; b < B; b++) {
        const uint32_t* mb = mask + (size_t)b * T;
        const real* base = qkv + (size_t)b * T * QKV;
        real* ob = out + (size_t)b * T * C;
        /* stable sort of token indices by group (a counting sort; a token with k groups appears k
         * times) */
        for (int c = 0; c <= K; c++) count[c] = 0;
        for (int i = 0; i < T; i++)
            for (int c = 0; c < K; c++) count[c] += (mb[i] >> c) & 1;
        start[0] = 0;
        for (int c = 0; c < K; c++) start[c + 1] = start[c] + count[c];
        int total = start[K];
        int* idx = mallocCheck(sizeof(int) * (total + 1));
        uint32_t* gm = mallocCheck(sizeof(uint32_t) * (total + 1));
        {
            int* fill = mallocCheck(sizeof(int) * (K + 1));
            memcpy(fill, start, sizeof(int) * (K + 1));
            for (int i = 0; i < T; i++)
                for (int c = 0; c < K; c++)
                    if ((mb[i] >> c) & 1) idx[fill[c]] = i, gm[fill[c]++] = mb[i];
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
                flash_rows(oA + (size_t)start[c] * C + h * hs, C, lA + (size_t)start[c] * NH + h,
                           NH, gc + h * hs, QKV, gc + C + kvh * hs, QKV,
                           gc + C + NKV * hs + kvh * hs, QKV, i0, i1, hs, scale, gm + start[c],
                           (1u << c) - 1, S, acc);
            }
            free(S);
            free(acc);
        }
        /* set B (local keys sharing no group) and the merge, per query */
#pragma omp parallel
        {
            real* p = mallocCheck(sizeof(real) * (w + 1));
            real* ob_tmp = mallocCheck(sizeof(real) * hs);
            int* pos = mallocCheck(sizeof(int) * (K + 1));
#pragma omp for schedule(static)
            for (int i = 0; i < T; i++) {
                /* where token i sits in each of its groups: binary search in the sorted lists */
                int np = 0;
                for (int c = 0; c < K; c++) {
                    if (!((mb[i] >> c) & 1)) continue;
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
                int j0 = i - w < 0 ? 0 : i - w;
                for (int h = 0; h < NH; h++) {
                    int kvh = h / rep;
                    real* o = ob + (size_t)i * C + h * hs;
                    real l = -INFINITY;
                    for (int q = 0; q < np; q++)
                        merge_into(o, &l, oA + (size_t)pos[q] * C + h * hs,
                                   lA[(size_t)pos[q] * NH + h], hs);
                    /* set B */
                    const real* qi = base + (size_t)i * QKV + h * hs;
                    real mx = -INFINITY;
                    int nbk = 0;
                    for (int j = j0; j <= i; j++) {
                        if (mb[i] & mb[j]) {
                            p[j - j0] = -INFINITY;
                            continue;
                        }
                        const real* kj = base + (size_t)j * QKV + C + kvh * hs;
                        real s = 0;
#pragma omp simd reduction(+ : s)
                        for (int e = 0; e < hs; e++) s += qi[e] * kj[e];
                        s *= scale;
                        p[j - j0] = s;
                        mx = s > mx ? s : mx;
                        nbk++;
                    }
                    if (nbk) {
                        real sum = 0;
                        for (int e = 0; e < hs; e++) ob_tmp[e] = 0;
                        for (int j = j0; j <= i; j++) {
                            if (p[j - j0] == -INFINITY) continue;
                            real pe = exp_f(p[j - j0] - mx);
                            sum += pe;
                            const real* vj = base + (size_t)j * QKV + C + NKV * hs + kvh * hs;
#pragma omp simd
                            for (int e = 0; e < hs; e++) ob_tmp[e] += pe * vj[e];
                        }
                        for (int e = 0; e < hs; e++) ob_tmp[e] /= sum;
                        merge_into(o, &l, ob_tmp, mx + logf(sum), hs);
                    }
                    lse[((size_t)b * NH + h) * T + i] = l;
                }
            }
            free(p);
            free(ob_tmp);
            free(pos);
        }
        free(tstart);
        free(idx);
        free(gm);
        free(g);
        free(oA);
        free(lA);
    }
    free(count);
    free(start);
}
