/* test_sparse.c: the flash-style dense kernel and the hard top-k executor against the masked
 * dense reference (attention_forward), to float round-off: K in {4, 8}, k in {1, 2, 3}, grouped-
 * query attention, T not a multiple of the tile sizes, empty groups, windows wider than a tile;
 * k = K equals dense. The training-free patterns: the band (sinks + window) against the masked
 * reference; block selection (Quest bounds, mean keys, oracle) against a per-query reference
 * written out here, with its pair count, and the oracle's kept mass at least every other
 * selection's. */
#include <math.h>
#include <string.h>

#include "../kernels/attention.h"
#include "../kernels/cpu.h"
#include "../kernels/quant.h"
#include "../kernels/sparse.h"
#include "../kernels/tile.h"
#include "testutil.h"

enum { NH = 4, NKV = 2, HS = 32 };

static double rel_err(const real* a, const real* b, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs(a[i] - b[i])), s = fmax(s, fabs(b[i]));
    return d / (s > 0 ? s : 1);
}

static void run(int B, int T, int K, int topk, int w, int empty_group, int sinks, Rng* rng) {
    size_t nqkv = (size_t)B * T * (NH + 2 * NKV) * HS, nout = (size_t)B * T * NH * HS,
           nl = (size_t)B * NH * T;
    real* qkv = mallocCheck(sizeof(real) * nqkv);
    real *ref = mallocCheck(sizeof(real) * nout), *got = mallocCheck(sizeof(real) * nout);
    real *lref = mallocCheck(sizeof(real) * nl), *lgot = mallocCheck(sizeof(real) * nl);
    uint32_t* mask = mallocCheck(sizeof(uint32_t) * B * T);
    tu_randn(qkv, nqkv, 1.5, rng);
    int avail = empty_group ? K - 1 : K;
    for (int i = 0; i < B * T; i++) {
        uint32_t m = 0;
        while (__builtin_popcount(m) < (topk < avail ? topk : avail))
            m |= 1u << (rng_u64(rng) % (uint64_t)avail);
        mask[i] = i % T < sinks ? (1u << K) - 1 : m; /* sinks: members of every group */
    }
    AttnGate g = {GATE_HARD, K, w, NULL, mask, 0, 0, sinks};
    attention_forward(ref, lref, qkv, &g, B, T, NH, NKV, HS);
    attention_hard_forward(got, lgot, qkv, mask, mask, K, w, B, T, NH, NKV, HS);
    double eo = rel_err(got, ref, nout), el = rel_err(lgot, lref, nl);
    printf(
        "  executor vs masked dense: B=%d T=%5d K=%d k=%d w=%3d sinks=%d%s  out %.1e  lse %.1e\n",
        B, T, K, topk, w, sinks, empty_group ? " (empty group)" : "", eo, el);
    CHECK(eo < 2e-5 && el < 2e-5, "executor differs (out %g, lse %g) at T=%d K=%d k=%d", eo, el, T,
          K, topk);
    free(qkv), free(ref), free(got), free(lref), free(lgot), free(mask);
}

/* A router with a query projection: queries keep topk groups (qmask), keys their top-1 group
 * (kmask), sinks every group. The executor and the pair count against attention written out
 * here: query i keeps key j <= i when i - j <= w or qmask[i] & kmask[j]. */
static void run_qk(int B, int T, int K, int topk, int w, int sinks, Rng* rng) {
    const int QKV = (NH + 2 * NKV) * HS, C = NH * HS;
    size_t nqkv = (size_t)B * T * QKV, nout = (size_t)B * T * C, nl = (size_t)B * NH * T;
    real* qkv = mallocCheck(sizeof(real) * nqkv);
    real *ref = mallocCheck(sizeof(real) * nout), *got = mallocCheck(sizeof(real) * nout);
    real *lref = mallocCheck(sizeof(real) * nl), *lgot = mallocCheck(sizeof(real) * nl);
    uint32_t* qm = mallocCheck(sizeof(uint32_t) * B * T * 2);
    uint32_t* km = qm + B * T;
    double* p = mallocCheck(sizeof(double) * T);
    tu_randn(qkv, nqkv, 1.5, rng);
    for (int i = 0; i < B * T; i++) {
        uint32_t m = 0;
        while (__builtin_popcount(m) < topk) m |= 1u << (rng_u64(rng) % (uint64_t)K);
        const int sink = i % T < sinks;
        const uint32_t all = K >= 32 ? ~0u : (1u << K) - 1;
        qm[i] = sink ? all : m;
        km[i] = sink ? all : 1u << (rng_u64(rng) % (uint64_t)K);
    }
    double pairs = 0, counted = 0;
    for (int b = 0; b < B; b++) {
        const real* base = qkv + (size_t)b * T * QKV;
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < T; i++) {
                const real* q = base + (size_t)i * QKV + h * HS;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= i; j++) {
                    p[j] = -INFINITY;
                    if (i - j > w && !(qm[b * T + i] & km[b * T + j])) continue;
                    const real* k = base + (size_t)j * QKV + C + h / (NH / NKV) * HS;
                    double s = 0;
                    for (int e = 0; e < HS; e++) s += (double)q[e] * k[e];
                    p[j] = s / sqrt((double)HS);
                    mx = fmax(mx, p[j]);
                    pairs += h == 0;
                }
                real* o = ref + ((size_t)b * T + i) * C + h * HS;
                for (int e = 0; e < HS; e++) o[e] = 0;
                for (int j = 0; j <= i; j++) {
                    if (p[j] == -INFINITY) continue;
                    const double a = exp(p[j] - mx);
                    sum += a;
                    const real* v = base + (size_t)j * QKV + C + NKV * HS + h / (NH / NKV) * HS;
                    for (int e = 0; e < HS; e++) o[e] += (real)(a * v[e]);
                }
                for (int e = 0; e < HS; e++) o[e] = (real)(o[e] / sum);
                lref[((size_t)b * NH + h) * T + i] = (real)(mx + log(sum));
            }
        counted += mask_pairs_kept(qm + b * T, km + b * T, T, w, 0);
    }
    attention_hard_forward(got, lgot, qkv, qm, km, K, w, B, T, NH, NKV, HS);
    double eo = rel_err(got, ref, nout), el = rel_err(lgot, lref, nl);
    printf(
        "  executor, query and key masks, vs attention written out: B=%d T=%4d K=%d k=%d w=%3d "
        "sinks=%d  out %.1e  lse %.1e  pairs %.0f\n",
        B, T, K, topk, w, sinks, eo, el, pairs);
    CHECK(eo < 2e-5 && el < 2e-5, "executor (query and key masks) differs (out %g, lse %g) at T=%d",
          eo, el, T);
    CHECK(counted == pairs, "mask_pairs_kept with query and key masks: %g, counted %g", counted,
          pairs);
    free(qkv), free(ref), free(got), free(lref), free(lgot), free(qm), free(p);
}

