/* model.c: the model's parameters, router and the calls of model.h, whichever device runs them.
 *
 * A layer, pre-norm in both families:
 *   h    = norm1(x)                       LayerNorm (gpt2) or RMSNorm (llama)
 *   qkv  = h Wqkv^T (+ b), RoPE on q, k   (llama)
 *   G    = routing((h W_g) C^T)           the router reads the same h (METHOD.md section 2)
 *   att  = attention(qkv, gate(G))        local window untouched, distant pairs gated
 *   x2   = x + att Wo^T (+ b)
 *   y    = x2 + mlp(norm2(x2))            GELU (gpt2) or SwiGLU (llama)
 * The passes themselves live in the backends (backend.h): model_cpu.c is the reference to read,
 * model_cuda.c its GPU mirror. Here: allocation and initialisation, argument checks, and the
 * causal routing bias beta, which is fitted on the host whatever the device. */
#include "model.h"

#include <math.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend.h"

_Static_assert(sizeof(ActSizes) == NUM_ACT_TENSORS * sizeof(size_t), "ActSizes names every tensor");

int model_kv_heads(const ModelConfig* c) {
    const int tp = model_tp(c), nh = c->NH / tp, group = c->NH / c->NKV;
    if (c->NKV % tp == 0) return c->NKV / tp; /* split with the query heads */
    return group % nh == 0 ? 1 : nh;          /* a copy of the one they share, or one each */
}

int model_kv_head(const ModelConfig* c, int j) {
    const int nh = model_heads(c), h0 = c->tp_rank * nh, group = c->NH / c->NKV;
    if (model_tp(c) == 1 || c->NKV % model_tp(c) == 0) return h0 / group + j;
    return model_kv_heads(c) == 1 ? h0 / group : (h0 + j) / group;
}

int model_qkv_width(const ModelConfig* c) {
    return (model_heads(c) + 2 * model_kv_heads(c)) * model_head_size(c);
}
int model_att_width(const ModelConfig* c) { return model_heads(c) * model_head_size(c); }
int model_fc_width(const ModelConfig* c) {
    return c->arch == ARCH_GPT2 ? model_ffn(c) : 2 * model_ffn(c);
}

LayerSpec model_layer_spec(const ModelConfig* c, int l) {
    const int gemma = c->arch == ARCH_GEMMA3;
    LayerSpec s = {.norm = c->arch == ARCH_GPT2 ? NORM_LAYER : NORM_RMS,
                   .sandwich = gemma,
                   .qk_norm = gemma,
                   .act = c->arch == ARCH_GPT2 ? ACT_GELU
                          : gemma              ? ACT_GEGLU
                                               : ACT_SWIGLU,
                   .rope = c->arch != ARCH_GPT2,
                   .rope_halves = gemma,
                   .rope_theta = c->rope_theta,
                   .hs = model_head_size(c),
                   .window = -1};
    if (gemma && c->swa_period && l % c->swa_period != c->swa_period - 1) {
        s.window = c->swa - 1; /* keys i - swa < j <= i */
        s.rope_theta = c->rope_local;
    }
    return s;
}

AttnMode model_layer_attn(const Model* m, int l) {
    if (model_layer_spec(&m->cfg, l).window >= 0 && m->fc.local != LOCAL_ROUTE)
        return m->fc.local == LOCAL_DENSE ? ATTN_DENSE : ATTN_LOCAL;
    return focus_layer_attn(&m->fc, l);
}

int model_layer_routed(const Model* m, int l) {
    return !focus_layer_dense(&m->fc, l) &&
           !(model_layer_spec(&m->cfg, l).window >= 0 && m->fc.local != LOCAL_ROUTE);
}

real model_embed_scale(const ModelConfig* c) {
    return c->arch == ARCH_GEMMA3 ? (real)sqrtf((float)c->C) : 1;
}

/* name, per layer, cut, projection, native, init, GGUF name */
#define PARTS(...) \
    { __VA_ARGS__ }
