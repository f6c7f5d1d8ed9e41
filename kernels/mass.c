/* mass.c: the teacher and the loss of the `mass` objective (see mass.h, docs/OBJECTIVE.md). */
#include "mass.h"

#include <math.h>
#include <string.h>

#include <omp.h>

#include "cpu.h"
#include "sparse.h"

#define MQ 64 /* query rows per teacher task */

int mass_sample_rows(int* rows, int T, int w, int sinks, int every, uint64_t seed) {
    if (every < 1) every = 1;
    /* whole tiles whose every row has far keys: the count depends on T, w, sinks and every only,
     * so each window of a run holds as many rows */
    int first = 0;
    while (first * MQ - w <= sinks) first++;
    const int tiles = T / MQ - first;
    if (tiles <= 0) return 0;
    const int n = tiles / every > 0 ? tiles / every : 1, span = every < tiles ? every : tiles;
    Rng r;
    rng_seed(&r, seed);
    const int phase = (int)(rng_u64(&r) % (uint64_t)span);
    int nr = 0;
    for (int k = 0; k < n; k++) {
        const int i0 = (first + k * span + phase) * MQ;
        for (int i = i0; i < i0 + MQ; i++) rows[nr++] = i;
    }
    return nr;
}

/* Put (v, vi) at the root of the min-heap p / idx of n entries and sift it down. */
static void sift_down(float* p, int* idx, int n, float v, int vi) {
    int c = 0;
    for (;;) {
        int s = 2 * c + 1;
        if (s >= n) break;
        if (s + 1 < n && p[s + 1] < p[s]) s++;
        if (p[s] >= v) break;
        p[c] = p[s], idx[c] = idx[s];
        c = s;
    }
    p[c] = v, idx[c] = vi;
}

/* Keep the m largest of the far masses a[sinks .. far) (indices into a) in idx / p, largest
 * first: a min-heap of the m best so far, then sorted. */
static void top_entries(int* idx, float* p, const real* a, int sinks, int far, int m) {
    int n = 0;
    for (int j = sinks; j < far; j++) {
        const float v = (float)a[j];
        if (n < m) { /* sift up */
            int c = n++;
            while (c > 0 && p[(c - 1) / 2] > v) {
                p[c] = p[(c - 1) / 2], idx[c] = idx[(c - 1) / 2];
                c = (c - 1) / 2;
            }
            p[c] = v, idx[c] = j;
        } else if (v > p[0]) {
            sift_down(p, idx, n, v, j); /* in place of the smallest */
        }
    }
    /* heap order to largest first: the smallest moves to the end, the last entry to the root */
    for (int e = n - 1; e > 0; e--) {
        const float tv = p[0];
        const int ti = idx[0];
        sift_down(p, idx, e, p[e], idx[e]);
        p[e] = tv, idx[e] = ti;
    }
    for (int e = n; e < m; e++) p[e] = 0, idx[e] = -1;
}

