/* adamw.c: AdamW, the learning-rate schedule and gradient clipping (see adamw.h). */
#include "adamw.h"

#include <math.h>
#include <string.h>

void adamw_init(AdamW* o, size_t n, float beta1, float beta2, float eps, float weight_decay) {
    o->n = n;
    o->m = callocCheck(n, sizeof(float));
    o->v = callocCheck(n, sizeof(float));
    o->t = 0;
    o->beta1 = beta1;
    o->beta2 = beta2;
    o->eps = eps;
    o->weight_decay = weight_decay;
}

void adamw_free(AdamW* o) {
    free(o->m);
    free(o->v);
    memset(o, 0, sizeof(*o));
}

void adamw_step(AdamW* o, real* params, const real* grads, float lr) {
    o->t++;
    double c1 = 1.0 - pow(o->beta1, (double)o->t), c2 = 1.0 - pow(o->beta2, (double)o->t);
    for (size_t i = 0; i < o->n; i++) {
        float g = (float)grads[i];
        o->m[i] = o->beta1 * o->m[i] + (1 - o->beta1) * g;
        o->v[i] = o->beta2 * o->v[i] + (1 - o->beta2) * g * g;
        double mh = o->m[i] / c1, vh = o->v[i] / c2;
        params[i] -= (real)(lr * (mh / (sqrt(vh) + o->eps) + o->weight_decay * params[i]));
    }
}

float lr_schedule(long step, long warmup, long total, float lr, float min_frac) {
    if (warmup > 0 && step < warmup) return lr * (float)(step + 1) / (float)warmup;
    if (total <= warmup) return lr;
    double p = (double)(step - warmup) / (double)(total - warmup);
    if (p > 1) p = 1;
    double c = 0.5 * (1 + cos(3.141592653589793 * p));
    return (float)(lr * (min_frac + (1 - min_frac) * c));
}

double grad_norm(const real* grads, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)grads[i] * grads[i];
    return sqrt(s);
}

void grad_clip(real* grads, size_t n, double norm, double max_norm) {
    if (max_norm > 0 && norm > max_norm) {
        real k = (real)(max_norm / (norm + 1e-12));
        for (size_t i = 0; i < n; i++) grads[i] *= k;
    }
}

double clip_grad_norm(real* grads, size_t n, double max_norm) {
    double norm = grad_norm(grads, n);
    grad_clip(grads, n, norm, max_norm);
    return norm;
}