const ParamSpec model_params[NUM_PARAM_TENSORS] = {
    [P_WTE] = {"wte", 0, CUT_WHOLE, -1, 1, INIT_RANDOM, "token_embd.weight", PARTS(NULL),
               PARTS("model.embed_tokens.weight"), "wte.weight"},
    [P_WPE] = {"wpe", 0, CUT_WHOLE, -1, 0, INIT_RANDOM, "position_embd.weight", PARTS(NULL),
               PARTS(NULL), "wpe.weight"},
    [P_LN1W] = {"ln1w", 1, CUT_WHOLE, -1, 0, INIT_ONE, "attn_norm.weight", PARTS(NULL),
                PARTS("input_layernorm.weight"), "ln_1.weight"},
    [P_LN1B] = {"ln1b", 1, CUT_WHOLE, -1, 0, INIT_ZERO, "attn_norm.bias", PARTS(NULL), PARTS(NULL),
                "ln_1.bias"},
    [P_QKVW] = {"qkvw", 1, CUT_HEAD_ROWS, 0, 1, INIT_RANDOM, "attn_qkv.weight",
                PARTS("attn_q.weight", "attn_k.weight", "attn_v.weight"),
                PARTS("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                      "self_attn.v_proj.weight"),
                "attn.c_attn.weight"},
    [P_QKVB] = {"qkvb", 1, CUT_HEAD_ROWS, -1, 0, INIT_ZERO, "attn_qkv.bias",
                PARTS("attn_q.bias", "attn_k.bias", "attn_v.bias"),
                PARTS("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
                "attn.c_attn.bias"},
    [P_ATTPROJW] = {"attprojw", 1, CUT_HEAD_COLS, 1, 1, INIT_RANDOM, "attn_output.weight",
                    PARTS(NULL), PARTS("self_attn.o_proj.weight"), "attn.c_proj.weight"},
    [P_ATTPROJB] = {"attprojb", 1, CUT_WHOLE, -1, 0, INIT_ZERO, "attn_output.bias", PARTS(NULL),
                    PARTS(NULL), "attn.c_proj.bias"},
    [P_LN2W] = {"ln2w", 1, CUT_WHOLE, -1, 0, INIT_ONE, "ffn_norm.weight", PARTS(NULL),
                PARTS("post_attention_layernorm.weight"), "ln_2.weight"},
    [P_LN2B] = {"ln2b", 1, CUT_WHOLE, -1, 0, INIT_ZERO, "ffn_norm.bias", PARTS(NULL), PARTS(NULL),
                "ln_2.bias"},
    [P_FCW] = {"fcw", 1, CUT_FFN_ROWS, 2, 1, INIT_RANDOM, "ffn_up.weight",
               PARTS("ffn_gate.weight", "ffn_up.weight"),
               PARTS("mlp.gate_proj.weight", "mlp.up_proj.weight"), "mlp.c_fc.weight"},
    [P_FCB] = {"fcb", 1, CUT_FFN_ROWS, -1, 0, INIT_ZERO, "ffn_up.bias", PARTS(NULL), PARTS(NULL),
               "mlp.c_fc.bias"},
    [P_FCPROJW] = {"fcprojw", 1, CUT_FFN_COLS, 3, 1, INIT_RANDOM, "ffn_down.weight", PARTS(NULL),
                   PARTS("mlp.down_proj.weight"), "mlp.c_proj.weight"},
    [P_FCPROJB] = {"fcprojb", 1, CUT_WHOLE, -1, 0, INIT_ZERO, "ffn_down.bias", PARTS(NULL),
                   PARTS(NULL), "mlp.c_proj.bias"},
    [P_LNFW] = {"lnfw", 0, CUT_WHOLE, -1, 0, INIT_ONE, "output_norm.weight", PARTS(NULL),
                PARTS("model.norm.weight"), "ln_f.weight"},
    [P_LNFB] = {"lnfb", 0, CUT_WHOLE, -1, 0, INIT_ZERO, "output_norm.bias", PARTS(NULL),
                PARTS(NULL), "ln_f.bias"},
    [P_LMHEAD] = {"lmhead", 0, CUT_WHOLE, -1, 1, INIT_RANDOM, "output.weight", PARTS(NULL),
                  PARTS("lm_head.weight"), NULL},
    /* gemma3: the norms of QK-norm and the sandwich (GGUF holds them with Gemma's +1) */
    [P_QNORMW] = {"qnormw", 1, CUT_WHOLE, -1, 0, INIT_ONE, "attn_q_norm.weight", PARTS(NULL),
                  PARTS(NULL), NULL},
    [P_KNORMW] = {"knormw", 1, CUT_WHOLE, -1, 0, INIT_ONE, "attn_k_norm.weight", PARTS(NULL),
                  PARTS(NULL), NULL},
    [P_PAN] = {"pan", 1, CUT_WHOLE, -1, 0, INIT_ONE, "post_attention_norm.weight", PARTS(NULL),
               PARTS(NULL), NULL},
    [P_PFN] = {"pfn", 1, CUT_WHOLE, -1, 0, INIT_ONE, "post_ffw_norm.weight", PARTS(NULL),
               PARTS(NULL), NULL},
};
#undef PARTS

const NativePart model_native[NATIVE_PER_LAYER] = {
    [NATIVE_Q] = {P_QKVW, 0},      [NATIVE_K] = {P_QKVW, 1},   [NATIVE_V] = {P_QKVW, 2},
    [NATIVE_O] = {P_ATTPROJW, 0},  [NATIVE_GATE] = {P_FCW, 0}, [NATIVE_UP] = {P_FCW, 1},
    [NATIVE_DOWN] = {P_FCPROJW, 0}};

int model_param_parts(int t) {
    int n = 0;
    while (n < 3 && model_params[t].gguf_part[n]) n++;
    return n ? n : 1;
}

const char* model_param_gguf(int t, int i, int split) {
    const ParamSpec* p = &model_params[t];
    return split && p->gguf_part[0] ? p->gguf_part[i] : p->gguf;
}

void model_param_part(const ModelConfig* c, int t, int i, size_t* rows, size_t* cols) {
    model_param_shape(c, t, rows, cols);
    const size_t hs = model_head_size(c), heads = (size_t)(i ? c->NKV : c->NH) * hs;
    if (t == P_QKVW) /* q, then k and v */
        *rows = heads;
    else if (t == P_QKVB)
        *cols = heads;
    else if (t == P_FCW) /* gate, then up */
        *rows = (size_t)c->F;
}

/* the table's order is Params' */
_Static_assert(offsetof(Params, pfn) == P_PFN * sizeof(real*) &&
                   offsetof(Params, qkvw) == P_QKVW * sizeof(real*) &&
                   sizeof(Params) == NUM_PARAM_TENSORS * sizeof(real*),
               "model_params and Params disagree");

void model_param_shape(const ModelConfig* c, int t, size_t* rows, size_t* cols) {
    const size_t C = c->C, V = c->V, Q = model_qkv_width(c), FC = model_fc_width(c),
                 F = model_ffn(c), A = model_att_width(c), hs = model_head_size(c);
    const int g = c->arch == ARCH_GPT2, gemma = c->arch == ARCH_GEMMA3;
    size_t r = 1, k = C;
    switch ((ParamId)t) {
        case P_WTE:
            r = V;
            break;
        case P_WPE:
            r = g ? (size_t)c->maxT : 0;
            break;
        case P_QKVW:
            r = Q;
            break;
        case P_QKVB:
            r = g || c->qkv_bias, k = Q;
            break;
        case P_ATTPROJW:
            r = C, k = A;
            break;
        case P_FCW:
            r = FC;
            break;
        case P_FCB:
            r = g, k = FC;
            break;
        case P_FCPROJW:
            r = C, k = F;
            break;
        case P_LMHEAD:
            r = c->tied ? 0 : V;
            break;
        case P_QNORMW:
        case P_KNORMW:
            r = gemma, k = hs;
            break;
        case P_PAN:
        case P_PFN:
            r = gemma;
            break;
        case P_LN1B:
        case P_ATTPROJB:
        case P_LN2B:
        case P_FCPROJB:
        case P_LNFB:
            r = g;
            break;
        case P_LN1W:
        case P_LN2W:
        case P_LNFW:
            break;
        case NUM_PARAM_TENSORS:
            fatal("internal: parameter tensor %d", t);
    }
    *rows = r, *cols = k;
}

static int param_layers(const ModelConfig* c, int t) {
    return model_params[t].per_layer ? c->L : 1;
}

static void param_sizes(size_t* s, const ModelConfig* c) {
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        size_t r, k;
        model_param_shape(c, t, &r, &k);
        s[t] = (size_t)param_layers(c, t) * r * k;
    }
}

size_t model_param_count(const ModelConfig* c) {
    size_t s[NUM_PARAM_TENSORS];
    param_sizes(s, c);
    return model_sum_sizes(s, NUM_PARAM_TENSORS);
}

/* Carve mem into n consecutive tensors of the given sizes; size 0 gives NULL. */
void model_carve(real** ptrs, real* mem, const size_t* sizes, int n) {
    for (int i = 0; i < n; i++) {
        ptrs[i] = sizes[i] ? mem : NULL;
        mem += sizes[i];
    }
}

size_t model_sum_sizes(const size_t* s, int n) {
    size_t t = 0;
    for (int i = 0; i < n; i++) t += s[i];
    return t;
}

/* (Re)allocate the router buffers for m->fc and initialise them from its seed. */
static void alloc_router(Model* m) {
    const ModelConfig* cfg = &m->cfg;
    const FocusConfig* fc = &m->fc;
    free(m->router_mem);
    free(m->rgrads_mem);
    free(m->beta);
    m->router_sizes[ROUTER_WG] = (size_t)cfg->L * cfg->C * fc->dg;
    m->router_sizes[ROUTER_CENT] = (size_t)cfg->L * fc->K * fc->dg;
    m->router_sizes[ROUTER_WQ] = fc->qproj ? (size_t)cfg->L * cfg->C * fc->dg : 0;
    m->router_sizes[ROUTER_GATE] = (size_t)cfg->L * 2;
    m->num_router = model_sum_sizes(m->router_sizes, NUM_ROUTER_TENSORS);
    m->router_mem = callocCheck(m->num_router, sizeof(real));
    model_carve((real**)&m->router, m->router_mem, m->router_sizes, NUM_ROUTER_TENSORS);
    m->rgrads_mem = callocCheck(m->num_router, sizeof(real));
    model_carve((real**)&m->rgrads, m->rgrads_mem, m->router_sizes, NUM_ROUTER_TENSORS);
    m->beta = callocCheck((size_t)cfg->L * fc->K, sizeof(real));
    /* activations depend on K and dg: reallocate them on the next forward */
    free(m->acts_mem);
    m->acts_mem = NULL;
    model_init_router(m, fc->seed);
}

void model_build(Model* m, const ModelConfig* cfg, const FocusConfig* fc) {
    config_validate(cfg, fc);
    memset(m, 0, sizeof(*m));
    m->cfg = *cfg;
    m->fc = *fc;
    param_sizes(m->param_sizes, cfg);
    m->num_params = model_sum_sizes(m->param_sizes, NUM_PARAM_TENSORS);
    m->params_mem = callocCheck(m->num_params, sizeof(real));
    model_carve((real**)&m->params, m->params_mem, m->param_sizes, NUM_PARAM_TENSORS);
    m->mean_loss = -1;
    m->bos = -1;
    m->backend = &model_cpu_backend;
    alloc_router(m);
}

/* The hash's start for a model of shape c: the fields before the slice's, then for gemma3 the
 * fields after them (the other families' fingerprints are those they had before those fields) */
static uint64_t shape_hash(const ModelConfig* c) {
    uint64_t h = fnv1a(FNV1A_START, c, offsetof(ModelConfig, tp));
    if (c->arch == ARCH_GEMMA3)
        h = fnv1a(h, &c->hs, sizeof(ModelConfig) - offsetof(ModelConfig, hs));
    return h;
}

uint64_t model_weights_hash(const Model* m) {
    /* the shape (the fields before the slice's), the fp32 parameters, the bf16 store */
    uint64_t h = shape_hash(&m->cfg);
    h = fnv1a(h, m->params_mem, m->num_params * sizeof(real));
    return fnv1a(h, m->wbf16, m->wbf16_n * sizeof(uint16_t));
}

uint64_t model_fingerprint(const Model* m) {
    return model_tp(&m->cfg) > 1 || m->wbf16 ? m->whole_fingerprint : model_weights_hash(m);
}

ParamId model_proj_tensor(int k) {
    for (int t = 0; t < NUM_PARAM_TENSORS; t++)
        if (model_params[t].proj == k) return (ParamId)t;
    fatal("internal: projection %d", k);
}

/* The store's index of parameter tensor t (its projection), or -1 for a tensor kept in fp32. */
static int bf16_index(int t) { return model_params[t].proj; }

static void drop_pages(void* p, size_t n);

/* The bf16 store's buffers for m's shape (its slice's) and the parameter sizes without the
 * projections (param_sizes and num_params updated; params_mem left to the caller). */
static void bf16_layout(Model* m) {
    size_t total = 0, stage = 0;
    for (int k = 0; k < 4; k++) {
        const size_t n = model_param_slab(&m->cfg, model_proj_tensor(k));
        m->wbf16_off[k] = total;
        total += n * m->cfg.L;
        stage = n > stage ? n : stage;
        m->param_sizes[model_proj_tensor(k)] = 0;
    }
    m->num_params = model_sum_sizes(m->param_sizes, NUM_PARAM_TENSORS);
    m->wbf16 = mallocCheck(sizeof(uint16_t) * total);
    m->wbf16_n = total;
    m->wstage = mallocCheck(sizeof(real) * stage);
    m->wstage_n = stage;
}

void model_store_bf16(Model* m) {
    if (m->wbf16) return;
    if (m->backend != &model_cpu_backend || m->lora.rank || m->grads_mem)
        fatal("--weights bf16: a CPU model without adapters or weight gradients only");
    if (model_tp(&m->cfg) == 1) m->whole_fingerprint = model_weights_hash(m);
    size_t old[NUM_PARAM_TENSORS];
    memcpy(old, m->param_sizes, sizeof old);
    real* const* src = (real* const*)&m->params;
    bf16_layout(m);
    /* each projection rounded into the store, its fp32 pages given back at once (the process
     * never holds much more than the fp32 model it had) */
    for (int k = 0; k < 4; k++) {
        const int t = model_proj_tensor(k);
        real_to_bf16_rows(m->wbf16 + m->wbf16_off[k], src[t], old[t]);
        drop_pages(src[t], sizeof(real) * old[t]);
    }
    /* the other tensors moved down over the projections' places, in order, then the tail cut */
    real* at = m->params_mem;
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        if (!m->param_sizes[t]) continue;
        memmove(at, src[t], sizeof(real) * m->param_sizes[t]);
        at += m->param_sizes[t];
    }
    m->params_mem = reallocCheck(m->params_mem, sizeof(real) * (m->num_params ? m->num_params : 1));
    model_carve((real**)&m->params, m->params_mem, m->param_sizes, NUM_PARAM_TENSORS);
    free(m->acts_mem); /* the passes start over with fresh buffers */
    m->acts_mem = NULL;
}