void mass_choose_blocks(MassBlocks* b, const MassRows* t, const real* qkv, const real* gate,
                        int nblocks, int T, int NH, int NKV, int hs, int w, int sinks) {
    const int C = NH * hs, QKV = (NH + 2 * NKV) * hs, rep = NH / NKV, bs = b->bs;
    const int nb = (T + bs - 1) / bs;
    const size_t sbytes = BLOCKGATE_STAT_BYTES(hs); /* a block's statistics */
    const real scale = (real)(1.0 / sqrt((double)hs));
    int8_t* st = mallocCheck(sbytes * ((size_t)NKV * nb + 1));
#pragma omp parallel for schedule(static)
    for (int u = 0; u < NKV * nb; u++) {
        const int g = u / nb, c = u % nb, j1 = (c + 1) * bs < T ? (c + 1) * bs : T;
        blockgate_key_stats8(st + (size_t)u * sbytes, qkv + C + g * hs, QKV, c * bs, j1, hs);
    }
#pragma omp parallel
    {
        real* sc = mallocCheck(sizeof(real) * (nb + 1));
        real* p = mallocCheck(sizeof(real) * (T + 1 > rep * nb ? T + 1 : rep * nb));
        real lb[64];
#pragma omp for schedule(dynamic, 4)
        for (int r = 0; r < t->nq; r++) {
            const int i = t->rows[r], lo = i - w < 0 ? 0 : i - w;
            for (int g = 0; g < NKV; g++) {
                const real* q = qkv + (size_t)i * QKV + (size_t)g * rep * hs;
                for (int h = 0; h < rep && h < 64; h++) { /* the band's log-sum-exp per head */
                    real mx = -INFINITY;
                    int n = 0;
                    for (int j = 0; j <= i; j++) {
                        if (j >= sinks && j < lo) j = lo;
                        real d = 0;
                        for (int e = 0; e < hs; e++)
                            d += q[(size_t)h * hs + e] * qkv[(size_t)j * QKV + C + g * hs + e];
                        p[n] = d * scale;
                        mx = p[n] > mx ? p[n] : mx;
                        n++;
                    }
                    double sum = 0;
                    for (int e = 0; e < n; e++) sum += exp((double)(p[e] - mx));
                    lb[h] = mx + (real)log(sum);
                }
                const size_t rg = (size_t)r * NKV + g;
                b->nsel[rg] = block_select(b->sel + rg * b->nbmax, BLOCKS_LEARNED, q, rep,
                                           st + (size_t)g * nb * sbytes,
                                           gate + (size_t)g * rep * BLOCKGATE_WIDTH(hs), lb, 1,
                                           NULL, 0, i, w, sinks, bs, nblocks, 0, hs, sc, p);
            }
        }
        free(sc), free(p);
    }
    free(st);
}

/* The output-restoring score of one head (values = 1, see mass.h) for the task's rows: P (nr, n1)
 * the head's dense probabilities (keys 0..n1-1, 0 beyond each row), Pm (nr, n1) those of the keys
 * it misses (far and not in a chosen block; 0 elsewhere), v the head's values (row stride ld),
 * vn (n1) their squared norms, U (nr, hs) and O (nr, 2 hs) scratch. Adds to a (nr, n, each row's
 * far keys) c_ij / NH, c_ij = Pm_ij (v_j - o_S) . u / (|u| rho): the key's mass times how far its
 * value moves the kept keys' output o_S towards the missed keys' output o_M (u = o_M - o_S), in
 * units of the missed values' spread rho around o_S. Uses S (nr, n) as scratch. */
static void restore_scores(real* a, real* S, const real* P, const real* Pm, const real* v, int ld,
                           const real* vn, real* U, real* O, const int* rows, int nr, int n1, int n,
                           int hs, int w, int NH) {
    real* od = O;                   /* (nr, hs) sum_j P_ij v_j: the dense output */
    real* om = O + (size_t)nr * hs; /* (nr, hs) sum_j Pm_ij v_j */
    gemm(0, 0, nr, hs, n1, 1, P, n1, v, ld, 0, od, hs);
    gemm(0, 0, nr, hs, n1, 1, Pm, n1, v, ld, 0, om, hs);
    real cst[MQ];
    for (int r = 0; r < nr; r++) {
        const real* pm = Pm + (size_t)r * n1;
        const real* p = P + (size_t)r * n1;
        double zm = 0, z = 0, mv = 0;
        for (int j = 0; j <= rows[r] && j < n1; j++) zm += pm[j], z += p[j], mv += pm[j] * vn[j];
        const double zs = z - zm;
        real* u = U + (size_t)r * hs;
        cst[r] = 0;
        if (zm <= 1e-12 || zs <= 1e-12) {
            memset(u, 0, sizeof(real) * hs);
            continue;
        }
        /* o_S, o_M; rho^2 = sum_missed Pm_j |v_j - o_S|^2 / zm */
        double uu = 0, osm = 0, oss = 0;
        for (int e = 0; e < hs; e++) {
            const double os = (od[(size_t)r * hs + e] - om[(size_t)r * hs + e]) / zs;
            const double ue = om[(size_t)r * hs + e] / zm - os;
            u[e] = (real)ue;
            uu += ue * ue, osm += os * om[(size_t)r * hs + e], oss += os * os;
        }
        const double rho2 = (mv - 2 * osm + zm * oss) / zm, den = sqrt(uu * (rho2 > 0 ? rho2 : 0));
        double c = 0;
        for (int e = 0; e < hs; e++) {
            const double os = (od[(size_t)r * hs + e] - om[(size_t)r * hs + e]) / zs;
            u[e] = den > 1e-20 ? (real)(u[e] / den) : 0;
            c += os * u[e];
        }
        cst[r] = (real)c;
    }
    /* S = U v^T over the far keys: v_j . u / (|u| rho) */
    gemm(0, 1, nr, n, hs, 1, U, hs, v, ld, 0, S, n);
    for (int r = 0; r < nr; r++) {
        const int far = rows[r] - w;
        const real* pm = Pm + (size_t)r * n1;
        const real* s = S + (size_t)r * n;
        real* ar = a + (size_t)r * n;
        for (int j = 0; j < far; j++)
            if (pm[j] != 0) ar[j] += pm[j] * (s[j] - cst[r]) / NH;
    }
}

