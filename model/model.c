/* model.c: the calls of model.h, whichever device runs them.
 *
 * A layer, pre-norm in both families:
 *   h    = norm1(x)                       LayerNorm (gpt2) or RMSNorm (llama)
 *   qkv  = h Wqkv^T (+ b), RoPE on q, k   (llama)
 *   G    = routing((h W_g) C^T)           the router reads the same h (METHOD.md section 2)
 *   att  = attention(qkv, gate(G))        local window untouched, distant pairs gated
 *   x2   = x + att Wo^T (+ b)
 *   y    = x2 + mlp(norm2(x2))            GELU (gpt2) or SwiGLU (llama)
 * The passes themselves live in the backends (backend.h): model_cpu.c is the reference to read,
 * model_cuda.c its GPU mirror. Here: the shapes and each layer's description, building and freeing
 * a model, the activations' layout, and the calls that the backend runs. The parameters are
 * params.c's, the router's and its causal bias router_params.c's, the LoRA adapters lora.c's. */
#include "model.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

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

void model_build(Model* m, const ModelConfig* cfg, const FocusConfig* fc) {
    config_validate(cfg, fc);
    memset(m, 0, sizeof(*m));
    m->cfg = *cfg;
    m->fc = *fc;
    model_param_sizes(m->param_sizes, cfg);
    m->num_params = model_sum_sizes(m->param_sizes, NUM_PARAM_TENSORS);
    m->params_mem = callocCheck(m->num_params, sizeof(real));
    model_carve((real**)&m->params, m->params_mem, m->param_sizes, NUM_PARAM_TENSORS);
    m->mean_loss = -1;
    m->bos = -1;
    m->backend = &model_cpu_backend;
    model_alloc_router(m);
}

void model_free(Model* m) {
    if (m->backend && m->backend->release) m->backend->release(m);
    model_release_native(m);
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
    free(m->method.selector);
    free(m->method.selector_blocks);
    free(m->lora_mem);
    free(m->lora_grads_mem);
    free(m->lora_scratch);
    memset(m, 0, sizeof(*m));
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
    if (m->pass.kl_active && (B != m->B || T != m->T))
        m->pass.kl_active = 0; /* not this batch's teacher */
    if (!m->pass.routed_dense)
        m->pass.mass_ready = 0; /* the attn objective reads the teacher's activations */
    /* router training on the CPU keeps only what its backward reads (PassFlags.lean_acts) */
    if (keep && m->pass.lean_acts && m->backend == &model_cpu_backend) keep = KEEP_ROUTER;
    m->backend->forward(m, inputs, targets, B, T, keep);
}

void model_teacher_forward(Model* m, const int* inputs, int B, int T, int want_logp,
                           int want_mass) {
    AttnMode attn = m->fc.attn;
    m->fc.attn = ATTN_DENSE;
    m->pass.routed_dense = want_mass;
    m->pass.kl_active = 0;
    m->pass.mass_ready = want_mass;
    model_forward(m, inputs, NULL, B, T, 1);
    m->fc.attn = attn;
    m->pass.routed_dense = 0;
    m->backend->teacher(m, want_logp, want_mass);
}

double model_attn_objective_norm(const Model* m) {
    int routed = 0;
    for (int l = 0; l < m->cfg.L; l++) routed += model_layer_routed(m, l);
    return routed ? 1.0 / ((double)routed * m->B * m->T * m->cfg.NH) : 0;
}

double model_attn_objective(Model* m, real weight, int backward) {
    if (!m->pass.mass_ready)
        fatal("internal: model_attn_objective needs a teacher pass with want_mass");
    return m->backend->attn_objective(m, weight, backward);
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

void model_router_pull(Model* m, const real* center, size_t n, real rate) {
    const real r = rate < 1 ? rate : 1;
    for (size_t i = 0; i < n; i++) m->router_mem[i] -= r * (m->router_mem[i] - center[i]);
    m->backend->push_router(m);
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
                                  int queries, int keys, int threads, int values, WeightStore w) {
    MemoryPlan p = model_memory_plan(c, f, 1, T, 0, 0, w);
    const size_t R = sizeof(real), Ts = (size_t)T, C = (size_t)c->C, K = (size_t)f->K;
    ActSizes a = model_act_sizes(c, f, 1, T, 0);
    p.activations = model_sum_sizes(a.n, NUM_ACT_TENSORS) * R - a.logits * R;
    p.logits = 0; /* allocated, never touched: the teacher's pass has no head */
    const size_t chunk = Ts * C * 2 + (size_t)queries * 8 + (size_t)queries * keys * 8;
    p.teacher = (size_t)layers * chunk + (size_t)threads * 3 * 64 * Ts * R;
    /* the output-restoring score: each thread's probabilities and missed probabilities, and the
     * values' norms (kernels/mass.c) */
    if (values) p.teacher += (size_t)threads * 2 * 64 * Ts * R + (size_t)c->NKV * Ts * R;
    p.workspace = (size_t)threads * (Ts * C * (R + 2) + Ts * (4 * K + 2 * (size_t)f->dg) * R +
                                     (size_t)queries * keys * 8) +
                  (size_t)layers * 2048 * K * R;
    p.total = p.weights + p.activations + p.logits + p.router + p.workspace + p.teacher;
    return p;
}
