/* test_blockgate.c: the fit of the learned block selector (kernels/blockgate.h), in double
 * precision: the samples' exact log-partitions against sums written out, the loss's gradient
 * against central differences, and a fit on keys with planted spikes that lowers the held-out
 * divergence and keeps at least the mass of the untrained cumulant expansion, below the oracle.
 * (The selector inside attention_blocks_forward is checked against a reference written out in
 * tests/test_sparse.c.) */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../kernels/blockgate.h"
#include "testutil.h"

enum { NH = 4, NKV = 2, HS = 16, W = BLOCKGATE_WIDTH(HS) };

/* Keys with spikes: a few topic directions; 1 key in 20 is a large multiple of one of them, and
 * every query leans towards one topic, so the blocks holding its topic's spikes hold its mass. */
static real* spiky_qkv(int T, Rng* rng) {
    const int QKV = (NH + 2 * NKV) * HS, C = NH * HS;
    real* qkv = mallocCheck(sizeof(real) * (size_t)T * QKV);
    tu_randn(qkv, (size_t)T * QKV, 1.0, rng);
    real topic[4][HS];
    tu_randn(&topic[0][0], 4 * HS, 1.0, rng);
    for (int i = 0; i < T; i++) {
        real* row = qkv + (size_t)i * QKV;
        for (int h = 0; h < NH; h++) {
            const int t = (int)(rng_u64(rng) % 4);
            for (int e = 0; e < HS; e++) row[h * HS + e] += 1.5f * topic[t][e];
        }
        for (int kvh = 0; kvh < NKV; kvh++)
            if (rng_uniform(rng) < 0.05) {
                const int t = (int)(rng_u64(rng) % 4);
                for (int e = 0; e < HS; e++) row[C + kvh * HS + e] += 2.5f * topic[t][e];
            }
    }
    return qkv;
}

/* Each sample's band and block log-partitions against the scores summed directly. */
static void check_samples(const BlockFit* f, const real* qkv, int T) {
    const int QKV = (NH + 2 * NKV) * HS, C = NH * HS, rep = NH / NKV;
    const BlockFitWindow* x = &f->win[0];
    double worst = 0;
    for (int s = 0; s < x->nq; s++)
        for (int h = 0; h < NH; h++) {
            const int i = x->pos[s], kvh = h / rep;
            double band = 0, blk[64] = {0};
            for (int j = 0; j <= i; j++) {
                double d = 0;
                for (int e = 0; e < HS; e++)
                    d +=
                        qkv[(size_t)i * QKV + h * HS + e] * qkv[(size_t)j * QKV + C + kvh * HS + e];
                const double p = exp(d / sqrt((double)HS));
                if (j < f->sinks || i - j <= f->w)
                    band += p;
                else
                    blk[j / f->bs] += p;
            }
            worst = fmax(worst, fabs(log(band) - x->lband[(size_t)s * NH + h]));
            for (int c = 0; c < x->nb; c++) {
                const real lz = x->lz[((size_t)s * NH + h) * x->nb + c];
                if (blk[c] > 0) worst = fmax(worst, fabs(log(blk[c]) - lz));
                CHECK((blk[c] > 0) == (lz > -INFINITY), "sample %d head %d block %d: %g vs %g", s,
                      h, c, blk[c], (double)lz);
            }
        }
    printf("  sampled log-partitions against direct sums: max error %.1e\n", worst);
    CHECK(worst < 1e-9, "log-partitions differ by %g", worst);
    (void)T;
}

static void check_gradient(const BlockFit* f, Rng* rng) {
    real wgt[W], grad[W], tmp[W];
    blockgate_init(wgt, 1, HS);
    for (int e = 0; e < W; e++) wgt[e] += 0.2 * rng_normal(rng);
    for (int h = 0; h < NH; h++) {
        blockfit_loss(f, 0, h, wgt, grad);
        double worst = 0, scale = 0;
        for (int e = 0; e < W; e++) {
            const double eps = 1e-5;
            memcpy(tmp, wgt, sizeof tmp);
            tmp[e] += eps;
            const double up = blockfit_loss(f, 0, h, tmp, NULL);
            tmp[e] -= 2 * eps;
            const double down = blockfit_loss(f, 0, h, tmp, NULL);
            const double num = (up - down) / (2 * eps);
            worst = fmax(worst, fabs(num - grad[e]));
            scale = fmax(scale, fabs(num));
        }
        printf("  head %d: gradient against central differences: max error %.1e (largest %.1e)\n",
               h, worst, scale);
        CHECK(worst < 1e-7 + 1e-5 * scale, "head %d: the gradient is off by %g", h, worst);
    }
}

