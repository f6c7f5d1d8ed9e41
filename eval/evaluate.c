/* evaluate.c: strided perplexity, pairs kept and routing statistics (see evaluate.h). */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "evaluate.h"

double hard_pairs_kept(const Model* m) {
    const FocusConfig* f = &m->fc;
    const int B = m->B, T = m->T, K = f->K, w = f->w;
    uint32_t* mask = mallocCheck(sizeof(uint32_t) * (size_t)B * T);
    double kept = 0, total = 0;
    for (int l = 0; l < m->cfg.L; l++) {
        const double causal = (double)T * (T + 1) / 2;
        total += B * causal;
        const AttnMethod* a = attn_methods[model_layer_attn(m, l)];
        if (a->own_window) { /* a sliding-window layer keeps its own window, not the router's */
            const int window = model_layer_spec(&m->cfg, l).window;
            for (int i = 0; i < T; i++) kept += B * band_pairs_kept(i, window, 0);
            continue;
        }
        if (a->count == COUNT_ALL) { /* a dense layer */
            kept += B * causal;
            continue;
        }
        /* the sinks are members of every group in the masks: counted as shared distant keys */
        routing_topk_mask(mask, model_groups(m, l), B, T, K, f->topk, f->topp, f->sinks, 0);
        for (int b = 0; b < B; b++)
            kept += mask_pairs_kept(mask + (size_t)b * T, mask + (size_t)b * T, T, w, 0);
    }
    free(mask);
    return kept / total;
}

/* Strided perplexity: windows of ctx input tokens (predicting the ctx tokens after each),
 * advancing by stride; each window scores only the targets the previous window did not, so
 * with stride = ctx every token after the first is scored exactly once. A model whose
 * tokenizer adds a BOS (m->bos) reads it in place of each window's first token, as llama.cpp's
 * perplexity does: a window then starts as the model's own sequences do (Gemma is lost without
 * it). llama (stride = ctx): llama.cpp's llama-perplexity instead, ids holding the BOS first:
 * whole windows only, each scoring the predictions of its positions ctx/2 .. ctx - 2. */
PplResult eval_perplexity_llama(Model* m, const int* ids, size_t n, int ctx, int stride, int llama,
                                int quiet) {
    PplResult r = {0, 0, 0, 0};
    int windows = 0;
    if (n < 2) fatal("eval: need at least 2 tokens, got %zu", n);
    int* tgt = mallocCheck(sizeof(int) * ctx);
    int* in = mallocCheck(sizeof(int) * ctx);
    double t0 = now_seconds();
    size_t scored_to = 0; /* targets with absolute index <= scored_to are done */
    for (size_t st = 0;; st += (size_t)stride) {
        size_t end = st + (size_t)ctx + 1 < n ? st + (size_t)ctx + 1 : n; /* targets < end */
        int T = (int)(end - st) - 1;
        if (llama && st + (size_t)ctx > n) break; /* whole windows only */
        if (llama) T = ctx, end = st + (size_t)ctx;
        if (T < 1) break;
        for (int i = 0; i < T; i++) {
            size_t j = st + 1 + (size_t)i;
            tgt[i] = (llama ? i >= ctx / 2 && i < ctx - 1 : j > scored_to) ? ids[j] : -1;
        }
        memcpy(in, ids + st, sizeof(int) * (size_t)T);
        if (m->bos >= 0) in[0] = m->bos;
        model_forward(m, in, tgt, 1, T, 0);
        if (attn_is_sparse(m->fc.attn)) {
            r.kept += model_method(m)->count == COUNT_GROUPS && !m->router.wq
                          ? hard_pairs_kept(m)
                          : m->pattern_kept / m->pattern_pairs;
            windows++;
        }
        for (int i = 0; i < T; i++) {
            if (tgt[i] >= 0) {
                r.nll += m->losses[i];
                r.count++;
            }
        }
        scored_to = end - 1;
        if (!quiet) {
            fprintf(stderr, "\r  %zu / %zu tokens, ppl so far %.3f", r.count, n - 1,
                    exp(r.nll / r.count));
            fflush(stderr);
        }
        if (end == n) break;
    }
    if (!quiet) fprintf(stderr, "\n");
    if (!r.count) fatal("eval: no window of %d tokens in %zu tokens", ctx, n);
    r.seconds = now_seconds() - t0;
    if (windows) r.kept /= windows;
    free(tgt);
    free(in);
    return r;
}

