/* model.c: the transformer forward and backward passes with the Focus router.
 *
 * A layer, pre-norm in both families:
 *   h    = norm1(x)                       LayerNorm (gpt2) or RMSNorm (llama)
 *   qkv  = h Wqkv^T (+ b), RoPE on q, k   (llama)
 *   G    = routing((h W_g) C^T)           the router reads the same h (METHOD.md section 2)
 *   att  = attention(qkv, gate(G))        local window untouched, distant pairs gated
 *   x2   = x + att Wo^T (+ b)
 *   y    = x2 + mlp(norm2(x2))            GELU (gpt2) or SwiGLU (llama)
 * The backward pass runs the same steps in reverse; frozen weights get no gradient
 * (NULL weight-gradient pointers), so in GRAD_ROUTER mode only input gradients flow. */
#include "model.h"

#ifdef FOCUS_CUDA
#include "model_cuda.h"
#endif

#include <math.h>
#include <string.h>
#include <strings.h>

#include "../kernels/cpu.h"
#include "../kernels/sparse.h"

static int qkv_width(const ModelConfig* c) { return (c->NH + 2 * c->NKV) * (c->C / c->NH); }
static int fc_width(const ModelConfig* c) { return c->arch == ARCH_LLAMA ? 2 * c->F : c->F; }
int model_qkv_width(const ModelConfig* c) { return qkv_width(c); }
int model_fc_width(const ModelConfig* c) { return fc_width(c); }

int model_config_preset(const char* name, ModelConfig* c) {
    memset(c, 0, sizeof(*c));
    c->eps = 1e-5f;
    c->rope_theta = 10000.0f;
    c->tied = 1;
    if (!strcmp(name, "gpt2-124m")) {
        *c = (ModelConfig){ARCH_GPT2, 12, 768, 12, 12, 3072, 50257, 1024, 1e-5f, 0, 0, 1};
    } else if (!strcmp(name, "smollm2-135m")) {
        *c = (ModelConfig){ARCH_LLAMA, 30, 576, 9, 3, 1536, 49152, 8192, 1e-5f, 100000.0f, 0, 1};
    } else if (!strcmp(name, "tiny-gpt2")) {
        *c = (ModelConfig){ARCH_GPT2, 2, 32, 4, 4, 128, 64, 64, 1e-5f, 0, 0, 1};
    } else if (!strcmp(name, "tiny-llama")) {
        *c = (ModelConfig){ARCH_LLAMA, 2, 32, 4, 2, 96, 64, 64, 1e-5f, 10000.0f, 0, 0};
    } else {
        return -1;
    }
    return 0;
}

void focus_config_default(FocusConfig* fc) {
    *fc = (FocusConfig){.attn = ATTN_SOFT,
                        .routing = ROUTE_SINKHORN,
                        .K = 8,
                        .dg = 16,
                        .iters = 10,
                        .w = 128,
                        .topk = 1,
                        .tau = 0.1f,
                        .lambda = 10.0f,
                        .bias = 0.5f,
                        .beta_momentum = 0.9f,
                        .learn_gate = 0,
                        /* project choice (METHOD.md section 9): beta balances causal routing
                         * itself; the paper's EMA of Sinkhorn offsets (beta_balance = 0,
                         * beta_momentum = 0.99) left one group with 40 % of a layer's tokens */
                        .beta_balance = 1,
                        /* project choice (METHOD.md section 9): 4 sinks, as StreamingLLM; on
                         * SmolLM2 one sink took hard k=1 from 35.3 to 21.0 (dense 20.3), 4 to
                         * 20.96 (docs/RESULTS.md) */
                        .sinks = 4,
                        .seed = 1234};
}

static int parse_int(const char* v, int* out) {
    char* end;
    long x = strtol(v, &end, 10);
    if (end == v || *end) return -2;
    *out = (int)x;
    return 0;
}

static int parse_float(const char* v, float* out) {
    char* end;
    double x = strtod(v, &end);
    if (end == v || *end || !isfinite(x)) return -2;
    *out = (float)x;
    return 0;
}

