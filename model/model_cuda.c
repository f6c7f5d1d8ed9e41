/* model_cuda.c: the CUDA backend (backend.h), a mirror of model_cpu.c: the same layer order,
 * activation layout and kernel choices, with *_cuda kernels in place of the CPU ones and device
 * copies of the weights, router and activations. Router training only (GRAD_ROUTER); training
 * a backbone from scratch stays on the CPU. Host code only; the kernels live in kernels/cuda.
 * Tested against the CPU by tests/test_cuda.c. */
#include <math.h>
#include <string.h>

#include "../kernels/cuda/cuda.h"
#include "backend.h"

struct CudaModel {
    Params params; /* device pointers into params_mem */
    float* params_mem;
    RouterParams router, rgrads;
    float* router_mem;
    float* rgrads_mem;
    float* beta;
    Acts acts; /* device activations for (B, T, keep) */
    float* acts_mem;
    uint32_t* rmask;
    int *inputs, *targets;
    float* losses;
    int B, T, keep;
    float* scratch; /* backward scratch */
    size_t scratch_size;
    HardPlan* plan;
    float *adam_m, *adam_v;
    size_t adam_n;
    float *tprob, *tnegent, *kl_losses; /* (B, T, V), (B, T), (B, T): objective kl */
    float* atarget;                     /* (L, B, T, K): objective attn */
    float* obj_scratch;                 /* group mass per head, then dG, dS, dproj */
    float* route_scratch;               /* the Sinkhorn replay of the attn objective's backward */
    size_t tprob_n, tnegent_n, atarget_n, obj_n, route_n;
    int groups_fresh; /* host rG matches the device */
};

static struct CudaModel* G(const Model* m) { return m->device; }
static void cuda_push_router(Model* m);

/* Carve with every tensor starting on a 64-float boundary (16-byte vector loads). */
static size_t carve_aligned(real** ptrs, real* mem, const size_t* sizes, int n) {
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if (ptrs) ptrs[i] = sizes[i] ? mem + off : NULL;
        off += (sizes[i] + 63) / 64 * 64;
    }
    return off;
}

static void cuda_attach(Model* m) {
    /* the GPU passes mirror the gpt2 and llama layers; gemma3's (QK-norm, sandwich norms, GeGLU,
     * sliding-window layers) run on the CPU in this version */
    if (m->cfg.arch == ARCH_GEMMA3)
        fatal("%s: gemma3 runs on the CPU (--device cpu); its GPU passes are not written yet",
              m->source[0] ? m->source : "the model");
    if (m->fc.qproj)
        fatal("a router with a query projection (qproj = 1) runs on the CPU (--device cpu)");
    if (m->method.with_groups)
        fatal("a block selector with a token router's groups runs on the CPU (--device cpu)");
    cuda_init(0);
    struct CudaModel* g = callocCheck(1, sizeof(*g));
    size_t np = carve_aligned(NULL, NULL, m->param_sizes, NUM_PARAM_TENSORS);
    g->params_mem = cuda_malloc(np * sizeof(float));
    carve_aligned((real**)&g->params, g->params_mem, m->param_sizes, NUM_PARAM_TENSORS);
    real** hp = (real**)&m->params;
    real** dp = (real**)&g->params;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++)
        if (m->param_sizes[i]) cuda_upload(dp[i], hp[i], m->param_sizes[i] * sizeof(float));
    /* router buffers keep the host layout (one contiguous block) so AdamW can run over it */
    g->router_mem = cuda_malloc(m->num_router * sizeof(float));
    g->rgrads_mem = cuda_malloc(m->num_router * sizeof(float));
    g->beta = cuda_malloc(sizeof(float) * m->cfg.L * m->fc.K);
    m->device = g;
    cuda_push_router(m);
    cuda_memset0(g->rgrads_mem, m->num_router * sizeof(float));
    g->plan = hard_plan_create();
}

static void cuda_push_router(Model* m) {
    struct CudaModel* g = G(m);
    if (!g) return;
    cuda_upload(g->router_mem, m->router_mem, m->num_router * sizeof(float));
    real* base = g->router_mem;
    for (int i = 0; i < NUM_ROUTER_TENSORS; i++) {
        real* hp = ((real**)&m->router)[i];
        ((real**)&g->router)[i] = hp ? base + (hp - m->router_mem) : NULL;
        real* hg = ((real**)&m->rgrads)[i];
        ((real**)&g->rgrads)[i] = hg ? g->rgrads_mem + (hg - m->rgrads_mem) : NULL;
    }
    cuda_upload(g->beta, m->beta, sizeof(float) * m->cfg.L * m->fc.K);
}

