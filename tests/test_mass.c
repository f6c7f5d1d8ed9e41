/* test_mass.c: the mass objective (kernels/mass.h), in double precision: the teacher's far mass
 * and its largest entries against the dense attention written out; the row sample's size
 * independent of the seed; the loss's gradient (mass and pairs terms) through Sinkhorn routing
 * against central differences; and a plain descent on the scores that raises the far mass
 * top-1 groups keep per far pair they keep. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../kernels/mass.h"
#include "../kernels/router.h"
#include "../kernels/sparse.h"
#include "testutil.h"

enum { NH = 4, NKV = 2, HS = 8, T = 320, WIN = 20, SINKS = 2, KEYS = 12, K = 4 };

/* Head h's scaled score of query i for key j. */
static double score(const real* qkv, int h, int i, int j) {
    const int QKV = (NH + 2 * NKV) * HS, C = NH * HS, rep = NH / NKV;
    double d = 0;
    for (int e = 0; e < HS; e++)
        d += qkv[(size_t)i * QKV + h * HS + e] * qkv[(size_t)j * QKV + C + (h / rep) * HS + e];
    return d / sqrt((double)HS);
}

/* Dense causal attention's log-sum-exps (NH, T) and, for query i, each key's mass averaged over
 * the heads (a, T) restricted to the far keys. */
static void direct_except(const real* qkv, real* lse, double* a, int i, const MassBlocks* b,
                          int r_of_i);
static void direct(const real* qkv, real* lse, double* a, int i) {
    direct_except(qkv, lse, a, i, NULL, 0);
}

/* direct, each head's mass on the blocks b chose for row r_of_i and the head's key/value head
 * left out (b NULL: none) */
static void direct_except(const real* qkv, real* lse, double* a, int i, const MassBlocks* b,
                          int r_of_i) {
    const int rep = NH / NKV;
    for (int j = 0; j < T; j++) a[j] = 0;
    for (int h = 0; h < NH; h++)
        for (int r = 0; r < T; r++) {
            if (i >= 0 && r != i) continue;
            double s[T], mx = -INFINITY, z = 0;
            for (int j = 0; j <= r; j++) {
                s[j] = score(qkv, h, r, j);
                mx = fmax(mx, s[j]);
            }
            for (int j = 0; j <= r; j++) z += exp(s[j] - mx);
            const double l = mx + log(z);
            if (lse) lse[(size_t)h * T + r] = (real)l;
            if (i < 0) continue;
            for (int j = SINKS; j < r - WIN; j++) {
                int out = 0;
                const size_t rg = (size_t)r_of_i * NKV + h / rep;
                for (int e = 0; b && e < b->nsel[rg]; e++)
                    out |= b->sel[rg * b->nbmax + e] == j / b->bs;
                if (!out) a[j] += exp(s[j] - l) / NH;
            }
        }
}

/* A random sequence's q, k, v (qkv), its dense log-sum-exps (lse) and a teacher of its sampled
 * rows (into rows), its entries not yet filled. */
static MassRows teacher_input(Rng* rng, real** qkv, real** lse, int* rows) {
    const int QKV = (NH + 2 * NKV) * HS;
    *qkv = mallocCheck(sizeof(real) * T * QKV);
    tu_randn(*qkv, (size_t)T * QKV, 1.0, rng);
    *lse = mallocCheck(sizeof(real) * NH * T);
    double a[T];
    direct(*qkv, *lse, a, -1);
    const int nq = mass_sample_rows(rows, T, WIN, SINKS, 2, 7);
    return (MassRows){nq,
                      KEYS,
                      rows,
                      mallocCheck(sizeof(float) * nq),
                      mallocCheck(sizeof(int) * nq * KEYS),
                      mallocCheck(sizeof(float) * nq * KEYS)};
}