int config_set(ModelConfig* c, FocusConfig* f, const char* key, const char* v) {
    struct {
        const char* name;
        int* i;
        float* x;
    } keys[] = {
        {"L", &c->L, 0},
        {"C", &c->C, 0},
        {"NH", &c->NH, 0},
        {"NKV", &c->NKV, 0},
        {"F", &c->F, 0},
        {"V", &c->V, 0},
        {"maxT", &c->maxT, 0},
        {"eps", 0, &c->eps},
        {"rope_theta", 0, &c->rope_theta},
        {"qkv_bias", &c->qkv_bias, 0},
        {"tied", &c->tied, 0},
        {"K", &f->K, 0},
        {"dg", &f->dg, 0},
        {"iters", &f->iters, 0},
        {"w", &f->w, 0},
        {"tau", 0, &f->tau},
        {"lambda", 0, &f->lambda},
        {"b", 0, &f->bias},
        {"beta_momentum", 0, &f->beta_momentum},
        {"beta_balance", &f->beta_balance, 0},
        {"learn_gate", &f->learn_gate, 0},
        {"sinks", &f->sinks, 0},
    };
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        if (strcmp(key, keys[i].name)) continue;
        return keys[i].i ? parse_int(v, keys[i].i) : parse_float(v, keys[i].x);
    }
    if (!strcmp(key, "arch")) {
        if (!strcmp(v, "gpt2"))
            c->arch = ARCH_GPT2;
        else if (!strcmp(v, "llama"))
            c->arch = ARCH_LLAMA;
        else
            return -2;
        return 0;
    }
    if (!strcmp(key, "routing")) return routing_parse(v, &f->routing) ? -2 : 0;
    if (!strcmp(key, "topk")) {
        /* "2": a fixed budget; "p0.9": groups until 90 % of G_i; "p0.9:2": the same, at most 2 */
        if (v[0] != 'p') {
            f->topp = 0;
            return parse_int(v, &f->topk);
        }
        char* end;
        double p = strtod(v + 1, &end);
        if (end == v + 1 || !(p > 0 && p <= 1)) return -2;
        int cap = 0;
        if (*end == ':') {
            if (parse_int(end + 1, &cap) || cap < 1) return -2;
        } else if (*end) {
            return -2;
        }
        f->topp = (float)p;
        f->topk = cap;
        return 0;
    }
    if (!strcmp(key, "dense_layers")) {
        /* "none", or layer indices and ranges: "0,1,28-29" */
        memset(f->dense_layers, 0, sizeof f->dense_layers);
        if (!strcmp(v, "none") || !*v) return 0;
        const char* q = v;
        while (*q) {
            char* end;
            long a = strtol(q, &end, 10), b = a;
            if (end == q || a < 0 || a > 255) return -2;
            if (*end == '-') {
                q = end + 1;
                b = strtol(q, &end, 10);
                if (end == q || b < a || b > 255) return -2;
            }
            for (long l = a; l <= b; l++) f->dense_layers[l >> 6] |= 1ull << (l & 63);
            if (*end == ',')
                end++;
            else if (*end)
                return -2;
            q = end;
        }
        return 0;
    }
    if (!strcmp(key, "attn")) {
        if (!strcmp(v, "dense"))
            f->attn = ATTN_DENSE;
        else if (!strcmp(v, "soft"))
            f->attn = ATTN_SOFT;
        else if (!strcmp(v, "hard"))
            f->attn = ATTN_HARD;
        else
            return -2;
        return 0;
    }
    if (!strcmp(key, "seed")) {
        char* end;
        unsigned long long s = strtoull(v, &end, 10);
        if (end == v || *end) return -2;
        f->seed = s;
        return 0;
    }
    return -1;
}

void config_validate(const ModelConfig* c, const FocusConfig* f) {
    if (c->L < 1 || c->C < 1 || c->NH < 1 || c->NKV < 1 || c->F < 1 || c->V < 2 || c->maxT < 1)
        fatal(
            "model config: L, C, NH, NKV, F, V and maxT must be positive (got L=%d C=%d NH=%d "
            "NKV=%d F=%d V=%d maxT=%d)",
            c->L, c->C, c->NH, c->NKV, c->F, c->V, c->maxT);
    if (c->C % c->NH) fatal("model config: C=%d is not a multiple of NH=%d", c->C, c->NH);
    if (c->NH % c->NKV) fatal("model config: NH=%d is not a multiple of NKV=%d", c->NH, c->NKV);
    if (c->arch == ARCH_GPT2 && c->NKV != c->NH)
        fatal("model config: gpt2 has no grouped-query attention (NKV=%d, NH=%d)", c->NKV, c->NH);
    if (c->arch == ARCH_LLAMA && ((c->C / c->NH) % 2))
        fatal("model config: RoPE needs an even head size (got %d)", c->C / c->NH);
    if (f->K < 1 || f->K > 32) fatal("focus config: K=%d must be in 1..32", f->K);
    if (f->dg < 1) fatal("focus config: dg=%d must be positive", f->dg);
    if (f->iters < 1) fatal("focus config: iters=%d must be at least 1", f->iters);
    if (f->w < 0) fatal("focus config: window w=%d must be >= 0", f->w);
    if (f->topp > 0 ? (f->topk < 0 || f->topk > f->K) : (f->topk < 1 || f->topk > f->K))
        fatal("focus config: topk=%d must be in 1..K=%d", f->topk, f->K);
    if (!(f->topp >= 0 && f->topp <= 1))
        fatal("focus config: topk=p%g: the share must be in (0, 1]", (double)f->topp);
    if (f->sinks < 0) fatal("focus config: sinks=%d must be >= 0", f->sinks);
    for (int l = c->L; l < 256; l++)
        if (focus_layer_dense(f, l))
            fatal("focus config: dense_layers names layer %d, but the model has %d (0..%d)", l,
                  c->L, c->L - 1);
    if (!(f->tau > 0)) fatal("focus config: tau=%g must be positive", (double)f->tau);
}

const char* focus_topk_str(const FocusConfig* f, char* buf) {
    if (f->topp > 0 && f->topk > 0)
        snprintf(buf, 32, "p%g:%d", (double)f->topp, f->topk);
    else if (f->topp > 0)
        snprintf(buf, 32, "p%g", (double)f->topp);
    else
        snprintf(buf, 32, "%d", f->topk);
    return buf;
}

const char* focus_dense_layers_str(const FocusConfig* f, char* buf, size_t n) {
    size_t at = 0;
    buf[0] = 0;
    for (int l = 0; l < 256 && at + 8 < n; l++)
        if (focus_layer_dense(f, l)) at += (size_t)snprintf(buf + at, n - at, at ? ",%d" : "%d", l);
    if (!at) snprintf(buf, n, "none");
    return buf;
}

