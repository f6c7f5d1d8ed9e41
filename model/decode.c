/* decode.c: one-token forward passes over a group-organised KV cache (see decode.h). */
#include "layer_cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "../kernels/cpu.h"
#include "../kernels/sparse.h"
#include "sample.h"

static void check_mode(const Model* m) {
    const FocusConfig* f = &m->fc;
    if (model_method(m)->no_decode) fatal("%s", model_method(m)->no_decode);
    if (attn_is_blocks(f->attn) && f->w < f->block - 1)
        fatal(
            "generation with key blocks needs w >= block - 1 (got w = %d, block = %d): a query's "
            "candidate blocks must be complete",
            f->w, f->block);
    if (model_method(m)->causal_routing && f->routing != ROUTE_CAUSAL)
        fatal("generation needs causal routing (got %s)", routing_name(f->routing));
}

/* Whether n rows can be fed: each token in the vocabulary, each row's position (the next of its
 * cache, after the rows before it on the same cache) inside the cache and, with learned
 * positions, the model's context. 0 with why written when not (pos: NULL, or n positions). */
static int rows_fit(const Model* m, KVCache* const* cs, const int* tokens, int n, int* pos,
                    char* why, size_t wl) {
    const ModelConfig* mc = &m->cfg;
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= mc->V) {
            snprintf(why, wl, "token id %d outside the vocabulary (V=%d)", tokens[i], mc->V);
            return 0;
        }
        int at = cs[i]->n;
        for (int j = 0; j < i; j++) at += cs[j] == cs[i];
        if (at >= cs[i]->cap) {
            snprintf(why, wl, "KV cache full (%d tokens)", cs[i]->cap);
            return 0;
        }
        if (!model_layer_spec(mc, 0).rope && at >= mc->maxT) { /* learned positions */
            snprintf(why, wl, "position %d exceeds the model's context (%d)", at, mc->maxT);
            return 0;
        }
        if (pos) pos[i] = at;
    }
    return 1;
}

/* one step of decode_rows on gov's threads */
static void decode_rows(Model* m, KVCache* const* cs, const int* tokens, int n, real* logits,
                        int all, int per_row);

static void governed_rows(Model* m, KVCache* const* cs, const int* tokens, int n, real* logits,
                          Governor* gov) {
    const int on = gov && gov->on;
    const double t0 = on ? now_seconds() : 0;
    if (on) omp_set_num_threads(governor_threads(gov));
    decode_rows(m, cs, tokens, n, logits, 1, 1);
    if (on) {
        omp_set_num_threads(gov->max);
        governor_update(gov, now_seconds() - t0);
    }
}

void model_decode_step(Model* m, KVCache* c, int token, real* logits) {
    governed_rows(m, &c, &token, 1, logits, &c->gov);
}

int model_decode_batch(Model* m, KVCache* const* caches, const int* tokens, int n, real* logits,
                       Governor* gov, char* why, size_t wl) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++)
            if (caches[i] == caches[j]) {
                snprintf(why, wl, "decode batch: rows %d and %d share a cache", j, i);
                return 0;
            }
    if (!rows_fit(m, caches, tokens, n, NULL, why, wl)) return 0;
    if (n > 0) governed_rows(m, caches, tokens, n, logits, gov);
    return 1;
}

/* The layers (cpu_layer) over n rows of tokens and the head, the decode step's and the
 * prompt's: row i feeds tokens[i] to cs[i] at position pos[i] (rows of one cache in order: a
 * prompt's tokens after cached ones), attending over each row's cache (per_row: each row's
 * arithmetic that of a single-row step, else a prompt's rows, batched). logits: each row's
 * (n, V) when `all`, else the last row's. */