/* sinks + window against the reference with empty group masks (only band pairs survive) */
static void run_band(int B, int T, int w, int sinks, Rng* rng) {
    size_t nqkv = (size_t)B * T * (NH + 2 * NKV) * HS, nout = (size_t)B * T * NH * HS,
           nl = (size_t)B * NH * T;
    real* qkv = mallocCheck(sizeof(real) * nqkv);
    real *ref = mallocCheck(sizeof(real) * nout), *got = mallocCheck(sizeof(real) * nout);
    real *lref = mallocCheck(sizeof(real) * nl), *lgot = mallocCheck(sizeof(real) * nl);
    uint32_t* mask = callocCheck((size_t)B * T, sizeof(uint32_t));
    tu_randn(qkv, nqkv, 1.5, rng);
    AttnGate g = {GATE_HARD, 1, w, NULL, mask, 0, 0, sinks};
    attention_forward(ref, lref, qkv, &g, B, T, NH, NKV, HS);
    attention_band_forward(got, lgot, qkv, w, sinks, B, T, NH, NKV, HS);
    double eo = rel_err(got, ref, nout), el = rel_err(lgot, lref, nl);
    printf("  band vs masked dense: B=%d T=%5d w=%4d sinks=%d  out %.1e  lse %.1e\n", B, T, w,
           sinks, eo, el);
    CHECK(eo < 2e-5 && el < 2e-5, "band differs (out %g, lse %g) at T=%d w=%d sinks=%d", eo, el, T,
          w, sinks);
    double kept = 0, want = 0;
    for (int i = 0; i < T; i++) {
        kept += band_pairs_kept(i, w, sinks);
        for (int j = 0; j <= i; j++) want += i - j <= w || j < sinks;
    }
    CHECK(kept == want, "band pairs %g, counted %g (T=%d w=%d sinks=%d)", kept, want, T, w, sinks);
    free(qkv), free(ref), free(got), free(lref), free(lgot), free(mask);
}

/* The learned selector's scores written out (sparse.h): per query head the logit of each
 * candidate block from its keys' mean, variance, min and max, plus the log of its distant key
 * count, normalised with the band's exact log-partition; summed over the key/value head's query
 * heads. s: the dense scores (T, NH) of query i; keep: its band. */
/* a block's statistic (hs values) as the selection reads it: rounded to bytes of its largest
 * magnitude over 127 (blockgate_key_stats8); a query's features the same way */
static void as_bytes(double* x, int n) {
    float m = 0;
    for (int e = 0; e < n; e++) m = fmaxf(m, fabsf((float)x[e]));
    const float inv = m > 0 ? 127.0f / m : 0, scale = m / 127.0f;
    for (int e = 0; e < n; e++) x[e] = (double)((float)lrintf((float)x[e] * inv) * scale);
}

/* block c's statistics of key/value head kvh's keys, as the selection reads them */
static void block_stats(double* mean, double* var, double* lo, double* hi, const real* base,
                        int kvh, int c, int bs, int T) {
    const int C = NH * HS, QKV = (NH + 2 * NKV) * HS;
    for (int e = 0; e < HS; e++) {
        int n = 0;
        lo[e] = INFINITY, hi[e] = -INFINITY, mean[e] = 0, var[e] = 0;
        for (int j = c * bs; j < (c + 1) * bs && j < T; j++, n++) {
            double x = base[(size_t)j * QKV + C + kvh * HS + e];
            lo[e] = fmin(lo[e], x), hi[e] = fmax(hi[e], x), mean[e] += x;
        }
        mean[e] /= n;
        for (int j = c * bs; j < (c + 1) * bs && j < T; j++) {
            double x = base[(size_t)j * QKV + C + kvh * HS + e];
            var[e] += (x - mean[e]) * (x - mean[e]) / n;
        }
    }
    as_bytes(mean, HS), as_bytes(var, HS), as_bytes(lo, HS), as_bytes(hi, HS);
}

static void learned_scores(double* sc, const real* base, const double* s, const char* keep,
                           const real* gate, int kvh, int i, int w, int sinks, int bs, int c0,
                           int c1, int T) {
    const int QKV = (NH + 2 * NKV) * HS, rep = NH / NKV, W = BLOCKGATE_WIDTH(HS);
    const double scale = 1 / sqrt((double)HS);
    for (int c = c0; c < c1; c++) sc[c] = 0;
    for (int h = kvh * rep; h < (kvh + 1) * rep; h++) {
        const real* q = base + (size_t)i * QKV + h * HS;
        const real* g = gate + (size_t)h * W;
        double lg[64], mx = -INFINITY, band = 0;
        for (int j = 0; j <= i; j++)
            if (keep[j]) mx = fmax(mx, s[(size_t)j * NH + h]);
        for (int j = 0; j <= i; j++)
            if (keep[j]) band += exp(s[(size_t)j * NH + h] - mx);
        const double lb = mx + log(band);
        double z = 1; /* the band, relative to lb */
        for (int c = c0; c < c1; c++) {
            double mean[HS], var[HS], lo[HS], hi[HS];
            block_stats(mean, var, lo, hi, base, kvh, c, bs, T);
            /* the features, in bytes as the statistics: g x in the minimum's place where x < 0,
             * else in the maximum's */
            double f[4][HS];
            for (int e = 0; e < HS; e++) {
                const double x = scale * q[e], gx = g[1 + 2 * HS + e] * x;
                f[0][e] = g[1 + e] * x, f[1][e] = g[1 + HS + e] * x * x;
                f[2][e] = x < 0 ? gx : 0, f[3][e] = x < 0 ? 0 : gx;
            }
            for (int a = 0; a < 4; a++) as_bytes(f[a], HS);
            double v = g[0];
            for (int e = 0; e < HS; e++)
                v += f[0][e] * mean[e] + f[1][e] * var[e] + f[2][e] * lo[e] + f[3][e] * hi[e];
            int d = 0;
            for (int j = c * bs; j < (c + 1) * bs && j < i - w; j++) d += j >= sinks;
            lg[c - c0] = v + log((double)d);
            z += exp(lg[c - c0] - lb);
        }
        for (int c = c0; c < c1; c++) sc[c] += exp(lg[c - c0] - lb - log(z));
    }
}