static void check_teacher(Rng* rng) {
    real *qkv, *lse;
    double a[T];
    int rows[T];
    MassRows t = teacher_input(rng, &qkv, &lse, rows);
    const int nq = t.nq;
    CHECK(nq > 0 && nq % 64 == 0, "sampled %d rows", nq);
    for (uint64_t seed = 1; seed < 6; seed++) {
        int other[T];
        CHECK(mass_sample_rows(other, T, WIN, SINKS, 2, seed) == nq, "row count depends on seed");
    }
    mass_teacher(&t, qkv, lse, T, NH, NKV, HS, WIN, SINKS, NULL, 0, NULL);
    double worst_far = 0, worst_p = 0;
    int order_ok = 1;
    for (int r = 0; r < nq; r++) {
        const int i = rows[r];
        CHECK(i - WIN > SINKS, "row %d has no far key", i);
        direct(qkv, NULL, a, i);
        double M = 0;
        for (int j = SINKS; j < i - WIN; j++) M += a[j];
        worst_far = fmax(worst_far, fabs(M - t.far[r]));
        /* the stored entries are the largest: each equals a[j], and none left out is larger */
        double smallest = INFINITY;
        for (int e = 0; e < KEYS; e++) {
            const int j = t.idx[(size_t)r * KEYS + e];
            if (j < 0) continue;
            CHECK(j >= SINKS && j < i - WIN, "row %d: key %d is not far", i, j);
            worst_p = fmax(worst_p, fabs(a[j] - t.p[(size_t)r * KEYS + e]));
            if (e && t.p[(size_t)r * KEYS + e] > t.p[(size_t)r * KEYS + e - 1]) order_ok = 0;
            smallest = fmin(smallest, a[j]);
            a[j] = -1; /* taken */
        }
        for (int j = SINKS; j < i - WIN; j++)
            if (a[j] > smallest + 1e-6) order_ok = 0;
    }
    CHECK(worst_far < 1e-5, "far mass off by %g", worst_far);
    CHECK(worst_p < 1e-5, "entries off by %g", worst_p);
    CHECK(order_ok, "entries not the largest, largest first");
    free(qkv), free(lse), free(t.far), free(t.idx), free(t.p);
}

/* The teacher beside a block selector: the blocks chosen per row and key/value head are
 * distinct candidates (distant keys past the sinks), as many as asked or every candidate; the far
 * mass is the dense mass left on the other keys, head by head. */
static void check_teacher_blocks(Rng* rng) {
    const int bs = 16, want = 3;
    real *qkv, *lse;
    double a[T];
    int rows[T];
    MassRows t = teacher_input(rng, &qkv, &lse, rows);
    const int nq = t.nq;
    real gate[NH * BLOCKGATE_WIDTH(HS)];
    blockgate_init(gate, NH, HS);
    for (int e = 0; e < NH * BLOCKGATE_WIDTH(HS); e++) gate[e] += 0.3 * rng_normal(rng);
    MassBlocks b = {mallocCheck(sizeof(int) * nq * NKV * (T / bs + 1)),
                    mallocCheck(sizeof(int) * nq * NKV), T / bs + 1, bs};
    mass_choose_blocks(&b, &t, qkv, gate, want, T, NH, NKV, HS, WIN, SINKS);
    int sel_ok = 1;
    for (int r = 0; r < nq; r++)
        for (int g = 0; g < NKV; g++) {
            const int i = rows[r], c0 = SINKS / bs, c1 = (i - WIN - 1) / bs + 1;
            const size_t rg = (size_t)r * NKV + g;
            const int n = b.nsel[rg];
            sel_ok &= n == (c1 - c0 < want ? c1 - c0 : want);
            for (int e = 0; e < n; e++) {
                const int c = b.sel[rg * b.nbmax + e];
                sel_ok &= c >= c0 && c < c1;
                for (int e2 = 0; e2 < e; e2++) sel_ok &= b.sel[rg * b.nbmax + e2] != c;
            }
        }
    CHECK(sel_ok, "the chosen blocks are not %d distinct candidates per row and head", want);
    mass_teacher(&t, qkv, lse, T, NH, NKV, HS, WIN, SINKS, &b, 0, NULL);
    double worst = 0, left = 0, all = 0;
    for (int r = 0; r < nq; r++) {
        const int i = rows[r];
        direct_except(qkv, NULL, a, i, &b, r);
        double M = 0;
        for (int j = SINKS; j < i - WIN; j++) M += a[j];
        worst = fmax(worst, fabs(M - t.far[r]));
        left += M;
        direct(qkv, NULL, a, i);
        for (int j = SINKS; j < i - WIN; j++) all += a[j];
    }
    printf(
        "  teacher beside %d blocks of %d: far mass %.3f of the dense far mass %.3f, off by %.1e\n",
        want, bs, left, all, worst);
    CHECK(worst < 1e-5, "far mass beside the blocks off by %g", worst);
    CHECK(left < all, "the blocks left out no mass (%g of %g)", left, all);
    free(qkv), free(lse), free(t.far), free(t.idx), free(t.p), free(b.sel), free(b.nsel);
}

