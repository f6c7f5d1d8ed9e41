/* params.c: the backbone's parameters: the table of named tensors (model_params: shapes, cuts,
 * names in each file format), their sizes and fingerprints, where they are held (fp32, the bf16
 * store, a tensor-parallel slice: model_fill, model_shard, model_build_slice), the synthetic
 * initialisation, and the file's native blocks given back. */
#include <math.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend.h"
#include "model.h"

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

void model_param_sizes(size_t* s, const ModelConfig* c) {
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        size_t r, k;
        model_param_shape(c, t, &r, &k);
        s[t] = (size_t)param_layers(c, t) * r * k;
    }
}

size_t model_param_count(const ModelConfig* c) {
    size_t s[NUM_PARAM_TENSORS];
    model_param_sizes(s, c);
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
    model_param_sizes(s, c);
    return s[t] / param_layers(c, t);
}

/* Tensor t passes through model_fill's stage: cut into slices (tp) or stored in bf16. */
static int staged(int t, int tp, int bf16) {
    return (tp && model_params[t].cut != CUT_WHOLE) || (bf16 && bf16_index(t) >= 0);
}

void model_fill(Model* m, const ModelConfig* whole, const WeightSource* src) {
    real** p = (real**)&m->params;
    size_t ws[NUM_PARAM_TENSORS];
    model_param_sizes(ws, whole);
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
void model_release_native(Model* m) {
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
    model_param_sizes(m->param_sizes, &m->cfg);
    m->num_params = model_sum_sizes(m->param_sizes, NUM_PARAM_TENSORS);
    m->params_mem = callocCheck(m->num_params, sizeof(real));
    model_carve((real**)&m->params, m->params_mem, m->param_sizes, NUM_PARAM_TENSORS);
    model_fill(m, &whole.cfg, &(WeightSource){&whole, whole_slab});
    free(whole.params_mem);
    model_release_native(m); /* the file's blocks are the whole model's */
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
