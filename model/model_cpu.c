/* model_cpu.c: the forward and backward passes on the CPU, the reference implementation (see
 * model.h for the layer and backend.h for the seam). Plain C over kernels/: read this file with
 * METHOD.md; model_cuda.c mirrors it step for step. Frozen weights get no gradient (NULL
 * weight-gradient pointers), so in GRAD_ROUTER mode only input gradients flow. */
#include <math.h>
#include <string.h>

#include "../kernels/cpu.h"
#include "../kernels/sparse.h"
#include "layer_cpu.h"

static void ensure_acts(Model* m, int B, int T, int keep) {
    if (m->acts_mem && m->B == B && m->T == T && m->keep == keep) return;
    model_host_buffers(m, B, T, keep);
    ActSizes s = model_act_sizes(&m->cfg, &m->fc, B, T, keep);
    m->acts_mem = mallocCheck(model_sum_sizes(s.n, NUM_ACT_TENSORS) * sizeof(real));
    model_carve((real**)&m->acts, m->acts_mem, s.n, NUM_ACT_TENSORS);
    /* the keys' masks of every slot, then (a router with a query projection) the queries' */
    m->rmask =
        mallocCheck(sizeof(uint32_t) * (keep ? m->cfg.L : 1) * B * T * (m->router.wq ? 2 : 1));
}

static LayerActs layer_acts(const Model* m, int l) {
    return model_layer_acts(m, &m->acts, m->rmask, l);
}

/* LoRA adapter k (0 qkv, 1 o, 2 fc, 3 fcproj) of layer l, when m has one: out (BT, OC) of the
 * projection from x (BT, IC) gains (alpha / rank) x A^T B^T; lora_grad accumulates its gradients
 * (and dx, unless NULL) from dout. */
static real* lora_scratch(Model* m, size_t n) {
    if (m->lora_scratch_n < n) {
        m->lora_scratch = reallocCheck(m->lora_scratch, sizeof(real) * n);
        m->lora_scratch_n = n;
    }
    return m->lora_scratch;
}

static void lora_add(Model* m, LoraTarget k, int l, real* out, const real* x, size_t BT, int IC,
                     int OC) {
    if (!((m->lora.targets >> k) & 1)) return;
    const int r = m->lora.rank;
    lora_forward(out, x, lora_a(&m->lw, k) + (size_t)l * r * IC,
                 lora_b(&m->lw, k) + (size_t)l * OC * r, BT, IC, OC, r, (real)(m->lora.alpha / r),
                 lora_scratch(m, BT * r));
}

static void lora_grad(Model* m, LoraTarget k, int l, real* dx, const real* dout, const real* x,
                      size_t BT, int IC, int OC) {
    if (!((m->lora.targets >> k) & 1)) return;
    const int r = m->lora.rank;
    real* t = lora_scratch(m, 2 * BT * r);
    lora_backward(dx, lora_a(&m->lg, k) + (size_t)l * r * IC,
                  lora_b(&m->lg, k) + (size_t)l * OC * r, dout, x,
                  lora_a(&m->lw, k) + (size_t)l * r * IC, lora_b(&m->lw, k) + (size_t)l * OC * r,
                  BT, IC, OC, r, (real)(m->lora.alpha / r), t, t + BT * r);
}

void cpu_norm(const Model* m, const LayerSpec* S, real* out, real* mean, real* rstd,
              const real* inp, const real* w, const real* b, size_t N) {
    if (S->norm == NORM_LAYER)
        layernorm_forward(out, mean, rstd, inp, w, b, N, m->cfg.C, m->cfg.eps);
    else
        rmsnorm_forward(out, rstd, inp, w, N, m->cfg.C, m->cfg.eps);
}

static void norm_backward(const Model* m, const LayerSpec* S, real* dinp, real* dw, real* db,
                          const real* dout, const real* inp, const real* w, const real* mean,
                          const real* rstd, size_t N) {
    if (S->norm == NORM_LAYER)
        layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, m->cfg.C);
    else
        rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, m->cfg.C);
}

/* The layer's rotary positions on the q and k heads of qkv (sign 1), or their inverse on
 * dqkv (-1). */
static void layer_rope(const LayerSpec* S, real* qkv, int B, int T, int NH, int NKV, int sign) {
    if (!S->rope) return;
    if (S->rope_halves)
        (sign > 0 ? rope_halves_forward : rope_halves_backward)(qkv, B, T, NH, NKV, S->hs,
                                                                S->rope_theta, 0);
    else
        (sign > 0 ? rope_forward : rope_backward)(qkv, B, T, NH, NKV, S->hs, S->rope_theta, 0);
}

/* ... on n cached rows, row i at position pos[i]. */
static void layer_rope_rows(const LayerSpec* S, real* qkv, int n, int NH, int NKV,
                            const LayerRows* r) {
    if (!S->rope) return;
    for (int k = 0; k < r->nrope; k++)
        if (r->rope_base[k] == S->rope_theta) { /* the table of this base, made already */
            rope_rows_apply(qkv, n, r->rope_cs[k], NH, NKV, S->hs, S->rope_halves);
            return;
        }
    rope_rows_forward(qkv, n, r->pos, NH, NKV, S->hs, S->rope_theta, S->rope_halves);
}