void config_print(const ModelConfig* c, const FocusConfig* f, FILE* o) {
    static const char* attn[] = {"dense", "soft", "hard"};
    fprintf(o, "+-----------------+----------------------+\n");
#define ROW(k, fmt, v) fprintf(o, "| %-15s | %-20" fmt " |\n", k, v)
    ROW("arch", "s", c->arch == ARCH_GPT2 ? "gpt2" : "llama");
    ROW("L", "d", c->L);
    ROW("C", "d", c->C);
    ROW("NH / NKV", "s", "");
    fprintf(o, "|   heads         | %d / %-17d |\n", c->NH, c->NKV);
    ROW("F", "d", c->F);
    ROW("V", "d", c->V);
    ROW("maxT", "d", c->maxT);
    ROW("eps", "g", (double)c->eps);
    if (c->arch == ARCH_LLAMA) ROW("rope_theta", "g", (double)c->rope_theta);
    ROW("tied", "d", c->tied);
    ROW("attn", "s", attn[f->attn]);
    ROW("routing", "s", routing_name(f->routing));
    ROW("K", "d", f->K);
    ROW("dg", "d", f->dg);
    ROW("iters", "d", f->iters);
    ROW("w", "d", f->w);
    char buf[1024];
    ROW("topk", "s", focus_topk_str(f, buf));
    ROW("sinks", "d", f->sinks);
    ROW("dense_layers", "s", focus_dense_layers_str(f, buf, sizeof buf));
    ROW("tau", "g", (double)f->tau);
    ROW("lambda", "g", (double)f->lambda);
    ROW("b", "g", (double)f->bias);
    ROW("learn_gate", "d", f->learn_gate);
    ROW("beta_balance", "d", f->beta_balance);
    ROW("seed", "llu", (unsigned long long)f->seed);
#undef ROW
    fprintf(o, "+-----------------+----------------------+\n");
}

static void param_sizes(size_t* s, const ModelConfig* c) {
    size_t L = c->L, C = c->C, V = c->V, Q = qkv_width(c), FC = fc_width(c), F = c->F;
    int g = c->arch == ARCH_GPT2;
    s[0] = V * C;
    s[1] = g ? (size_t)c->maxT * C : 0;
    s[2] = L * C;
    s[3] = g ? L * C : 0;
    s[4] = L * Q * C;
    s[5] = (g || c->qkv_bias) ? L * Q : 0;
    s[6] = L * C * C;
    s[7] = g ? L * C : 0;
    s[8] = L * C;
    s[9] = g ? L * C : 0;
    s[10] = L * FC * C;
    s[11] = g ? L * FC : 0;
    s[12] = L * C * F;
    s[13] = g ? L * C : 0;
    s[14] = C;
    s[15] = g ? C : 0;
    s[16] = c->tied ? 0 : V * C;
}

/* Carve mem into n consecutive tensors of the given sizes; size 0 gives NULL. */
static void carve(real** ptrs, real* mem, const size_t* sizes, int n) {
    for (int i = 0; i < n; i++) {
        ptrs[i] = sizes[i] ? mem : NULL;
        mem += sizes[i];
    }
}

static size_t sum_sizes(const size_t* s, int n) {
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
    m->router_sizes[0] = (size_t)cfg->L * cfg->C * fc->dg;
    m->router_sizes[1] = (size_t)cfg->L * fc->K * fc->dg;
    m->router_sizes[2] = (size_t)cfg->L * 2;
    m->num_router = sum_sizes(m->router_sizes, NUM_ROUTER_TENSORS);
    m->router_mem = callocCheck(m->num_router, sizeof(real));
    carve((real**)&m->router, m->router_mem, m->router_sizes, NUM_ROUTER_TENSORS);
    m->rgrads_mem = callocCheck(m->num_router, sizeof(real));
    carve((real**)&m->rgrads, m->rgrads_mem, m->router_sizes, NUM_ROUTER_TENSORS);
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
    m->num_params = sum_sizes(m->param_sizes, NUM_PARAM_TENSORS);
    m->params_mem = callocCheck(m->num_params, sizeof(real));
    carve((real**)&m->params, m->params_mem, m->param_sizes, NUM_PARAM_TENSORS);
    m->mean_loss = -1;
    alloc_router(m);
}

void model_set_router_config(Model* m, const FocusConfig* fc) {
    config_validate(&m->cfg, fc);
    m->fc = *fc;
    alloc_router(m);
}