/* Block selection written out per query: the candidate blocks' scores from the keys themselves,
 * the nsel best (ties to the earlier block), then a plain softmax over sinks, window and the
 * chosen blocks' distant keys. Returns the pairs kept; *mass (unless NULL) gains the dense
 * attention mass the kept pairs hold, summed over queries and heads. */
static double blocks_reference(real* out, real* lse, const real* qkv, int w, int sinks, int bs,
                               int nsel, double cover, BlockScore score, const real* gate,
                               const uint32_t* qm, const uint32_t* km, int B, int T, double* mass) {
    const int C = NH * HS, QKV = (NH + 2 * NKV) * HS, rep = NH / NKV, nb = (T + bs - 1) / bs;
    const double scale = 1 / sqrt((double)HS);
    double kept = 0;
    double* s = mallocCheck(sizeof(double) * T * NH);
    double* sc = mallocCheck(sizeof(double) * nb);
    char* keep = mallocCheck(T);
    for (int b = 0; b < B; b++) {
        const real* base = qkv + (size_t)b * T * QKV;
        for (int i = 0; i < T; i++)
            for (int kvh = 0; kvh < NKV; kvh++) {
                /* every head's dense scores and log-sum-exp */
                double dl[NH];
                for (int h = kvh * rep; h < (kvh + 1) * rep; h++) {
                    double mx = -INFINITY, sum = 0;
                    for (int j = 0; j <= i; j++) {
                        double d = 0;
                        for (int e = 0; e < HS; e++)
                            d += base[(size_t)i * QKV + h * HS + e] *
                                 base[(size_t)j * QKV + C + kvh * HS + e];
                        s[(size_t)j * NH + h] = d * scale;
                        mx = fmax(mx, d * scale);
                    }
                    for (int j = 0; j <= i; j++) sum += exp(s[(size_t)j * NH + h] - mx);
                    dl[h] = mx + log(sum);
                }
                for (int j = 0; j <= i; j++) keep[j] = i - j <= w || j < sinks;
                int c0 = sinks / bs, c1 = i - w > sinks ? (i - w - 1) / bs + 1 : c0;
                if (score == BLOCKS_LEARNED)
                    learned_scores(sc, base, s, keep, gate, kvh, i, w, sinks, bs, c0, c1, T);
                for (int c = c0; c < c1 && score != BLOCKS_LEARNED; c++) {
                    double mean[HS], var[HS], lo[HS], hi[HS];
                    if (score != BLOCKS_ORACLE) block_stats(mean, var, lo, hi, base, kvh, c, bs, T);
                    sc[c] = 0;
                    for (int h = kvh * rep; h < (kvh + 1) * rep; h++) {
                        const real* q = base + (size_t)i * QKV + h * HS;
                        if (score == BLOCKS_ORACLE) {
                            for (int j = c * bs; j < (c + 1) * bs && j < i - w; j++)
                                if (j >= sinks) sc[c] += exp(s[(size_t)j * NH + h] - dl[h]);
                            continue;
                        }
                        /* the query in bytes, as the statistics: Quest's q e lo_e where q_e < 0,
                         * else q_e hi_e (two parts), the mean key's q */
                        double qn[HS], qp[HS];
                        for (int e = 0; e < HS; e++)
                            qn[e] = q[e] < 0 ? q[e] : 0, qp[e] = q[e] < 0 ? 0 : q[e];
                        if (score != BLOCKS_QUEST)
                            for (int e = 0; e < HS; e++) qp[e] = q[e];
                        as_bytes(qn, HS), as_bytes(qp, HS);
                        for (int e = 0; e < HS; e++)
                            sc[c] += score == BLOCKS_QUEST ? qn[e] * lo[e] + qp[e] * hi[e]
                                                           : qp[e] * mean[e];
                    }
                }
                /* cover: the best blocks until their estimated share of the mass reaches it
                 * (shares of the whole attention for the learned and oracle scores, else a
                 * softmax over the blocks of the heads' mean score plus log of the key count) */
                const int shares = score == BLOCKS_LEARNED || score == BLOCKS_ORACLE;
                double covered = 0, target = cover, share[T / 4 + 2];
                if (cover > 0 && shares) {
                    double tot = 0;
                    for (int c = c0; c < c1; c++) tot += sc[c];
                    covered = rep - tot, target = cover * rep;
                } else if (cover > 0) {
                    double z = 0;
                    for (int c = c0; c < c1; c++) {
                        int d = 0;
                        for (int j = c * bs; j < (c + 1) * bs && j < i - w; j++) d += j >= sinks;
                        share[c] = exp(scale * sc[c] / rep + log((double)d));
                        z += share[c];
                    }
                    for (int c = c0; c < c1; c++) share[c] /= z;
                }
                const int cap = cover > 0 && nsel <= 0 ? c1 - c0 : nsel;
                for (int t = 0; t < cap && t < c1 - c0; t++) {
                    if (cover > 0 && covered >= target) break;
                    int best = -1;
                    for (int c = c0; c < c1; c++)
                        if (sc[c] > -INFINITY && (best < 0 || sc[c] > sc[best])) best = c;
                    covered += shares ? sc[best] : share[best];
                    sc[best] = -INFINITY;
                    for (int j = best * bs; j < (best + 1) * bs && j < i - w; j++)
                        if (j >= sinks) keep[j] = 1;
                }
                /* the groups: every distant key sharing a group with the query */
                for (int j = sinks; qm && j < i - w; j++)
                    if (qm[(size_t)b * T + i] & km[(size_t)b * T + j]) keep[j] = 1;
                for (int h = kvh * rep; h < (kvh + 1) * rep; h++) {
                    double mx = -INFINITY, sum = 0, o[HS] = {0};
                    for (int j = 0; j <= i; j++)
                        if (keep[j]) mx = fmax(mx, s[(size_t)j * NH + h]);
                    for (int j = 0; j <= i; j++) {
                        if (!keep[j]) continue;
                        double p = exp(s[(size_t)j * NH + h] - mx);
                        sum += p;
                        if (mass) *mass += exp(s[(size_t)j * NH + h] - dl[h]);
                        for (int e = 0; e < HS; e++)
                            o[e] += p * base[(size_t)j * QKV + C + NKV * HS + kvh * HS + e];
                        kept += 1.0 / NH;
                    }
                    for (int e = 0; e < HS; e++)
                        out[((size_t)b * T + i) * C + h * HS + e] = (real)(o[e] / sum);
                    lse[((size_t)b * NH + h) * T + i] = (real)(mx + log(sum));
                }
            }
    }
    free(s), free(sc), free(keep);
    return kept;
}