/* The MLP's activation of fch (BT rows) into act, and its backward. */
static void act_forward(const LayerSpec* S, real* act, const real* fch, size_t BT, int F) {
    if (S->act == ACT_GELU)
        gelu_forward(act, fch, BT * F);
    else if (S->act == ACT_SWIGLU)
        swiglu_forward(act, fch, BT, F);
    else
        geglu_forward(act, fch, BT, F);
}

static void act_backward(const LayerSpec* S, real* dfch, const real* fch, const real* dact,
                         size_t BT, int F) {
    if (S->act == ACT_GELU)
        gelu_backward(dfch, fch, dact, BT * F);
    else if (S->act == ACT_SWIGLU)
        swiglu_backward(dfch, fch, dact, BT, F);
    else
        geglu_backward(dfch, fch, dact, BT, F);
}

/* Tensor parallelism: x (n reals), a partial sum over this slice's heads or feed-forward units,
 * becomes the whole model's sum (a no-op for a whole model). */
static void tp_sum(const Model* m, real* x, size_t n) {
    if (m->tp) comm_allreduce_sum(m->tp, x, n, COMM_F32);
}

/* A bias added after a row-parallel product: by one slice only, before the partial sums are
 * added up. */
static const real* tp_bias(const Model* m, const real* b) { return m->cfg.tp_rank ? NULL : b; }

/* The n activations after layer l (-1: the token embedding, L: the output head) must be finite:
 * a NaN or infinite weight that the loader could not check (a block's scale in the file's own
 * format, a norm of a lean load) or an overflow would otherwise turn into garbage tokens. */
void check_finite_acts(const Model* m, const real* x, size_t n, int l) {
    for (size_t i = 0; i < n; i++) {
        if (isfinite(x[i])) continue;
        char where[64];
        if (l < 0)
            snprintf(where, sizeof where, "the token embedding");
        else if (l >= m->cfg.L)
            snprintf(where, sizeof where, "the output head");
        else
            snprintf(where, sizeof where, "layer %d of %d", l, m->cfg.L);
        fatal(
            "%s: non-finite activations (%g) after %s: a NaN or infinite weight in the file, "
            "or an overflow; generation stopped",
            m->source[0] ? m->source : "the model", (double)x[i], where);
    }
}

/* Pairs kept by one layer of method t over B sequences of T (its row's count: every pair, the
 * band, the masks qmask and mask; a kernel that counts its own adds nothing here), and the
 * causal pairs, into m->pattern_kept / pattern_pairs. */
static void pattern_count(Model* m, const AttnMethod* t, const uint32_t* qmask,
                          const uint32_t* mask, int B, int T, int window) {
    const FocusConfig* f = &m->fc;
    const double causal = (double)T * (T + 1) / 2;
    const int w = t->own_window ? window : f->w, sinks = t->own_window ? 0 : f->sinks;
    m->pattern_pairs += B * causal;
    if (t->count == COUNT_ALL)
        m->pattern_kept += B * causal;
    else if (t->count == COUNT_BAND)
        for (int i = 0; i < T; i++) m->pattern_kept += B * band_pairs_kept(i, w, sinks);
    else if (t->count == COUNT_MASKS || t->count == COUNT_GROUPS)
        /* the sinks are in every group of the masks: counted in the band or through the masks
         * alike. A pattern's masks serve queries and keys both. */
        for (int b = 0; b < B; b++)
            m->pattern_kept +=
                mask_pairs_kept((t->masks == MASKS_PATTERN ? mask : qmask) + (size_t)b * T,
                                mask + (size_t)b * T, T, w, sinks);
}

/* Projection k of layer l (0 q k v, 1 attention output, 2 gate + up or fc, 3 down or fc
 * projection) over n rows, with its LoRA adapter and, after a row-parallel product, the partial
 * sums of tensor parallelism added up. The cached rows read the file's blocks where the model
 * has them (the q, k, v and gate, up matrices side by side in the rows of out). */
static void layer_project(Model* m, const LayerRows* r, int k, int l, real* out, const real* in,
                          size_t n) {
    const ModelConfig* c = &m->cfg;
    const Params* p = &m->params;
    const int C = c->C, A = model_att_width(c), F = model_ffn(c), QKV = model_qkv_width(c),
              FC = model_fc_width(c);
    const int cols[4] = {C, A, C, F}, rows[4] = {QKV, C, FC, C};
    const real* bias[4] = {model_slice(p->qkvb, l, QKV), model_slice(tp_bias(m, p->attprojb), l, C),
                           model_slice(p->fcb, l, FC), model_slice(tp_bias(m, p->fcprojb), l, C)};
    const real* b = bias[k];
    const QMatrix* nw =
        m->native && r->kind != ROWS_SEQUENCES ? m->native + (size_t)l * NATIVE_PER_LAYER : NULL;
    const int N = (int)n, ex = r->exact, pr = r->per_row;
    const int s0 = r->kind == ROWS_CACHED && r->pos ? r->pos[0] : 0; /* the first row's place */
    if (nw && k == 0) { /* three matrices in the file */
        const int kvw = model_kv_heads(c) * model_head_size(c);
        rows_project(out, QKV, in, N, NULL, b, C, A, nw + NATIVE_Q, ex, pr, s0);
        rows_project(out + A, QKV, in, N, NULL, b ? b + A : NULL, C, kvw, nw + NATIVE_K, ex, pr,
                     s0);
        rows_project(out + A + kvw, QKV, in, N, NULL, b ? b + A + kvw : NULL, C, kvw, nw + NATIVE_V,
                     ex, pr, s0);
    } else if (nw && k == 2) { /* gate rows then up rows, as fcw holds them */
        rows_project(out, FC, in, N, NULL, NULL, C, F, nw + NATIVE_GATE, ex, pr, s0);
        rows_project(out + F, FC, in, N, NULL, NULL, C, F, nw + NATIVE_UP, ex, pr, s0);
    } else {
        const QMatrix* q = nw ? nw + (k == 1 ? NATIVE_O : NATIVE_DOWN) : NULL;
        const real* w = q ? NULL : model_layer_weight(m, model_proj_tensor(k), l);
        rows_project(out, rows[k], in, N, w, b, cols[k], rows[k], q, ex, pr, s0);
    }
    lora_add(m, k, l, out, in, n, cols[k], rows[k]);
    if (k == 1 || k == 3) tp_sum(m, out, n * C);
}