PplResult eval_perplexity(Model* m, const int* ids, size_t n, int ctx, int stride, int quiet) {
    return eval_perplexity_llama(m, ids, n, ctx, stride, 0, quiet);
}

PplResult eval_mode(Model* m, const int* ids, size_t n, int T, AttnMode attn, int topk, Routing r) {
    FocusConfig keep = m->fc;
    m->fc.attn = attn;
    m->fc.topk = topk;
    m->fc.routing = r;
    PplResult res = eval_perplexity(m, ids, n, T, T, 1);
    m->fc = keep;
    return res;
}

double focus_largest_share(const Model* m) {
    double s = 0;
    for (int l = 0; l < m->cfg.L; l++)
        s += routing_largest_share(model_groups(m, l), (size_t)m->B * m->T, m->fc.K);
    return s / m->cfg.L;
}

double focus_gate_far_mean(const Model* m, Rng* rng) {
    int B = m->B, T = m->T, K = m->fc.K, w = m->fc.w;
    if (T <= w + 1) return NAN;
    double s = 0;
    int n = 0;
    for (int l = 0; l < m->cfg.L; l++) {
        const real* G = model_groups(m, l);
        double lam = m->router.gate[2 * l], bias = m->router.gate[2 * l + 1];
        for (int k = 0; k < 256; k++) {
            int b = (int)(rng_u64(rng) % (uint64_t)B);
            int i = w + 1 + (int)(rng_u64(rng) % (uint64_t)(T - w - 1));
            int j = (int)(rng_u64(rng) % (uint64_t)(i - w));
            double a = 0;
            for (int g = 0; g < K; g++)
                a += G[((size_t)b * T + i) * K + g] * G[((size_t)b * T + j) * K + g];
            s += 1 / (1 + exp(-lam * (a - bias)));
            n++;
        }
    }
    return s / n;
}

void eval_continuations(Model* m, int* const* seqs, const size_t* n, const size_t* first, int nc,
                        double* ll, int* greedy) {
    /* a model whose tokenizer adds a BOS reads each sequence after it (Gemma) */
    const int off = m->bos >= 0;
    int T = 1;
    for (int c = 0; c < nc; c++) {
        if (n[c] < 2 || first[c] < 1 || first[c] >= n[c])
            fatal("internal: eval_continuations needs 1 <= first < n");
        if ((int)n[c] - 1 + off > T) T = (int)n[c] - 1 + off;
    }
    int* inp = callocCheck((size_t)nc * T, sizeof(int)); /* padding: token 0, never scored */
    int* tgt = mallocCheck(sizeof(int) * (size_t)nc * T);
    for (int i = 0; i < nc * T; i++) tgt[i] = -1;
    for (int c = 0; c < nc; c++) {
        if (off) inp[c * T] = m->bos;
        for (size_t t = 0; t + 1 < n[c]; t++) {
            inp[c * T + (int)t + off] = seqs[c][t];
            if (t + 1 >= first[c]) tgt[c * T + (int)t + off] = seqs[c][t + 1];
        }
    }
    model_forward(m, inp, tgt, nc, T, 0);
    for (int c = 0; c < nc; c++) {
        ll[c] = 0;
        greedy[c] = 1;
        for (int t = 0; t < T; t++) {
            const int y = tgt[c * T + t];
            if (y < 0) continue;
            ll[c] -= m->losses[c * T + t];
            /* greedy: no token scores above the target (ties keep it) */
            greedy[c] &= !(m->row_max[c * T + t] > m->row_target[c * T + t]);
        }
    }
    free(inp);
    free(tgt);
}