void model_free(Model* m) {
#ifdef FOCUS_CUDA
    model_cuda_free(m);
#endif
    free(m->params_mem);
    free(m->grads_mem);
    free(m->router_mem);
    free(m->rgrads_mem);
    free(m->beta);
    free(m->acts_mem);
    free(m->rmask);
    free(m->inputs);
    free(m->targets);
    free(m->losses);
    free(m->scratch_mem);
    free(m->tprob);
    free(m->tnegent);
    free(m->kl_losses);
    free(m->atarget);
    memset(m, 0, sizeof(*m));
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

void model_init_router(Model* m, uint64_t seed) {
    const ModelConfig* c = &m->cfg;
    const FocusConfig* f = &m->fc;
    Rng rng;
    rng_seed(&rng, seed);
    for (size_t i = 0; i < m->router_sizes[0]; i++)
        m->router.wg[i] = (real)(rng_normal(&rng) / sqrt((double)c->C));
    for (size_t i = 0; i < m->router_sizes[1]; i++)
        m->router.cent[i] = (real)(rng_normal(&rng) / sqrt((double)f->dg));
    for (int l = 0; l < c->L; l++) {
        m->router.gate[2 * l] = f->lambda;
        m->router.gate[2 * l + 1] = f->bias;
    }
    memset(m->beta, 0, sizeof(real) * c->L * f->K);
    m->beta_updates = 0;
}

/* Activation sizes for (B, T); per-layer tensors hold L layers when keep, else one. */
void model_act_sizes(size_t* s, const ModelConfig* c, const FocusConfig* f, int B, int T,
                     int keep) {
    size_t BT = (size_t)B * T, C = c->C, Ls = keep ? c->L : 1;
    /* Router tensors are small and always allocated, so the attention mode can change
     * between calls without reallocation. */
    int router = 1;
    s[0] = BT * C;
    s[1] = Ls * BT * C;
    s[2] = Ls * BT;
    s[3] = Ls * BT;
    s[4] = Ls * BT * qkv_width(c);
    s[5] = Ls * BT * C;
    s[6] = Ls * B * c->NH * (size_t)T;
    s[7] = Ls * BT * C;
    s[8] = Ls * BT * C;
    s[9] = Ls * BT;
    s[10] = Ls * BT;
    s[11] = Ls * BT * fc_width(c);
    s[12] = Ls * BT * c->F;
    s[13] = Ls * BT * C;
    s[14] = router ? Ls * BT * f->dg : 0;
    s[15] = router ? Ls * BT * f->K : 0;
    s[16] = router ? (size_t)c->L * BT * f->K : 0; /* groups of every layer are kept for reports */
    s[17] = router ? (size_t)c->L * B * f->K : 0;
    s[18] = BT * C;
    s[19] = 2 * BT;
    s[20] = BT * c->V;
}

void model_host_buffers(Model* m, int B, int T, int keep) {
    free(m->acts_mem);
    free(m->rmask);
    free(m->inputs);
    free(m->targets);
    free(m->losses);
    m->acts_mem = NULL;
    m->rmask = NULL;
    m->inputs = mallocCheck(sizeof(int) * B * T);
    m->targets = mallocCheck(sizeof(int) * B * T);
    m->losses = mallocCheck(sizeof(real) * B * T);
    m->B = B;
    m->T = T;
    m->keep = keep;
}

static void ensure_acts(Model* m, int B, int T, int keep) {
    if (m->acts_mem && m->B == B && m->T == T && m->keep == keep) return;
    model_host_buffers(m, B, T, keep);
    size_t s[NUM_ACT_TENSORS];
    model_act_sizes(s, &m->cfg, &m->fc, B, T, keep);
    m->acts_mem = mallocCheck(sum_sizes(s, NUM_ACT_TENSORS) * sizeof(real));
    carve((real**)&m->acts, m->acts_mem, s, NUM_ACT_TENSORS);
    m->rmask = mallocCheck(sizeof(uint32_t) * (keep ? m->cfg.L : 1) * B * T);
}

const real* model_groups(const Model* m, int l) {
#ifdef FOCUS_CUDA
    if (m->gpu) model_cuda_sync_groups(m);
#endif
    if (!m->acts.rG) return NULL;
    return m->acts.rG + (size_t)l * m->B * m->T * m->fc.K;
}

static void norm_forward(const Model* m, real* out, real* mean, real* rstd, const real* inp,
                         const real* w, const real* b, size_t N) {
    if (m->cfg.arch == ARCH_GPT2)
        layernorm_forward(out, mean, rstd, inp, w, b, N, m->cfg.C, m->cfg.eps);
    else
        rmsnorm_forward(out, rstd, inp, w, N, m->cfg.C, m->cfg.eps);
}

static void norm_backward(const Model* m, real* dinp, real* dw, real* db, const real* dout,
                          const real* inp, const real* w, const real* mean, const real* rstd,
                          size_t N) {
    if (m->cfg.arch == ARCH_GPT2)
        layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, m->cfg.C);
    else
        rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, m->cfg.C);
}

LayerActs model_layer_acts(const Model* m, const Acts* a, uint32_t* rmask, int l) {
    const ModelConfig* c = &m->cfg;
    const FocusConfig* f = &m->fc;
    size_t BT = (size_t)m->B * m->T, s = m->keep ? (size_t)l : 0;
    LayerActs r;
    r.ln1 = a->ln1 + s * BT * c->C;
    r.ln1_mean = a->ln1_mean + s * BT;
    r.ln1_rstd = a->ln1_rstd + s * BT;
    r.qkv = a->qkv + s * BT * qkv_width(c);
    r.att = a->att + s * BT * c->C;
    r.lse = a->lse + s * BT * c->NH;
    r.res2 = a->res2 + s * BT * c->C;
    r.ln2 = a->ln2 + s * BT * c->C;
    r.ln2_mean = a->ln2_mean + s * BT;
    r.ln2_rstd = a->ln2_rstd + s * BT;
    r.fch = a->fch + s * BT * fc_width(c);
    r.fch_act = a->fch_act + s * BT * c->F;
    r.res3 = a->res3 + s * BT * c->C;
    r.rproj = a->rproj + s * BT * f->dg;
    r.rS = a->rS + s * BT * f->K;
    r.rG = a->rG + (size_t)l * BT * f->K;
    r.colofs = a->colofs + (size_t)l * m->B * f->K;
    r.mask = rmask + s * BT;
    return r;
}