/* The stream y = x + o, the branch output o normed first with sandwich norms (weight w, its
 * rstd to rstd); y may be x (in place: the norm then overwrites o) or o. */
static void layer_join(const Model* m, const LayerSpec* S, real* y, const real* x, real* o,
                       const real* w, real* rstd, size_t n) {
    const size_t C = (size_t)m->cfg.C;
    if (S->sandwich) {
        real* normed = y != x ? y : o;
        cpu_norm(m, S, normed, NULL, rstd, o, w, NULL, n);
        o = normed;
    }
    for (size_t i = 0; i < n * C; i++) y[i] = x[i] + o[i];
}

/* Model.attn_error: layer l's attention and its contribution to the residual stream y (from
 * the layer's input x) against the dense attention of the same q, k, v and the window alone
 * (AttnError in model.h). */
static void attention_error(Model* m, const LayerRows* r, const LayerSpec* S, int l, const real* x,
                            const LayerActs* la) {
    const ModelConfig* c = &m->cfg;
    const int B = r->B, T = r->T, NH = model_heads(c), NKV = model_kv_heads(c),
              hs = model_head_size(c);
    const size_t n = (size_t)B * T, C = c->C, A = n * NH * hs;
    const Params* p = &m->params;
    real* o = mallocCheck(sizeof(real) * 2 * A); /* dense's heads, then the window's */
    real* lse = mallocCheck(sizeof(real) * n * NH);
    real* proj = mallocCheck(sizeof(real) * n * C);
    real* y = mallocCheck(sizeof(real) * 2 * n * C); /* dense's stream, then the window's */
    real* rstd = mallocCheck(sizeof(real) * n);
    AttnError* e = m->attn_error;
    attention_flash_forward(o, lse, la->qkv, B, T, NH, NKV, hs);
    attention_band_forward(o + A, lse, la->qkv, m->fc.w, m->fc.sinks, B, T, NH, NKV, hs);
    double he = 0, hw = 0, hr = 0;
    for (size_t i = 0; i < A; i++) {
        he += ((double)la->att[i] - o[i]) * ((double)la->att[i] - o[i]);
        hw += ((double)o[A + i] - o[i]) * ((double)o[A + i] - o[i]);
        hr += (double)o[i] * o[i];
    }
    for (int k = 0; k < 2; k++) {
        layer_project(m, r, 1, l, proj, o + k * A, n);
        layer_join(m, S, y + k * n * C, x, proj, model_slice(p->pan, l, C), rstd, n);
    }
    double oe = 0, ow = 0, orf = 0;
    for (size_t i = 0; i < n * C; i++) {
        const double d = y[i];
        oe += (la->res2[i] - d) * (la->res2[i] - d);
        ow += (y[n * C + i] - d) * (y[n * C + i] - d);
        orf += (d - x[i]) * (d - x[i]);
    }
    e->heads[l] += he, e->heads_window[l] += hw, e->heads_ref[l] += hr;
    e->out[l] += oe, e->out_window[l] += ow, e->out_ref[l] += orf;
    free(o), free(lse), free(proj), free(y), free(rstd);
}

/* A router with a query projection (qproj; docs/OBJECTIVE.md): each token joins its top-1 group
 * by W_g as a key (la->mask, from la->rG) and keeps the top-k groups of its own projection W_q
 * as a query (la->qmask), causal routing with the same beta. */
static void query_masks(const Model* m, int l, const LayerActs* la, int B, int T) {
    const ModelConfig* c = &m->cfg;
    const FocusConfig* f = &m->fc;
    const size_t BT = (size_t)B * T, lC = (size_t)l * c->C;
    routing_topk_mask(la->mask, la->rG, B, T, f->K, 1, 0, f->sinks, 0);
    real* buf = mallocCheck(sizeof(real) * BT * ((size_t)f->dg + 2 * f->K));
    real *proj = buf, *S = proj + BT * f->dg, *G = S + BT * f->K;
    router_scores_forward(proj, S, la->ln1, m->router.wq + lC * f->dg,
                          m->router.cent + (size_t)l * f->K * f->dg, BT, c->C, f->dg, f->K);
    routing_forward(G, NULL, S, m->beta + (size_t)l * f->K, ROUTE_CAUSAL, B, T, f->K, f->tau,
                    f->iters);
    routing_topk_mask(la->qmask, G, B, T, f->K, f->topk, f->topp, f->sinks, 0);
    free(buf);
}