/* groups: 0 none; else token groups beside the blocks (K = 6: each key in one group, each
 * query in `groups` of them) */
static void run_blocks(int B, int T, int w, int sinks, int bs, int nsel, double cover,
                       BlockScore score, int groups, Rng* rng) {
    const int K = 6;
    uint32_t* qm = groups ? mallocCheck(sizeof(uint32_t) * B * T) : NULL;
    uint32_t* km = groups ? mallocCheck(sizeof(uint32_t) * B * T) : NULL;
    for (int t = 0; groups && t < B * T; t++) {
        km[t] = 1u << (rng_u64(rng) % K);
        qm[t] = 0;
        while (__builtin_popcount(qm[t]) < groups) qm[t] |= 1u << (rng_u64(rng) % K);
    }
    real gate[NH * BLOCKGATE_WIDTH(HS)];
    blockgate_init(gate, NH, HS);
    for (int t = 0; t < NH * BLOCKGATE_WIDTH(HS); t++) gate[t] += 0.3 * rng_normal(rng);
    size_t nqkv = (size_t)B * T * (NH + 2 * NKV) * HS, nout = (size_t)B * T * NH * HS,
           nl = (size_t)B * NH * T;
    real* qkv = mallocCheck(sizeof(real) * nqkv);
    real *ref = mallocCheck(sizeof(real) * nout), *got = mallocCheck(sizeof(real) * nout);
    real *lref = mallocCheck(sizeof(real) * nl), *lgot = mallocCheck(sizeof(real) * nl);
    tu_randn(qkv, nqkv, 1.5, rng);
    double want = blocks_reference(ref, lref, qkv, w, sinks, bs, nsel, cover, score, gate, qm, km,
                                   B, T, NULL);
    double kept = attention_blocks_forward(got, lgot, qkv, w, sinks, bs, nsel, cover, score, gate,
                                           qm, km, K, B, T, NH, NKV, HS);
    double eo = rel_err(got, ref, nout), el = rel_err(lgot, lref, nl);
    printf(
        "  blocks (%s) vs per-query reference: B=%d T=%4d w=%3d sinks=%d bs=%d nsel=%d p=%.2f "
        "groups=%d  out %.1e  lse %.1e  pairs %.4f\n",
        block_score_name(score), B, T, w, sinks, bs, nsel, cover, groups, eo, el,
        kept / (B * (double)T * (T + 1) / 2));
    CHECK(eo < 2e-5 && el < 2e-5, "blocks (%s) differ (out %g, lse %g) at T=%d w=%d nsel=%d",
          block_score_name(score), eo, el, T, w, nsel);
    CHECK(fabs(kept - want) < 1e-6 * want, "blocks (%s) count %.3f pairs, the reference %.3f",
          block_score_name(score), kept, want);
    free(qkv), free(ref), free(got), free(lref), free(lgot), free(qm), free(km);
}

/* At the same budget the oracle's blocks hold at least the dense mass of Quest's and the mean
 * key's, and every selection at least the band's. */
/* Random keys' block statistics (nb blocks of bs, head size hs; into *st), n query rows of
 * stride ldq (into *q) and the selector's weights of rep heads (into *gate) */
static void random_selection(int nb, int bs, int hs, int n, int ldq, int rep, int8_t** st, real** q,
                             real** gate, Rng* rng) {
    const size_t sb = BLOCKGATE_STAT_BYTES(hs);
    real* k = mallocCheck(sizeof(real) * (size_t)nb * bs * hs);
    *q = mallocCheck(sizeof(real) * (size_t)n * ldq);
    *gate = mallocCheck(sizeof(real) * (size_t)rep * BLOCKGATE_WIDTH(hs));
    *st = mallocCheck(sb * nb);
    tu_randn(k, (size_t)nb * bs * hs, 1.0, rng);
    tu_randn(*q, (size_t)n * ldq, 2.0, rng);
    tu_randn(*gate, (size_t)rep * BLOCKGATE_WIDTH(hs), 1.0, rng);
    for (int c = 0; c < nb; c++)
        blockgate_key_stats8(*st + c * sb, k, hs, c * bs, (c + 1) * bs, hs);
    free(k);
}

/* The selection's products in bytes are exact integers: block_logits and the choices of Quest and
 * the mean keys give the same bits at every instruction-set level this CPU has (scalar, AVX2's
 * 32-byte steps and their tail, AVX-512 VNNI's 64 with a masked tail), for head sizes that are
 * and are not multiples of 32 and 64, and 1 to 5 query heads (four at a time, then the rest). */