static LayerActs layer_acts(const Model* m, int l) {
    return model_layer_acts(m, &m->acts, m->rmask, l);
}

AttnGate model_layer_gate(const Model* m, int l, const LayerActs* a) {
    AttnGate g = {GATE_NONE, m->fc.K, m->fc.w, a->rG, a->mask, 0, 0, m->fc.sinks};
    AttnMode mode = focus_layer_attn(&m->fc, l);
    if (mode == ATTN_SOFT) g.mode = GATE_SOFT;
    if (mode == ATTN_HARD) g.mode = GATE_HARD;
    if (m->router.gate) {
        g.lambda = m->router.gate[2 * l];
        g.bias = m->router.gate[2 * l + 1];
    }
    return g;
}

void model_forward(Model* m, const int* inputs, const int* targets, int B, int T, int keep) {
    const ModelConfig* c = &m->cfg;
    const FocusConfig* f = &m->fc;
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
#ifdef FOCUS_CUDA
    if (m->gpu) {
        model_cuda_forward(m, inputs, targets, B, T, keep);
        return;
    }
#endif
    ensure_acts(m, B, T, keep);
    memcpy(m->inputs, inputs, sizeof(int) * B * T);
    const size_t BT = (size_t)B * T;
    const int C = c->C, hs = C / c->NH, QKV = qkv_width(c), FC = fc_width(c);
    const Params* p = &m->params;
    Acts* a = &m->acts;
    encoder_forward(a->encoded, inputs, p->wte, p->wpe, B, T, C);
    const real* x = a->encoded;
    for (int l = 0; l < c->L; l++) {
        LayerActs la = layer_acts(m, l);
        size_t lC = (size_t)l * C;
        norm_forward(m, la.ln1, la.ln1_mean, la.ln1_rstd, x, p->ln1w + lC,
                     p->ln1b ? p->ln1b + lC : NULL, BT);
        matmul_forward(la.qkv, la.ln1, p->qkvw + (size_t)l * QKV * C,
                       p->qkvb ? p->qkvb + (size_t)l * QKV : NULL, BT, C, QKV);
        if (c->arch == ARCH_LLAMA) rope_forward(la.qkv, B, T, c->NH, c->NKV, hs, c->rope_theta, 0);
        const AttnMode mode = focus_layer_attn(f, l);
        if (f->attn != ATTN_DENSE || m->routed_dense) {
            /* a dense layer's groups are still computed (reports and statistics read them) */
            router_scores_forward(la.rproj, la.rS, la.ln1, m->router.wg + lC * f->dg,
                                  m->router.cent + (size_t)l * f->K * f->dg, BT, C, f->dg, f->K);
            routing_forward(la.rG, la.colofs, la.rS, m->beta + (size_t)l * f->K, f->routing, B, T,
                            f->K, f->tau, f->iters);
            if (mode == ATTN_HARD)
                routing_topk_mask(la.mask, la.rG, B, T, f->K, f->topk, f->topp, f->sinks, 0);
        }
        /* Hard top-k runs on the sparse executor; dense inference on the flash kernel; training
         * (keep) and the soft gate on the reference kernel, whose backward pass exists. */
        if (mode == ATTN_HARD) {
            attention_hard_forward(la.att, la.lse, la.qkv, la.mask, f->K, f->w, B, T, c->NH, c->NKV,
                                   hs);
        } else if (mode == ATTN_DENSE && !keep) {
            attention_flash_forward(la.att, la.lse, la.qkv, B, T, c->NH, c->NKV, hs);
        } else {
            AttnGate gate = model_layer_gate(m, l, &la);
            attention_forward(la.att, la.lse, la.qkv, &gate, B, T, c->NH, c->NKV, hs);
        }
        matmul_forward(la.res2, la.att, p->attprojw + (size_t)l * C * C,
                       p->attprojb ? p->attprojb + lC : NULL, BT, C, C);
        for (size_t i = 0; i < BT * C; i++) la.res2[i] += x[i];
        norm_forward(m, la.ln2, la.ln2_mean, la.ln2_rstd, la.res2, p->ln2w + lC,
                     p->ln2b ? p->ln2b + lC : NULL, BT);
        matmul_forward(la.fch, la.ln2, p->fcw + (size_t)l * FC * C,
                       p->fcb ? p->fcb + (size_t)l * FC : NULL, BT, C, FC);
        if (c->arch == ARCH_GPT2)
            gelu_forward(la.fch_act, la.fch, BT * c->F);
        else
            swiglu_forward(la.fch_act, la.fch, BT, c->F);
        matmul_forward(la.res3, la.fch_act, p->fcprojw + (size_t)l * C * c->F,
                       p->fcprojb ? p->fcprojb + lC : NULL, BT, c->F, C);
        for (size_t i = 0; i < BT * C; i++) la.res3[i] += la.res2[i];
        x = la.res3;
    }
    norm_forward(m, a->lnf, a->lnf_stat, a->lnf_stat + BT, x, p->lnfw, p->lnfb, BT);
    matmul_forward(a->logits, a->lnf, c->tied ? p->wte : p->lmhead, NULL, BT, C, c->V);
    m->have_dlogits = 0;
    m->mean_loss = -1;
    if (targets) {
        memcpy(m->targets, targets, sizeof(int) * BT);
        size_t valid = 0;
        for (size_t i = 0; i < BT; i++) valid += targets[i] >= 0;
        crossentropy_forward(m->losses, NULL, a->logits, targets, BT, c->V, 0);
        double s = 0;
        for (size_t i = 0; i < BT; i++) s += m->losses[i];
        m->mean_loss = valid ? (real)(s / valid) : 0;
        if (m->kl_active) {
            kl_forward(m->kl_losses, NULL, a->logits, m->tprob, m->tnegent, targets, BT, c->V, 0);
            s = 0;
            for (size_t i = 0; i < BT; i++) s += m->kl_losses[i];
            m->mean_kl = valid ? (real)(s / valid) : 0;
        }
    }
}