/* The attention of layer l over whole sequences (ROWS_SEQUENCES): the router's
 * groups where the mode needs them, the kernel of the layer's mode, the pairs it keeps. */
static void layer_attention(Model* m, int l, const LayerActs* la, const LayerRows* r) {
    const ModelConfig* c = &m->cfg;
    const FocusConfig* f = &m->fc;
    const int B = r->B, T = r->T, hs = model_head_size(c), NH = model_heads(c),
              NKV = model_kv_heads(c);
    const size_t BT = (size_t)B * T, lC = (size_t)l * c->C;
    /* the layer's method (model_layer_attn: a dense or sliding-window layer has its own) */
    const AttnMethod* t = attn_methods[model_layer_attn(m, l)];
    const AttnKernel kernel = model_attn_kernel(t->mode, r->keep);
    /* the centroids beside a block selector: the router's groups (causal routing, as the hard
     * mode evaluates) join the chosen blocks */
    const int with_groups = kernel == ATTN_KERNEL_BLOCKS && m->method.with_groups;
    const MaskKind masks = with_groups ? MASKS_ROUTER : t->masks;
    /* a dense layer's groups are still computed (reports and statistics read them) */
    if (masks == MASKS_ROUTER || attn_uses_router(f->attn) || m->pass.routed_dense) {
        router_scores_forward(la->rproj, la->rS, la->ln1, m->router.wg + lC * f->dg,
                              m->router.cent + (size_t)l * f->K * f->dg, BT, c->C, f->dg, f->K);
        routing_forward(la->rG, la->colofs, la->rS, m->beta + (size_t)l * f->K,
                        with_groups ? ROUTE_CAUSAL : f->routing, B, T, f->K, f->tau, f->iters);
        if (masks == MASKS_ROUTER && m->router.wq)
            query_masks(m, l, la, B, T);
        else if (masks == MASKS_ROUTER)
            routing_topk_mask(la->mask, la->rG, B, T, f->K, f->topk, f->topp, f->sinks, 0);
    }
    if (masks == MASKS_PATTERN) t->pattern_mask(la->mask, B, T, m, l, 0);
    if (masks == MASKS_ZERO) memset(la->mask, 0, sizeof(uint32_t) * BT); /* no groups */
    /* the method's kernel (model.h, AttnKernel) */
    AttnGate gate = model_layer_gate(m, l, la);
    double kept = 0; /* the block kernels' count */
    switch (kernel) {
        case ATTN_KERNEL_SPARSE:
            attention_hard_forward(la->att, la->lse, la->qkv, la->qmask, la->mask, f->K, f->w, B, T,
                                   NH, NKV, hs);
            break;
        case ATTN_KERNEL_DENSE:
            attention_flash_forward(la->att, la->lse, la->qkv, B, T, NH, NKV, hs);
            break;
        case ATTN_KERNEL_GATED:
            if (m->router.wq && t->gate == GATE_SOFT)
                fatal(
                    "a router with a query projection (qproj = 1) runs in hard mode for "
                    "evaluation and serving, and trains with objective = mass");
            attention_forward(la->att, la->lse, la->qkv, &gate, B, T, NH, NKV, hs);
            break;
        case ATTN_KERNEL_BAND: /* the window pattern, or a local layer's own window */
            attention_band_forward(la->att, la->lse, la->qkv, gate.w, gate.sinks, B, T, NH, NKV,
                                   hs);
            break;
        case ATTN_KERNEL_BLOCKS:
            kept = attention_blocks_forward(
                la->att, la->lse, la->qkv, f->w, f->sinks, f->block, model_layer_blocks(m, l),
                f->blocks_p, t->score,
                m->method.selector ? model_slice(m->method.selector, l, NH * BLOCKGATE_WIDTH(hs))
                                   : NULL,
                with_groups ? la->qmask : NULL, with_groups ? la->mask : NULL, f->K, B, T, NH, NKV,
                hs);
            break;
    }
    m->pattern_kept += kept;
    /* the pairs a sparse method keeps (the router's groups without a query projection:
     * evaluate.c counts them from the groups, on either backend) */
    if (attn_is_sparse(f->attn) && (model_method(m)->count != COUNT_GROUPS || m->router.wq))
        pattern_count(m, t, la->qmask, la->mask, B, T, model_layer_spec(c, l).window);
}

