/* decode.c: one-token forward passes over a group-organised KV cache (see decode.h). */
#include "decode.h"

#include <math.h>
#include <string.h>

#include "../kernels/cpu.h"

static int qkvw(const ModelConfig* c) { return (c->NH + 2 * c->NKV) * (c->C / c->NH); }

void kvcache_init(KVCache* c, const Model* m, int cap) {
    const ModelConfig* mc = &m->cfg;
    int hs = mc->C / mc->NH, K = m->fc.K;
    memset(c, 0, sizeof(*c));
    c->cap = cap;
    size_t kv = (size_t)mc->L * cap * mc->NKV * hs;
    c->k = mallocCheck(sizeof(real) * kv);
    c->v = mallocCheck(sizeof(real) * kv);
    c->mask = mallocCheck(sizeof(uint32_t) * (size_t)mc->L * cap);
    c->gpos = mallocCheck(sizeof(int) * (size_t)mc->L * K * cap);
    c->gn = callocCheck((size_t)mc->L * K, sizeof(int));
    c->keys = mallocCheck(sizeof(int) * cap);
    size_t FC = mc->arch == ARCH_LLAMA ? 2 * (size_t)mc->F : (size_t)mc->F;
    c->scratch = mallocCheck(sizeof(real) * (6 * (size_t)mc->C + qkvw(mc) + FC + mc->F + m->fc.dg +
                                             2 * m->fc.K + 8 + (size_t)mc->NH * cap));
}

void kvcache_free(KVCache* c) {
    free(c->k), free(c->v), free(c->mask), free(c->gpos), free(c->gn), free(c->keys),
        free(c->scratch);
    memset(c, 0, sizeof(*c));
}

static void norm1(const Model* m, real* out, const real* x, const real* w, const real* b) {
    real mean, rstd;
    if (m->cfg.arch == ARCH_GPT2)
        layernorm_forward(out, &mean, &rstd, x, w, b, 1, m->cfg.C, m->cfg.eps);
    else
        rmsnorm_forward(out, &rstd, x, w, 1, m->cfg.C, m->cfg.eps);
}

/* y (out) = W x (in) + b: from the file's blocks when the model has native weights (nw), else
 * the fp32 parameters w. */
static void project(real* y, const real* x, const real* w, const real* b, int in, int out,
                    const QMatrix* nw) {
#ifndef FOCUS_DOUBLE
    if (nw) {
        qmatvec(y, nw, x, b);
        return;
    }
#endif
    (void)nw;
    matmul_forward(y, x, w, b, 1, in, out);
}