/* The output-restoring teacher (values = 1) against its formula written out in double, with and
 * without blocks left out: for each row and head, the kept keys' output o_S, the missed keys'
 * o_M, u = o_M - o_S, rho^2 = the missed values' spread around o_S, and each missed key's
 * P (v_j - o_S) . u / (|u| rho); the heads' mean clipped at 0. */
static void direct_values(const real* qkv, double* a, int i, const MassBlocks* b, int r_of_i,
                          int clip) {
    const int QKV = (NH + 2 * NKV) * HS, C = NH * HS, rep = NH / NKV;
    for (int j = 0; j < T; j++) a[j] = 0;
    for (int h = 0; h < NH; h++) {
        const real* v0 = qkv + C + (NKV + h / rep) * HS;
        double s[T], mx = -INFINITY, z = 0;
        int missed[T];
        for (int j = 0; j <= i; j++) {
            s[j] = score(qkv, h, i, j);
            mx = fmax(mx, s[j]);
            int out = 0;
            const size_t rg = (size_t)r_of_i * NKV + h / rep;
            for (int e = 0; b && e < b->nsel[rg]; e++)
                out |= b->sel[rg * b->nbmax + e] == j / b->bs;
            missed[j] = j >= SINKS && j < i - WIN && !out;
        }
        for (int j = 0; j <= i; j++) z += exp(s[j] - mx);
        double os[HS] = {0}, om[HS] = {0}, zs = 0, zm = 0;
        for (int j = 0; j <= i; j++) {
            const double pj = exp(s[j] - mx) / z;
            for (int e = 0; e < HS; e++) (missed[j] ? om : os)[e] += pj * v0[(size_t)j * QKV + e];
            *(missed[j] ? &zm : &zs) += pj;
        }
        double u[HS], uu = 0, rho2 = 0;
        for (int e = 0; e < HS; e++)
            os[e] /= zs, om[e] /= zm, u[e] = om[e] - os[e], uu += u[e] * u[e];
        for (int j = 0; j <= i; j++)
            for (int e = 0; missed[j] && e < HS; e++) {
                const double d = v0[(size_t)j * QKV + e] - os[e];
                rho2 += exp(s[j] - mx) / z * d * d / zm;
            }
        for (int j = 0; j <= i; j++) {
            if (!missed[j]) continue;
            double d = 0;
            for (int e = 0; e < HS; e++) d += (v0[(size_t)j * QKV + e] - os[e]) * u[e];
            a[j] += exp(s[j] - mx) / z * d / sqrt(uu * rho2) / NH;
        }
    }
    for (int j = 0; clip && j < T; j++) a[j] = fmax(a[j], 0);
}