void cpu_layer(Model* m, int l, const real* x, const LayerActs* la, const LayerRows* r) {
    const ModelConfig* c = &m->cfg;
    const Params* p = &m->params;
    const size_t n = (size_t)r->B * r->T, C = (size_t)c->C;
    const int hs = model_head_size(c), NH = model_heads(c), NKV = model_kv_heads(c),
              F = model_ffn(c);
    const LayerSpec S = model_layer_spec(c, l);
    /* FOCUS_PROFILE: the time of each part of DECODE_PARTS */
    cpu_norm(m, &S, la->ln1, la->ln1_mean, la->ln1_rstd, x, model_slice(p->ln1w, l, C),
             model_slice(p->ln1b, l, C), n);
    profile_tick(r->prof, r->mark, 5);
    layer_project(m, r, 0, l, la->qkv, la->ln1, n);
    profile_tick(r->prof, r->mark, 0);
    if (S.qk_norm)
        qknorm_forward(la->qkv, la->qkpre, la->qkrstd, model_slice(p->qnormw, l, hs),
                       model_slice(p->knormw, l, hs), n, NH, NKV, hs, c->eps);
    if (r->kind == ROWS_CACHED) { /* each row at its own position */
        layer_rope_rows(&S, la->qkv, (int)n, NH, NKV, r);
        kvcache_attend_rows(m, l, r, la->ln1, la->qkv, la->att);
    } else {
        layer_rope(&S, la->qkv, r->B, r->T, NH, NKV, 1);
        layer_attention(m, l, la, r);
        if (m->layer_observer && r->kind == ROWS_SEQUENCES)
            m->layer_observer(m->layer_observer_ctx, l, la->ln1, la->qkv, la->lse, r->B, r->T);
    }
    profile_tick(r->prof, r->mark, 1);
    /* the attention output (gemma3: normed before the residual add) */
    real* ao = la->attp ? la->attp : la->res2;
    layer_project(m, r, 1, l, ao, la->att, n);
    profile_tick(r->prof, r->mark, 2);
    layer_join(m, &S, la->res2, x, ao, model_slice(p->pan, l, C), la->attp_rstd, n);
    if (m->attn_error && r->kind == ROWS_SEQUENCES && S.window < 0)
        attention_error(m, r, &S, l, x, la);
    cpu_norm(m, &S, la->ln2, la->ln2_mean, la->ln2_rstd, la->res2, model_slice(p->ln2w, l, C),
             model_slice(p->ln2b, l, C), n);
    profile_tick(r->prof, r->mark, 5);
    layer_project(m, r, 2, l, la->fch, la->ln2, n);
    profile_tick(r->prof, r->mark, 3);
    act_forward(&S, la->fch_act, la->fch, n, F);
    profile_tick(r->prof, r->mark, 5);
    real* mo = la->mlpp ? la->mlpp : la->res3;
    layer_project(m, r, 3, l, mo, la->fch_act, n);
    profile_tick(r->prof, r->mark, 4);
    layer_join(m, &S, la->res3, la->res2, mo, model_slice(p->pfn, l, C), la->mlpp_rstd, n);
    if (r->kind != ROWS_SEQUENCES) check_finite_acts(m, la->res3, n * C, l);
    profile_tick(r->prof, r->mark, 5);
}

static void cpu_forward(Model* m, const int* inputs, const int* targets, int B, int T, int keep) {
    const ModelConfig* c = &m->cfg;
    ensure_acts(m, B, T, keep);
    memcpy(m->inputs, inputs, sizeof(int) * B * T);
    const size_t BT = (size_t)B * T;
    const int C = c->C;
    const Params* p = &m->params;
    Acts* a = &m->acts;
    encoder_forward(a->encoded, inputs, p->wte, p->wpe, B, T, C);
    const real escale = model_embed_scale(c);
    if (escale != 1)
        for (size_t i = 0; i < BT * C; i++) a->encoded[i] *= escale;
    const real* x = a->encoded;
    m->pattern_kept = m->pattern_pairs = 0;
    const LayerRows rows = {.kind = ROWS_SEQUENCES, .B = B, .T = T, .keep = keep};
    for (int l = 0; l < c->L; l++) {
        LayerActs la = layer_acts(m, l);
        cpu_layer(m, l, x, &la, &rows);
        x = la.res3;
    }
    m->mean_loss = -1;
    if (m->pass.no_head) return;
    const LayerSpec S0 = model_layer_spec(c, 0);
    cpu_norm(m, &S0, a->lnf, a->lnf_stat, a->lnf_stat + BT, x, p->lnfw, p->lnfb, BT);
    const size_t hr = model_head_rows(c, BT, keep); /* rows of logits held at once */
    if (hr < BT && m->pass.kl_active)
        fatal("internal: the kl objective needs every row's logits (%zu rows)", BT);
    const real* head = c->tied ? p->wte : p->lmhead;
    for (size_t r0 = 0; r0 < BT; r0 += hr) { /* the head, a chunk of rows at a time */
        const size_t nr = BT - r0 < hr ? BT - r0 : hr;
        matmul_forward(a->logits, a->lnf + r0 * C, head, NULL, nr, C, c->V);
        if (!targets) continue;
        crossentropy_forward(m->losses + r0, a->logits, targets + r0, nr, c->V);
        for (size_t i = 0; i < nr; i++) { /* what the greedy check of a continuation reads */
            const real* row = a->logits + i * c->V;
            real mx = row[0];
            for (int v = 1; v < c->V; v++) mx = row[v] > mx ? row[v] : mx;
            m->row_max[r0 + i] = mx;
            m->row_target[r0 + i] = targets[r0 + i] >= 0 ? row[targets[r0 + i]] : 0;
        }
    }
    if (targets) {
        memcpy(m->targets, targets, sizeof(int) * BT);
        size_t valid = 0;
        for (size_t i = 0; i < BT; i++) valid += targets[i] >= 0;
        double s = 0;
        for (size_t i = 0; i < BT; i++) s += m->losses[i];
        m->mean_loss = valid ? (real)(s / valid) : 0;
        if (m->pass.kl_active) {
            kl_forward(m->kl_losses, a->logits, m->tprob, m->tnegent, targets, BT, c->V);
            s = 0;
            for (size_t i = 0; i < BT; i++) s += m->kl_losses[i];
            m->mean_kl = valid ? (real)(s / valid) : 0;
        }
    }
}