/* values = 3, the first pass over the heads: head h's dense output and that of the keys it
 * misses, OD and OM (nr, NH hs) at the head's columns, and their masses zd, zm (nr, NH). */
static void stream_collect(real* OD, real* OM, double* zd, double* zm, const real* P,
                           const real* Pm, const real* v, int ld, const int* rows, int nr, int n1,
                           int h, int NH, int hs) {
    const int A = NH * hs;
    gemm(0, 0, nr, hs, n1, 1, P, n1, v, ld, 0, OD + h * hs, A);
    gemm(0, 0, nr, hs, n1, 1, Pm, n1, v, ld, 0, OM + h * hs, A);
    for (int r = 0; r < nr; r++) {
        double a = 0, b = 0;
        for (int j = 0; j <= rows[r] && j < n1; j++)
            a += P[(size_t)r * n1 + j], b += Pm[(size_t)r * n1 + j];
        zd[(size_t)r * NH + h] = a, zm[(size_t)r * NH + h] = b;
    }
}

/* values = 3, between the passes: OM becomes each head's kept output o_S (OM's rows overwritten;
 * the dense output where the head misses nothing, its weight then 0), U (nr, NH hs) the stream's
 * error pulled back to the heads, u^h, and wgt (nr, NH) each head's factor Zbar_M / (Z_S^h |e|^2)
 * (0: nothing to score). Z (nr, 3 Cm) scratch. */