static void check_teacher_values(Rng* rng) {
    const int bs = 16;
    real *qkv, *lse;
    double a[T];
    int rows[T];
    MassRows t = teacher_input(rng, &qkv, &lse, rows);
    const int nq = t.nq;
    MassBlocks b = {mallocCheck(sizeof(int) * nq * NKV * (T / bs + 1)),
                    mallocCheck(sizeof(int) * nq * NKV), T / bs + 1, bs};
    real gate[NH * BLOCKGATE_WIDTH(HS)];
    blockgate_init(gate, NH, HS);
    mass_choose_blocks(&b, &t, qkv, gate, 3, T, NH, NKV, HS, WIN, SINKS);
    for (int with = 0; with < 2; with++) {
        const MassBlocks* bb = with ? &b : NULL;
        mass_teacher(&t, qkv, lse, T, NH, NKV, HS, WIN, SINKS, bb, 1, NULL);
        double worst_far = 0, worst_p = 0, left = 0, mass = 0;
        int order_ok = 1;
        for (int r = 0; r < nq; r++) {
            const int i = rows[r];
            direct_values(qkv, a, i, bb, r, 1);
            double M = 0;
            for (int j = SINKS; j < i - WIN; j++) M += a[j];
            worst_far = fmax(worst_far, fabs(M - t.far[r]));
            left += M;
            double ma[T];
            direct_except(qkv, NULL, ma, i, bb, r);
            for (int j = SINKS; j < i - WIN; j++) mass += ma[j];
            double smallest = INFINITY;
            for (int e = 0; e < KEYS; e++) {
                const int j = t.idx[(size_t)r * KEYS + e];
                if (j < 0) continue;
                worst_p = fmax(worst_p, fabs(a[j] - t.p[(size_t)r * KEYS + e]));
                smallest = fmin(smallest, a[j]);
                a[j] = -1;
            }
            for (int j = SINKS; j < i - WIN; j++)
                if (a[j] > smallest + 1e-5) order_ok = 0;
        }
        printf("  output-restoring teacher%s: %.3f (the missed mass %.3f), off by %.1e / %.1e\n",
               with ? " beside 3 blocks" : "", left, mass, worst_far, worst_p);
        CHECK(worst_far < 1e-4, "output-restoring far score off by %g", worst_far);
        CHECK(worst_p < 1e-5, "output-restoring entries off by %g", worst_p);
        CHECK(order_ok, "output-restoring entries not the largest");
        CHECK(left > 0, "the output-restoring teacher kept nothing");
    }
    /* values = 2: the same gains in the first half of the entries, the most negative scores
     * (stored negative) in the second */
    MassRows t2 = t;
    t2.m = 2 * KEYS;
    t2.idx = mallocCheck(sizeof(int) * nq * 2 * KEYS);
    t2.p = mallocCheck(sizeof(float) * nq * 2 * KEYS);
    mass_teacher(&t2, qkv, lse, T, NH, NKV, HS, WIN, SINKS, &b, 2, NULL);
    double worst = 0, harm = 0;
    int neg_ok = 1;
    for (int r = 0; r < nq; r++) {
        const int i = rows[r];
        direct_values(qkv, a, i, &b, r, 0);
        double smallest = INFINITY;
        for (int e = 0; e < 2 * KEYS; e++) {
            const int j = t2.idx[(size_t)r * 2 * KEYS + e];
            const double pe = t2.p[(size_t)r * 2 * KEYS + e];
            if (j < 0) continue;
            worst = fmax(worst, fabs(fmax(e < KEYS ? a[j] : -a[j], 0) - fabs(pe)));
            neg_ok &= e < KEYS ? pe >= 0 : pe <= 0;
            if (e >= KEYS) smallest = fmin(smallest, -pe), harm -= pe;
        }
        for (int e = KEYS; e < 2 * KEYS; e++) {
            const int j = t2.idx[(size_t)r * 2 * KEYS + e];
            if (j >= 0) a[j] = 0; /* taken */
        }
        for (int j = SINKS; j < i - WIN; j++)
            if (-a[j] > smallest + 1e-5) neg_ok = 0;
    }
    printf("  with the harm: %.3f of negative scores stored, entries off by %.1e\n", harm, worst);
    CHECK(worst < 1e-5, "signed entries off by %g", worst);
    CHECK(neg_ok && harm > 0, "the harm entries are not the most negative scores, stored negative");
    free(t2.idx), free(t2.p);
    free(qkv), free(lse), free(t.far), free(t.idx), free(t.p), free(b.sel), free(b.nsel);
}

/* The stream's teacher (values = 3) against its definition, in double: per query i, each
 * head's kept output o_S^h, kept and missed masses; the stream's error e = N(W_o o_D) - N(W_o
 * o_S); for a missed key j the stream's move when it joins every head's kept set, by central
 * differences of N (not through the Jacobian the kernel uses); c_ij = Zbar_M (move . e) /
 * |e|^2 (N: the RMS norm with weight nw, or nothing). */