static void cpu_teacher(Model* m, int want_logp, int want_mass) {
    const ModelConfig* c = &m->cfg;
    const FocusConfig* f = &m->fc;
    const int B = m->B, T = m->T;
    const size_t BT = (size_t)B * T;
    if (want_logp) {
        if (m->teacher_bt != BT) { /* kept between steps: reallocated only when (B, T) changes */
            m->teacher_bt = BT;
            m->tprob = reallocCheck(m->tprob, sizeof(real) * BT * c->V);
            m->tnegent = reallocCheck(m->tnegent, sizeof(real) * BT);
            m->kl_losses = reallocCheck(m->kl_losses, sizeof(real) * BT);
        }
        memcpy(m->tprob, m->acts.logits, sizeof(real) * BT * c->V);
        teacher_probs_forward(m->tprob, m->tnegent, BT, c->V);
        m->pass.kl_active = 1;
    }
    if (want_mass) {
        if (m->atarget_n != (size_t)c->L * BT * f->K) {
            m->atarget_n = (size_t)c->L * BT * f->K;
            m->atarget = reallocCheck(m->atarget, sizeof(real) * m->atarget_n);
        }
        const int hs = model_head_size(c);
        for (int l = 0; l < c->L; l++) {
            LayerActs la = layer_acts(m, l);
            attention_group_mass(m->atarget + (size_t)l * BT * f->K, la.qkv, la.lse, la.rG, f->K,
                                 f->w, f->sinks, B, T, model_heads(c), model_kv_heads(c), hs);
        }
        tp_sum(m, m->atarget, m->atarget_n); /* summed over heads: this slice's, then all */
    }
}

static double cpu_attn_objective(Model* m, real weight, int backward) {
    const ModelConfig* c = &m->cfg;
    const FocusConfig* f = &m->fc;
    const size_t BT = (size_t)m->B * m->T, K = f->K;
    const double norm = model_attn_objective_norm(m);
    if (!norm) return 0;
    real* dG = mallocCheck(sizeof(real) * BT * K);
    real* dS = mallocCheck(sizeof(real) * BT * K);
    real* dproj = mallocCheck(sizeof(real) * BT * f->dg);
    double loss = 0;
    for (int l = 0; l < c->L; l++) {
        if (!model_layer_routed(m, l)) continue;
        LayerActs la = layer_acts(m, l);
        const real* t = m->atarget + (size_t)l * BT * K;
        for (size_t i = 0; i < BT * K; i++) {
            /* G > 0 in exact arithmetic; a float underflow to 0 must not give 0 * inf */
            double g = la.rG[i] > 1e-30 ? la.rG[i] : 1e-30;
            loss -= norm * t[i] * log(g);
            dG[i] = (real)(-weight * norm * t[i] / g);
        }
        if (!backward) continue;
        size_t lC = (size_t)l * c->C;
        memset(dS, 0, sizeof(real) * BT * K);
        routing_backward(dS, dG, la.rS, la.rG, m->beta + (size_t)l * K, f->routing, m->B, m->T,
                         f->K, f->tau, f->iters);
        router_scores_backward(NULL, m->rgrads.wg + lC * f->dg,
                               m->rgrads.cent + (size_t)l * K * f->dg, dproj, dS, la.ln1, la.rproj,
                               m->router.wg + lC * f->dg, m->router.cent + (size_t)l * K * f->dg,
                               BT, c->C, f->dg, f->K);
    }
    free(dG);
    free(dS);
    free(dproj);
    return loss;
}

/* layer_join's backward: d(branch output) from d(stream) dy, which the residual passes on
 * whole; with sandwich norms through the norm of the branch output (its output normed, weight w,
 * rstd), into scratch dpost. */
static const real* join_backward(Model* m, const LayerSpec* S, real* dpost, const real* dy,
                                 const real* normed, const real* w, const real* rstd, size_t BT) {
    if (!S->sandwich) return dy;
    memset(dpost, 0, sizeof(real) * BT * m->cfg.C);
    norm_backward(m, S, dpost, NULL, NULL, dy, normed, w, NULL, rstd, BT);
    return dpost;
}

/* The gradients a backward of this mode adds into set to zero (the full gradients allocated on
 * first use; model_zero_grad zeroes the router's in every mode). */
static void cpu_zero_grad(Model* m, GradMode mode) {
    if (mode == GRAD_LORA && m->lora_grads_mem)
        memset(m->lora_grads_mem, 0, sizeof(real) * m->num_lora);
    if (mode == GRAD_ALL) {
        if (!m->grads_mem) {
            m->grads_mem = callocCheck(m->num_params, sizeof(real));
            model_carve((real**)&m->grads, m->grads_mem, m->param_sizes, NUM_PARAM_TENSORS);
        }
        memset(m->grads_mem, 0, sizeof(real) * m->num_params);
    }
}