static void rows_pass(Model* m, KVCache* const* cs, const int* pos, const int* tokens, int n,
                      real* logits, int all, int per_row) {
    const ModelConfig* mc = &m->cfg;
    const FocusConfig* f = &m->fc;
    const Params* p = &m->params;
    const int C = mc->C, NH = mc->NH, NKV = mc->NKV, hs = model_head_size(mc),
              Q = cached_qkv_width(mc);
    const int K = f->K, F = mc->F, FC = model_fc_width(mc), A = NH * hs;
    const size_t N = (size_t)n;
    KVCache* c0 = cs[0];
    real* buf =
        mallocCheck(sizeof(real) * N * (3 * (size_t)C + A + Q + FC + F + NH + 2 + f->dg + 2 * K));
    real *x = buf, *h = x + N * C, *att = h + N * C, *tmp = att + N * A, *qkv = tmp + N * C;
    real *fch = qkv + N * Q, *act = fch + N * FC, *lse = act + N * F, *stat = lse + N * NH;
    real *proj = stat + 2 * N, *S = proj + N * f->dg, *G = S + N * K;
    uint32_t* mask = mallocCheck(sizeof(uint32_t) * N);
    /* the cached rows' scratch: each key/value head's key list, the block patterns' */
    int nbmax = 1;
    for (int i = 0; i < (per_row ? n : 1); i++) { /* a prompt's one cache */
        const int nb = kvcache_block_cap(cs[i]->cap, f->block);
        nbmax = nb > nbmax ? nb : nbmax;
    }
    RowScratch rs = {.kl = mallocCheck(sizeof(int*) * (size_t)NKV),
                     .nkg = mallocCheck(sizeof(int) * (size_t)NKV),
                     .bsel = mallocCheck(sizeof(int) * (size_t)NKV * nbmax),
                     .bsc = mallocCheck(sizeof(real) * (size_t)NKV * nbmax),
                     .bp = mallocCheck(sizeof(real) * (size_t)NH * nbmax),
                     .npre = mallocCheck(sizeof(int) * (size_t)NKV),
                     .rlo = mallocCheck(sizeof(int) * (size_t)NKV),
                     .rhi = mallocCheck(sizeof(int) * (size_t)NKV)};
    /* FOCUS_PROFILE: the parts of the decode steps, and apart those of a prompt's rows */
    double* prof = c0->profile ? (per_row ? c0->prof : c0->pprof) : NULL;
    double mark = prof ? now_seconds() : 0;
    for (int i = 0; i < n; i++) {
        real* xi = x + (size_t)i * C;
#ifndef FOCUS_DOUBLE
        if (m->native) {
            qrow(xi, m->native + (size_t)mc->L * NATIVE_PER_LAYER + 1, tokens[i]);
            continue;
        }
#endif
        for (int e = 0; e < C; e++)
            xi[e] =
                p->wte[(size_t)tokens[i] * C + e] + (p->wpe ? p->wpe[(size_t)pos[i] * C + e] : 0);
    }
    const real escale = model_embed_scale(mc);
    if (escale != 1)
        for (size_t e = 0; e < N * C; e++) x[e] *= escale;
    check_finite_acts(m, x, N * C, -1);
    profile_tick(prof, &mark, 7);
    /* one layer's tensors: the stream x updated in place, the branch outputs in tmp */
    const LayerActs la = {.ln1 = h,
                          .ln1_mean = stat,
                          .ln1_rstd = stat + N,
                          .qkv = qkv,
                          .att = att,
                          .lse = lse,
                          .res2 = x,
                          .ln2 = h,
                          .ln2_mean = stat,
                          .ln2_rstd = stat + N,
                          .fch = fch,
                          .fch_act = act,
                          .res3 = x,
                          .rproj = proj,
                          .rS = S,
                          .rG = G,
                          .mask = mask,
                          .qmask = mask,
                          .attp = tmp,
                          .attp_rstd = stat,
                          .mlpp = tmp,
                          .mlpp_rstd = stat};
    /* RoPE's cosines and sines of the rows' positions, once for the layers of each base (two
     * in Gemma 3: its local and global layers) instead of once a layer (perf, an 8K prompt with
     * the block selector: 0.6 % of the samples, 0.04 % after) */
    real* rope_cs[2] = {NULL, NULL};
    float rope_base[2] = {0, 0};
    int nrope = 0;
    for (int l = 0; l < mc->L; l++) {
        const LayerSpec S = model_layer_spec(mc, l);
        int have = !S.rope;
        for (int k = 0; k < nrope; k++) have |= rope_base[k] == S.rope_theta;
        if (have || nrope == 2) continue;
        rope_base[nrope] = S.rope_theta;
        rope_cs[nrope] = mallocCheck(sizeof(real) * N * S.hs);
        rope_rows_table(rope_cs[nrope++], n, pos, S.hs, S.rope_theta);
    }
    const LayerRows rows = {.kind = ROWS_CACHED,
                            .B = 1,
                            .T = n,
                            .cs = cs,
                            .pos = pos,
                            .exact = m->prefill_exact && !per_row,
                            .per_row = per_row,
                            .scratch = &rs,
                            .prof = prof,
                            .mark = &mark,
                            .rope_cs = {rope_cs[0], rope_cs[1]},
                            .rope_base = {rope_base[0], rope_base[1]},
                            .nrope = nrope};
    for (int l = 0; l < mc->L; l++) cpu_layer(m, l, x, &la, &rows);
    /* the head: every row's logits, or the last row's only (a prompt needs no more) */
    const int nr = all ? n : 1;
    const real* last = all ? x : x + (N - 1) * C;
    const LayerSpec S0 = model_layer_spec(mc, 0);
    cpu_norm(m, &S0, h, stat, stat + nr, last, p->lnfw, p->lnfb, nr);
    profile_tick(prof, &mark, 5);
    rows_project(logits, mc->V, h, nr, mc->tied ? p->wte : p->lmhead, NULL, C, mc->V,
                 m->native ? m->native + (size_t)mc->L * NATIVE_PER_LAYER : NULL, rows.exact,
                 per_row, pos[all ? 0 : N - 1]);
    check_finite_acts(m, logits, (size_t)nr * mc->V, mc->L);
    profile_tick(prof, &mark, 6);
    for (int i = 0; i < n; i++) cs[i]->n++;
    free(rs.kl), free(rs.nkg), free(rs.bsel), free(rs.bsc), free(rs.bp), free(rs.npre);
    free(rs.rlo), free(rs.rhi);
    free(rope_cs[0]), free(rope_cs[1]);
    free(mask);
    free(buf);
}

