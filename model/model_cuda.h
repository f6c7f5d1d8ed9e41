/* model_cuda.h: the model on one GPU (built when FOCUS_CUDA is defined).
 *
 * model_to_cuda copies a loaded model's weights, router and beta to the device; from then on
 * model_forward / model_backward / model_zero_grad / model_update_beta (model.h) run there,
 * through kernels/cuda, with the same buffers and layer order as the CPU code (model_cuda.c
 * mirrors model.c). What callers read on the host stays valid: losses and mean_loss after a
 * forward pass, router gradients after a backward pass, group distributions through
 * model_groups. Logits stay on the device. Only router training (GRAD_ROUTER) runs on the GPU;
 * training a backbone from scratch stays on the CPU. Tested by tests/test_cuda.c. */
#ifndef FOCUS_MODEL_CUDA_H
#define FOCUS_MODEL_CUDA_H

#include "../kernels/adamw.h"
#include "model.h"

/* Move m to the GPU (cuda_init first). Host weights stay as they are. */
void model_to_cuda(Model* m);
void model_cuda_free(Model* m);
void model_cuda_forward(Model* m, const int* inputs, const int* targets, int B, int T, int keep);
void model_cuda_backward(Model* m, GradMode mode);
void model_cuda_zero_grad(Model* m, GradMode mode);
/* Host -> device after the host router parameters or beta changed (loading a checkpoint). */
void model_cuda_upload_router(Model* m);
/* Device -> host copies of the last forward pass's group distributions / Sinkhorn offsets. */
void model_cuda_sync_groups(const Model* m);
void model_cuda_sync_colofs(Model* m);
void model_cuda_sync_scores(Model* m); /* router scores of every kept layer */
/* Sum of squares of the router gradients on the device (for the global-norm clip). */
double model_cuda_grad_sumsq(Model* m, size_t n);
/* AdamW on the first opt->n router parameters with the device gradients times grad_scale; the
 * moments live on the device (uploaded from opt on first use) and the updated parameters are
 * copied back to m->router_mem. */
void model_cuda_adamw(Model* m, AdamW* opt, float lr, float grad_scale);
/* After a dense teacher pass on the device (model_teacher_forward): the teacher's log-probabilities
 * (want_logp) and the per-layer group mass (want_mass) on the device. */
void model_cuda_teacher(Model* m, int want_logp, int want_mass);
double model_cuda_attn_objective(Model* m, float weight, int backward);
/* Copy the device moments into opt (before a checkpoint is written). */
void model_cuda_adamw_download(Model* m, AdamW* opt);

#endif