static void cpu_backward(Model* m, GradMode mode) {
    const ModelConfig* c = &m->cfg;
    const FocusConfig* f = &m->fc;
    if (mode == GRAD_ALL && !m->grads_mem) model_zero_grad(m, GRAD_ALL);
    const int B = m->B, T = m->T, C = c->C, hs = model_head_size(c), QKV = model_qkv_width(c),
              FC = model_fc_width(c), NH = model_heads(c), NKV = model_kv_heads(c),
              F = model_ffn(c), A = NH * hs;
    const size_t BT = (size_t)B * T;
    const int all = mode == GRAD_ALL, lora = mode == GRAD_LORA;
    if (lora && !m->lora.rank) fatal("internal: GRAD_LORA on a model without LoRA adapters");
    if (m->wbf16 && (all || lora))
        fatal("the bf16 weight store trains the router only (no weight or adapter gradients)");
    if (m->tp && (all || lora))
        fatal("a tensor-parallel model trains its router only (no weight or adapter gradients)");
    if (c->arch == ARCH_GEMMA3 && (all || lora))
        fatal("gemma3 trains its router only here (no weight or adapter gradients)");
    /* only the soft gate is differentiable */
    const int router_on = model_method(m)->gate == GATE_SOFT;
    const Params* p = &m->params;
    Params* g = all ? &m->grads : &(Params){0};
    Acts* a = &m->acts;

    /* scratch (model_backward_scratch): dres (BT, C), dbuf (BT, max(C, A)); dqkv (BT, QKV); dfch
     * (BT, FC); dact (BT, F); dG, dS (BT, K); dproj (BT, dg); gemma3: dpost (BT, C) */
    size_t need = model_backward_scratch(c, f, BT);
    if (m->scratch_size < need) {
        free(m->scratch_mem);
        m->scratch_mem = mallocCheck(need * sizeof(real));
        m->scratch_size = need;
    }
    real* dres = m->scratch_mem;
    real* dbuf = dres + BT * C;
    real* dqkv = dbuf + BT * (A > C ? A : C);
    real* dfch = dqkv + BT * QKV;
    real* dact = dfch + BT * FC;
    real* dG = dact + BT * F;
    real* dS = dG + BT * f->K;
    real* dproj = dS + BT * f->K;
    real* dpost = dproj + BT * f->dg;

    /* d loss / d logits, in place over the logits */
    size_t valid = 0;
    for (size_t i = 0; i < BT; i++) valid += m->targets[i] >= 0;
    if (m->pass.kl_active)
        kl_backward(a->logits, m->kl_losses, a->logits, m->tprob, m->tnegent, m->targets, BT, c->V,
                    (real)(1.0 / (valid ? valid : 1)));
    else
        crossentropy_backward(a->logits, m->losses, a->logits, m->targets, BT, c->V,
                              (real)(1.0 / (valid ? valid : 1)));

    const real* xlast = a->res3 + (size_t)(c->L - 1) * BT * C;
    memset(dbuf, 0, sizeof(real) * BT * C);
    memset(dres, 0, sizeof(real) * BT * C);
    matmul_backward(dbuf, all ? (c->tied ? g->wte : g->lmhead) : NULL, NULL, a->logits, a->lnf,
                    c->tied ? p->wte : p->lmhead, BT, C, c->V);
    const LayerSpec S0 = model_layer_spec(c, 0);
    norm_backward(m, &S0, dres, g->lnfw, g->lnfb, dbuf, xlast, p->lnfw, a->lnf_stat,
                  a->lnf_stat + BT, BT);

    for (int l = c->L - 1; l >= 0; l--) {
        const LayerSpec S = model_layer_spec(c, l);
        LayerActs la = layer_acts(m, l);
        const real* x = l == 0 ? a->encoded : a->res3 + (size_t)(l - 1) * BT * C;
        size_t lC = (size_t)l * C;
        /* MLP: dres holds d(layer output) = d(res3) = d(res2) via the residual. With tensor
         * parallelism dres is whole on every rank, and the input gradients of the column-parallel
         * products are partial sums: added up across the slices (tp_sum). */
        /* d(MLP output); through its norm with sandwich norms */
        const real* dmo = join_backward(m, &S, dpost, dres, la.mlpp, p->pfn + lC, la.mlpp_rstd, BT);
        memset(dact, 0, sizeof(real) * BT * F);
        matmul_backward(dact, model_slice(g->fcprojw, l, (size_t)C * F),
                        model_slice(g->fcprojb, l, C), dmo, la.fch_act,
                        model_layer_weight(m, P_FCPROJW, l), BT, F, C);
        if (lora) lora_grad(m, LORA_TARGET_FCPROJ, l, dact, dmo, la.fch_act, BT, F, C);
        memset(dfch, 0, sizeof(real) * BT * FC);
        act_backward(&S, dfch, la.fch, dact, BT, F);
        memset(dbuf, 0, sizeof(real) * BT * C);
        matmul_backward(dbuf, model_slice(g->fcw, l, (size_t)FC * C),
                        model_slice(g->fcb, l, (size_t)FC), dfch, la.ln2,
                        model_layer_weight(m, P_FCW, l), BT, C, FC);
        if (lora) lora_grad(m, LORA_TARGET_FC, l, dbuf, dfch, la.ln2, BT, C, FC);
        tp_sum(m, dbuf, BT * C);
        norm_backward(m, &S, dres, model_slice(g->ln2w, l, C), model_slice(g->ln2b, l, C), dbuf,
                      la.res2, p->ln2w + lC, la.ln2_mean, la.ln2_rstd, BT);
        /* attention (dbuf: this slice's heads' d(att), (BT, A)) */
        /* d(attention output); through its norm with sandwich norms */
        const real* dao = join_backward(m, &S, dpost, dres, la.attp, p->pan + lC, la.attp_rstd, BT);
        memset(dbuf, 0, sizeof(real) * BT * A);
        matmul_backward(dbuf, model_slice(g->attprojw, l, (size_t)C * A),
                        model_slice(g->attprojb, l, C), dao, la.att,
                        model_layer_weight(m, P_ATTPROJW, l), BT, A, C);
        if (lora) lora_grad(m, LORA_TARGET_O, l, dbuf, dao, la.att, BT, C, C);
        memset(dqkv, 0, sizeof(real) * BT * QKV);
        const int router = router_on && model_layer_routed(m, l);
        if (router) memset(dG, 0, sizeof(real) * BT * f->K);
        AttnGate gate = model_layer_gate(m, l, &la);
        real* dgate = router && f->learn_gate ? m->rgrads.gate + 2 * l : NULL;
        real gate_before[2] = {dgate ? dgate[0] : 0, dgate ? dgate[1] : 0};
        if (dgate && m->tp) dgate[0] = dgate[1] = 0;
        attention_backward(dqkv, router ? dG : NULL, dgate, dbuf, la.qkv, la.att, la.lse, &gate, B,
                           T, NH, NKV, hs);
        if (router && m->tp) {
            /* the gate is shared by every head of the layer: its gradients so far cover this
             * slice's heads, the router's backward needs all of them */
            tp_sum(m, dG, BT * f->K);
            if (dgate) {
                tp_sum(m, dgate, 2);
                dgate[0] += gate_before[0], dgate[1] += gate_before[1];
            }
        }
        /* Layer 0's input gradient is needed only for the embeddings. */
        if (l == 0 && !all && !router && !(lora && (m->lora.targets & LORA_QKV))) break;
        layer_rope(&S, dqkv, B, T, NH, NKV, -1);
        if (S.qk_norm)
            qknorm_backward(dqkv, la.qkpre, la.qkrstd, p->qnormw + (size_t)l * hs,
                            p->knormw + (size_t)l * hs, BT, NH, NKV, hs);
        memset(dbuf, 0, sizeof(real) * BT * C);
        if (l > 0 || all) {
            matmul_backward(dbuf, model_slice(g->qkvw, l, (size_t)QKV * C),
                            model_slice(g->qkvb, l, (size_t)QKV), dqkv, la.ln1,
                            model_layer_weight(m, P_QKVW, l), BT, C, QKV);
            tp_sum(m, dbuf, BT * C); /* before the router's share, which every rank has whole */
        }
        if (lora) lora_grad(m, LORA_TARGET_QKV, l, l > 0 ? dbuf : NULL, dqkv, la.ln1, BT, C, QKV);
        if (router) {
            memset(dS, 0, sizeof(real) * BT * f->K);
            routing_backward(dS, dG, la.rS, la.rG, m->beta + (size_t)l * f->K, f->routing, B, T,
                             f->K, f->tau, f->iters);
            router_scores_backward(dbuf, m->rgrads.wg + lC * f->dg,
                                   m->rgrads.cent + (size_t)l * f->K * f->dg, dproj, dS, la.ln1,
                                   la.rproj, m->router.wg + lC * f->dg,
                                   m->router.cent + (size_t)l * f->K * f->dg, BT, C, f->dg, f->K);
        }
        if (l == 0 && !all) break;
        norm_backward(m, &S, dres, model_slice(g->ln1w, l, C), model_slice(g->ln1b, l, C), dbuf, x,
                      p->ln1w + lC, la.ln1_mean, la.ln1_rstd, BT);
    }
    if (all) encoder_backward(g->wte, g->wpe, dres, m->inputs, B, T, C);
    m->pass.kl_active = 0; /* the teacher's distributions served this backward pass */
}