/* Free the device buffers at the given addresses and clear them. */
static void free_all(void** bufs[], int n) {
    for (int i = 0; i < n; i++) {
        cuda_free(*bufs[i]);
        *bufs[i] = NULL;
    }
}

static void free_acts(struct CudaModel* g) {
    void** acts[] = {(void**)&g->acts_mem, (void**)&g->rmask, (void**)&g->inputs,
                     (void**)&g->targets, (void**)&g->losses};
    free_all(acts, 5);
}

static void cuda_release(Model* m) {
    struct CudaModel* g = G(m);
    if (!g) return;
    free_acts(g);
    void** rest[] = {(void**)&g->params_mem,   (void**)&g->router_mem, (void**)&g->rgrads_mem,
                     (void**)&g->beta,         (void**)&g->scratch,    (void**)&g->adam_m,
                     (void**)&g->adam_v,       (void**)&g->tprob,      (void**)&g->tnegent,
                     (void**)&g->kl_losses,    (void**)&g->atarget,    (void**)&g->obj_scratch,
                     (void**)&g->route_scratch};
    free_all(rest, (int)(sizeof rest / sizeof rest[0]));
    hard_plan_free(g->plan);
    free(g);
    m->device = NULL;
}

/* Device activations for (B, T, keep); on the host only what callers read (groups, offsets,
 * losses, tokens). */
static void ensure_acts(Model* m, int B, int T, int keep) {
    struct CudaModel* g = G(m);
    if (g->acts_mem && g->B == B && g->T == T && g->keep == keep) return;
    free_acts(g);
    ActSizes s = model_act_sizes(&m->cfg, &m->fc, B, T, keep);
    size_t n = carve_aligned(NULL, NULL, s.n, NUM_ACT_TENSORS);
    g->acts_mem = cuda_malloc(n * sizeof(float));
    carve_aligned((real**)&g->acts, g->acts_mem, s.n, NUM_ACT_TENSORS);
    g->rmask = cuda_malloc(sizeof(uint32_t) * (keep ? m->cfg.L : 1) * B * T);
    g->inputs = cuda_malloc(sizeof(int) * B * T);
    g->targets = cuda_malloc(sizeof(int) * B * T);
    g->losses = cuda_malloc(sizeof(float) * B * T);
    g->B = B;
    g->T = T;
    g->keep = keep;
    /* host side: only the groups and column offsets that callers read */
    model_host_buffers(m, B, T, keep);
    memset(&m->acts, 0, sizeof m->acts);
    const size_t nS = s.rS, nG = s.rG, nofs = s.colofs;
    m->acts_mem = mallocCheck(sizeof(real) * (nS + nG + nofs + 1));
    m->acts.rG = nG ? m->acts_mem : NULL;
    m->acts.colofs = nofs ? m->acts_mem + nG : NULL;
    m->acts.rS = nS ? m->acts_mem + nG + nofs : NULL;
}

/* out (BT, rows) = in (BT, cols) W^T + b with layer l's W (rows, cols) and b (rows, or none) */
static void linear(float* out, const float* in, const float* W, const float* b, int l, size_t BT,
                   int cols, int rows) {
    cuda_prof_mark("fwd gemm");
    matmul_forward_cuda(out, in, model_slice(W, l, (size_t)rows * cols), model_slice(b, l, rows),
                        BT, cols, rows);
}

static void norm_forward(const Model* m, float* out, float* mean, float* rstd, const float* inp,
                         const float* w, const float* b, size_t N) {
    if (m->cfg.arch == ARCH_GPT2)
        layernorm_forward_cuda(out, mean, rstd, inp, w, b, N, m->cfg.C, m->cfg.eps);
    else
        rmsnorm_forward_cuda(out, rstd, inp, w, N, m->cfg.C, m->cfg.eps);
}

static void norm_backward(const Model* m, float* dinp, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, size_t N) {
    if (m->cfg.arch == ARCH_GPT2)
        layernorm_backward_cuda(dinp, NULL, NULL, dout, inp, w, mean, rstd, N, m->cfg.C);
    else
        rmsnorm_backward_cuda(dinp, NULL, dout, inp, w, rstd, N, m->cfg.C);
}