const real* model_layer_weight(Model* m, int t, int l) {
    const int k = bf16_index(t);
    if (k < 0) fatal("internal: model_layer_weight of tensor %d", t);
    const size_t n = model_param_slab(&m->cfg, t);
    if (!m->wbf16) return ((real* const*)&m->params)[t] + (size_t)l * n;
    bf16_to_real_rows(m->wstage, m->wbf16 + m->wbf16_off[k] + (size_t)l * n, n);
    return m->wstage;
}

/* Rows [r0, r0 + n) of the (rows, cols) matrix src to dst. */
static real* copy_rows(real* dst, const real* src, size_t r0, size_t n, size_t cols) {
    memcpy(dst, src + r0 * cols, sizeof(real) * n * cols);
    return dst + n * cols;
}

/* Columns [c0, c0 + n) of the (rows, cols) matrix src to dst (rows, n). */
static void copy_cols(real* dst, const real* src, size_t rows, size_t cols, size_t c0, size_t n) {
    for (size_t r = 0; r < rows; r++) memcpy(dst + r * n, src + r * cols + c0, sizeof(real) * n);
}

/* Slab l of parameter tensor t of the whole model w (in stage): the part slice c holds, to dst. */
static void slice_slab(const ModelConfig* c, const ModelConfig* w, int t, const real* stage,
                       real* dst) {
    size_t rows, cols;
    model_param_shape(w, t, &rows, &cols);
    const size_t hs = model_head_size(w), F = w->F;
    const size_t nh = model_heads(c), h0 = (size_t)c->tp_rank * nh, Fl = model_ffn(c);
    const size_t f0 = (size_t)c->tp_rank * Fl;
    /* a bias is one row: its "rows" below are its elements */
    const size_t per = rows == 1 ? 1 : cols;
    switch (model_params[t].cut) {
        case CUT_HEAD_ROWS: /* qkvw, qkvb: this slice's q heads, then its k and v heads */
            dst = copy_rows(dst, stage, h0 * hs, nh * hs, per);
            for (int kv = 0; kv < 2; kv++)
                for (int j = 0; j < model_kv_heads(c); j++)
                    dst = copy_rows(
                        dst, stage,
                        ((size_t)w->NH + (size_t)kv * w->NKV + model_kv_head(c, j)) * hs, hs, per);
            break;
        case CUT_HEAD_COLS: /* attprojw: the input columns of this slice's heads */
            copy_cols(dst, stage, rows, cols, h0 * hs, nh * hs);
            break;
        case CUT_FFN_ROWS: /* fcw, fcb: this slice's units (llama: of the gate, then of up) */
            for (size_t part = 0; part < (size_t)model_fc_width(w) / F; part++)
                dst = copy_rows(dst, stage, part * F + f0, Fl, per);
            break;
        case CUT_FFN_COLS: /* fcprojw: the input columns of this slice's units */
            copy_cols(dst, stage, rows, cols, f0, Fl);
            break;
        case CUT_WHOLE: /* norms, embeddings, head, output biases */
            memcpy(dst, stage, sizeof(real) * model_param_slab(c, t));
    }
}