enum { CM = 12 };
static double rms_norm(double* y, const double* z, const real* nw) {
    double ss = 0;
    for (int c = 0; c < CM; c++) ss += z[c] * z[c];
    const double s = 1 / sqrt(ss / CM + 1e-6);
    for (int c = 0; c < CM; c++) y[c] = nw ? nw[c] * z[c] * s : z[c];
    return s;
}
static void direct_stream(const real* qkv, const real* wo, const real* nw, double* a, int i,
                          const MassBlocks* b, int r_of_i) {
    const int QKV = (NH + 2 * NKV) * HS, C = NH * HS, rep = NH / NKV;
    static double P[NH][T], os[NH][HS], zs[NH];
    static int missed[NH][T];
    double od[C], zbar = 0, zS[CM] = {0}, zD[CM] = {0}, yS[CM], yD[CM], e[CM], ee = 0;
    for (int h = 0; h < NH; h++) {
        double s[T], mx = -INFINITY, z = 0, zm = 0;
        for (int j = 0; j <= i; j++) {
            s[j] = score(qkv, h, i, j);
            mx = fmax(mx, s[j]);
            int out = 0;
            const size_t rg = (size_t)r_of_i * NKV + h / rep;
            for (int x = 0; b && x < b->nsel[rg]; x++)
                out |= b->sel[rg * b->nbmax + x] == j / b->bs;
            missed[h][j] = j >= SINKS && j < i - WIN && !out;
        }
        for (int j = 0; j <= i; j++) z += exp(s[j] - mx);
        for (int x = 0; x < HS; x++) os[h][x] = od[h * HS + x] = 0;
        zs[h] = 0;
        for (int j = 0; j <= i; j++) {
            P[h][j] = exp(s[j] - mx) / z;
            const real* v = qkv + (size_t)j * QKV + C + (NKV + h / rep) * HS;
            for (int x = 0; x < HS; x++) {
                od[h * HS + x] += P[h][j] * v[x];
                if (!missed[h][j]) os[h][x] += P[h][j] * v[x];
            }
            if (missed[h][j])
                zm += P[h][j];
            else
                zs[h] += P[h][j];
        }
        for (int x = 0; x < HS; x++) os[h][x] /= zs[h];
        zbar += zm / NH;
    }
    for (int c = 0; c < CM; c++)
        for (int h = 0; h < NH; h++)
            for (int x = 0; x < HS; x++) {
                zS[c] += wo[(size_t)c * C + h * HS + x] * os[h][x];
                zD[c] += wo[(size_t)c * C + h * HS + x] * od[h * HS + x];
            }
    rms_norm(yS, zS, nw), rms_norm(yD, zD, nw);
    for (int c = 0; c < CM; c++) e[c] = yD[c] - yS[c], ee += e[c] * e[c];
    for (int j = 0; j < T; j++) a[j] = 0;
    for (int j = SINKS; j < i - WIN; j++) {
        double dz[CM] = {0}, zp[CM], zn[CM], yp[CM], yn[CM], d = 0;
        int any = 0;
        for (int h = 0; h < NH; h++) {
            if (!missed[h][j]) continue;
            any = 1;
            const real* v = qkv + (size_t)j * QKV + C + (NKV + h / rep) * HS;
            for (int c = 0; c < CM; c++)
                for (int x = 0; x < HS; x++)
                    dz[c] += wo[(size_t)c * C + h * HS + x] * P[h][j] * (v[x] - os[h][x]) / zs[h];
        }
        if (!any) continue;
        const double eps = 1e-5;
        for (int c = 0; c < CM; c++) zp[c] = zS[c] + eps * dz[c], zn[c] = zS[c] - eps * dz[c];
        rms_norm(yp, zp, nw), rms_norm(yn, zn, nw);
        for (int c = 0; c < CM; c++) d += (yp[c] - yn[c]) / (2 * eps) * e[c];
        a[j] = zbar * d / ee;
    }
}

