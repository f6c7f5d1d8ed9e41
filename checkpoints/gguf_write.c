/* gguf_write.c: write a model as a GGUF `llama` or `gemma3` file (F32, or Q8_0 matrices with an
 * F16 embedding). Used to save base models trained from scratch, and by tests/test_gguf.c. */
#include <math.h>
#include <string.h>

#include "../io/io.h"
#include "../io/gguf.h"
#include "load.h"

typedef struct {
    uint8_t* b;
    size_t n, cap;
} Buf;

static void put(Buf* b, const void* p, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->b = reallocCheck(b->b, b->cap);
    }
    memcpy(b->b + b->n, p, n);
    b->n += n;
}
static void put32(Buf* b, uint32_t v) { put(b, &v, 4); }
static void put64(Buf* b, uint64_t v) { put(b, &v, 8); }
static void putstr(Buf* b, const char* s) {
    put64(b, strlen(s));
    put(b, s, strlen(s));
}
static void kv_u32(Buf* b, const char* k, uint32_t v) {
    putstr(b, k);
    put32(b, GGUF_VAL_UINT32);
    put32(b, v);
}
static void kv_f32(Buf* b, const char* k, float v) {
    putstr(b, k);
    put32(b, GGUF_VAL_FLOAT32);
    put(b, &v, 4);
}

typedef struct {
    char name[64];
    const float* data;
    uint64_t rows, cols;
    uint32_t type;
} WTensor;

static void encode_tensor(Buf* d, const WTensor* t) {
    uint64_t n = t->rows * t->cols;
    if (t->type == GGML_F32) {
        put(d, t->data, n * 4);
    } else if (t->type == GGML_F16) {
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h = f32_to_f16(t->data[i], 0);
            put(d, &h, 2);
        }
    } else { /* Q8_0 */
        for (uint64_t b = 0; b < n / 32; b++) {
            float amax = 0;
            for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(t->data[b * 32 + j]));
            float dd = amax / 127;
            uint16_t h = f32_to_f16(dd, 0);
            float dq = f16_to_f32(h);
            put(d, &h, 2);
            for (int j = 0; j < 32; j++) {
                int8_t q = (int8_t)(dq > 0 ? lrintf(t->data[b * 32 + j] / dq) : 0);
                put(d, &q, 1);
            }
        }
    }
}

static void kv_str(Buf* b, const char* k, const char* v) {
    putstr(b, k);
    put32(b, GGUF_VAL_STRING);
    putstr(b, v);
}

/* Tensor t's slab l of m (when m has it) to ts as its GGUF parts (model_param_gguf):
 * F32, or with quant the projection matrices in Q8_0 and the embedding in F16. */
static void add_parts(WTensor* ts, int* nt, const Model* m, int t, int l, int quant) {
    const ModelConfig* c = &m->cfg;
    const ParamSpec* s = &model_params[t];
    size_t rows, cols;
    model_param_shape(c, t, &rows, &cols);
    const float* src = ((float* const*)&m->params)[t];
    if (!rows || !src) return;
    src += (size_t)l * rows * cols;
    for (int i = 0; i < model_param_parts(t); i++) {
        model_param_part(c, t, i, &rows, &cols);
        WTensor* w = &ts[(*nt)++];
        if (s->per_layer)
            snprintf(w->name, sizeof w->name, "blk.%d.%s", l, model_param_gguf(t, i, 1));
        else
            snprintf(w->name, sizeof w->name, "%s", model_param_gguf(t, i, 1));
        w->data = src, w->rows = rows, w->cols = cols;
        w->type = !quant ? GGML_F32 : t == P_WTE ? GGML_F16 : s->proj >= 0 ? GGML_Q8_0 : GGML_F32;
        src += rows * cols;
    }
}

/* Write m as a GGUF `llama` or `gemma3` file; quant: 0 all F32, 1 matrices in Q8_0 / F16. Our
 * RoPE pairs are GGUF's for both (adjacent for llama, half-split for gemma3): no reordering. */
