/* adamw.h: AdamW with warmup + cosine learning-rate schedule and global-norm clipping. */
#ifndef FOCUS_ADAMW_H
#define FOCUS_ADAMW_H

#include "common.h"

typedef struct {
    size_t n;
    float* m; /* (n) first moment */
    float* v; /* (n) second moment */
    long t;   /* updates done */
    float beta1, beta2, eps, weight_decay;
} AdamW;

void adamw_init(AdamW* o, size_t n, float beta1, float beta2, float eps, float weight_decay);
void adamw_free(AdamW* o);
/* One update of params (n) with grads (n) at learning rate lr. */
void adamw_step(AdamW* o, real* params, const real* grads, float lr);

/* Linear warmup over `warmup` steps, then cosine decay to min_frac * lr at `total`. */
float lr_schedule(long step, long warmup, long total, float lr, float min_frac);

/* Global L2 norm of grads; grad_clip scales them by max_norm / norm when norm > max_norm > 0. */
double grad_norm(const real* grads, size_t n);
void grad_clip(real* grads, size_t n, double norm, double max_norm);
/* Scale grads so their global L2 norm is at most max_norm (if > 0); returns the norm before. */
double clip_grad_norm(real* grads, size_t n, double max_norm);

#endif