size_t model_param_slab(const ModelConfig* c, int t) {
    size_t s[NUM_PARAM_TENSORS];
    param_sizes(s, c);
    return s[t] / param_layers(c, t);
}

/* Tensor t passes through model_fill's stage: cut into slices (tp) or stored in bf16. */
static int staged(int t, int tp, int bf16) {
    return (tp && model_params[t].cut != CUT_WHOLE) || (bf16 && bf16_index(t) >= 0);
}

void model_fill(Model* m, const ModelConfig* whole, const WeightSource* src) {
    real** p = (real**)&m->params;
    size_t ws[NUM_PARAM_TENSORS];
    param_sizes(ws, whole);
    if (model_tp(&m->cfg) == 1 && !m->wbf16) {
        for (int t = 0; t < NUM_PARAM_TENSORS; t++)
            for (int l = 0; ws[t] && l < param_layers(whole, t); l++)
                src->slab(src->ctx, t, l, p[t] + (size_t)l * (ws[t] / param_layers(whole, t)));
        return;
    }
    /* a slice or a bf16 store: the slabs hashed in the order model_weights_hash reads a whole
     * model's parameters (so the fingerprint is the whole fp32 model's). Those cut into slices
     * or stored in bf16 pass through stage (a projection's part then through wstage into the
     * store); the others go where they belong and are hashed there. */
    const int tp = model_tp(&m->cfg) > 1;
    size_t most = 0;
    for (int t = 0; t < NUM_PARAM_TENSORS; t++)
        if ((staged(t, tp, m->wbf16 != NULL)) && ws[t] / param_layers(whole, t) > most)
            most = ws[t] / param_layers(whole, t);
    real* stage = mallocCheck(sizeof(real) * (most ? most : 1));
    uint64_t h = shape_hash(whole);
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        const size_t n = ws[t] / param_layers(whole, t), nl = model_param_slab(&m->cfg, t);
        const int k = m->wbf16 ? bf16_index(t) : -1, via = staged(t, tp, m->wbf16 != NULL);
        for (int l = 0; ws[t] && l < param_layers(whole, t); l++) {
            real* dst = via ? stage : p[t] + (size_t)l * nl;
            src->slab(src->ctx, t, l, dst);
            h = fnv1a(h, dst, n * sizeof(real));
            if (!via) continue;
            slice_slab(&m->cfg, whole, t, stage, k >= 0 ? m->wstage : p[t] + (size_t)l * nl);
            if (k >= 0)
                real_to_bf16_rows(m->wbf16 + m->wbf16_off[k] + (size_t)l * nl, m->wstage, nl);
        }
    }
    free(stage);
    m->whole_fingerprint = h;
}

/* Native weights (decode's view of the mapped file) given back; m has none afterwards. */
static void release_native(Model* m) {
    for (int i = 0; m->native && i < m->cfg.L * NATIVE_PER_LAYER + 2; i++)
        qmatrix_release(&m->native[i]);
    if (m->native_release) m->native_release(m->native_owner);
    free(m->native);
    m->native = NULL;
    m->native_release = NULL;
    m->native_owner = NULL;
}

/* model_shard's source: the whole model's own parameters */
static void whole_slab(void* ctx, int t, int l, real* dst) {
    const Model* w = ctx;
    const size_t n = w->param_sizes[t] / param_layers(&w->cfg, t);
    memcpy(dst, ((real* const*)&w->params)[t] + (size_t)l * n, sizeof(real) * n);
}

void model_shard(Model* m, Comm* tp) {
    char err[256];
    if (model_tp_check(&m->cfg, tp->size, err, sizeof err)) fatal("%s", err);
    if (model_tp(&m->cfg) != 1) fatal("internal: model_shard of a model already sharded");
    if (m->backend != &model_cpu_backend || m->lora.rank || m->grads_mem)
        fatal("internal: model_shard wants a CPU model without adapters or gradients");
    if (tp->size == 1) {
        m->whole_fingerprint = model_weights_hash(m);
        return;
    }
    Model whole = *m; /* its parameters; the rest is m's */
    m->cfg.tp = tp->size;
    m->cfg.tp_rank = tp->rank;
    param_sizes(m->param_sizes, &m->cfg);
    m->num_params = model_sum_sizes(m->param_sizes, NUM_PARAM_TENSORS);
    m->params_mem = callocCheck(m->num_params, sizeof(real));
    model_carve((real**)&m->params, m->params_mem, m->param_sizes, NUM_PARAM_TENSORS);
    model_fill(m, &whole.cfg, &(WeightSource){&whole, whole_slab});
    free(whole.params_mem);
    release_native(m); /* the file's blocks are the whole model's */
    free(m->acts_mem);
    m->acts_mem = NULL;
    m->tp = tp;
}

void model_build_slice(Model* m, const ModelConfig* whole, const FocusConfig* fc,
                       const ModelLayout* lay) {
    ModelConfig c = *whole;
    Comm* tp = lay && lay->tp && lay->tp->size > 1 ? lay->tp : NULL;
    if (tp) c.tp = tp->size, c.tp_rank = tp->rank;
    model_build(m, &c, fc);
    m->tp = tp;
    if (lay && lay->store == WEIGHTS_BF16_PROJ) {
        free(m->params_mem); /* (never touched: it cost no memory) */
        bf16_layout(m);
        m->params_mem = callocCheck(m->num_params ? m->num_params : 1, sizeof(real));
        model_carve((real**)&m->params, m->params_mem, m->param_sizes, NUM_PARAM_TENSORS);
    } else if (lay && lay->store != WEIGHTS_FP32) {
        fatal("internal: a model's weights are held fp32 or with the bf16 store");
    }
}