static void stream_directions(real* U, double* wgt, real* OM, const real* OD, const double* zd,
                              const double* zm, real* Z, const MassStream* st, int nr, int NH,
                              int hs) {
    const int A = NH * hs, Cm = st->Cm;
    for (int r = 0; r < nr; r++)
        for (int h = 0; h < NH; h++) {
            const double zs = zd[(size_t)r * NH + h] - zm[(size_t)r * NH + h];
            real* o = OM + (size_t)r * A + h * hs;
            const real* od = OD + (size_t)r * A + h * hs;
            for (int e = 0; e < hs; e++)
                o[e] = zs > 1e-12 && zm[(size_t)r * NH + h] > 1e-12 ? (real)((od[e] - o[e]) / zs)
                                                                    : od[e];
        }
    /* z_S and z_D (nr, Cm each) */
    real *zS = Z, *zD = Z + (size_t)nr * Cm, *g = Z + (size_t)2 * nr * Cm;
    gemm(0, 1, nr, Cm, A, 1, OM, A, st->wo, A, 0, zS, Cm);
    gemm(0, 1, nr, Cm, A, 1, OD, A, st->wo, A, 0, zD, Cm);
    for (int r = 0; r < nr; r++) {
        real *a = zS + (size_t)r * Cm, *d = zD + (size_t)r * Cm, *gr = g + (size_t)r * Cm;
        double ee = 0;
        if (st->norm) { /* e = N(z_D) - N(z_S); g = J^T e = s (w e) - z s^3 (z . w e) / Cm */
            double ssa = 0, ssd = 0;
            for (int c = 0; c < Cm; c++) ssa += (double)a[c] * a[c], ssd += (double)d[c] * d[c];
            const double sa = 1 / sqrt(ssa / Cm + st->eps), sd = 1 / sqrt(ssd / Cm + st->eps);
            double zwe = 0;
            for (int c = 0; c < Cm; c++) {
                const double e = st->norm[c] * (d[c] * sd - a[c] * sa);
                ee += e * e, zwe += a[c] * st->norm[c] * e;
                gr[c] = (real)(st->norm[c] * e);
            }
            for (int c = 0; c < Cm; c++)
                gr[c] = (real)(sa * gr[c] - a[c] * sa * sa * sa * zwe / Cm);
        } else {
            for (int c = 0; c < Cm; c++) {
                gr[c] = d[c] - a[c];
                ee += (double)gr[c] * gr[c];
            }
        }
        double zbar = 0;
        for (int h = 0; h < NH; h++) zbar += zm[(size_t)r * NH + h] / NH;
        for (int h = 0; h < NH; h++) {
            const double zs = zd[(size_t)r * NH + h] - zm[(size_t)r * NH + h];
            const int ok = ee > 1e-30 && zs > 1e-12 && zm[(size_t)r * NH + h] > 1e-12;
            wgt[(size_t)r * NH + h] = ok ? zbar / (zs * ee) : 0;
        }
    }
    gemm(0, 0, nr, A, Cm, 1, g, Cm, st->wo, A, 0, U, A);
}

/* values = 3, the second pass: adds head h's c_ij (see MassStream in mass.h) to a (nr, n, each
 * row's far keys); S (nr, n) scratch. */
static void stream_scores(real* a, real* S, const real* Pm, const real* v, int ld, const real* U,
                          const real* OS, const double* wgt, const int* rows, int nr, int n1, int n,
                          int h, int NH, int hs, int w) {
    const int A = NH * hs;
    gemm(0, 1, nr, n, hs, 1, U + h * hs, A, v, ld, 0, S, n);
    for (int r = 0; r < nr; r++) {
        const double wr = wgt[(size_t)r * NH + h];
        if (wr == 0) continue;
        double cst = 0;
        for (int e = 0; e < hs; e++)
            cst += (double)OS[(size_t)r * A + h * hs + e] * U[(size_t)r * A + h * hs + e];
        const int far = rows[r] - w;
        const real* pm = Pm + (size_t)r * n1;
        const real* s = S + (size_t)r * n;
        real* ar = a + (size_t)r * n;
        for (int j = 0; j < far; j++)
            if (pm[j] != 0) ar[j] += (real)(pm[j] * (s[j] - cst) * wr);
    }
}