static void byte_products_agree(Rng* rng) {
    const int hss[] = {8, 40, 64, 96, 256}, reps[] = {1, 3, 4, 5}, bs = 16, nb = 37;
    const int best = quant_isa_detected(), level = quant_isa(); /* (FOCUS_ISA's, restored) */
    int compared = 0;
    for (int a = 0; a < 5; a++)
        for (int b = 0; b < 4; b++) {
            const int hs = hss[a], rep = reps[b], w = 3, i = nb * bs + w - 7,
                      sinks = 2; /* (the last block partial) */
            int8_t* st;
            real *q, *gate;
            random_selection(nb, bs, hs, 1, rep * hs, rep, &st, &q, &gate, rng);
            real lband[5] = {1, 2, 3, 4, 5};
            real *p[QUANT_ISA_COUNT] = {NULL}, sc[64], pp[5 * 64 + 1024];
            real scs[QUANT_ISA_COUNT][6][64]; /* each choice's scores of the nb blocks */
            int sel[QUANT_ISA_COUNT][6][16], ns[QUANT_ISA_COUNT][6];
            for (int isa = 0; isa <= best; isa++) {
                if (!quant_isa_has(isa)) continue; /* (not nested on every CPU) */
                quant_set_isa(isa);
                p[isa] = mallocCheck(sizeof(real) * (size_t)rep * nb);
                block_logits(p[isa], q, rep, st, gate, i, w, sinks, bs, hs);
                const BlockScore s3[3] = {BLOCKS_LEARNED, BLOCKS_QUEST, BLOCKS_MEAN};
                for (int s = 0; s < 6; s++) { /* 8 blocks, then 14 (two vectors at AVX2) */
                    memset(sc, 0, sizeof sc);
                    ns[isa][s] =
                        block_select(sel[isa][s], s3[s % 3], q, rep, st, gate, lband, 1, NULL, 0, i,
                                     w, sinks, bs, s < 3 ? 8 : 14, 0, hs, sc, pp);
                    memcpy(scs[isa][s], sc, sizeof(real) * nb);
                }
                if (isa == 0) continue;
                compared++;
                CHECK(!memcmp(p[isa], p[0], sizeof(real) * (size_t)rep * nb),
                      "block_logits at level %d differs from the scalar one (hs %d, %d heads)", isa,
                      hs, rep);
                /* the scores: the learned shares, Quest's bounds, the mean keys' products */
                for (int s = 0; s < 3; s++)
                    CHECK(!memcmp(scs[isa][s], scs[0][s], sizeof(real) * nb),
                          "block scores (kind %d) at level %d differ from the scalar ones (hs %d, "
                          "%d heads)",
                          s, isa, hs, rep);
                CHECK(!memcmp(ns[isa], ns[0], sizeof ns[0]) &&
                          !memcmp(sel[isa], sel[0], sizeof sel[0]),
                      "block choices at level %d differ from the scalar ones (hs %d, %d heads)",
                      isa, hs, rep);
            }
            for (int isa = 0; isa <= best; isa++) free(p[isa]);
            free(q), free(gate), free(st);
        }
    /* ties (a query of zeros: every mean-key score 0): the earliest blocks, in order */
    {
        const int hs = 64, nbt = 20;
        real k[20 * 16 * 64], q0[64] = {0}, sc[32], pp[2048];
        int8_t st[20 * BLOCKGATE_STAT_BYTES(64)];
        tu_randn(k, 20 * 16 * 64, 1.0, rng);
        for (int c = 0; c < nbt; c++)
            blockgate_key_stats8(st + c * BLOCKGATE_STAT_BYTES(hs), k, hs, c * 16, (c + 1) * 16,
                                 hs);
        for (int isa = 0; isa <= best; isa++)
            for (int want = 8; want <= 14 && quant_isa_has(isa); want += 6) {
                quant_set_isa(isa);
                int sel[16];
                const int ns = block_select(sel, BLOCKS_MEAN, q0, 1, st, NULL, NULL, 1, NULL, 0,
                                            nbt * 16 + 2, 2, 0, 16, want, 0, hs, sc, pp);
                int in_order = ns == want;
                for (int s = 0; s < ns; s++) in_order &= sel[s] == s;
                CHECK(in_order, "tied blocks at level %d: not the first %d in order", isa, want);
            }
    }
    quant_set_isa(level);
    printf(
        "  block products in bytes: the same bits at every level up to %d this CPU has (%d "
        "comparisons)\n",
        best, compared);
}

/* A prompt's tile of logits (block_logits_tile: at AVX-512 VNNI and AVX2 16 blocks at a time
 * against every row) has each row's bits of block_logits at every level this CPU has, rows whose
 * candidates end in different blocks, partial or whole, with 1 to 5 heads. */
static void logits_tile_agrees(Rng* rng) {
    const int hss[] = {40, 64, 256}, reps[] = {1, 3, 5}, bs = 16, nb = 40, nq = 21;
    const int best = quant_isa_detected(), level = quant_isa();
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            const int hs = hss[a], rep = reps[b], w = 20, sinks = 3, i0 = 27 * bs + 9;
            const size_t ldp = (size_t)rep * nb;
            const int ldq = rep * hs + 7;
            real *pt = mallocCheck(sizeof(real) * nq * ldp), *pr = mallocCheck(sizeof(real) * ldp);
            int8_t* st;
            real *q, *gate;
            random_selection(nb, bs, hs, nq, ldq, rep, &st, &q, &gate, rng);
            for (int isa = 0; isa <= best; isa++) { /* each level's tile against the scalar rows */
                if (!quant_isa_has(isa)) continue;
                quant_set_isa(isa);
                block_logits_tile(pt, ldp, q, ldq, i0, nq, st, gate, w, sinks, bs, rep, hs);
                quant_set_isa(QUANT_ISA_SCALAR);
                int same = 1;
                for (int r = 0; r < nq; r++) {
                    const int i = i0 + r, nc = (i - w - 1) / bs + 1 - sinks / bs;
                    block_logits(pr, q + (size_t)r * ldq, rep, st, gate, i, w, sinks, bs, hs);
                    same &= !memcmp(pr, pt + r * ldp, sizeof(real) * (size_t)rep * nc);
                }
                CHECK(same,
                      "block_logits_tile at level %d differs from block_logits (hs %d, %d heads)",
                      isa, hs, rep);
            }
            free(q), free(gate), free(pt), free(pr), free(st);
        }
    quant_set_isa(level);
    printf("  block logits of a prompt's tile: each row's bits of block_logits at every level\n");
}

static void oracle_is_ceiling(Rng* rng) {
    const int B = 1, T = 400, w = 32, sinks = 2, bs = 16, nsel = 4;
    size_t nqkv = (size_t)B * T * (NH + 2 * NKV) * HS, nout = (size_t)B * T * NH * HS,
           nl = (size_t)B * NH * T;
    real* qkv = mallocCheck(sizeof(real) * nqkv);
    real* o = mallocCheck(sizeof(real) * nout);
    real* l = mallocCheck(sizeof(real) * nl);
    tu_randn(qkv, nqkv, 1.5, rng);
    double mass[3] = {0, 0, 0}, band = 0;
    for (int s = 0; s < 3; s++)
        blocks_reference(o, l, qkv, w, sinks, bs, nsel, 0, (BlockScore)s, NULL, NULL, NULL, B, T,
                         &mass[s]);
    blocks_reference(o, l, qkv, w, sinks, bs, 0, 0, BLOCKS_QUEST, NULL, NULL, NULL, B, T, &band);
    printf("  dense mass kept (of %d): band %.1f, Quest %.1f, mean keys %.1f, oracle %.1f\n",
           T * NH, band, mass[0], mass[1], mass[2]);
    CHECK(
        mass[2] >= mass[0] - 1e-9 && mass[2] >= mass[1] - 1e-9 && mass[0] > band && mass[1] > band,
        "the oracle's mass %g is below Quest's %g or the mean key's %g (band %g)", mass[2], mass[0],
        mass[1], band);
    free(qkv), free(o), free(l);
}

/* The cached kernels of a prompt (attention_cached_forward / _blocks / _groups) against a
 * per-row softmax written out here, over T cached positions fed in two calls (rows [0, p1) then
 * [p1, T)): dense, the band with sinks, the band plus chosen blocks, the window plus groups. The
 * keys and values in an f32 cache laid out as the KV cache's layers (CachedKV: by head). */