/* The CPU keeps no copies: the activations and router are the host's. */
static void cpu_pull(const Model* m, ModelPull what) { (void)m, (void)what; }
static void cpu_push_router(Model* m) { (void)m; }

static double cpu_grad_norm(Model* m, size_t n, int accum) {
    if (accum > 1)
        for (size_t i = 0; i < n; i++) m->rgrads_mem[i] /= (real)accum;
    return grad_norm(m->rgrads_mem, n);
}

static void cpu_adamw(Model* m, AdamW* opt, float lr, double gnorm, float clip, int accum) {
    (void)accum; /* cpu_grad_norm divided already */
    grad_clip(m->rgrads_mem, opt->n, gnorm, clip);
    adamw_step(opt, m->router_mem, m->rgrads_mem, lr);
}

static void cpu_adamw_sync(Model* m, AdamW* opt) { (void)m, (void)opt; }

const ModelBackend model_cpu_backend = {.name = "cpu",
                                        .attach = NULL,
                                        .forward = cpu_forward,
                                        .backward = cpu_backward,
                                        .zero_grad = cpu_zero_grad,
                                        .teacher = cpu_teacher,
                                        .attn_objective = cpu_attn_objective,
                                        .pull = cpu_pull,
                                        .push_router = cpu_push_router,
                                        .grad_norm = cpu_grad_norm,
                                        .adamw = cpu_adamw,
                                        .adamw_sync = cpu_adamw_sync,
                                        .release = NULL};