void model_set_router_config(Model* m, const FocusConfig* fc) {
    config_validate(&m->cfg, fc);
    m->fc = *fc;
    alloc_router(m);
}

void model_free(Model* m) {
    if (m->backend && m->backend->release) m->backend->release(m);
    release_native(m);
    free(m->params_mem);
    free(m->wbf16);
    free(m->wstage);
    free(m->grads_mem);
    free(m->router_mem);
    free(m->rgrads_mem);
    free(m->beta);
    free(m->acts_mem);
    free(m->rmask);
    free(m->inputs);
    free(m->targets);
    free(m->losses);
    free(m->row_max), free(m->row_target);
    free(m->scratch_mem);
    free(m->tprob);
    free(m->tnegent);
    free(m->kl_losses);
    free(m->atarget);
    free(m->blockgate);
    free(m->blockgate_blocks);
    free(m->lora_mem);
    free(m->lora_grads_mem);
    free(m->lora_scratch);
    memset(m, 0, sizeof(*m));
}

int lora_parse_targets(const char* s) {
    static const char* names[] = {"qkv", "o", "fc", "fcproj"};
    int bits = 0;
    while (*s) {
        size_t n = strcspn(s, ",");
        int k = 0;
        while (k < 4 && (strlen(names[k]) != n || strncmp(s, names[k], n))) k++;
        if (k == 4) return -1;
        bits |= 1 << k;
        s += n + (s[n] == ',');
    }
    return bits;
}

/* Sizes of the LoRA tensors (A, B per target; 0 for a target not chosen), and each target's
 * input and output widths. */
static void lora_shapes(const Model* m, size_t* s, int* in, int* out) {
    const ModelConfig* c = &m->cfg;
    const size_t L = c->L, r = m->lora.rank;
    const int ins[4] = {c->C, c->C, c->C, c->F};
    const int outs[4] = {model_qkv_width(c), c->C, model_fc_width(c), c->C};
    for (int k = 0; k < 4; k++) {
        const int on = (m->lora.targets >> k) & 1;
        s[2 * k] = on ? L * r * ins[k] : 0;
        s[2 * k + 1] = on ? L * outs[k] * r : 0;
        if (in) in[k] = ins[k], out[k] = outs[k];
    }
}

void model_lora_init(Model* m, const LoraConfig* lc, uint64_t seed) {
    if (m->tp) fatal("lora: a tensor-parallel model takes no adapters (LoRA runs in one process)");
    if (m->wbf16) fatal("lora: adapters need the fp32 weights (not --weights bf16)");
    if (lc->rank < 1 || lc->targets <= 0 || lc->targets > 15 || !(lc->alpha > 0))
        fatal("lora: rank must be >= 1, alpha > 0 and targets a subset of qkv,o,fc,fcproj");
    free(m->lora_mem);
    free(m->lora_grads_mem);
    m->lora = *lc;
    int in[4], out[4];
    lora_shapes(m, m->lora_sizes, in, out);
    m->num_lora = model_sum_sizes(m->lora_sizes, NUM_LORA_TENSORS);
    m->lora_mem = callocCheck(m->num_lora, sizeof(real));
    m->lora_grads_mem = callocCheck(m->num_lora, sizeof(real));
    model_carve((real**)&m->lw, m->lora_mem, m->lora_sizes, NUM_LORA_TENSORS);
    model_carve((real**)&m->lg, m->lora_grads_mem, m->lora_sizes, NUM_LORA_TENSORS);
    Rng rng;
    rng_seed(&rng, seed);
    for (int k = 0; k < 4; k++) /* A ~ N(0, 1/in); B stays zero */
        for (size_t i = 0; i < m->lora_sizes[2 * k]; i++)
            lora_a(&m->lw, k)[i] = (real)(rng_normal(&rng) / sqrt((double)in[k]));
}

void model_lora_merge(Model* m) {
    if (!m->lora.rank) return;
    const ModelConfig* c = &m->cfg;
    const int r = m->lora.rank;
    int in[4], out[4];
    size_t s[NUM_LORA_TENSORS];
    lora_shapes(m, s, in, out);
    real* W[4] = {m->params.qkvw, m->params.attprojw, m->params.fcw, m->params.fcprojw};
    const double scale = m->lora.alpha / r;
    for (int k = 0; k < 4; k++) {
        if (!s[2 * k]) continue;
        for (int l = 0; l < c->L; l++) {
            const real* A = lora_a(&m->lw, k) + (size_t)l * r * in[k];
            const real* B = lora_b(&m->lw, k) + (size_t)l * out[k] * r;
            real* Wl = W[k] + (size_t)l * out[k] * in[k];
            for (int o = 0; o < out[k]; o++)
                for (int i = 0; i < in[k]; i++) {
                    double d = 0;
                    for (int j = 0; j < r; j++)
                        d += (double)B[o * r + j] * A[(size_t)j * in[k] + i];
                    Wl[(size_t)o * in[k] + i] += (real)(scale * d);
                }
        }
    }
    free(m->lora_mem);
    free(m->lora_grads_mem);
    m->lora_mem = m->lora_grads_mem = NULL;
    memset(&m->lw, 0, sizeof m->lw);
    memset(&m->lg, 0, sizeof m->lg);
    memset(&m->lora, 0, sizeof m->lora);
    m->num_lora = 0;
}

void model_init_backbone(Model* m, uint64_t seed) {
    const ModelConfig* c = &m->cfg;
    Rng rng;
    rng_seed(&rng, seed);
    real** p = (real**)&m->params;
    real resid_std = (real)(0.02 / sqrt(2.0 * c->L));
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        if (!p[i]) continue;
        int is_norm = p[i] == m->params.ln1w || p[i] == m->params.ln2w || p[i] == m->params.lnfw;
        int is_bias = p[i] == m->params.ln1b || p[i] == m->params.ln2b || p[i] == m->params.lnfb ||
                      p[i] == m->params.qkvb || p[i] == m->params.attprojb ||
                      p[i] == m->params.fcb || p[i] == m->params.fcprojb;
        int is_resid = p[i] == m->params.attprojw || p[i] == m->params.fcprojw;
        for (size_t j = 0; j < m->param_sizes[i]; j++) {
            p[i][j] = is_norm   ? 1
                      : is_bias ? 0
                                : (real)(rng_normal(&rng) * (is_resid ? resid_std : 0.02));
        }
    }
}