static void cached_kernels(int T, int p1, int w, int sinks, Rng* rng) {
    enum { BS = 64, KG = 4 };
    const int Q = NH * HS, kvw = NKV * HS, rep = NH / NKV, nb = T / BS + 1;
    real* q = mallocCheck(sizeof(real) * (size_t)T * Q);
    real* k = mallocCheck(sizeof(real) * (size_t)T * kvw);
    real* v = mallocCheck(sizeof(real) * (size_t)T * kvw);
    real* got = mallocCheck(sizeof(real) * (size_t)T * Q);
    real* lse = mallocCheck(sizeof(real) * (size_t)T * NH);
    real* ref = mallocCheck(sizeof(real) * (size_t)T * Q);
    unsigned char* keep = mallocCheck((size_t)T);
    double* sco = mallocCheck(sizeof(double) * (size_t)T);
    int* sel = mallocCheck(sizeof(int) * (size_t)T * NKV * nb);
    int* nsel = mallocCheck(sizeof(int) * (size_t)T * NKV);
    uint32_t* mask = mallocCheck(sizeof(uint32_t) * (size_t)T);
    const CachedKV kv = {k, v, 0, T};
    int* gpos = mallocCheck(sizeof(int) * (size_t)KG * T);
    int gn[KG] = {0};
    tu_randn(q, (size_t)T * Q, 1.5, rng);
    tu_randn(k, (size_t)T * kvw, 1.5, rng);
    tu_randn(v, (size_t)T * kvw, 1.0, rng);
    for (int i = 0; i < T; i++) { /* one or two groups each, the sinks in all */
        mask[i] = i < sinks
                      ? (1u << KG) - 1
                      : (1u << (rng_u64(rng) % KG)) | (rng_u64(rng) % 3 ? 0u : 1u << (i % KG));
        for (int g = 0; g < KG; g++)
            if ((mask[i] >> g) & 1) gpos[(size_t)g * T + gn[g]++] = i;
    }
    for (int i = 0; i < T; i++) /* ascending distinct blocks of distant keys, some rows none */
        for (int g = 0; g < NKV; g++) {
            int* sg = sel + ((size_t)i * NKV + g) * nb;
            int ns = 0;
            for (int b = 0; b * BS < i - w; b++)
                if (rng_u64(rng) % 3 == 0) sg[ns++] = b;
            nsel[(size_t)i * NKV + g] = ns;
        }
    for (int kind = 0; kind < 4; kind++) { /* dense, band, band + blocks, window + groups */
        const int bw = kind == 0 ? -1 : w, bsinks = kind == 1 || kind == 2 ? sinks : 0;
        const int parts[2][2] = {{0, p1}, {p1, T - p1}};
        for (int c = 0; c < 2; c++) {
            const int p0 = parts[c][0], n = parts[c][1];
            real* o = got + (size_t)p0 * Q;
            real* ls = lse + (size_t)p0 * NH;
            attention_cached_forward(o, Q, ls, q + (size_t)p0 * Q, Q, p0, n, &kv, bw, bsinks, NH,
                                     NKV, HS);
            if (kind == 2)
                attention_cached_blocks(o, Q, ls, q + (size_t)p0 * Q, Q, p0, n, &kv, w, sinks, BS,
                                        sel + (size_t)p0 * NKV * nb, nsel + (size_t)p0 * NKV, nb,
                                        NH, NKV, HS);
            if (kind == 3) { /* the lists as a prompt's call sees them: its rows joined */
                int gn_now[KG];
                for (int g = 0; g < KG; g++) {
                    gn_now[g] = 0;
                    while (gn_now[g] < gn[g] && gpos[(size_t)g * T + gn_now[g]] < p0 + n)
                        gn_now[g]++;
                }
                const GroupLists gl = {gpos, gn_now, T, KG, NULL, NULL};
                attention_cached_groups(o, Q, ls, q + (size_t)p0 * Q, Q, p0, n, &kv, w, mask + p0,
                                        mask, &gl, NULL, NH, NKV, HS);
            }
        }
        for (int i = 0; i < T; i++)
            for (int h = 0; h < NH; h++) {
                const int g = h / rep;
                for (int j = 0; j < T; j++) {
                    int kj = j <= i;
                    if (kind >= 1) kj = kj && (j >= i - w || (kind != 3 && j < sinks));
                    keep[j] = (unsigned char)kj;
                }
                if (kind == 2)
                    for (int s2 = 0; s2 < nsel[(size_t)i * NKV + g]; s2++) {
                        const int b = sel[((size_t)i * NKV + g) * nb + s2];
                        for (int j = b * BS > sinks ? b * BS : sinks; j < (b + 1) * BS && j < i - w;
                             j++)
                            keep[j] = 1;
                    }
                if (kind == 3)
                    for (int j = 0; j < i - w; j++) /* its groups' earlier tokens */
                        if (mask[j] & mask[i]) keep[j] = 1;
                double mx = -INFINITY, sum = 0;
                double acc[HS] = {0};
                for (int j = 0; j < T; j++) {
                    if (!keep[j]) continue;
                    double sc = 0;
                    for (int e = 0; e < HS; e++)
                        sc +=
                            (double)q[(size_t)i * Q + h * HS + e] * k[((size_t)g * T + j) * HS + e];
                    sco[j] = sc / sqrt((double)HS);
                    mx = sco[j] > mx ? sco[j] : mx;
                }
                for (int j = 0; j < T; j++) {
                    if (!keep[j]) continue;
                    const double p = exp(sco[j] - mx);
                    sum += p;
                    for (int e = 0; e < HS; e++) acc[e] += p * v[((size_t)g * T + j) * HS + e];
                }
                for (int e = 0; e < HS; e++) ref[(size_t)i * Q + h * HS + e] = (real)(acc[e] / sum);
            }
        const double err = rel_err(got, ref, (size_t)T * Q);
        CHECK(err < 1e-5, "cached kernel %s, T=%d in calls of %d and %d, w=%d, sinks=%d: off by %g",
              (const char*[]){"dense", "band", "band + blocks", "window + groups"}[kind], T, p1,
              T - p1, w, sinks, err);
    }
    free(q), free(k), free(v), free(got), free(lse), free(ref), free(keep), free(sco), free(sel);
    free(nsel);
    free(mask), free(gpos);
}

/* exp_f, the kernels' exp (written to vectorise), against the C library's: within 2 ulp up to 88.3
 * (inf from 88.4 on), 0 below -87.3 and for -inf, NaN for NaN, the same vectorised as alone. */
