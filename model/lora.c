/* lora.c: the LoRA adapters of the fine-tuning baselines (focus finetune): their targets, shapes,
 * initialisation, and merging them into the weights for evaluation. */
#include <math.h>
#include <string.h>

#include "backend.h"
#include "model.h"

int lora_parse_targets(const char* s) {
    static const char* names[NUM_LORA_TARGETS] = {"qkv", "o", "fc", "fcproj"};
    int bits = 0;
    while (*s) {
        size_t n = strcspn(s, ",");
        int k = 0;
        while (k < NUM_LORA_TARGETS && (strlen(names[k]) != n || strncmp(s, names[k], n))) k++;
        if (k == NUM_LORA_TARGETS) return -1;
        bits |= 1 << k;
        s += n + (s[n] == ',');
    }
    return bits;
}

/* Sizes of the LoRA tensors (A, B per target; 0 for a target not chosen), and each target's
 * input and output widths. */
static void lora_shapes(const Model* m, size_t* s, int* in, int* out) {
    const ModelConfig* c = &m->cfg;
    const size_t L = c->L, r = m->lora.rank;
    const int ins[NUM_LORA_TARGETS] = {c->C, c->C, c->C, c->F};
    const int outs[NUM_LORA_TARGETS] = {model_qkv_width(c), c->C, model_fc_width(c), c->C};
    for (LoraTarget k = 0; k < NUM_LORA_TARGETS; k++) {
        const int on = (m->lora.targets >> k) & 1;
        s[lora_a_at(k)] = on ? L * r * ins[k] : 0;
        s[lora_b_at(k)] = on ? L * outs[k] * r : 0;
        if (in) in[k] = ins[k], out[k] = outs[k];
    }
}

void model_lora_init(Model* m, const LoraConfig* lc, uint64_t seed) {
    if (m->tp) fatal("lora: a tensor-parallel model takes no adapters (LoRA runs in one process)");
    if (m->wbf16) fatal("lora: adapters need the fp32 weights (not --weights bf16)");
    if (lc->rank < 1 || lc->targets <= 0 || lc->targets > 15 || !(lc->alpha > 0))
        fatal("lora: rank must be >= 1, alpha > 0 and targets a subset of qkv,o,fc,fcproj");
    free(m->lora_mem);
    free(m->lora_grads_mem);
    m->lora = *lc;
    int in[NUM_LORA_TARGETS], out[NUM_LORA_TARGETS];
    lora_shapes(m, m->lora_sizes, in, out);
    m->num_lora = model_sum_sizes(m->lora_sizes, NUM_LORA_TENSORS);
    m->lora_mem = callocCheck(m->num_lora, sizeof(real));
    m->lora_grads_mem = callocCheck(m->num_lora, sizeof(real));
    model_carve((real**)&m->lw, m->lora_mem, m->lora_sizes, NUM_LORA_TENSORS);
    model_carve((real**)&m->lg, m->lora_grads_mem, m->lora_sizes, NUM_LORA_TENSORS);
    Rng rng;
    rng_seed(&rng, seed);
    for (LoraTarget k = 0; k < NUM_LORA_TARGETS; k++) /* A ~ N(0, 1/in); B stays zero */
        for (size_t i = 0; i < m->lora_sizes[lora_a_at(k)]; i++)
            lora_a(&m->lw, k)[i] = (real)(rng_normal(&rng) / sqrt((double)in[k]));
}

void model_lora_merge(Model* m) {
    if (!m->lora.rank) return;
    const ModelConfig* c = &m->cfg;
    const int r = m->lora.rank;
    int in[NUM_LORA_TARGETS], out[NUM_LORA_TARGETS];
    size_t s[NUM_LORA_TENSORS];
    lora_shapes(m, s, in, out);
    real* W[NUM_LORA_TARGETS] = {m->params.qkvw, m->params.attprojw, m->params.fcw,
                                 m->params.fcprojw};
    const double scale = m->lora.alpha / r;
    for (LoraTarget k = 0; k < NUM_LORA_TARGETS; k++) {
        if (!s[lora_a_at(k)]) continue;
        for (int l = 0; l < c->L; l++) {
            const real* A = lora_a(&m->lw, k) + (size_t)l * r * in[k];
            const real* B = lora_b(&m->lw, k) + (size_t)l * out[k] * r;
            real* Wl = W[k] + (size_t)l * out[k] * in[k];
            for (int o = 0; o < out[k]; o++)
                for (int i = 0; i < in[k]; i++) {
                    double d = 0;
                    for (int j = 0; j < r; j++)
                        d += (double)B[o * r + j] * A[(size_t)j * in[k] + i];
                    Wl[(size_t)o * in[k] + i] += (real)(scale * d);
                }
        }
    }
    free(m->lora_mem);
    free(m->lora_grads_mem);
    m->lora_mem = m->lora_grads_mem = NULL;
    memset(&m->lw, 0, sizeof m->lw);
    memset(&m->lg, 0, sizeof m->lg);
    memset(&m->lora, 0, sizeof m->lora);
    m->num_lora = 0;
}
