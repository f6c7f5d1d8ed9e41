/* cuda.h: the GPU kernels of the engine, callable from C. Every function mirrors the CPU kernel
 * of the same name (kernels/cpu.h, kernels/attention.h, kernels/sparse.h, model/router.h) with a
 * `_cuda` suffix, the same argument order and the same conventions (backward passes accumulate
 * into input gradients; a NULL weight gradient means frozen). All pointers are device pointers
 * and all tensors are float; work is queued on one stream (the default stream) and functions
 * return without waiting unless they say otherwise.
 *
 * GEMMs go through cuBLAS in TF32 with fp32 accumulation (cuda_set_tf32(0) asks for full fp32,
 * which the tests use to compare with the CPU path at float round-off). Attention is flash-style:
 * each row's log-sum-exp is kept and no T x T buffer is ever formed. Tested against the CPU
 * functions by tests/test_cuda.c. */
#ifndef FOCUS_CUDA_H
#define FOCUS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "../attention.h"
#include "../router.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- runtime ---- */
/* 1 if a CUDA device is usable (without printing anything), else 0. */
int cuda_available(void);
/* Select device 0, create the cuBLAS handle; fatal() with the driver's message on failure.
 * Prints one line naming the device unless quiet. */
void cuda_init(int quiet);
void cuda_set_tf32(int on);
void* cuda_malloc(size_t bytes); /* fatal() naming the size when memory runs out */
void cuda_free(void* p);
void cuda_upload(void* dst, const void* src, size_t bytes);
void cuda_download(void* dst, const void* src, size_t bytes);
void cuda_memset0(void* p, size_t bytes);
void cuda_copy(void* dst, const void* src, size_t bytes); /* device to device, queued */
void cuda_sync(void); /* waits for the device; fatal() if a kernel failed */
const char* cuda_device_name(void);
/* Phase timing (FOCUS_PROFILE=1 in the environment, else every call returns at once): a mark
 * records an event on the stream and names the work queued until the next mark; the report waits
 * for the device, prints the time per name (largest first) to stdout and starts over. Names are
 * string literals (compared by content); a NULL title starts over without printing. */
int cuda_prof_enabled(void);
void cuda_prof_mark(const char* name);
void cuda_prof_report(const char* title);

/* ---- dense layers (kernels/cpu.h) ---- */
void gemm_cuda(int ta, int tb, int M, int N, int K, float alpha, const float* A, int lda,
               const float* B, int ldb, float beta, float* C, int ldc);
void matmul_forward_cuda(float* out, const float* inp, const float* weight, const float* bias,
                         size_t N, int IC, int OC);
void matmul_backward_cuda(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, size_t N, int IC, int OC);
void layernorm_forward_cuda(float* out, float* mean, float* rstd, const float* inp,
                            const float* weight, const float* bias, size_t N, int C, float eps);
void layernorm_backward_cuda(float* dinp, float* dweight, float* dbias, const float* dout,
                             const float* inp, const float* weight, const float* mean,
                             const float* rstd, size_t N, int C);
void rmsnorm_forward_cuda(float* out, float* rstd, const float* inp, const float* weight, size_t N,
                          int C, float eps);
void rmsnorm_backward_cuda(float* dinp, float* dweight, const float* dout, const float* inp,
                           const float* weight, const float* rstd, size_t N, int C);
void rope_forward_cuda(float* qkv, int B, int T, int NH, int NKV, int hs, float theta, int pos0);
void rope_backward_cuda(float* dqkv, int B, int T, int NH, int NKV, int hs, float theta, int pos0);
void gelu_forward_cuda(float* out, const float* inp, size_t n);
void gelu_backward_cuda(float* dinp, const float* inp, const float* dout, size_t n);
void swiglu_forward_cuda(float* out, const float* inp, size_t N, int F);
void swiglu_backward_cuda(float* dinp, const float* inp, const float* dout, size_t N, int F);
void encoder_forward_cuda(float* out, const int* tokens, const float* wte, const float* wpe, int B,
                          int T, int C);
void crossentropy_forward_cuda(float* losses, const float* logits, const int* targets, size_t N,
                               int V);
void crossentropy_backward_cuda(float* dlogits, float* losses, const float* logits,
                                const int* targets, size_t N, int V, float dscale);
/* ---- objectives that target the dense model (kernels/cpu.h, kernels/attention.h) ---- */
void teacher_probs_forward_cuda(float* x, float* negent, size_t N, int V);
void kl_forward_cuda(float* losses, const float* logits, const float* p, const float* negent,
                     const int* targets, size_t N, int V);
void kl_backward_cuda(float* dlogits, float* losses, const float* logits, const float* p,
                      const float* negent, const int* targets, size_t N, int V, float dscale);
/* scratch: B * T * NH * K floats (per-head sums, added in head order). */
void attention_group_mass_cuda(float* mass, const float* qkv, const float* lse, const float* G,
                               int K, int w, int sinks, int B, int T, int NH, int NKV, int hs,
                               float* scratch);
/* model_attn_objective's arithmetic for one layer (n = B T K entries): dG = -weight * norm * t / G,
 * returns -norm * sum t log G (waits for the device). */
