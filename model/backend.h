/* backend.h: the one seam between the model and the hardware it runs on. For model/ only.
 *
 * model.c owns what does not depend on the device: the host parameters and router, the calls of
 * model.h and their argument checks, and the causal routing bias beta (fitted on the host from
 * the router scores). A backend owns the passes over activations:
 *   model_cpu.c   the reference: plain C over kernels/, what a reader follows with METHOD.md
 *   model_cuda.c  the same passes over kernels/cuda with device copies of weights and activations
 * A model starts on the CPU backend (model_build); model_place switches it once (device.c).
 * Both backends walk the same layers in the same order over the same activation layout
 * (ActSizes, model_layer_acts) and pick the attention kernel of each mode the same way
 * (model_attn_kernel). */
#ifndef FOCUS_BACKEND_H
#define FOCUS_BACKEND_H

#include "model.h"

/* Host copies a backend keeps current on request (the CPU's are the activations themselves). */
typedef enum { PULL_GROUPS = 0, PULL_SCORES = 1, PULL_OFFSETS = 2 } ModelPull;

typedef struct ModelBackend {
    const char* name;
    /* copy a host model to the device (model_place); NULL for the CPU */
    void (*attach)(Model* m);
    /* the passes of model.h, after model.c checked their arguments */
    void (*forward)(Model* m, const int* inputs, const int* targets, int B, int T, int keep);
    void (*backward)(Model* m, GradMode mode);
    void (*zero_grad)(Model* m, GradMode mode);
    /* after the dense pass of model_teacher_forward: keep the teacher's signals */
    void (*teacher)(Model* m, int want_logp, int want_mass);
    double (*attn_objective)(Model* m, real weight, int backward);
    /* make the host copy of acts.rG, acts.rS or acts.colofs current */
    void (*pull)(const Model* m, ModelPull what);
    /* the host router parameters or beta changed: copy them to the device */
    void (*push_router)(Model* m);
    /* the router update (model_router_grad_norm, model_router_adamw, model_router_adamw_sync) */
    double (*grad_norm)(Model* m, size_t n, int accum);
    void (*adamw)(Model* m, AdamW* opt, float lr, double gnorm, float clip, int accum);
    void (*adamw_sync)(Model* m, AdamW* opt);
    /* free the device state (model_free) */
    void (*release)(Model* m);
} ModelBackend;

extern const ModelBackend model_cpu_backend;
/* The backend for a device name ("cpu", "cuda"), or NULL with *why saying what is missing. */
const ModelBackend* model_find_backend(const char* device, const char** why);

/* Sizes of the activation tensors for (B, T, keep), by name or as the array carve() takes. */
typedef union {
    size_t n[NUM_ACT_TENSORS];
    struct {
        size_t encoded, ln1, ln1_mean, ln1_rstd, qkv, att, lse, res2, ln2, ln2_mean, ln2_rstd, fch,
            fch_act, res3, rproj, rS, rG, colofs, lnf, lnf_stat, logits, qkpre, qkrstd, attp,
            attp_rstd, mlpp, mlpp_rstd;
    };
} ActSizes;
ActSizes model_act_sizes(const ModelConfig* c, const FocusConfig* f, int B, int T, int keep);
/* Carve mem into n consecutive tensors of the given sizes; size 0 gives NULL. */
void model_carve(real** ptrs, real* mem, const size_t* sizes, int n);
size_t model_sum_sizes(const size_t* s, int n);
/* Reals of the backward pass's scratch for BT rows: dres (BT, C), dbuf (BT, max(C, NH hs));
 * dqkv (BT, QKV); dfch (BT, FC); dact (BT, F); dG, dS (BT, K); dproj (BT, dg); with sandwich
 * norms (gemma3) dpost (BT, C). */
size_t model_backward_scratch(const ModelConfig* c, const FocusConfig* f, size_t BT);
/* (Re)allocates a model's per-call host buffers for (B, T, keep): inputs, targets, losses; frees
 * acts_mem and rmask (NULL afterwards) for the backend to allocate as it needs. */
void model_host_buffers(Model* m, int B, int T, int keep);

/* Pointers to layer l's slice of activations a (slot 0 when not keeping). */
typedef struct {
    real *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *lse, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch,
        *fch_act, *res3, *rproj, *rS, *rG, *colofs;
    uint32_t* mask;  /* the tokens' group masks (as keys, with a query projection) */
    uint32_t* qmask; /* as queries: mask itself unless the router has a query projection */
    real *qkpre, *qkrstd, *attp, *attp_rstd, *mlpp, *mlpp_rstd; /* gemma3, else NULL */
} LayerActs;
LayerActs model_layer_acts(const Model* m, const Acts* a, uint32_t* rmask, int l);
/* Layer l's attention gate for the current attention mode: groups and masks from a (host or
 * device pointers, as a holds), lambda and b from the host router. */
AttnGate model_layer_gate(const Model* m, int l, const LayerActs* a);

/* The attn objective's normalisation 1 / (L' B T NH) over the L' routed layers (model.h), 0 when
 * every layer is dense. */
double model_attn_objective_norm(const Model* m);

/* Layer l's slice of a tensor stacked over layers of n elements, or NULL for an absent tensor
 * (a bias the architecture does not have, a frozen weight's gradient). */
static inline real* model_slice(const real* t, int l, size_t n) {
    return t ? (real*)t + (size_t)l * n : NULL;
}

/* Which attention kernel (AttnKernel, model.h) a layer in mode `mode` runs over whole sequences,
 * the same choice on every backend: its method's row says, for a pass kept for a backward (keep)
 * or not. */
static inline AttnKernel model_attn_kernel(AttnMode mode, int keep) {
    return keep ? attn_methods[mode]->kernel_train : attn_methods[mode]->kernel;
}

/* What model.c, params.c and router_params.c share: the parameter tensors' sizes for shape c
 * (model_params order), the router's buffers (re)allocated and initialised for m->fc, and the
 * file's native blocks given back (m has none afterwards). */
void model_param_sizes(size_t* s, const ModelConfig* c);
void model_alloc_router(Model* m);
void model_release_native(Model* m);

#endif