static void exp_values(void) {
    double worst = 0;
    for (float x = -87.29f; x < 88.3f; x += 0.0137f) { /* (2^128 overflows above) */
        const double want = exp((double)x), got = exp_f(x);
        worst = fmax(worst, fabs(got - want) / want);
    }
    CHECK(worst < 2.4e-7, "exp_f within 2 ulp of exp over [-87.3, 88.3] (worst relative %.3g)",
          worst);
    const float nan = NAN;
    CHECK(exp_f(-87.31f) == 0 && exp_f(-INFINITY) == 0 && exp_f(-1e30f) == 0 &&
              exp_f(nan) != exp_f(nan) && exp_f(0) == 1,
          "exp_f: 0 below -87.3 and for -inf, NaN for NaN, exp(0) = 1");
    enum { N = 1000 };
    static float v[N], one[N];
    float (*volatile alone)(float) = exp_f; /* a call: never vectorised */
    for (int i = 0; i < N; i++) v[i] = -100 + 0.2f * i, one[i] = alone(v[i]);
#pragma omp simd
    for (int i = 0; i < N; i++) v[i] = exp_f(v[i]);
    CHECK(!memcmp(v, one, sizeof v), "exp_f: a vectorised loop gives each value's bits");
    /* exp_d (the activations' sigmoid) against the C library's: within 2 ulp over [-708, 709], and
     * a float's sigmoid rounded to float the same over float inputs of every size */
    double dworst = 0;
    for (double x = -707.99; x < 709; x += 0.001373) {
        const double want = exp(x);
        dworst = fmax(dworst, fabs(exp_d(x) - want) / want);
    }
    CHECK(dworst < 4.5e-16, "exp_d within 2 ulp of exp over [-708, 709] (worst relative %.3g)",
          dworst);
    CHECK(exp_d(-708.01) == 0 && exp_d(-INFINITY) == 0 && exp_d(709.01) == INFINITY &&
              exp_d(INFINITY) == INFINITY && exp_d(NAN) != exp_d(NAN) && exp_d(0) == 1,
          "exp_d: 0 below -708 and for -inf, inf above 709, NaN for NaN, exp(0) = 1");
    long differ = 0, tried = 0;
    for (float x = -120; x < 120; x = nextafterf(x, 200) + fabsf(x) * 1e-5f, tried++)
        differ +=
            (float)(1.0 / (1.0 + exp_d(-(double)x))) != (float)(1.0 / (1.0 + exp(-(double)x)));
    CHECK(differ == 0,
          "the sigmoid through exp_d rounds to the C library's float (%ld of %ld differ)", differ,
          tried);
    static double dv[N], done[N];
    double (*volatile dalone)(double) = exp_d;
    for (int i = 0; i < N; i++) dv[i] = -800 + 1.6 * i, done[i] = dalone(dv[i]);
#pragma omp simd
    for (int i = 0; i < N; i++) dv[i] = exp_d(dv[i]);
    CHECK(!memcmp(dv, done, sizeof dv), "exp_d: a vectorised loop gives each value's bits");
}

/* kernels/tile.c: against a float64 product, and a row's bits the same at any place among the
 * rows, beside other rows, and when only some rows are listed (the property the prompt's tiles
 * rest on; OpenBLAS's Haswell kernels do not have it) */
static void tile_products(Rng* rng) {
    enum { M = 29, N = 72, K = 40 }; /* (the remainders past the vector chunks too) */
    real *A = mallocCheck(sizeof(real) * M * K), *B = mallocCheck(sizeof(real) * N * K);
    real *A2 = mallocCheck(sizeof(real) * M * K), *C = mallocCheck(sizeof(real) * M * N);
    real *C2 = mallocCheck(sizeof(real) * M * N), *bt = mallocCheck(sizeof(real) * N * K);
    real *V = mallocCheck(sizeof(real) * K * N), *D = mallocCheck(sizeof(real) * M * N);
    tu_randn(A, M * K, 1, rng);
    tu_randn(B, N * K, 1, rng);
    tu_randn(V, K * N, 1, rng);
    tile_abt(C, N, A, K, B, K, M, N, K, (real)0.5, NULL, 0, bt);
    double worst = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int e = 0; e < K; e++) s += (double)A[i * K + e] * B[j * K + e];
            worst = fmax(worst, fabs(0.5 * s - C[i * N + j]));
        }
    CHECK(worst < 1e-5, "tile_abt: %g from the float64 product", worst);
    /* the rows shifted by 5 and the others replaced: each row's bits as before */
    tu_randn(A2, M * K, 1, rng);
    for (int i = 0; i < M - 5; i++) memcpy(A2 + (i + 5) * K, A + i * K, sizeof(real) * K);
    tile_abt(C2, N, A2, K, B, K, M, N, K, (real)0.5, NULL, 0, bt);
    int same = 1;
    for (int i = 0; i < M - 5; i++) same &= !memcmp(C2 + (i + 5) * N, C + i * N, sizeof(real) * N);
    /* only rows 3, 4 and 20 listed: theirs as in the whole product, the others untouched */
    const int rows[3] = {3, 4, 20};
    for (int i = 0; i < M * N; i++) C2[i] = -7;
    tile_abt(C2, N, A, K, B, K, M, N, K, (real)0.5, rows, 3, bt);
    for (int i = 0; i < M; i++) {
        const int listed = i == 3 || i == 4 || i == 20;
        same &= listed ? !memcmp(C2 + i * N, C + i * N, sizeof(real) * N) : C2[i * N + 7] == -7;
    }
    CHECK(same, "tile_abt: a row's bits depend on its place or the rows beside it");
    /* tile_ab: D = A V, then + A V; against float64, and the listed rows alone */
    tile_ab(D, N, A, K, V, N, M, N, K, 0, NULL, 0);
    tile_ab(D, N, A, K, V, N, M, N, K, 1, NULL, 0);
    worst = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int e = 0; e < K; e++) s += (double)A[i * K + e] * V[e * N + j];
            worst = fmax(worst, fabs(2 * s - D[i * N + j]));
        }
    CHECK(worst < 2e-5, "tile_ab: %g from the float64 product", worst);
    tile_ab(C, N, A, K, V, N, M, N, K, 0, NULL, 0);
    tile_ab(C2, N, A, K, V, N, M, N, K, 0, rows, 3);
    same = 1;
    for (int r = 0; r < 3; r++)
        same &= !memcmp(C2 + rows[r] * N, C + rows[r] * N, sizeof(real) * N);
    CHECK(same, "tile_ab: a listed row's bits differ from the whole product's");
    printf("  tile products: %.1e from float64; a row's bits the same at any place\n", worst);
    free(A), free(B), free(A2), free(C), free(C2), free(bt), free(V), free(D);
}