double attn_objective_cuda(float* dG, const float* t, const float* G, size_t n, double norm,
                           float weight);

/* y += x (n elements) */
void residual_add_cuda(float* y, const float* x, size_t n);
/* x *= s (n elements) */
void scale_cuda(float* x, float s, size_t n);
/* sum of squares of x (n elements), computed in double; waits for the device. */
double sumsq_cuda(const float* x, size_t n);

/* ---- router (model/router.h) ---- */
void router_scores_forward_cuda(float* proj, float* S, const float* h, const float* wg,
                                const float* cent, size_t N, int C, int dg, int K);
void router_scores_backward_cuda(float* dh, float* dwg, float* dcent, float* dproj, const float* dS,
                                 const float* h, const float* proj, const float* wg,
                                 const float* cent, size_t N, int C, int dg, int K);
/* scratch: routing_scratch_floats(B, T, K, iters) floats (the Sinkhorn iterates the backward
 * pass replays; the forward pass uses none). */
size_t routing_scratch_floats(int B, int T, int K, int iters);
void routing_forward_cuda(float* G, float* colofs, const float* S, const float* beta, Routing mode,
                          int B, int T, int K, float tau, int iters);
void routing_backward_cuda(float* dS, const float* dG, const float* S, const float* G,
                           const float* beta, Routing mode, int B, int T, int K, float tau,
                           int iters, float* scratch);
void routing_topk_mask_cuda(uint32_t* mask, const float* G, int B, int T, int K, int topk,
                            float topp, int sinks, int pos0);

/* ---- attention (kernels/attention.h); gate->G and gate->mask are device pointers ---- */
void attention_forward_cuda(float* out, float* lse, const float* qkv, const AttnGate* gate, int B,
                            int T, int NH, int NKV, int hs);
/* scratch: B * NH * T floats. dgate (2 floats on the device) may be NULL. */
void attention_backward_cuda(float* dqkv, float* dG, float* dgate, const float* dout,
                             const float* qkv, const float* out, const float* lse,
                             const AttnGate* gate, int B, int T, int NH, int NKV, int hs,
                             float* scratch);

/* The same attention on bf16 tensor cores (attention_mma.cu: operands rounded to bf16, fp32
 * accumulation), for head size 64 and K <= 8 groups (attention_mma_applies). The model trains
 * with them by default (FOCUS_ATTN_MMA=0 in the environment, or cuda_set_attention_mma(0), keeps
 * the fp32 kernels); evaluation always uses the fp32 kernels, so that perplexities match the CPU.
 */
void cuda_set_attention_mma(int on);
int attention_mma_applies(const AttnGate* gate, int hs);
void attention_forward_mma_cuda(float* out, float* lse, const float* qkv, const AttnGate* gate,
                                int B, int T, int NH, int NKV);
void attention_backward_mma_cuda(float* dqkv, float* dG, float* dgate, const float* dout,
                                 const float* qkv, const float* out, const float* lse,
                                 const AttnGate* gate, int B, int T, int NH, int NKV,
                                 float* scratch);

/* ---- the hard top-k executor (kernels/sparse.h) ---- */
typedef struct HardPlan HardPlan; /* device buffers of the group sort, reused across calls */
HardPlan* hard_plan_create(void);
void hard_plan_free(HardPlan* p);
/* fp32 executor: equals attention_hard_forward (and GATE_HARD attention) to float round-off. */
void attention_hard_forward_cuda(HardPlan* plan, float* out, float* lse, const float* qkv,
                                 const uint32_t* mask, int K, int w, int B, int T, int NH, int NKV,
                                 int hs);

/* bf16 tensor-core kernels (head size 64) for inference and benchmarks: qkv is bf16 (as
 * uint16_t bits), out is fp32 (B, T, NH*64), lse (B, NH, T). */
void attention_flash_forward_bf16_cuda(float* out, float* lse, const uint16_t* qkv, int B, int T,
                                       int NH, int NKV, int hs);
void attention_hard_forward_bf16_cuda(HardPlan* plan, float* out, float* lse, const uint16_t* qkv,
                                      const uint32_t* mask, int K, int w, int B, int T, int NH,
                                      int NKV, int hs);
void float_to_bf16_cuda(uint16_t* dst, const float* src, size_t n);

/* ---- benchmark inputs ---- */
/* x[i] ~ N(0, 1) as bf16, from a counter-based hash of (seed, i): reproducible, no host copy. */
void cuda_fill_normal_bf16(uint16_t* x, size_t n, uint64_t seed);
/* mask[i]: topk distinct groups of K drawn uniformly (synthetic balanced routing). */
void cuda_random_masks(uint32_t* mask, size_t n, int K, int topk, uint64_t seed);

/* ---- optimizer (kernels/adamw.h) ---- */
/* One AdamW update on the device; grads are multiplied by grad_scale first (clipping). t is the
 * update count after this step (bias correction). */
void adamw_step_cuda(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                     float beta1, float beta2, float eps, float weight_decay, long t,
                     float grad_scale);

#ifdef __cplusplus
}
#endif

#endif