void model_teacher_forward(Model* m, const int* inputs, int B, int T, int want_logp,
                           int want_mass) {
    const ModelConfig* c = &m->cfg;
    const FocusConfig* f = &m->fc;
    const size_t BT = (size_t)B * T;
    AttnMode attn = m->fc.attn;
    m->fc.attn = ATTN_DENSE;
    m->routed_dense = want_mass;
    m->kl_active = 0;
    m->mass_ready = want_mass;
    model_forward(m, inputs, NULL, B, T, 1);
    m->fc.attn = attn;
    m->routed_dense = 0;
#ifdef FOCUS_CUDA
    if (m->gpu) {
        model_cuda_teacher(m, want_logp, want_mass);
        return;
    }
#endif
    if (want_logp) {
        if (m->teacher_bt != BT) { /* kept between steps: reallocated only when (B, T) changes */
            free(m->tprob);
            free(m->tnegent);
            free(m->kl_losses);
            m->tprob = mallocCheck(sizeof(real) * BT * c->V);
            m->tnegent = mallocCheck(sizeof(real) * BT);
            m->kl_losses = mallocCheck(sizeof(real) * BT);
            m->teacher_bt = BT;
        }
        memcpy(m->tprob, m->acts.logits, sizeof(real) * BT * c->V);
        teacher_probs_forward(m->tprob, m->tnegent, BT, c->V);
        m->kl_active = 1;
    }
    if (want_mass) {
        if (m->atarget_n != (size_t)c->L * BT * f->K) {
            free(m->atarget);
            m->atarget_n = (size_t)c->L * BT * f->K;
            m->atarget = mallocCheck(sizeof(real) * m->atarget_n);
        }
        const int hs = c->C / c->NH;
        for (int l = 0; l < c->L; l++) {
            LayerActs la = layer_acts(m, l);
            attention_group_mass(m->atarget + (size_t)l * BT * f->K, la.qkv, la.lse, la.rG, f->K,
                                 f->w, f->sinks, B, T, c->NH, c->NKV, hs);
        }
    }
}

double model_attn_objective(Model* m, real weight, int backward) {
    const ModelConfig* c = &m->cfg;
    const FocusConfig* f = &m->fc;
    const size_t BT = (size_t)m->B * m->T, K = f->K;
    if (!m->mass_ready) fatal("internal: model_attn_objective needs a teacher pass with want_mass");
#ifdef FOCUS_CUDA
    if (m->gpu) return model_cuda_attn_objective(m, weight, backward);
#endif
    int routed = 0;
    for (int l = 0; l < c->L; l++) routed += !focus_layer_dense(f, l);
    if (!routed) return 0;
    const double norm = 1.0 / ((double)routed * BT * c->NH);
    real* dG = mallocCheck(sizeof(real) * BT * K);
    real* dS = mallocCheck(sizeof(real) * BT * K);
    real* dproj = mallocCheck(sizeof(real) * BT * f->dg);
    double loss = 0;
    for (int l = 0; l < c->L; l++) {
        if (focus_layer_dense(f, l)) continue;
        LayerActs la = layer_acts(m, l);
        const real* t = m->atarget + (size_t)l * BT * K;
        for (size_t i = 0; i < BT * K; i++) {
            /* G > 0 in exact arithmetic; a float underflow to 0 must not give 0 * inf */
            double g = la.rG[i] > 1e-30 ? la.rG[i] : 1e-30;
            loss -= norm * t[i] * log(g);
            dG[i] = (real)(-weight * norm * t[i] / g);
        }
        if (!backward) continue;
        size_t lC = (size_t)l * c->C;
        memset(dS, 0, sizeof(real) * BT * K);
        routing_backward(dS, dG, la.rS, la.rG, m->beta + (size_t)l * K, f->routing, m->B, m->T,
                         f->K, f->tau, f->iters);
        router_scores_backward(NULL, m->rgrads.wg + lC * f->dg,
                               m->rgrads.cent + (size_t)l * K * f->dg, dproj, dS, la.ln1, la.rproj,
                               m->router.wg + lC * f->dg, m->router.cent + (size_t)l * K * f->dg,
                               BT, c->C, f->dg, f->K);
    }
    free(dG);
    free(dS);
    free(dproj);
    return loss;
}

/* The beta under which causal routing gives every group 1/K of the routing mass on the N score
 * rows S (every `step`-th row): fixed-point steps beta_k -= log(K mean_t G_tk), G = softmax(S/tau
 * + beta) (Sinkhorn's column step, applied to beta instead of to each sequence), from the
 * current beta; centred. */