/* The decode step's layers over n rows (ROWS_CACHED): each row's position the next of its
 * cache. */
static void decode_rows(Model* m, KVCache* const* cs, const int* tokens, int n, real* logits,
                        int all, int per_row) {
    check_mode(m);
    int* pos = mallocCheck(sizeof(int) * (size_t)n); /* each row's position in its cache */
    char why[160];
    if (!rows_fit(m, cs, tokens, n, pos, why, sizeof why)) fatal("%s", why);
    rows_pass(m, cs, pos, tokens, n, logits, all, per_row);
    free(pos);
}

/* The rows of a prompt chunk at most (a longer prompt is fed in chunks: the arithmetic is the same,
 * the activations' memory bounded). */
enum { PREFILL_CHUNK = 1024 };

int model_prefill_checked(Model* m, KVCache* c, const int* tokens, int n, real* logits, int all,
                          char* why, size_t wl) {
    check_mode(m);
    if (n < 1) {
        snprintf(why, wl, "prefill: no tokens");
        return 0;
    }
    if (c->n + n > c->cap) {
        snprintf(why, wl, "KV cache full (%d + %d tokens, capacity %d)", c->n, n, c->cap);
        return 0;
    }
    if (!model_layer_spec(&m->cfg, 0).rope && c->n + n > m->cfg.maxT) { /* learned positions */
        snprintf(why, wl, "position %d exceeds the model's context (%d)", c->n + n - 1,
                 m->cfg.maxT);
        return 0;
    }
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->cfg.V) {
            snprintf(why, wl, "token id %d outside the vocabulary (V=%d)", tokens[i], m->cfg.V);
            return 0;
        }
    const int most = n < PREFILL_CHUNK ? n : PREFILL_CHUNK;
    KVCache** cs = mallocCheck(sizeof(KVCache*) * (size_t)most);
    for (int i = 0; i < most; i++) cs[i] = c;
    for (int i0 = 0; i0 < n; i0 += most) {
        const int k = n - i0 < most ? n - i0 : most;
        /* the logits of every row, or of the prompt's last row only */
        real* lg = all ? logits + (size_t)i0 * m->cfg.V : logits;
        decode_rows(m, cs, tokens + i0, k, lg, all, 0);
    }
    free(cs);
    return 1;
}

void model_prefill(Model* m, KVCache* c, const int* tokens, int n, real* logits, int all) {
    char why[160];
    if (!model_prefill_checked(m, c, tokens, n, logits, all, why, sizeof why)) fatal("%s", why);
}

int decode_sample(const real* logits, int V, double temperature, double top_p, Rng* rng) {
    Sampling s = sampling_defaults();
    s.temperature = temperature, s.top_p = top_p;
    return sample_token(logits, V, &s, NULL, 0, NULL, 0, rng);
}