size_t model_router_trained(const Model* m, int learn_gate) {
    return m->router_sizes[ROUTER_WG] + m->router_sizes[ROUTER_CENT] + m->router_sizes[ROUTER_WQ] +
           (learn_gate ? m->router_sizes[ROUTER_GATE] : 0);
}

void model_init_router(Model* m, uint64_t seed) {
    const ModelConfig* c = &m->cfg;
    const FocusConfig* f = &m->fc;
    Rng rng;
    rng_seed(&rng, seed);
    for (size_t i = 0; i < m->router_sizes[ROUTER_WG]; i++)
        m->router.wg[i] = (real)(rng_normal(&rng) / sqrt((double)c->C));
    for (size_t i = 0; i < m->router_sizes[ROUTER_CENT]; i++)
        m->router.cent[i] = (real)(rng_normal(&rng) / sqrt((double)f->dg));
    /* the queries start where the keys are: the router begins as the symmetric one */
    if (m->router.wq) memcpy(m->router.wq, m->router.wg, sizeof(real) * m->router_sizes[ROUTER_WQ]);
    for (int l = 0; l < c->L; l++) {
        m->router.gate[2 * l] = f->lambda;
        m->router.gate[2 * l + 1] = f->bias;
    }
    memset(m->beta, 0, sizeof(real) * c->L * f->K);
    m->beta_updates = 0;
}

/* Activation sizes for (B, T); per-layer tensors hold L layers when keep, else one; with
 * keep = KEEP_ROUTER one for ln2 and fch_act as well. */
static size_t head_limit = (size_t)1 << 30; /* reals: 4 GiB of logits */

void model_set_head_limit(size_t reals) { head_limit = reals ? reals : (size_t)1 << 30; }

size_t model_head_rows(const ModelConfig* c, size_t BT, int keep) {
    if (keep || BT * (size_t)c->V <= head_limit) return BT;
    const size_t rows = (head_limit / 4) / (size_t)c->V; /* a quarter of the limit per chunk */
    return rows < 1 ? 1 : rows > BT ? BT : rows;
}

ActSizes model_act_sizes(const ModelConfig* c, const FocusConfig* f, int B, int T, int keep) {
    ActSizes r;
    size_t* s = r.n;
    size_t BT = (size_t)B * T, C = c->C, Ls = keep ? c->L : 1;
    /* Router tensors are small and always allocated, so the attention mode can change
     * between calls without reallocation. */
    int router = 1;
    s[0] = BT * C;
    s[1] = Ls * BT * C;
    s[2] = Ls * BT;
    s[3] = Ls * BT;
    s[4] = Ls * BT * model_qkv_width(c);
    s[5] = Ls * BT * model_att_width(c);
    s[6] = Ls * B * model_heads(c) * (size_t)T;
    s[7] = Ls * BT * C;
    /* ln2 and the MLP's activation only feed weight gradients: a router's backward (frozen
     * weights) does without them, and they share one slot */
    const size_t Lw = keep == KEEP_ROUTER ? 1 : Ls;
    s[8] = Lw * BT * C;
    s[9] = Ls * BT;
    s[10] = Ls * BT;
    s[11] = Ls * BT * model_fc_width(c);
    s[12] = Lw * BT * model_ffn(c);
    s[13] = Ls * BT * C;
    s[14] = router ? Ls * BT * f->dg : 0;
    s[15] = router ? Ls * BT * f->K : 0;
    s[16] = router ? (size_t)c->L * BT * f->K : 0; /* groups of every layer are kept for reports */
    s[17] = router ? (size_t)c->L * B * f->K : 0;
    s[18] = BT * C;
    s[19] = 2 * BT;
    s[20] = model_head_rows(c, BT, keep) * c->V;
    const int gemma = c->arch == ARCH_GEMMA3;
    const size_t H = (size_t)model_heads(c) + model_kv_heads(c);
    s[21] = gemma ? Ls * BT * H * model_head_size(c) : 0;
    s[22] = gemma ? Ls * BT * H : 0;
    s[23] = gemma ? Ls * BT * C : 0;
    s[24] = gemma ? Ls * BT : 0;
    s[25] = gemma ? Ls * BT * C : 0;
    s[26] = gemma ? Ls * BT : 0;
    return r;
}

void model_host_buffers(Model* m, int B, int T, int keep) {
    free(m->acts_mem);
    free(m->rmask);
    m->acts_mem = NULL;
    m->rmask = NULL;
    m->inputs = reallocCheck(m->inputs, sizeof(int) * B * T);
    m->targets = reallocCheck(m->targets, sizeof(int) * B * T);
    m->losses = reallocCheck(m->losses, sizeof(real) * B * T);
    m->row_max = reallocCheck(m->row_max, sizeof(real) * B * T);
    m->row_target = reallocCheck(m->row_target, sizeof(real) * B * T);
    m->B = B;
    m->T = T;
    m->keep = keep;
}

const real* model_groups(const Model* m, int l) {
    m->backend->pull(m, PULL_GROUPS);
    if (!m->acts.rG) return NULL;
    return m->acts.rG + (size_t)l * m->B * m->T * m->fc.K;
}

/* LayerActs starts with the per-layer tensors of Acts, ln1 .. rS, in the same order */
_Static_assert(offsetof(LayerActs, rS) / sizeof(real*) == 14 &&
                   (offsetof(Acts, rS) - offsetof(Acts, ln1)) / sizeof(real*) == 14,
               "LayerActs and Acts list ln1 .. rS alike");

LayerActs model_layer_acts(const Model* m, const Acts* a, uint32_t* rmask, int l) {
    const ModelConfig* c = &m->cfg;
    const FocusConfig* f = &m->fc;
    const size_t BT = (size_t)m->B * m->T, slot = m->keep ? (size_t)l : 0;
    /* ln1 .. rS: a slice of BT rows of these widths in slot l (slot 0 when not keeping) */
    const size_t width[15] = {
        c->C, 1, 1, model_qkv_width(c), model_att_width(c), model_heads(c), c->C,
        c->C, 1, 1, model_fc_width(c),  model_ffn(c),       c->C,           f->dg,
        f->K};
    LayerActs r;
    real** out = &r.ln1;
    real* const* in = &a->ln1;
    for (int i = 0; i < 15; i++) out[i] = in[i] + slot * BT * width[i];
    if (m->keep == KEEP_ROUTER) r.ln2 = a->ln2, r.fch_act = a->fch_act; /* one slot (above) */
    /* the groups and Sinkhorn offsets keep every layer's (reports read them after the pass) */
    r.rG = a->rG + (size_t)l * BT * f->K;
    r.colofs = a->colofs + (size_t)l * m->B * f->K;
    r.mask = rmask + slot * BT;
    /* a router with a query projection: the queries' masks after every slot's keys' masks */
    r.qmask = m->router.wq ? rmask + ((m->keep ? (size_t)c->L : 1) + slot) * BT : r.mask;
    const size_t H = (size_t)model_heads(c) + model_kv_heads(c);
    r.qkpre = model_slice(a->qkpre, (int)slot, BT * H * model_head_size(c));
    r.qkrstd = model_slice(a->qkrstd, (int)slot, BT * H);
    r.attp = model_slice(a->attp, (int)slot, BT * c->C);
    r.attp_rstd = model_slice(a->attp_rstd, (int)slot, BT);
    r.mlpp = model_slice(a->mlpp, (int)slot, BT * c->C);
    r.mlpp_rstd = model_slice(a->mlpp_rstd, (int)slot, BT);
    return r;
}