static void check_teacher_stream(Rng* rng) {
    const int bs = 16, C = NH * HS;
    real *qkv, *lse, wo[CM * NH * HS], nw[CM];
    double a[T];
    int rows[T];
    MassRows t = teacher_input(rng, &qkv, &lse, rows);
    const int nq = t.nq;
    tu_randn(wo, (size_t)CM * C, 0.3, rng);
    for (int c = 0; c < CM; c++) nw[c] = (real)(0.5 + rng_uniform(rng));
    MassBlocks b = {mallocCheck(sizeof(int) * nq * NKV * (T / bs + 1)),
                    mallocCheck(sizeof(int) * nq * NKV), T / bs + 1, bs};
    real gate[NH * BLOCKGATE_WIDTH(HS)];
    blockgate_init(gate, NH, HS);
    mass_choose_blocks(&b, &t, qkv, gate, 3, T, NH, NKV, HS, WIN, SINKS);
    MassRows t2 = t;
    t2.m = 2 * KEYS;
    t2.idx = mallocCheck(sizeof(int) * nq * 2 * KEYS);
    t2.p = mallocCheck(sizeof(float) * nq * 2 * KEYS);
    for (int normed = 0; normed < 2; normed++) {
        const MassStream st = {wo, normed ? nw : NULL, CM, (real)1e-6};
        mass_teacher(&t2, qkv, lse, T, NH, NKV, HS, WIN, SINKS, &b, 3, &st);
        double worst = 0, worst_far = 0, big = 0, gain = 0, harm = 0;
        int order_ok = 1;
        for (int r = 0; r < nq; r++) {
            const int i = rows[r];
            direct_stream(qkv, wo, normed ? nw : NULL, a, i, &b, r);
            double M = 0;
            for (int j = SINKS; j < i - WIN; j++) M += fmax(a[j], 0), big = fmax(big, fabs(a[j]));
            worst_far = fmax(worst_far, fabs(M - t2.far[r]) / (M > 1e-3 ? M : 1e-3));
            double smallest = INFINITY, least = INFINITY;
            for (int e = 0; e < 2 * KEYS; e++) {
                const int j = t2.idx[(size_t)r * 2 * KEYS + e];
                const double pe = t2.p[(size_t)r * 2 * KEYS + e];
                if (j < 0) continue;
                worst = fmax(worst, fabs(fmax(e < KEYS ? a[j] : -a[j], 0) - fabs(pe)));
                order_ok &= e < KEYS ? pe >= 0 : pe <= 0;
                if (e < KEYS)
                    smallest = fmin(smallest, pe), gain += pe;
                else
                    least = fmin(least, -pe), harm -= pe;
            }
            for (int e = 0; e < 2 * KEYS; e++) {
                const int j = t2.idx[(size_t)r * 2 * KEYS + e];
                if (j >= 0) a[j] = 0; /* taken */
            }
            for (int j = SINKS; j < i - WIN; j++)
                if (a[j] > smallest + 1e-5 || -a[j] > least + 1e-5) order_ok = 0;
        }
        printf(
            "  the stream's teacher%s beside 3 blocks: gains %.3f, harm %.3f stored; entries off "
            "by %.1e (largest score %.2f), far score by %.1e relative\n",
            normed ? ", normed" : "", gain, harm, worst, big, worst_far);
        CHECK(worst < 1e-4 * (1 + big), "stream scores off by %g", worst);
        CHECK(worst_far < 1e-3, "stream far score off by %g", worst_far);
        CHECK(order_ok, "the stream's entries are not the largest gains and harms, signed");
        CHECK(gain > 0 && harm > 0, "the stream's teacher stored no gain or no harm");
    }
    free(t2.idx), free(t2.p);
    free(qkv), free(lse), free(t.far), free(t.idx), free(t.p), free(b.sel), free(b.nsel);
}