static void cuda_forward(Model* m, const int* inputs, const int* targets, int B, int T, int keep) {
    struct CudaModel* g = G(m);
    const ModelConfig* c = &m->cfg;
    const FocusConfig* f = &m->fc;
    if (!model_method(m)->cuda)
        fatal(
            "--attn window / random / blocks / blocks_mean / oracle run on the CPU (no --device "
            "cuda)");
    ensure_acts(m, B, T, keep);
    memcpy(m->inputs, inputs, sizeof(int) * B * T);
    cuda_upload(g->inputs, inputs, sizeof(int) * B * T);
    const size_t BT = (size_t)B * T;
    const int C = c->C, hs = model_head_size(c), QKV = model_qkv_width(c), FC = model_fc_width(c);
    const Params* p = &g->params;
    Acts* a = &g->acts;
    cuda_prof_mark("fwd embedding");
    encoder_forward_cuda(a->encoded, g->inputs, p->wte, p->wpe, B, T, C);
    const float* x = a->encoded;
    for (int l = 0; l < c->L; l++) {
        LayerActs la = model_layer_acts(m, a, g->rmask, l);
        size_t lC = (size_t)l * C;
        cuda_prof_mark("fwd norm");
        norm_forward(m, la.ln1, la.ln1_mean, la.ln1_rstd, x, model_slice(p->ln1w, l, C),
                     model_slice(p->ln1b, l, C), BT);
        linear(la.qkv, la.ln1, p->qkvw, p->qkvb, l, BT, C, QKV);
        cuda_prof_mark("fwd rope");
        if (c->arch == ARCH_LLAMA)
            rope_forward_cuda(la.qkv, B, T, c->NH, c->NKV, hs, c->rope_theta, 0);
        const AttnMode mode = focus_layer_attn(f, l);
        if (f->attn != ATTN_DENSE || m->pass.routed_dense) {
            cuda_prof_mark("fwd router scores");
            router_scores_forward_cuda(la.rproj, la.rS, la.ln1, g->router.wg + lC * f->dg,
                                       g->router.cent + (size_t)l * f->K * f->dg, BT, C, f->dg,
                                       f->K);
            cuda_prof_mark("fwd routing");
            routing_forward_cuda(la.rG, la.colofs, la.rS, g->beta + (size_t)l * f->K, f->routing, B,
                                 T, f->K, f->tau, f->iters);
            if (attn_methods[mode]->masks == MASKS_ROUTER)
                routing_topk_mask_cuda(la.mask, la.rG, B, T, f->K, f->topk, f->topp, f->sinks, 0);
        }
        cuda_prof_mark("fwd attention");
        AttnGate gate = model_layer_gate(m, l, &la);
        switch (model_attn_kernel(mode, keep)) {
            case ATTN_KERNEL_SPARSE:
                attention_hard_forward_cuda(g->plan, la.att, la.lse, la.qkv, la.mask, f->K, f->w, B,
                                            T, c->NH, c->NKV, hs);
                break;
            case ATTN_KERNEL_DENSE: /* the fp32 kernel with no gate: perplexities match the CPU's */
                attention_forward_cuda(la.att, la.lse, la.qkv, &gate, B, T, c->NH, c->NKV, hs);
                break;
            case ATTN_KERNEL_GATED: /* training on tensor cores where they apply, else fp32 */
                if (keep && attention_mma_applies(&gate, hs))
                    attention_forward_mma_cuda(la.att, la.lse, la.qkv, &gate, B, T, c->NH, c->NKV);
                else
                    attention_forward_cuda(la.att, la.lse, la.qkv, &gate, B, T, c->NH, c->NKV, hs);
                break;
            case ATTN_KERNEL_BAND:
            case ATTN_KERNEL_BLOCKS:
                fatal(
                    "--attn window / blocks / blocks_mean / oracle run on the CPU (no --device "
                    "cuda)");
                break;
        }
        linear(la.res2, la.att, p->attprojw, p->attprojb, l, BT, C, C);
        cuda_prof_mark("fwd residual+norm");
        residual_add_cuda(la.res2, x, BT * C);
        norm_forward(m, la.ln2, la.ln2_mean, la.ln2_rstd, la.res2, model_slice(p->ln2w, l, C),
                     model_slice(p->ln2b, l, C), BT);
        linear(la.fch, la.ln2, p->fcw, p->fcb, l, BT, C, FC);
        cuda_prof_mark("fwd gelu/swiglu");
        if (c->arch == ARCH_GPT2)
            gelu_forward_cuda(la.fch_act, la.fch, BT * c->F);
        else
            swiglu_forward_cuda(la.fch_act, la.fch, BT, c->F);
        linear(la.res3, la.fch_act, p->fcprojw, p->fcprojb, l, BT, c->F, C);
        cuda_prof_mark("fwd residual");
        residual_add_cuda(la.res3, la.res2, BT * C);
        x = la.res3;
    }
    cuda_prof_mark("fwd final norm");
    norm_forward(m, a->lnf, a->lnf_stat, a->lnf_stat + BT, x, p->lnfw, p->lnfb, BT);
    cuda_prof_mark("fwd lm head");
    matmul_forward_cuda(a->logits, a->lnf, c->tied ? p->wte : p->lmhead, NULL, BT, C, c->V);
    g->groups_fresh = 0;
    m->mean_loss = -1;
    if (targets) {
        memcpy(m->targets, targets, sizeof(int) * BT);
        cuda_upload(g->targets, targets, sizeof(int) * BT);
        size_t valid = 0;
        for (size_t i = 0; i < BT; i++) valid += targets[i] >= 0;
        cuda_prof_mark("fwd cross-entropy");
        crossentropy_forward_cuda(g->losses, a->logits, g->targets, BT, c->V);
        cuda_prof_mark(NULL);
        cuda_download(m->losses, g->losses, sizeof(float) * BT); /* waits for the device */
        double s = 0;
        for (size_t i = 0; i < BT; i++) s += m->losses[i];
        m->mean_loss = valid ? (real)(s / valid) : 0;
        if (m->pass.kl_active) {
            kl_forward_cuda(g->kl_losses, a->logits, g->tprob, g->tnegent, g->targets, BT, c->V);
            cuda_download(m->kl_losses, g->kl_losses, sizeof(float) * BT);
            s = 0;
            for (size_t i = 0; i < BT; i++) s += m->kl_losses[i];
            m->mean_kl = valid ? (real)(s / valid) : 0;
        }
    } else {
        cuda_sync();
    }
}