void mass_teacher(MassRows* t, const real* qkv, const real* lse, int T, int NH, int NKV, int hs,
                  int w, int sinks, const MassBlocks* b, int values, const MassStream* stream) {
    const int C = NH * hs, QKV = (NH + 2 * NKV) * hs, rep = NH / NKV, m = t->m;
    if (b && rep > 64) fatal("the teacher beside a selector takes at most 64 heads per KV head");
    if ((values == 3) != (stream != NULL))
        fatal(
            "internal: the stream's teacher (values = 3) needs the output projection, and only it");
    const int Cm = stream ? stream->Cm : 0;
    const int ntask = (t->nq + MQ - 1) / MQ;
    const real scale = (real)(1.0 / sqrt((double)hs));
    /* the values' squared norms, per key/value head (the output-restoring score) */
    real* vn = values ? mallocCheck(sizeof(real) * (size_t)NKV * T) : NULL;
    for (int g = 0; values && g < NKV; g++)
        for (int j = 0; j < T; j++) {
            const real* v = qkv + (size_t)j * QKV + C + (NKV + g) * hs;
            double s = 0;
            for (int e = 0; e < hs; e++) s += (double)v[e] * v[e];
            vn[(size_t)g * T + j] = (real)s;
        }
#pragma omp parallel
    {
        real* q = mallocCheck(sizeof(real) * MQ * hs);
        real* S = mallocCheck(sizeof(real) * MQ * (size_t)T);
        real* A = mallocCheck(sizeof(real) * MQ * (size_t)T);
        real* P = values ? mallocCheck(sizeof(real) * MQ * (size_t)T) : NULL;
        real* Pm = values ? mallocCheck(sizeof(real) * MQ * (size_t)T) : NULL;
        real* U = values ? mallocCheck(sizeof(real) * MQ * (size_t)hs) : NULL;
        real* O = values ? mallocCheck(sizeof(real) * 2 * MQ * (size_t)hs) : NULL;
        unsigned char* chosen = b ? callocCheck((size_t)T / b->bs + 2, 1) : NULL;
        /* values = 3: the heads' outputs (dense, then missed / kept), their masses, the
         * directions and each head's factor, the stream's scratch */
        real* OD = stream ? mallocCheck(sizeof(real) * MQ * (size_t)C) : NULL;
        real* OM = stream ? mallocCheck(sizeof(real) * MQ * (size_t)C) : NULL;
        real* UH = stream ? mallocCheck(sizeof(real) * MQ * (size_t)C) : NULL;
        real* Z = stream ? mallocCheck(sizeof(real) * 3 * MQ * (size_t)Cm) : NULL;
        double* zd = stream ? mallocCheck(sizeof(double) * MQ * (size_t)NH) : NULL;
        double* zm = stream ? mallocCheck(sizeof(double) * MQ * (size_t)NH) : NULL;
        double* wgt = stream ? mallocCheck(sizeof(double) * MQ * (size_t)NH) : NULL;
#pragma omp for schedule(dynamic, 1)
        for (int task = 0; task < ntask; task++) {
            const int r0 = task * MQ, nr = t->nq - r0 < MQ ? t->nq - r0 : MQ;
            const int* rows = t->rows + r0;
            /* keys that are far for some row of the task (rows ascending); with values, every
             * key some row sees */
            const int n = rows[nr - 1] - w, n1 = values ? rows[nr - 1] + 1 : n;
            memset(A, 0, sizeof(real) * nr * (size_t)n);
            /* values = 3 goes over the heads twice: their outputs, then the scores */
            for (int pass = stream ? 0 : 1; pass < 2; pass++)
                for (int h = 0; h < NH; h++) {
                    for (int r = 0; r < nr; r++)
                        memcpy(q + (size_t)r * hs, qkv + (size_t)rows[r] * QKV + h * hs,
                               sizeof(real) * hs);
                    gemm(0, 1, nr, n1, hs, scale, q, hs, qkv + C + (h / rep) * hs, QKV, 0, S, n1);
                    const real* l = lse + (size_t)h * T;
                    for (int r = 0; r < nr; r++) {
                        const int i = rows[r], far = i - w;
                        const float li = (float)l[i];
                        real* s = S + (size_t)r * n1;
                        real* a = A + (size_t)r * n;
                        /* the blocks of this head's key/value head (beside a selector) */
                        const size_t rg = (size_t)(r0 + r) * NKV + h / rep;
                        const int* sg = b ? b->sel + rg * b->nbmax : NULL;
                        for (int e = 0; b && e < b->nsel[rg]; e++) chosen[sg[e]] = 1;
                        if (!values) { /* the mass the blocks miss (all far mass without them) */
                            for (int j = sinks; j < far; j++)
                                if (!b || !chosen[j / b->bs]) a[j] += exp_f((float)s[j] - li) / NH;
                        } else { /* the head's probabilities, and those of the keys it misses */
                            real* p = P + (size_t)r * n1;
                            real* pm = Pm + (size_t)r * n1;
                            for (int j = 0; j < n1; j++) {
                                p[j] = j <= i ? exp_f((float)s[j] - li) : 0;
                                pm[j] =
                                    j >= sinks && j < far && (!b || !chosen[j / b->bs]) ? p[j] : 0;
                            }
                        }
                        for (int e = 0; b && e < b->nsel[rg]; e++) chosen[sg[e]] = 0;
                    }
                    const real* vh = qkv + C + (NKV + h / rep) * hs;
                    if (stream && pass == 0) {
                        stream_collect(OD, OM, zd, zm, P, Pm, vh, QKV, rows, nr, n1, h, NH, hs);
                        if (h == NH - 1)
                            stream_directions(UH, wgt, OM, OD, zd, zm, Z, stream, nr, NH, hs);
                    } else if (stream) {
                        stream_scores(A, S, Pm, vh, QKV, UH, OM, wgt, rows, nr, n1, n, h, NH, hs,
                                      w);
                    } else if (values) {
                        restore_scores(A, S, P, Pm, vh, QKV, vn + (size_t)(h / rep) * T, U, O, rows,
                                       nr, n1, n, hs, w, NH);
                    }
                }
            for (int r = 0; r < nr; r++) {
                const int far = rows[r] - w;
                real* a = A + (size_t)r * n;
                int* idx = t->idx + (size_t)(r0 + r) * m;
                float* p = t->p + (size_t)(r0 + r) * m;
                /* values = 2 keeps the harm apart: the m / 2 keys of most negative score go to
                 * the second half of the entries, stored negative */
                if (values >= 2) {
                    real* neg = S + (size_t)r * n; /* free by now */
                    for (int j = 0; j < far; j++) neg[j] = a[j] < 0 ? -a[j] : 0;
                    top_entries(idx + m / 2, p + m / 2, neg, sinks, far, m - m / 2);
                    for (int e = m / 2; e < m; e++) p[e] = -p[e];
                }
                /* the output-restoring score is signed: a key whose value moves the output away
                 * from the dense one is not a key to keep */
                for (int j = sinks; values && j < far; j++) a[j] = a[j] > 0 ? a[j] : 0;
                double M = 0;
                for (int j = sinks; j < far; j++) M += a[j];
                t->far[r0 + r] = (float)M;
                top_entries(idx, p, a, sinks, far, values >= 2 ? m / 2 : m);
            }
        }
        free(q);
        free(S);
        free(A);
        free(P);
        free(Pm);
        free(U);
        free(O);
        free(chosen);
        free(OD), free(OM), free(UH), free(Z), free(zd), free(zm), free(wgt);
    }
    free(vn);
}