AttnGate model_layer_gate(const Model* m, int l, const LayerActs* a) {
    AttnGate g = {GATE_NONE, m->fc.K, m->fc.w, a->rG, a->mask, 0, 0, m->fc.sinks};
    const AttnMethod* t = attn_methods[model_layer_attn(m, l)];
    g.mode = t->gate;
    if (t->own_window) { /* the layer's own window: a hard gate whose masks are all 0 */
        g.w = model_layer_spec(&m->cfg, l).window;
        g.sinks = 0;
        return g;
    }
    if (m->router.gate) {
        g.lambda = m->router.gate[2 * l];
        g.bias = m->router.gate[2 * l + 1];
    }
    return g;
}

void model_forward(Model* m, const int* inputs, const int* targets, int B, int T, int keep) {
    if (m->decode_only)
        fatal(
            "this model was loaded for decoding only (its weights read in place from the file); "
            "load it with --weights f32 for a full forward pass");
    const ModelConfig* c = &m->cfg;
    if (T > c->maxT && c->arch == ARCH_GPT2)
        fatal("sequence length T=%d exceeds the model's position table (maxT=%d)", T, c->maxT);
    for (int i = 0; i < B * T; i++) {
        if (inputs[i] < 0 || inputs[i] >= c->V)
            fatal("token id %d at position %d is outside the vocabulary (V=%d)", inputs[i], i,
                  c->V);
    }
    if (m->kl_active && (B != m->B || T != m->T)) m->kl_active = 0; /* not this batch's teacher */
    if (!m->routed_dense)
        m->mass_ready = 0; /* the attn objective reads the teacher's activations */
    /* router training on the CPU keeps only what its backward reads (model.h, lean_acts) */
    if (keep && m->lean_acts && m->backend == &model_cpu_backend) keep = KEEP_ROUTER;
    m->backend->forward(m, inputs, targets, B, T, keep);
}

void model_teacher_forward(Model* m, const int* inputs, int B, int T, int want_logp,
                           int want_mass) {
    AttnMode attn = m->fc.attn;
    m->fc.attn = ATTN_DENSE;
    m->routed_dense = want_mass;
    m->kl_active = 0;
    m->mass_ready = want_mass;
    model_forward(m, inputs, NULL, B, T, 1);
    m->fc.attn = attn;
    m->routed_dense = 0;
    m->backend->teacher(m, want_logp, want_mass);
}

double model_attn_objective_norm(const Model* m) {
    int routed = 0;
    for (int l = 0; l < m->cfg.L; l++) routed += model_layer_routed(m, l);
    return routed ? 1.0 / ((double)routed * m->B * m->T * m->cfg.NH) : 0;
}

double model_attn_objective(Model* m, real weight, int backward) {
    if (!m->mass_ready) fatal("internal: model_attn_objective needs a teacher pass with want_mass");
    return m->backend->attn_objective(m, weight, backward);
}

/* The causal routing bias that balances the groups on this batch, every layer's (targets, L x K):
 * eight steps of the fixed point beta_k -= log(K share_k), the shares those of softmax(S / tau +
 * beta) over (a subsample of at most about 2048 of) the batch's rows. With data-parallel ranks
 * (m->dp) the batch is the union of theirs: the shares' sums are added up across the ranks at
 * every step, so every rank finds the beta one process would on the whole batch. */
static void balanced_beta(Model* m, real* targets) {
    const FocusConfig* f = &m->fc;
    const int L = m->cfg.L, K = f->K, ranks = m->dp ? m->dp->size : 1;
    const size_t BT = (size_t)m->B * m->T, all = BT * ranks;
    /* the global subsample: rows with a global index divisible by step */
    const size_t step = all > 2048 ? all / 2048 : 1;
    const size_t first = (step - ((size_t)(m->dp ? m->dp->rank : 0) * BT) % step) % step;
    double* b = mallocCheck(sizeof(double) * (size_t)L * K);
    double* col = mallocCheck(sizeof(double) * (size_t)L * (K + 1)); /* sums, then the count */
    for (int i = 0; i < L * K; i++) b[i] = m->beta[i];
    for (int it = 0; it < 8; it++) {
#pragma omp parallel for schedule(static)
        for (int l = 0; l < L; l++)
            routing_shares(col + (size_t)l * (K + 1), m->acts.rS + (size_t)l * BT * K, first, BT,
                           step, K, f->tau, b + (size_t)l * K);
        if (ranks > 1) comm_allreduce_sum(m->dp, col, (size_t)L * (K + 1), COMM_F64);
        for (int l = 0; l < L; l++)
            routing_beta_step(b + (size_t)l * K, col + (size_t)l * (K + 1), K);
    }
    for (int i = 0; i < L * K; i++) targets[i] = (real)b[i];
    free(b);
    free(col);
}

void model_update_beta(Model* m) {
    const FocusConfig* f = &m->fc;
    const int L = m->cfg.L, K = f->K, ranks = m->dp ? m->dp->size : 1;
    if (f->beta_balance) {
        /* from the score rows of every layer (a keep = 1 forward pass with the router on) */
        if (!m->keep || !m->acts.rS) return;
        m->backend->pull(m, PULL_SCORES);
        /* at most about 2048 rows a layer, the layers in parallel: on the GPU this host work
         * runs every step (4096 rows on one thread halved the training throughput) */
        real* target = mallocCheck(sizeof(real) * (size_t)L * K);
        balanced_beta(m, target);
        real mom = m->beta_updates ? f->beta_momentum : 0;
        for (int i = 0; i < L * K; i++) m->beta[i] = mom * m->beta[i] + (1 - mom) * target[i];
        free(target);
        m->beta_updates++;
        m->backend->push_router(m);
        return;
    }
    if (f->attn == ATTN_DENSE || f->routing == ROUTE_CAUSAL || !m->acts.colofs) return;
    /* Average of the batch's offsets (over every rank's rows); the first update takes it as is. */
    m->backend->pull(m, PULL_OFFSETS);
    double* sum = callocCheck((size_t)L * K, sizeof(double));
    for (int l = 0; l < L; l++)
        for (int k = 0; k < K; k++)
            for (int b = 0; b < m->B; b++)
                sum[l * K + k] += m->acts.colofs[((size_t)l * m->B + b) * K + k];
    if (ranks > 1) comm_allreduce_sum(m->dp, sum, (size_t)L * K, COMM_F64);
    real mom = m->beta_updates ? f->beta_momentum : 0;
    for (int i = 0; i < L * K; i++)
        m->beta[i] = mom * m->beta[i] + (1 - mom) * (real)(sum[i] / ((double)m->B * ranks));
    free(sum);
    m->beta_updates++;
    m->backend->push_router(m);
}