void model_decode_step(Model* m, KVCache* c, int token, real* logits) {
    const ModelConfig* mc = &m->cfg;
    const FocusConfig* f = &m->fc;
    const Params* p = &m->params;
    const int C = mc->C, NH = mc->NH, NKV = mc->NKV, hs = C / NH, Q = qkvw(mc), K = f->K,
              rep = NH / NKV;
    const int FC = mc->arch == ARCH_LLAMA ? 2 * mc->F : mc->F, kvw = NKV * hs;
    const int hard = f->attn == ATTN_HARD;
    if (f->attn == ATTN_SOFT)
        fatal("generation runs dense or hard top-k attention, not the soft gate");
    if (hard && f->routing != ROUTE_CAUSAL)
        fatal("generation needs causal routing (got %s)", routing_name(f->routing));
    if (token < 0 || token >= mc->V)
        fatal("token id %d outside the vocabulary (V=%d)", token, mc->V);
    if (c->n >= c->cap) fatal("KV cache full (%d tokens)", c->cap);
    if (mc->arch == ARCH_GPT2 && c->n >= mc->maxT)
        fatal("position %d exceeds the model's context (%d)", c->n, mc->maxT);
    const int n = c->n; /* this token's position */
    real* x = c->scratch;
    real* h = x + C;
    real* att = h + C;
    real* tmp = att + C;
    real* qkv = tmp + C;
    real* fch = qkv + Q;
    real* act = fch + FC;
    real* proj = act + mc->F;
    real* S = proj + f->dg;
    real* G = S + K;
    real* sc = G + K + 8; /* scores over cached keys: (NH, cap) */
#ifndef FOCUS_DOUBLE
    if (m->native) {
        qrow(x, m->native + (size_t)mc->L * NATIVE_PER_LAYER + 1, token);
    } else
#endif
    {
        for (int e = 0; e < C; e++)
            x[e] = p->wte[(size_t)token * C + e] + (p->wpe ? p->wpe[(size_t)n * C + e] : 0);
    }
    for (int l = 0; l < mc->L; l++) {
        size_t lC = (size_t)l * C;
        norm1(m, h, x, p->ln1w + lC, p->ln1b ? p->ln1b + lC : NULL);
        const QMatrix* nw = m->native ? m->native + (size_t)l * NATIVE_PER_LAYER : NULL;
        if (nw) { /* q, k and v are three matrices in the file, one (Q, C) here */
            const real* qb = p->qkvb ? p->qkvb + (size_t)l * Q : NULL;
            project(qkv, h, NULL, qb, C, C, nw + NATIVE_Q);
            project(qkv + C, h, NULL, qb ? qb + C : NULL, C, kvw, nw + NATIVE_K);
            project(qkv + C + kvw, h, NULL, qb ? qb + C + kvw : NULL, C, kvw, nw + NATIVE_V);
        } else {
            matmul_forward(qkv, h, p->qkvw + (size_t)l * Q * C,
                           p->qkvb ? p->qkvb + (size_t)l * Q : NULL, 1, C, Q);
        }
        if (mc->arch == ARCH_LLAMA) rope_forward(qkv, 1, 1, NH, NKV, hs, mc->rope_theta, n);
        real* kc = c->k + ((size_t)l * c->cap) * kvw;
        real* vc = c->v + ((size_t)l * c->cap) * kvw;
        memcpy(kc + (size_t)n * kvw, qkv + C, sizeof(real) * kvw);
        memcpy(vc + (size_t)n * kvw, qkv + C + kvw, sizeof(real) * kvw);
        uint32_t* cm = c->mask + (size_t)l * c->cap;
        int* gn = c->gn + (size_t)l * K;
        int* gpos = c->gpos + (size_t)l * K * c->cap;
        uint32_t mi = 0;
        const int routed = hard && !focus_layer_dense(f, l);
        if (routed) {
            router_scores_forward(proj, S, h, m->router.wg + lC * f->dg,
                                  m->router.cent + (size_t)l * K * f->dg, 1, C, f->dg, K);
            routing_forward(G, NULL, S, m->beta + (size_t)l * K, ROUTE_CAUSAL, 1, 1, K, f->tau,
                            f->iters);
            /* a sink position (n < sinks) joins every group, so every later query keeps it */
            routing_topk_mask(&mi, G, 1, 1, K, f->topk, f->topp, f->sinks, n);
            cm[n] = mi;
            for (int g = 0; g < K; g++)
                if ((mi >> g) & 1) gpos[(size_t)g * c->cap + gn[g]++] = n;
        }
        /* The keys this token attends to: (hard) its groups' earlier tokens before the window,
         * each taken in the lowest group it shares, then the window (everything when dense). */
        int lo = routed ? (n - f->w < 0 ? 0 : n - f->w) : 0, nk = 0;
        if (routed) {
            for (int g = 0; g < K; g++) {
                if (!((mi >> g) & 1)) continue;
                const int* gp = gpos + (size_t)g * c->cap;
                for (int t = 0; t < gn[g] && gp[t] < lo; t++)
                    if (!(cm[gp[t]] & mi & ((1u << g) - 1))) c->keys[nk++] = gp[t];
            }
        }
        for (int j = lo; j <= n; j++) c->keys[nk++] = j;
        c->pairs += (long)nk * NH;
        const real scale = (real)(1.0 / sqrt((double)hs));
        /* heads in parallel, each with its own score row; the sums may run in any order */
#pragma omp parallel for schedule(static) if (nk >= 256)
        for (int hh = 0; hh < NH; hh++) {
            const real* q = qkv + hh * hs;
            const int kvh = hh / rep;
            real* sh = sc + (size_t)hh * c->cap;
            real mx = -INFINITY;
            for (int t = 0; t < nk; t++) {
                const real* kj = kc + (size_t)c->keys[t] * kvw + kvh * hs;
                real s = 0;
#pragma omp simd reduction(+ : s)
                for (int e = 0; e < hs; e++) s += q[e] * kj[e];
                sh[t] = s * scale;
                mx = sh[t] > mx ? sh[t] : mx;
            }
            real sum = 0;
            real* o = att + hh * hs;
            for (int e = 0; e < hs; e++) o[e] = 0;
            for (int t = 0; t < nk; t++) {
                const real pj = (real)exp(sh[t] - mx);
                sum += pj;
                const real* vj = vc + (size_t)c->keys[t] * kvw + kvh * hs;
#pragma omp simd
                for (int e = 0; e < hs; e++) o[e] += pj * vj[e];
            }
            for (int e = 0; e < hs; e++) o[e] = o[e] / sum;
        }
        project(tmp, att, p->attprojw + (size_t)l * C * C, p->attprojb ? p->attprojb + lC : NULL, C,
                C, nw ? nw + NATIVE_O : NULL);
        for (int e = 0; e < C; e++) x[e] += tmp[e];
        norm1(m, h, x, p->ln2w + lC, p->ln2b ? p->ln2b + lC : NULL);
        if (nw) { /* gate rows then up rows, as fcw holds them */
            project(fch, h, NULL, NULL, C, mc->F, nw + NATIVE_GATE);
            project(fch + mc->F, h, NULL, NULL, C, mc->F, nw + NATIVE_UP);
        } else {
            matmul_forward(fch, h, p->fcw + (size_t)l * FC * C,
                           p->fcb ? p->fcb + (size_t)l * FC : NULL, 1, C, FC);
        }
        if (mc->arch == ARCH_GPT2)
            gelu_forward(act, fch, mc->F);
        else
            swiglu_forward(act, fch, 1, mc->F);
        project(tmp, act, p->fcprojw + (size_t)l * C * mc->F, p->fcprojb ? p->fcprojb + lC : NULL,
                mc->F, C, nw ? nw + NATIVE_DOWN : NULL);
        for (int e = 0; e < C; e++) x[e] += tmp[e];
    }
    norm1(m, h, x, p->lnfw, p->lnfb);
    project(logits, h, mc->tied ? p->wte : p->lmhead, NULL, C, mc->V,
            m->native ? m->native + (size_t)mc->L * NATIVE_PER_LAYER : NULL);
    c->n++;
}