int main(void) {
    Rng rng;
    rng_seed(&rng, 5);
    exp_values();
    tile_products(&rng);
    cached_kernels(700, 333, 100, 4, &rng);
    cached_kernels(300, 1, 40, 0, &rng);
    cached_kernels(97, 50, 200, 3, &rng);
    /* flash dense == reference dense */
    int Ts[] = {1, 63, 300, 1000};
    for (int t = 0; t < 4; t++) {
        int B = 2, T = Ts[t];
        size_t nqkv = (size_t)B * T * (NH + 2 * NKV) * HS, nout = (size_t)B * T * NH * HS,
               nl = (size_t)B * NH * T;
        real* qkv = mallocCheck(sizeof(real) * nqkv);
        real *ref = mallocCheck(sizeof(real) * nout), *got = mallocCheck(sizeof(real) * nout);
        real *lref = mallocCheck(sizeof(real) * nl), *lgot = mallocCheck(sizeof(real) * nl);
        tu_randn(qkv, nqkv, 1.5, &rng);
        attention_forward(ref, lref, qkv, NULL, B, T, NH, NKV, HS);
        attention_flash_forward(got, lgot, qkv, B, T, NH, NKV, HS);
        double eo = rel_err(got, ref, nout), el = rel_err(lgot, lref, nl);
        printf("  flash dense vs reference dense, T=%4d: out %.1e  lse %.1e\n", T, eo, el);
        CHECK(eo < 2e-5 && el < 2e-5, "flash attention differs at T=%d (%g, %g)", T, eo, el);
        free(qkv), free(ref), free(got), free(lref), free(lgot);
    }
    for (int K = 4; K <= 8; K += 4)
        for (int k = 1; k <= 3; k++) run(2, 700, K, k, 40, 0, 0, &rng);
    run(1, 1031, 8, 1, 128, 1, 0, &rng);
    run(1, 1031, 4, 2, 128, 1, 0, &rng);
    run(2, 517, 4, 4, 16, 0, 0, &rng); /* k = K: every pair kept */
    run(1, 50, 8, 1, 0, 0, 0, &rng);   /* no window at all */
    /* attention sinks: each sink pair computed once (in the query's lowest group) */
    run(2, 700, 8, 1, 40, 0, 4, &rng);
    run(1, 1031, 4, 2, 128, 1, 1, &rng);
    run(1, 300, 8, 1, 0, 0, 300, &rng); /* every token a sink: dense */
    run(1, 700, 8, 1, 600, 0, 4, &rng); /* a window wider than a key tile */
    run_qk(2, 600, 8, 1, 40, 0, &rng);
    run_qk(1, 777, 8, 2, 100, 4, &rng);
    run_qk(1, 300, 4, 3, 0, 1, &rng);
    run_qk(1, 500, 32, 2, 64, 2, &rng); /* K = 32: group 31 beside the executor's marker bit */
    /* sinks and window: tiles of sinks apart from the band, windows past the sequence */
    run_band(2, 700, 40, 4, &rng);
    run_band(1, 1031, 300, 1, &rng);
    run_band(1, 600, 1000, 0, &rng); /* the window covers everything: dense */
    run_band(1, 300, 0, 300, &rng);  /* every key a sink: dense */
    run_band(1, 50, 0, 0, &rng);     /* each query alone */
    run_band(1, 1, 5, 2, &rng);
    /* block selection: every score, partial blocks, T not a multiple of bs, nsel 0 (the band)
     * and nsel past the candidates (dense) */
    for (int s = 0; s < 4; s++) run_blocks(2, 300, 24, 4, 16, 3, 0, (BlockScore)s, 0, &rng);
    run_blocks(1, 333, 0, 0, 32, 2, 0, BLOCKS_LEARNED, 0, &rng);
    run_blocks(1, 257, 40, 1, 64, 1, 0, BLOCKS_LEARNED, 0, &rng);
    run_blocks(1, 333, 0, 0, 32, 2, 0, BLOCKS_QUEST, 0, &rng);
    run_blocks(1, 257, 40, 1, 64, 0, 0, BLOCKS_MEAN, 0, &rng);
    run_blocks(1, 200, 8, 4, 16, 100, 0, BLOCKS_QUEST, 0, &rng);
    /* token groups beside the blocks: one or two groups per query, none chosen blocks too */
    run_blocks(2, 300, 24, 4, 16, 3, 0, BLOCKS_LEARNED, 1, &rng);
    run_blocks(1, 333, 0, 0, 32, 2, 0, BLOCKS_QUEST, 2, &rng);
    run_blocks(1, 257, 40, 1, 64, 0, 0, BLOCKS_MEAN, 2, &rng);
    run_blocks(1, 200, 8, 4, 16, 100, 0, BLOCKS_ORACLE, 1, &rng);
    /* a mass-adaptive budget (Twilight's top-p) over every score, with and without a limit */
    for (int s = 0; s < 4; s++) run_blocks(2, 300, 24, 4, 16, 0, 0.6, (BlockScore)s, 0, &rng);
    run_blocks(1, 333, 8, 2, 16, 3, 0.9, BLOCKS_LEARNED, 0, &rng);
    run_blocks(1, 333, 8, 2, 16, 4, 0.95, BLOCKS_QUEST, 1, &rng);
    oracle_is_ceiling(&rng);
    byte_products_agree(&rng);
    logits_tile_agrees(&rng);
    /* pairs kept by group masks, counted through the distinct masks, against every pair */
    for (int k = 1; k <= 3; k++) {
        enum { PT = 900 };
        uint32_t mask[PT];
        for (int i = 0; i < PT; i++) {
            uint32_t mk = 0;
            while (__builtin_popcount(mk) < k) mk |= 1u << (rng_u64(&rng) % 8);
            mask[i] = i < 3 ? 0xffu : mk;
        }
        for (int w = 0; w <= 300; w += 150) {
            double want = 0;
            for (int i = 0; i < PT; i++)
                for (int j = 0; j <= i; j++) want += i - j <= w || j < 2 || (mask[i] & mask[j]);
            const double got = mask_pairs_kept(mask, mask, PT, w, 2);
            CHECK(got == want, "mask_pairs_kept (k=%d, w=%d): %g, every pair counted: %g", k, w,
                  got, want);
        }
    }
    return tu_finish("test_sparse");
}