void model_zero_grad(Model* m, GradMode mode) {
    memset(m->rgrads_mem, 0, sizeof(real) * m->num_router);
    m->backend->zero_grad(m, mode);
}

void model_backward(Model* m, GradMode mode) {
    if (!m->keep || m->mean_loss < 0)
        fatal("internal: model_backward needs a forward pass with targets and keep = 1");
    if (m->keep == KEEP_ROUTER && mode != GRAD_ROUTER)
        fatal(
            "internal: weight or adapter gradients after a forward pass that kept the router's "
            "activations only (lean_acts)");
    m->backend->backward(m, mode);
}

void model_place(Model* m, const char* device) {
    if (m->wbf16 && strcmp(device, "cpu"))
        fatal("--device %s: the bf16 weight store is the CPU's (--weights bf16)", device);
    if (m->tp && strcmp(device, "cpu"))
        fatal(
            "--device %s: a tensor-parallel model runs on CPU ranks (MPI) in this version; its "
            "GPU path (NCCL) is not built yet",
            device);
    const char* why = NULL;
    const ModelBackend* be = model_find_backend(device, &why);
    if (!be) fatal("--device %s: %s", device, why);
    if (be == m->backend) return;
    if (m->lora.rank) fatal("--device %s: LoRA adapters run on the CPU (merge them first)", device);
    if (m->backend != &model_cpu_backend)
        fatal("internal: a model is placed on a device once (it is on %s)", m->backend->name);
    m->backend = be;
    be->attach(m);
}

int model_device_usable(const char* device, const char** why) {
    return model_find_backend(device, why) != NULL;
}

double model_router_grad_norm(Model* m, size_t n, int accum) {
    return m->backend->grad_norm(m, n, accum);
}

void model_router_adamw(Model* m, AdamW* opt, float lr, double gnorm, float clip, int accum) {
    m->backend->adamw(m, opt, lr, gnorm, clip, accum);
}

void model_router_adamw_sync(Model* m, AdamW* opt) { m->backend->adamw_sync(m, opt); }

/* The whole pages inside [p, p + n bytes) returned to the system (they read as zeros after). */
static void drop_pages(void* p, size_t n) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + page - 1) / page * page, b = ((uintptr_t)p + n) / page * page;
    if (b > a) madvise((void*)a, b - a, MADV_DONTNEED);
}

void model_drop_native_copies(Model* m) {
    if (!m->native || m->wbf16) return;
    const ModelConfig* c = &m->cfg;
    Params* p = &m->params;
    const size_t L = (size_t)c->L, C = (size_t)c->C;
    const size_t Q = (size_t)model_qkv_width(c), FC = (size_t)model_fc_width(c);
    drop_pages(p->qkvw, sizeof(real) * L * Q * C);
    drop_pages(p->attprojw, sizeof(real) * L * C * (size_t)model_att_width(c));
    drop_pages(p->fcw, sizeof(real) * L * FC * C);
    drop_pages(p->fcprojw, sizeof(real) * L * C * (size_t)model_ffn(c));
    drop_pages(p->wte, sizeof(real) * (size_t)c->V * C);
    if (!c->tied) drop_pages(p->lmhead, sizeof(real) * (size_t)c->V * C);
    m->decode_only = 1;
}

size_t model_backward_scratch(const ModelConfig* c, const FocusConfig* f, size_t BT) {
    const size_t C = c->C, A = model_att_width(c), wide = A > C ? A : C;
    return BT * (C + wide + model_qkv_width(c) + model_fc_width(c) + model_ffn(c) +
                 2 * (size_t)f->K + f->dg + (c->arch == ARCH_GEMMA3 ? C : 0));
}

MemoryPlan model_memory_plan(const ModelConfig* c, const FocusConfig* f, int B, int T,
                             int objective_kl, int objective_attn, WeightStore w) {
    MemoryPlan p;
    memset(&p, 0, sizeof p);
    const size_t BT = (size_t)B * T, R = sizeof(real);
    p.weights = model_param_count(c) * (w == WEIGHTS_BF16 ? 2 : 4);
    if (w == WEIGHTS_BF16_PROJ) { /* the four projections at 2 bytes, one layer's at 4 */
        size_t proj = 0, most = 0;
        const int t[4] = {4, 6, 10, 12};
        for (int k = 0; k < 4; k++) {
            const size_t n = model_param_slab(c, t[k]);
            proj += n * c->L;
            most = n > most ? n : most;
        }
        p.weights -= 2 * proj;
        p.weights += 4 * most;
    }
    ActSizes a = model_act_sizes(c, f, B, T, KEEP_ROUTER);
    p.activations = model_sum_sizes(a.n, NUM_ACT_TENSORS) * R - a.logits * R;
    p.logits = a.logits * R;
    /* router tensors, gradients and AdamW's two moments */
    const size_t router = (size_t)c->L * ((size_t)c->C * f->dg + (size_t)f->K * f->dg + 2);
    p.router = 4 * router * R;
    /* the backward pass's scratch (model_cpu.c cpu_backward) and the top-k masks */
    p.workspace = model_backward_scratch(c, f, BT) * R + (size_t)c->L * BT * sizeof(uint32_t) +
                  3 * BT * sizeof(int);
    if (objective_kl) p.teacher += BT * (size_t)c->V * R + 2 * BT * R;
    if (objective_attn) p.teacher += (size_t)c->L * BT * f->K * R;
    p.total = p.weights + p.activations + p.logits + p.router + p.workspace + p.teacher;
    return p;
}

MemoryPlan model_memory_plan_mass(const ModelConfig* c, const FocusConfig* f, int T, int layers,
                                  int queries, int keys, int threads, WeightStore w) {
    MemoryPlan p = model_memory_plan(c, f, 1, T, 0, 0, w);
    const size_t R = sizeof(real), Ts = (size_t)T, C = (size_t)c->C, K = (size_t)f->K;
    ActSizes a = model_act_sizes(c, f, 1, T, 0);
    p.activations = model_sum_sizes(a.n, NUM_ACT_TENSORS) * R - a.logits * R;
    p.logits = 0; /* allocated, never touched: the teacher's pass has no head */
    const size_t chunk = Ts * C * 2 + (size_t)queries * 8 + (size_t)queries * keys * 8;
    p.teacher = (size_t)layers * chunk + (size_t)threads * 3 * 64 * Ts * R;
    p.workspace = (size_t)threads * (Ts * C * (R + 2) + Ts * (4 * K + 2 * (size_t)f->dg) * R +
                                     (size_t)queries * keys * 8) +
                  (size_t)layers * 2048 * K * R;
    p.total = p.weights + p.activations + p.logits + p.router + p.workspace + p.teacher;
    return p;
}