int main(void) {
    Rng rng;
    rng_seed(&rng, 11);
    const int T = 640, bs = 16, w = 32, sinks = 2, nsel = 4;
    BlockFit fit, held;
    blockfit_init(&fit, 1, NH, NKV, HS, bs, w, sinks);
    blockfit_init(&held, 1, NH, NKV, HS, bs, w, sinks);
    real* a = spiky_qkv(T, &rng);
    real* b = spiky_qkv(T, &rng);
    real* c = spiky_qkv(T, &rng);
    blockfit_add(&fit, 0, a, T, 200, 1);
    check_samples(&fit, a, T);
    blockfit_add(&fit, 0, b, T, 200, 2);
    blockfit_add(&held, 0, c, T, 300, 3);
    CHECK(blockfit_samples(&fit, 0) == 400, "%ld samples held, 400 added",
          blockfit_samples(&fit, 0));
    /* a sequence too short for two candidate blocks adds nothing */
    blockfit_add(&fit, 0, a, sinks + w + 2 * bs, 10, 4);
    CHECK(blockfit_samples(&fit, 0) == 400, "a short sequence added samples");
    check_gradient(&fit, &rng);

    real init[NH * W], wgt[NH * W];
    blockgate_init(init, NH, HS);
    memcpy(wgt, init, sizeof wgt);
    double before[NH], after[NH];
    blockfit_solve(&fit, wgt, 300, 0.02, before, after);
    double hb = 0, ha = 0;
    for (int h = 0; h < NH; h++) {
        hb += blockfit_loss(&held, 0, h, init + h * W, NULL);
        ha += blockfit_loss(&held, 0, h, wgt + h * W, NULL);
        CHECK(after[h] < before[h], "head %d: the fit raised the training loss %g -> %g", h,
              before[h], after[h]);
    }
    printf("  fit: held-out KL %.4f -> %.4f (mean over heads)\n", hb / NH, ha / NH);
    CHECK(ha < 0.8 * hb, "the fit lowered the held-out KL only from %g to %g", hb, ha);
    const double quest = blockfit_kept(&held, 0, BLOCKS_QUEST, NULL, nsel);
    const double mean = blockfit_kept(&held, 0, BLOCKS_MEAN, NULL, nsel);
    const double cum = blockfit_kept(&held, 0, BLOCKS_LEARNED, init, nsel);
    const double fitted = blockfit_kept(&held, 0, BLOCKS_LEARNED, wgt, nsel);
    const double oracle = blockfit_kept(&held, 0, BLOCKS_ORACLE, NULL, nsel);
    const double band = blockfit_kept(&held, 0, BLOCKS_ORACLE, NULL, 0);
    const double all = blockfit_kept(&held, 0, BLOCKS_ORACLE, NULL, 1000);
    printf(
        "  held-out mass kept with %d blocks: band %.4f, Quest %.4f, mean keys %.4f, cumulant "
        "%.4f, fitted %.4f, oracle %.4f, every block %.6f\n",
        nsel, band, quest, mean, cum, fitted, oracle, all);
    CHECK(fabs(all - 1) < 1e-9, "band and every block keep %.9f of the mass, not 1", all);
    CHECK(oracle >= quest && oracle >= mean && oracle >= cum && oracle >= fitted,
          "the oracle (%g) is not the ceiling", oracle);
    CHECK(fitted > band && fitted >= cum - 1e-3,
          "the fitted selector keeps %g (cumulant %g, band %g)", fitted, cum, band);
    /* every budget at once: the same as each alone, never less for more blocks */
    double curve[9];
    blockfit_kept_curve(&held, 0, BLOCKS_LEARNED, wgt, 8, curve);
    int mono = 1;
    for (int n = 1; n <= 8; n++) mono &= curve[n] >= curve[n - 1] - 1e-12;
    CHECK(mono && fabs(curve[nsel] - fitted) < 1e-12 && fabs(curve[0] - band) < 1e-12,
          "the budget curve (%g at 0, %g at %d) differs from the single budgets (%g, %g)", curve[0],
          curve[nsel], nsel, band, fitted);
    /* per-layer budgets: each block to the layer that gains most from it */
    const double gains[3][5] = {
        {0, 0.5, 0.6, 0.6, 0.6}, {0, 0.2, 0.4, 0.6, 0.8}, {0, 0.01, 0.02, 0.03, 0.04}};
    int share[3];
    blockfit_allocate(&gains[0][0], 3, 4, 2, 0, share);
    CHECK(share[0] == 2 && share[1] == 4 && share[2] == 0, "budgets %d %d %d, want 2 4 0", share[0],
          share[1], share[2]);
    blockfit_allocate(&gains[0][0], 3, 4, 2, 1, share); /* at least one block in every layer */
    CHECK(share[0] == 1 && share[1] == 4 && share[2] == 1, "budgets %d %d %d, want 1 4 1", share[0],
          share[1], share[2]);
    free(a), free(b), free(c);
    blockfit_free(&fit);
    blockfit_free(&held);
    return tu_finish("test_blockgate");
}