/* A synthetic teacher: rows with random far keys and masses. */
static MassRows synthetic(Rng* rng, int nq) {
    MassRows t = {nq,
                  KEYS,
                  mallocCheck(sizeof(int) * nq),
                  mallocCheck(sizeof(float) * nq),
                  mallocCheck(sizeof(int) * nq * KEYS),
                  mallocCheck(sizeof(float) * nq * KEYS)};
    for (int r = 0; r < nq; r++) {
        t.rows[r] = T - 1 - r * 2;
        t.far[r] = (float)(0.2 + 0.7 * rng_uniform(rng));
        double left = t.far[r];
        for (int e = 0; e < KEYS; e++) {
            const int keep = e < KEYS - 2;
            t.idx[(size_t)r * KEYS + e] = keep ? (int)(rng_u64(rng) % (uint64_t)(T / 2)) : -1;
            t.p[(size_t)r * KEYS + e] = keep ? (float)(left * 0.4) : 0;
            left *= keep ? 0.6 : 1;
        }
    }
    return t;
}

static const MassGate GATE = {10, 0.5, 6, 3, 2}; /* lambda, b, random keys, w, sinks */

static double loss_of(const real* S, const MassRows* t, real* G) {
    routing_forward(G, NULL, S, NULL, ROUTE_SINKHORN, 1, T, K, 0.5, 10);
    return mass_loss(NULL, NULL, G, G, K, t, &GATE, 1, NULL);
}

static void check_gradient(Rng* rng) {
    MassRows t = synthetic(rng, 40);
    real* S = mallocCheck(sizeof(real) * T * K);
    real* G = mallocCheck(sizeof(real) * T * K);
    real* dG = callocCheck((size_t)T * K, sizeof(real));
    real* dS = callocCheck((size_t)T * K, sizeof(real));
    tu_randn(S, (size_t)T * K, 0.5, rng);
    routing_forward(G, NULL, S, NULL, ROUTE_SINKHORN, 1, T, K, 0.5, 10);
    mass_loss(dG, dG, G, G, K, &t, &GATE, 1, NULL);
    routing_backward(dS, dG, S, G, NULL, ROUTE_SINKHORN, 1, T, K, 0.5, 10);
    double worst = 0, scale = 0;
    for (int n = 0; n < 60; n++) {
        const size_t i = rng_u64(rng) % ((size_t)T * K);
        const real keep = S[i], eps = 1e-5;
        S[i] = keep + eps;
        const double up = loss_of(S, &t, G);
        S[i] = keep - eps;
        const double down = loss_of(S, &t, G);
        S[i] = keep;
        const double fd = (up - down) / (2 * eps);
        worst = fmax(worst, fabs(fd - dS[i]));
        scale = fmax(scale, fabs(fd));
    }
    CHECK(scale > 1e-6, "the sampled gradient is zero (%g): the check would prove nothing", scale);
    CHECK(worst < 1e-6 + 1e-5 * scale, "gradient through Sinkhorn off by %g (largest %g)", worst,
          scale);
    /* descent on the scores: more far mass per far pair in top-1 groups */
    MassKept before, after;
    double lb, la;
    routing_forward(G, NULL, S, NULL, ROUTE_SINKHORN, 1, T, K, 0.5, 10);
    lb = mass_loss(NULL, NULL, G, G, K, &t, &GATE, 1, &before);
    for (int it = 0; it < 200; it++) {
        memset(dG, 0, sizeof(real) * T * K);
        memset(dS, 0, sizeof(real) * T * K);
        routing_forward(G, NULL, S, NULL, ROUTE_SINKHORN, 1, T, K, 0.5, 10);
        mass_loss(dG, dG, G, G, K, &t, &GATE, 1, NULL);
        routing_backward(dS, dG, S, G, NULL, ROUTE_SINKHORN, 1, T, K, 0.5, 10);
        for (size_t i = 0; i < (size_t)T * K; i++) S[i] -= 20 * dS[i];
    }
    routing_forward(G, NULL, S, NULL, ROUTE_SINKHORN, 1, T, K, 0.5, 10);
    la = mass_loss(NULL, NULL, G, G, K, &t, &GATE, 1, &after);
    CHECK(la < lb, "descent did not lower the loss (%g -> %g)", lb, la);
    const double lift0 = before.mass_top1 / fmax(before.pairs_top1, 1e-9),
                 lift1 = after.mass_top1 / fmax(after.pairs_top1, 1e-9);
    CHECK(lift1 > lift0 + 0.5 && after.mass_top1 > before.mass_top1,
          "top-1 groups keep %.3f of the far mass at %.3f of the pairs, %.3f at %.3f before",
          after.mass_top1, after.pairs_top1, before.mass_top1, before.pairs_top1);
    free(S), free(G), free(dG), free(dS);
    free(t.rows), free(t.far), free(t.idx), free(t.p);
}