static void balanced_beta(real* out, const real* beta, const real* S, size_t N, size_t step, int K,
                          real tau) {
    double b[32], col[32];
    for (int k = 0; k < K; k++) b[k] = beta[k];
    for (int it = 0; it < 8; it++) {
        for (int k = 0; k < K; k++) col[k] = 0;
        size_t n = 0;
        for (size_t t = 0; t < N; t += step, n++) {
            const real* s = S + t * K;
            double x[32], mx = -INFINITY, z = 0;
            for (int k = 0; k < K; k++) {
                x[k] = s[k] / tau + b[k];
                mx = x[k] > mx ? x[k] : mx;
            }
            for (int k = 0; k < K; k++) z += x[k] = exp(x[k] - mx);
            for (int k = 0; k < K; k++) col[k] += x[k] / z;
        }
        double mean = 0;
        for (int k = 0; k < K; k++) {
            /* an empty group moves by at most log(K) a step */
            double share = col[k] / n * K;
            b[k] -= log(share > 1.0 / K ? share : 1.0 / K);
            mean += b[k] / K;
        }
        for (int k = 0; k < K; k++) b[k] -= mean;
    }
    for (int k = 0; k < K; k++) out[k] = (real)b[k];
}

void model_update_beta(Model* m) {
    const FocusConfig* f = &m->fc;
    if (f->beta_balance) {
        /* from the score rows of every layer (a keep = 1 forward pass with the router on) */
        if (!m->keep || !m->acts.rS) return;
#ifdef FOCUS_CUDA
        if (m->gpu) model_cuda_sync_scores(m);
#endif
        /* at most about 2048 rows a layer, the layers in parallel: on the GPU this host work
         * runs every step (4096 rows on one thread halved the training throughput) */
        const size_t BT = (size_t)m->B * m->T, step = BT > 2048 ? BT / 2048 : 1;
        real mom = m->beta_updates ? f->beta_momentum : 0;
#pragma omp parallel for schedule(static)
        for (int l = 0; l < m->cfg.L; l++) {
            real target[32];
            real* beta = m->beta + (size_t)l * f->K;
            balanced_beta(target, beta, m->acts.rS + (size_t)l * BT * f->K, BT, step, f->K, f->tau);
            for (int k = 0; k < f->K; k++) beta[k] = mom * beta[k] + (1 - mom) * target[k];
        }
        m->beta_updates++;
#ifdef FOCUS_CUDA
        if (m->gpu) model_cuda_upload_router(m);
#endif
        return;
    }
    if (f->attn == ATTN_DENSE || f->routing == ROUTE_CAUSAL || !m->acts.colofs) return;
        /* Average of the batch's offsets; the first update takes it as is. */
#ifdef FOCUS_CUDA
    if (m->gpu) model_cuda_sync_colofs(m);
#endif
    real mom = m->beta_updates ? f->beta_momentum : 0;
    for (int l = 0; l < m->cfg.L; l++) {
        for (int k = 0; k < f->K; k++) {
            double s = 0;
            for (int b = 0; b < m->B; b++) s += m->acts.colofs[((size_t)l * m->B + b) * f->K + k];
            real* beta = &m->beta[(size_t)l * f->K + k];
            *beta = mom * *beta + (1 - mom) * (real)(s / m->B);
        }
    }
    m->beta_updates++;
#ifdef FOCUS_CUDA
    if (m->gpu) model_cuda_upload_router(m);
#endif
}

void model_zero_grad(Model* m, GradMode mode) {
    memset(m->rgrads_mem, 0, sizeof(real) * m->num_router);
#ifdef FOCUS_CUDA
    if (m->gpu) {
        model_cuda_zero_grad(m, mode);
        return;
    }
#endif
    if (mode == GRAD_ALL) {
        if (!m->grads_mem) {
            m->grads_mem = callocCheck(m->num_params, sizeof(real));
            carve((real**)&m->grads, m->grads_mem, m->param_sizes, NUM_PARAM_TENSORS);
        }
        memset(m->grads_mem, 0, sizeof(real) * m->num_params);
    }
}

/* Offset a gradient pointer, or NULL when that tensor is frozen. */
static real* gp(real* base, size_t off) { return base ? base + off : NULL; }