static Buf write_gguf(const Model* m, int quant) {
    const int gemma = m->cfg.arch == ARCH_GEMMA3;
    if (m->cfg.arch == ARCH_GPT2) fatal("GGUF export supports the llama and gemma3 families only");
    if (m->wbf16 || m->tp) fatal("internal: writing a bf16-stored or sliced model");
    const ModelConfig* c = &m->cfg;
    const char* arch = gemma ? "gemma3" : "llama";
    const int hs = model_head_size(c);
    WTensor* ts = mallocCheck(sizeof(WTensor) * (3 * NUM_PARAM_TENSORS * ((size_t)c->L + 1)));
    int nt = 0;
    /* the table's tensors that the model has, in their parts: the embedding, each layer's, then
     * the final norm and the head */
    for (int l = -1; l <= c->L; l++) /* -1: the embedding; 0 .. L - 1: the layers; L: the rest */
        for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
            const int per_layer = model_params[t].per_layer;
            const int here = per_layer ? l >= 0 && l < c->L : l == (t == P_WTE ? -1 : c->L);
            if (here) add_parts(ts, &nt, m, t, per_layer ? l : 0, quant);
        }
    Buf h = {0}, d = {0};
    put(&h, "GGUF", 4);
    put32(&h, 3);
    put64(&h, (uint64_t)nt);
    put64(&h, gemma ? 16 : 10);
    kv_str(&h, "general.architecture", arch);
    char k[96];
#define KEY(name) (snprintf(k, sizeof k, "%s.%s", arch, name), k)
    kv_u32(&h, KEY("block_count"), (uint32_t)c->L);
    kv_u32(&h, KEY("embedding_length"), (uint32_t)c->C);
    kv_u32(&h, KEY("attention.head_count"), (uint32_t)c->NH);
    kv_u32(&h, KEY("attention.head_count_kv"), (uint32_t)c->NKV);
    kv_u32(&h, KEY("feed_forward_length"), (uint32_t)c->F);
    kv_u32(&h, KEY("context_length"), (uint32_t)c->maxT);
    kv_f32(&h, KEY("rope.freq_base"), c->rope_theta);
    kv_f32(&h, KEY("attention.layer_norm_rms_epsilon"), c->eps);
    if (gemma) {
        kv_u32(&h, KEY("attention.key_length"), (uint32_t)hs);
        kv_u32(&h, KEY("attention.value_length"), (uint32_t)hs);
        kv_u32(&h, KEY("attention.sliding_window"), (uint32_t)c->swa);
        kv_u32(&h, KEY("attention.sliding_window_pattern"), (uint32_t)c->swa_period);
        kv_f32(&h, KEY("rope.freq_base_swa"), c->rope_local);
        kv_str(&h, "tokenizer.ggml.model", "none"); /* no vocabulary: refused by the reader */
    }
#undef KEY
    kv_u32(&h, "general.alignment", 32);
    for (int i = 0; i < nt; i++) {
        size_t at = d.n;
        encode_tensor(&d, &ts[i]);
        while (d.n % 32) put(&d, "", 1);
        putstr(&h, ts[i].name);
        int two = ts[i].rows > 1;
        put32(&h, two ? 2 : 1);
        put64(&h, ts[i].cols);
        if (two) put64(&h, ts[i].rows);
        put32(&h, ts[i].type);
        put64(&h, at);
    }
    while (h.n % 32) put(&h, "", 1);
    put(&h, d.b, d.n);
    free(d.b);
    free(ts);
    return h;
}

uint8_t* gguf_serialize_llama(const Model* m, int quant, size_t* len) {
    Buf b = write_gguf(m, quant);
    *len = b.n;
    return b.b;
}

void gguf_write_model(const Model* m, const char* path, int quant) {
    size_t n;
    uint8_t* b = gguf_serialize_llama(m, quant, &n);
    const void* parts[1] = {b};
    write_file_atomic(path, parts, &n, 1);
    free(b);
}