static void cuda_pull(const Model* m, ModelPull what) {
    struct CudaModel* g = G(m);
    if (what == PULL_GROUPS) {
        if (g->groups_fresh || !g->acts.rG || !m->acts.rG) return;
        size_t n = (size_t)m->cfg.L * g->B * g->T * m->fc.K;
        cuda_download(m->acts.rG, g->acts.rG, n * sizeof(float));
        g->groups_fresh = 1;
    } else if (what == PULL_OFFSETS) {
        if (!g->acts.colofs || !m->acts.colofs) return;
        cuda_download(m->acts.colofs, g->acts.colofs, sizeof(float) * m->cfg.L * g->B * m->fc.K);
    } else {
        if (!g->acts.rS || !m->acts.rS) return;
        ActSizes s = model_act_sizes(&m->cfg, &m->fc, g->B, g->T, g->keep);
        cuda_download(m->acts.rS, g->acts.rS, sizeof(float) * s.rS);
    }
}

static void cuda_zero_grad(Model* m, GradMode mode) {
    if (mode == GRAD_ALL)
        fatal("--device cuda trains the router only; train a backbone from scratch on the CPU");
    cuda_memset0(G(m)->rgrads_mem, sizeof(float) * m->num_router);
}

static void cuda_backward(Model* m, GradMode mode) {
    struct CudaModel* g = G(m);
    const ModelConfig* c = &m->cfg;
    const FocusConfig* f = &m->fc;
    if (mode == GRAD_ALL)
        fatal("--device cuda trains the router only; train a backbone from scratch on the CPU");
    const int B = g->B, T = g->T, C = c->C, hs = model_head_size(c), QKV = model_qkv_width(c),
              FC = model_fc_width(c);
    const size_t BT = (size_t)B * T;
    const int router_on = model_method(m)->gate == GATE_SOFT;
    const Params* p = &g->params;
    Acts* a = &g->acts;
    /* scratch: dres, dbuf (BT, C); dqkv (BT, QKV); dfch (BT, FC); dact (BT, F); dG, dS (BT, K);
     * dproj (BT, dg); attention (B NH T); routing replay */
    size_t sz[9] = {BT * C,
                    BT * C,
                    BT * QKV,
                    BT * FC,
                    BT * c->F,
                    BT * f->K,
                    BT * f->K,
                    BT * f->dg,
                    (size_t)B * c->NH * T + routing_scratch_floats(B, T, f->K, f->iters)};
    size_t need = carve_aligned(NULL, NULL, sz, 9);
    if (g->scratch_size < need) {
        cuda_free(g->scratch);
        g->scratch = cuda_malloc(need * sizeof(float));
        g->scratch_size = need;
    }
    real* buf[9];
    carve_aligned(buf, g->scratch, sz, 9);
    float *dres = buf[0], *dbuf = buf[1], *dqkv = buf[2], *dfch = buf[3], *dact = buf[4],
          *dG = buf[5], *dS = buf[6], *dproj = buf[7], *attn_scr = buf[8];
    float* route_scr = attn_scr + (size_t)B * c->NH * T;

    size_t valid = 0;
    for (size_t i = 0; i < BT; i++) valid += m->targets[i] >= 0;
    cuda_prof_mark("bwd cross-entropy");
    if (m->pass.kl_active)
        kl_backward_cuda(a->logits, g->kl_losses, a->logits, g->tprob, g->tnegent, g->targets, BT,
                         c->V, (float)(1.0 / (valid ? valid : 1)));
    else
        crossentropy_backward_cuda(a->logits, g->losses, a->logits, g->targets, BT, c->V,
                                   (float)(1.0 / (valid ? valid : 1)));

    const float* xlast = a->res3 + (size_t)(c->L - 1) * BT * C;
    cuda_memset0(dbuf, sizeof(float) * BT * C);
    cuda_memset0(dres, sizeof(float) * BT * C);
    cuda_prof_mark("bwd lm head");
    matmul_backward_cuda(dbuf, NULL, NULL, a->logits, a->lnf, c->tied ? p->wte : p->lmhead, BT, C,
                         c->V);
    cuda_prof_mark("bwd norm");
    norm_backward(m, dres, dbuf, xlast, p->lnfw, a->lnf_stat, a->lnf_stat + BT, BT);

    for (int l = c->L - 1; l >= 0; l--) {
        LayerActs la = model_layer_acts(m, a, g->rmask, l);
        const float* x = l == 0 ? a->encoded : a->res3 + (size_t)(l - 1) * BT * C;
        size_t lC = (size_t)l * C;
        cuda_prof_mark("bwd gemm");
        cuda_memset0(dact, sizeof(float) * BT * c->F);
        matmul_backward_cuda(dact, NULL, NULL, dres, la.fch_act, p->fcprojw + (size_t)l * C * c->F,
                             BT, c->F, C);
        cuda_prof_mark("bwd gelu/swiglu");
        cuda_memset0(dfch, sizeof(float) * BT * FC);
        if (c->arch == ARCH_GPT2)
            gelu_backward_cuda(dfch, la.fch, dact, BT * c->F);
        else
            swiglu_backward_cuda(dfch, la.fch, dact, BT, c->F);
        cuda_prof_mark("bwd gemm");
        cuda_memset0(dbuf, sizeof(float) * BT * C);
        matmul_backward_cuda(dbuf, NULL, NULL, dfch, la.ln2, p->fcw + (size_t)l * FC * C, BT, C,
                             FC);
        cuda_prof_mark("bwd norm");
        norm_backward(m, dres, dbuf, la.res2, p->ln2w + lC, la.ln2_mean, la.ln2_rstd, BT);
        cuda_prof_mark("bwd gemm");
        cuda_memset0(dbuf, sizeof(float) * BT * C);
        matmul_backward_cuda(dbuf, NULL, NULL, dres, la.att, p->attprojw + (size_t)l * C * C, BT, C,
                             C);
        cuda_prof_mark("bwd attention");
        cuda_memset0(dqkv, sizeof(float) * BT * QKV);
        const int router = router_on && !focus_layer_dense(f, l);
        if (router) cuda_memset0(dG, sizeof(float) * BT * f->K);
        AttnGate gate = model_layer_gate(m, l, &la);
        if (attention_mma_applies(&gate, hs))
            attention_backward_mma_cuda(
                dqkv, router ? dG : NULL, router && f->learn_gate ? g->rgrads.gate + 2 * l : NULL,
                dbuf, la.qkv, la.att, la.lse, &gate, B, T, c->NH, c->NKV, attn_scr);
        else
            attention_backward_cuda(
                dqkv, router ? dG : NULL, router && f->learn_gate ? g->rgrads.gate + 2 * l : NULL,
                dbuf, la.qkv, la.att, la.lse, &gate, B, T, c->NH, c->NKV, hs, attn_scr);
        if (l == 0 && !router) break;
        cuda_prof_mark("bwd rope");
        if (c->arch == ARCH_LLAMA)
            rope_backward_cuda(dqkv, B, T, c->NH, c->NKV, hs, c->rope_theta, 0);
        cuda_prof_mark("bwd gemm");
        cuda_memset0(dbuf, sizeof(float) * BT * C);
        if (l > 0)
            matmul_backward_cuda(dbuf, NULL, NULL, dqkv, la.ln1, p->qkvw + (size_t)l * QKV * C, BT,
                                 C, QKV);
        if (router) {
            cuda_prof_mark("bwd routing");
            cuda_memset0(dS, sizeof(float) * BT * f->K);
            routing_backward_cuda(dS, dG, la.rS, la.rG, g->beta + (size_t)l * f->K, f->routing, B,
                                  T, f->K, f->tau, f->iters, route_scr);
            cuda_prof_mark("bwd router scores");
            router_scores_backward_cuda(
                dbuf, g->rgrads.wg + lC * f->dg, g->rgrads.cent + (size_t)l * f->K * f->dg, dproj,
                dS, la.ln1, la.rproj, g->router.wg + lC * f->dg,
                g->router.cent + (size_t)l * f->K * f->dg, BT, C, f->dg, f->K);
        }
        if (l == 0) break;
        cuda_prof_mark("bwd norm");
        norm_backward(m, dres, dbuf, x, p->ln1w + lC, la.ln1_mean, la.ln1_rstd, BT);
    }
    m->pass.kl_active = 0; /* the teacher's distributions served this backward pass */
    /* the host copy of the router gradients (what clipping and tests read) */
    cuda_prof_mark("bwd gradient download");
    cuda_download(m->rgrads_mem, g->rgrads_mem, sizeof(float) * m->num_router);
    cuda_prof_mark(NULL);
}