/* The gate of METHOD.md section 3 as a probability, and its derivative by the affinity; lambda
 * = 0: the affinity itself (the chance that two tokens drawn into groups by G_i and G_j meet). */
static inline double gate_of(double a, double lambda, double b, double* dg_da) {
    if (lambda == 0) {
        *dg_da = 1;
        return a;
    }
    const double g = 1 / (1 + exp(-lambda * (a - b)));
    *dg_da = lambda * g * (1 - g);
    return g;
}

static int argmax_row(const real* g, int K) {
    int best = 0;
    for (int k = 1; k < K; k++)
        if (g[k] > g[best]) best = k;
    return best;
}

/* The u-th random far key of query i (sinks <= j < i - w): a hash of (i, u), the same at every
 * step, so the pairs' share is estimated on a fixed sample. */
static int random_far(int i, int u, int w, int sinks) {
    uint64_t z = (uint64_t)i * 0x9e3779b97f4a7c15ull + (uint64_t)u * 0xbf58476d1ce4e5b9ull + 1;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return sinks + (int)(z % (uint64_t)(i - w - sinks));
}

/* a_ij = G_i . G_j; with dG, dG_i += c G_j and dG_j += c G_i. */
static double affinity(const real* gi, const real* gj, int K) {
    double a = 0;
    for (int k = 0; k < K; k++) a += (double)gi[k] * gj[k];
    return a;
}
static void affinity_backward(real* dgi, real* dgj, const real* gi, const real* gj, double c,
                              int K) {
    for (int k = 0; k < K; k++) {
        dgi[k] += (real)(c * gj[k]);
        dgj[k] += (real)(c * gi[k]);
    }
}