/* A router with a query projection: the queries' groups Gq apart from the keys' G (causal
 * routing), each one's gradient by finite differences of its scores. */
static double loss_qk(const real* Sq, const real* Sk, const MassRows* t, real* Gq, real* Gk) {
    routing_forward(Gq, NULL, Sq, NULL, ROUTE_CAUSAL, 1, T, K, 0.5, 10);
    routing_forward(Gk, NULL, Sk, NULL, ROUTE_CAUSAL, 1, T, K, 0.5, 10);
    return mass_loss(NULL, NULL, Gq, Gk, K, t, &GATE, 1, NULL);
}

static void check_gradient_qk(Rng* rng) {
    MassRows t = synthetic(rng, 40);
    /* harm (mass_values = 2): on odd rows the two last entries are keys stored negative */
    for (int r = 1; r < t.nq; r += 2)
        for (int e = KEYS - 2; e < KEYS; e++) {
            t.idx[(size_t)r * KEYS + e] = (int)(rng_u64(rng) % (uint64_t)(T / 2));
            t.p[(size_t)r * KEYS + e] = -0.15f * t.far[r];
        }
    const size_t n = (size_t)T * K;
    real* buf = callocCheck(n * 6, sizeof(real));
    real *S[2] = {buf, buf + n}, *G[2] = {buf + 2 * n, buf + 3 * n},
         *dG[2] = {buf + 4 * n, buf + 5 * n};
    real* dS[2] = {callocCheck(n, sizeof(real)), callocCheck(n, sizeof(real))};
    tu_randn(buf, 2 * n, 0.5, rng);
    loss_qk(S[0], S[1], &t, G[0], G[1]);
    mass_loss(dG[0], dG[1], G[0], G[1], K, &t, &GATE, 1, NULL);
    for (int s = 0; s < 2; s++)
        routing_backward(dS[s], dG[s], S[s], G[s], NULL, ROUTE_CAUSAL, 1, T, K, 0.5, 10);
    for (int s = 0; s < 2; s++) {
        double worst = 0, scale = 0;
        for (int k = 0; k < 60; k++) {
            const size_t i = rng_u64(rng) % n;
            const real keep = S[s][i], eps = 1e-5;
            S[s][i] = keep + eps;
            const double up = loss_qk(S[0], S[1], &t, G[0], G[1]);
            S[s][i] = keep - eps;
            const double down = loss_qk(S[0], S[1], &t, G[0], G[1]);
            S[s][i] = keep;
            const double fd = (up - down) / (2 * eps);
            worst = fmax(worst, fabs(fd - dS[s][i]));
            scale = fmax(scale, fabs(fd));
        }
        printf("  query projection: gradient of the %s' scores off by %.1e (largest %.1e)\n",
               s ? "keys" : "queries", worst, scale);
        CHECK(scale > 1e-6, "the sampled gradient is zero (%g)", scale);
        CHECK(worst < 1e-6 + 1e-5 * scale, "%s' gradient off by %g (largest %g)",
              s ? "keys" : "queries", worst, scale);
    }
    free(buf), free(dS[0]), free(dS[1]);
    free(t.rows), free(t.far), free(t.idx), free(t.p);
}

int main(void) {
    Rng rng;
    rng_seed(&rng, 42);
    check_teacher(&rng);
    check_teacher_blocks(&rng);
    check_teacher_values(&rng);
    check_teacher_stream(&rng);
    check_gradient(&rng);
    check_gradient_qk(&rng);
    return tu_finish("test_mass");
}