/* Grow a device buffer to n floats. */
static float* grow(float* p, size_t* have, size_t n) {
    if (*have >= n && p) return p;
    cuda_free(p);
    *have = n;
    return cuda_malloc(sizeof(float) * n);
}

static void cuda_teacher(Model* m, int want_logp, int want_mass) {
    struct CudaModel* g = G(m);
    const ModelConfig* c = &m->cfg;
    const FocusConfig* f = &m->fc;
    const size_t BT = (size_t)g->B * g->T;
    if (want_logp) {
        g->tprob = grow(g->tprob, &g->tprob_n, BT * c->V);
        g->tnegent = grow(g->tnegent, &g->tnegent_n, BT);
        if (m->teacher_bt != BT) {
            cuda_free(g->kl_losses);
            g->kl_losses = cuda_malloc(sizeof(float) * BT);
            free(m->kl_losses);
            m->kl_losses = mallocCheck(sizeof(real) * BT);
            m->teacher_bt = BT;
        }
        cuda_copy(g->tprob, g->acts.logits, sizeof(float) * BT * c->V);
        teacher_probs_forward_cuda(g->tprob, g->tnegent, BT, c->V);
        m->pass.kl_active = 1;
    }
    if (want_mass) {
        g->atarget = grow(g->atarget, &g->atarget_n, (size_t)c->L * BT * f->K);
        g->obj_scratch =
            grow(g->obj_scratch, &g->obj_n, BT * (c->NH * (size_t)f->K + 2 * f->K + f->dg));
        const int hs = model_head_size(c);
        for (int l = 0; l < c->L; l++) {
            LayerActs la = model_layer_acts(m, &g->acts, g->rmask, l);
            attention_group_mass_cuda(g->atarget + (size_t)l * BT * f->K, la.qkv, la.lse, la.rG,
                                      f->K, f->w, f->sinks, g->B, g->T, c->NH, c->NKV, hs,
                                      g->obj_scratch);
        }
    }
}