double mass_loss(real* dGq, real* dGk, const real* Gq, const real* Gk, int K, const MassRows* t,
                 const MassGate* mg, real scale, MassKept* kept_out) {
    /* eps: a query whose stored keys all sit in other groups costs at most -log(eps), so a few
     * queries the groups cannot serve do not outweigh the rest; and a query alone in its group
     * gains at most log(1 / eps) from the pairs term */
    const double eps = 0.01, lambda = mg->lambda, b = mg->b;
    const int R = mg->nrand;
    double total = 0, loss = 0, soft = 0, hard = 0, pairs = 0, pairs_hard = 0;
    int prow = 0;
    for (int r = 0; r < t->nq; r++) total += t->far[r];
    if (kept_out) memset(kept_out, 0, sizeof *kept_out);
    if (total <= 0) return 0;
    for (int r = 0; r < t->nq; r++) {
        const double M = t->far[r];
        if (M <= 0) continue;
        const int i = t->rows[r];
        const real* gi = Gq + (size_t)i * K;
        const int* idx = t->idx + (size_t)r * t->m;
        const float* p = t->p + (size_t)r * t->m;
        const int top_i = argmax_row(gi, K);
        double kept = 0, harm = 0, dg;
        for (int e = 0; e < t->m; e++) {
            if (idx[e] < 0) continue;
            const real* gj = Gk + (size_t)idx[e] * K;
            const double g = gate_of(affinity(gi, gj, K), lambda, b, &dg);
            if (p[e] < 0) { /* a key that moves the output away (mass_values = 2) */
                harm -= p[e] * g;
                continue;
            }
            kept += p[e] * g;
            if (argmax_row(gj, K) == top_i) hard += p[e];
        }
        /* the share of the query's far pairs the gate keeps, on R random far keys */
        double cost = 0;
        for (int u = 0; u < R; u++) {
            const real* gj = Gk + (size_t)random_far(i, u, mg->w, mg->sinks) * K;
            cost += gate_of(affinity(gi, gj, K), lambda, b, &dg) / R;
            pairs_hard += argmax_row(gj, K) == top_i;
        }
        soft += kept;
        pairs += cost;
        prow++;
        /* the harm counts against what is kept: -log(kept - harm) to first order in the harm */
        const double kd = kept + eps * M;
        loss -= M * log(kd / M);
        loss += M * harm / kd;
        if (R) loss += M * log(cost + eps);
        if (!dGq) continue;
        /* d loss / d kept = -M / kd - M harm / kd^2; d loss / d harm = M / kd; d loss / d cost
         * = M / (cost + eps); over the total */
        const double dk = (-M / kd - M * harm / (kd * kd)) / total * scale;
        const double dh = M / kd / total * scale;
        real* dgi = dGq + (size_t)i * K;
        for (int e = 0; e < t->m; e++) {
            if (idx[e] < 0) continue;
            const real* gj = Gk + (size_t)idx[e] * K;
            gate_of(affinity(gi, gj, K), lambda, b, &dg);
            const double c = p[e] < 0 ? dh * -p[e] * dg : dk * p[e] * dg;
            affinity_backward(dgi, dGk + (size_t)idx[e] * K, gi, gj, c, K);
        }
        const double dc = R ? M / (cost + eps) / total * scale / R : 0;
        for (int u = 0; u < R; u++) {
            const int j = random_far(i, u, mg->w, mg->sinks);
            const real* gj = Gk + (size_t)j * K;
            gate_of(affinity(gi, gj, K), lambda, b, &dg);
            affinity_backward(dgi, dGk + (size_t)j * K, gi, gj, dc * dg, K);
        }
    }
    if (kept_out) {
        kept_out->mass_gate = soft / total;
        kept_out->mass_top1 = hard / total;
        kept_out->pairs_gate = prow ? pairs / prow : 0;
        kept_out->pairs_top1 = prow && R ? pairs_hard / ((double)prow * R) : 0;
    }
    return loss / total;
}