void model_backward(Model* m, GradMode mode) {
    const ModelConfig* c = &m->cfg;
    const FocusConfig* f = &m->fc;
    if (!m->keep || m->mean_loss < 0)
        fatal("internal: model_backward needs a forward pass with targets and keep = 1");
#ifdef FOCUS_CUDA
    if (m->gpu) {
        model_cuda_backward(m, mode);
        return;
    }
#endif
    if (mode == GRAD_ALL && !m->grads_mem) model_zero_grad(m, GRAD_ALL);
    const int B = m->B, T = m->T, C = c->C, hs = C / c->NH, QKV = qkv_width(c), FC = fc_width(c);
    const size_t BT = (size_t)B * T;
    const int all = mode == GRAD_ALL;
    const int router_on = f->attn == ATTN_SOFT; /* only the soft gate is differentiable */
    const Params* p = &m->params;
    Params* g = all ? &m->grads : &(Params){0};
    Acts* a = &m->acts;

    /* scratch: dres, dbuf (BT, C); dqkv (BT, QKV); dfch (BT, FC); dact (BT, F); dG, dS (BT, K);
     * dproj (BT, dg) */
    size_t need = BT * (2 * (size_t)C + QKV + FC + c->F + 2 * (size_t)f->K + f->dg);
    if (m->scratch_size < need) {
        free(m->scratch_mem);
        m->scratch_mem = mallocCheck(need * sizeof(real));
        m->scratch_size = need;
    }
    real* dres = m->scratch_mem;
    real* dbuf = dres + BT * C;
    real* dqkv = dbuf + BT * C;
    real* dfch = dqkv + BT * QKV;
    real* dact = dfch + BT * FC;
    real* dG = dact + BT * c->F;
    real* dS = dG + BT * f->K;
    real* dproj = dS + BT * f->K;

    /* d loss / d logits, in place over the logits */
    size_t valid = 0;
    for (size_t i = 0; i < BT; i++) valid += m->targets[i] >= 0;
    if (m->kl_active)
        kl_forward(m->kl_losses, a->logits, a->logits, m->tprob, m->tnegent, m->targets, BT, c->V,
                   (real)(1.0 / (valid ? valid : 1)));
    else
        crossentropy_forward(m->losses, a->logits, a->logits, m->targets, BT, c->V,
                             (real)(1.0 / (valid ? valid : 1)));
    m->have_dlogits = 1;

    const real* xlast = a->res3 + (size_t)(c->L - 1) * BT * C;
    memset(dbuf, 0, sizeof(real) * BT * C);
    memset(dres, 0, sizeof(real) * BT * C);
    matmul_backward(dbuf, all ? (c->tied ? g->wte : g->lmhead) : NULL, NULL, a->logits, a->lnf,
                    c->tied ? p->wte : p->lmhead, BT, C, c->V);
    norm_backward(m, dres, g->lnfw, g->lnfb, dbuf, xlast, p->lnfw, a->lnf_stat, a->lnf_stat + BT,
                  BT);

    for (int l = c->L - 1; l >= 0; l--) {
        LayerActs la = layer_acts(m, l);
        const real* x = l == 0 ? a->encoded : a->res3 + (size_t)(l - 1) * BT * C;
        size_t lC = (size_t)l * C;
        /* MLP: dres holds d(layer output) = d(res3) = d(res2) via the residual. */
        memset(dact, 0, sizeof(real) * BT * c->F);
        matmul_backward(dact, gp(g->fcprojw, (size_t)l * C * c->F), gp(g->fcprojb, lC), dres,
                        la.fch_act, p->fcprojw + (size_t)l * C * c->F, BT, c->F, C);
        if (c->arch == ARCH_GPT2) {
            memset(dfch, 0, sizeof(real) * BT * FC);
            gelu_backward(dfch, la.fch, dact, BT * c->F);
        } else {
            swiglu_backward(dfch, la.fch, dact, BT, c->F);
        }
        memset(dbuf, 0, sizeof(real) * BT * C);
        matmul_backward(dbuf, gp(g->fcw, (size_t)l * FC * C), gp(g->fcb, (size_t)l * FC), dfch,
                        la.ln2, p->fcw + (size_t)l * FC * C, BT, C, FC);
        norm_backward(m, dres, gp(g->ln2w, lC), gp(g->ln2b, lC), dbuf, la.res2, p->ln2w + lC,
                      la.ln2_mean, la.ln2_rstd, BT);
        /* attention */
        memset(dbuf, 0, sizeof(real) * BT * C);
        matmul_backward(dbuf, gp(g->attprojw, (size_t)l * C * C), gp(g->attprojb, lC), dres, la.att,
                        p->attprojw + (size_t)l * C * C, BT, C, C);
        memset(dqkv, 0, sizeof(real) * BT * QKV);
        const int router = router_on && !focus_layer_dense(f, l);
        if (router) memset(dG, 0, sizeof(real) * BT * f->K);
        AttnGate gate = model_layer_gate(m, l, &la);
        attention_backward(dqkv, router ? dG : NULL,
                           router && f->learn_gate ? m->rgrads.gate + 2 * l : NULL, dbuf, la.qkv,
                           la.att, la.lse, &gate, B, T, c->NH, c->NKV, hs);
        /* Layer 0's input gradient is needed only for the embeddings. */
        if (l == 0 && !all && !router) break;
        if (c->arch == ARCH_LLAMA) rope_backward(dqkv, B, T, c->NH, c->NKV, hs, c->rope_theta, 0);
        memset(dbuf, 0, sizeof(real) * BT * C);
        if (l > 0 || all) {
            matmul_backward(dbuf, gp(g->qkvw, (size_t)l * QKV * C), gp(g->qkvb, (size_t)l * QKV),
                            dqkv, la.ln1, p->qkvw + (size_t)l * QKV * C, BT, C, QKV);
        }
        if (router) {
            memset(dS, 0, sizeof(real) * BT * f->K);
            routing_backward(dS, dG, la.rS, la.rG, m->beta + (size_t)l * f->K, f->routing, B, T,
                             f->K, f->tau, f->iters);
            router_scores_backward(dbuf, m->rgrads.wg + lC * f->dg,
                                   m->rgrads.cent + (size_t)l * f->K * f->dg, dproj, dS, la.ln1,
                                   la.rproj, m->router.wg + lC * f->dg,
                                   m->router.cent + (size_t)l * f->K * f->dg, BT, C, f->dg, f->K);
        }
        if (l == 0 && !all) break;
        norm_backward(m, dres, gp(g->ln1w, lC), gp(g->ln1b, lC), dbuf, x, p->ln1w + lC, la.ln1_mean,
                      la.ln1_rstd, BT);
    }
    if (all) encoder_backward(g->wte, g->wpe, dres, m->inputs, B, T, C);
    m->kl_active = 0; /* the teacher's distributions served this backward pass */
}