static double cuda_attn_objective(Model* m, float weight, int backward) {
    struct CudaModel* g = G(m);
    const ModelConfig* c = &m->cfg;
    const FocusConfig* f = &m->fc;
    const size_t BT = (size_t)g->B * g->T, K = f->K;
    const double norm = model_attn_objective_norm(m);
    if (!norm) return 0;
    float* dG = g->obj_scratch;
    float* dS = dG + BT * K;
    float* dproj = dS + BT * K;
    float* route_scr = NULL;
    if (backward)
        route_scr = g->route_scratch = grow(g->route_scratch, &g->route_n,
                                            routing_scratch_floats(g->B, g->T, f->K, f->iters) + 1);
    double loss = 0;
    for (int l = 0; l < c->L; l++) {
        if (focus_layer_dense(f, l)) continue;
        LayerActs la = model_layer_acts(m, &g->acts, g->rmask, l);
        loss +=
            attn_objective_cuda(dG, g->atarget + (size_t)l * BT * K, la.rG, BT * K, norm, weight);
        if (!backward) continue;
        size_t lC = (size_t)l * c->C;
        cuda_memset0(dS, sizeof(float) * BT * K);
        routing_backward_cuda(dS, dG, la.rS, la.rG, g->beta + (size_t)l * K, f->routing, g->B, g->T,
                              f->K, f->tau, f->iters, route_scr);
        router_scores_backward_cuda(NULL, g->rgrads.wg + lC * f->dg,
                                    g->rgrads.cent + (size_t)l * K * f->dg, dproj, dS, la.ln1,
                                    la.rproj, g->router.wg + lC * f->dg,
                                    g->router.cent + (size_t)l * K * f->dg, BT, c->C, f->dg, f->K);
    }
    if (backward) cuda_download(m->rgrads_mem, g->rgrads_mem, sizeof(float) * m->num_router);
    return loss;
}

static double cuda_grad_norm(Model* m, size_t n, int accum) {
    /* the gradients stay as they are; cuda_adamw scales them by 1 / accum (and the clip) */
    return sqrt(sumsq_cuda(G(m)->rgrads_mem, n)) / accum;
}

static void cuda_adamw(Model* m, AdamW* opt, float lr, double gnorm, float clip, int accum) {
    struct CudaModel* g = G(m);
    const double k = clip > 0 && gnorm > clip ? clip / (gnorm + 1e-12) : 1.0;
    if (!g->adam_m || g->adam_n != opt->n) {
        cuda_free(g->adam_m);
        cuda_free(g->adam_v);
        g->adam_m = cuda_malloc(sizeof(float) * opt->n);
        g->adam_v = cuda_malloc(sizeof(float) * opt->n);
        g->adam_n = opt->n;
        cuda_upload(g->adam_m, opt->m, sizeof(float) * opt->n);
        cuda_upload(g->adam_v, opt->v, sizeof(float) * opt->n);
    }
    opt->t++;
    adamw_step_cuda(g->router_mem, g->rgrads_mem, g->adam_m, g->adam_v, opt->n, lr, opt->beta1,
                    opt->beta2, opt->eps, opt->weight_decay, opt->t, (float)(k / accum));
    cuda_download(m->router_mem, g->router_mem, sizeof(float) * opt->n);
}

static void cuda_adamw_sync(Model* m, AdamW* opt) {
    struct CudaModel* g = G(m);
    if (!g || !g->adam_m) return;
    cuda_download(opt->m, g->adam_m, sizeof(float) * opt->n);
    cuda_download(opt->v, g->adam_v, sizeof(float) * opt->n);
}

const ModelBackend model_cuda_backend = {.name = "cuda",
                                         .attach = cuda_attach,
                                         .forward = cuda_forward,
                                         .backward = cuda_backward,
                                         .zero_grad = cuda_zero_grad,
                                         .teacher = cuda_teacher,
                                         .attn_objective = cuda_attn_objective,
                                         .pull = cuda_pull,
                                         .push_router = cuda_push_router,
                                         .grad_norm = cuda_grad_norm,
                                         .adamw = cuda_adamw,
                                         .adamw_sync = cuda_adamw_sync,
                                         .release = cuda_release};
