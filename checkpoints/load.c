/* load.c: GGUF, safetensors and llm.c model import (see load.h). */
#define _GNU_SOURCE
#include "load.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "../io/io.h"
#include "../io/gguf.h"

_Static_assert(sizeof(real) == 4, "model import writes float parameters");

static const char* base_name(const char* path) {
    const char* s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* Before model_build allocates what the shape sizes: the shape must pass model_config_check, and
 * a file of file_bytes must be able to hold its parameters at min_bytes each at the least (so a
 * corrupt count cannot ask for gigabytes). */
static void check_shape(const char* path, const ModelConfig* cfg, double file_bytes,
                        double min_bytes) {
    char err[512];
    if (model_config_check(cfg, err, sizeof err)) fatal("%s: %s", path, err);
    double need = (double)model_param_count(cfg) * min_bytes;
    if (need > file_bytes)
        fatal(
            "%s: the header's shape (L=%d C=%d F=%d V=%d) has %zu parameters, more than the file "
            "(%.0f bytes) can hold; the file is corrupt or truncated",
            path, cfg->L, cfg->C, cfg->F, cfg->V, model_param_count(cfg), file_bytes);
}

static const char* const param_names[NUM_PARAM_TENSORS] = {
    "wte",  "wpe", "ln1w", "ln1b",    "qkvw",    "qkvb", "attprojw", "attprojb", "ln2w",
    "ln2b", "fcw", "fcb",  "fcprojw", "fcprojb", "lnfw", "lnfb",     "lmhead"};

/* Every weight must be finite: a NaN or inf in a file is corruption, not a model. */
static void check_finite(const Model* m, const char* path) {
    const real* p = m->params_mem;
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        for (size_t i = 0; i < m->param_sizes[t]; i++)
            if (!isfinite(p[i]))
                fatal("%s: weight %zu of %s is %g; the file is corrupt", path, i, param_names[t],
                      (double)p[i]);
        p += m->param_sizes[t];
    }
}

/* ------------------------------------------------------------------ GGUF */

/* Copy tensor `name` (expected rows x cols, row-major) into dst, dequantised. */
static void gguf_load_tensor(const GGUFFile* f, const char* name, float* dst, uint64_t rows,
                             uint64_t cols) {
    const GGUFTensor* t = gguf_tensor(f, name);
    if (!t) fatal("%s: tensor '%s' is missing", f->path, name);
    int ok = t->ne[0] == cols && t->nelem == rows * cols &&
             (t->n_dims == 1 ? rows == 1 : t->ne[1] == rows);
    if (!ok)
        fatal("%s: tensor '%s' has shape [%llu, %llu], expected [%llu, %llu] (ne0 = columns)",
              f->path, name, (unsigned long long)t->ne[0],
              (unsigned long long)(t->n_dims > 1 ? t->ne[1] : 1), (unsigned long long)cols,
              (unsigned long long)rows);
    if (!t->data || ggml_dequantize(dst, t->data, t->type, t->nelem))
        fatal(
            "%s: tensor '%s' has type %s (%u), which focus does not support (supported: F32, "
            "F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)",
            f->path, name, ggml_type_name(t->type), t->type);
}

static int gguf_need_int(const GGUFFile* f, const char* arch, const char* key) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    uint64_t v;
    if (gguf_get_u64(f, full, &v)) fatal("%s: metadata key '%s' is missing", f->path, full);
    if (v > INT_MAX)
        fatal("%s: metadata key '%s' = %llu is out of range", f->path, full, (unsigned long long)v);
    return (int)v;
}

/* lean: leave the projection matrices and embeddings out of the fp32 parameters (zero pages,
 * never touched: they cost no memory), for a model that decodes from the file's blocks. */
static void load_gguf(Model* m, const char* path, const FocusConfig* fc, ModelInfo* info,
                      int lean) {
    GGUFFile f;
    char err[512];
    if (gguf_open(&f, path, err, sizeof err)) fatal("%s: %s", path, err);
    GGUFFile* held = gguf_hold(&f); /* closed by fatal_release below */
    uint64_t alen;
    const char* a = gguf_get_str(&f, "general.architecture", &alen);
    if (!a) fatal("%s: metadata key 'general.architecture' is missing", path);
    char arch[16];
    snprintf(arch, sizeof arch, "%.*s", (int)(alen < 15 ? alen : 15), a);
    ModelConfig cfg = {0};
    if (!strcmp(arch, "llama") || !strcmp(arch, "qwen2"))
        cfg.arch = ARCH_LLAMA;
    else if (!strcmp(arch, "gpt2"))
        cfg.arch = ARCH_GPT2;
    else
        fatal("%s: architecture '%s' is not supported (supported: llama, qwen2, gpt2)", path, arch);
    cfg.L = gguf_need_int(&f, arch, "block_count");
    cfg.C = gguf_need_int(&f, arch, "embedding_length");
    cfg.NH = gguf_need_int(&f, arch, "attention.head_count");
    uint64_t nkv;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.head_count_kv", arch);
    cfg.NKV = gguf_get_u64(&f, key, &nkv) ? cfg.NH : nkv > INT_MAX ? -1 : (int)nkv;
    cfg.F = gguf_need_int(&f, arch, "feed_forward_length");
    cfg.maxT = gguf_need_int(&f, arch, "context_length");
    snprintf(key, sizeof key, "%s.attention.layer_norm_%s", arch,
             cfg.arch == ARCH_LLAMA ? "rms_epsilon" : "epsilon");
    if (gguf_get_f32(&f, key, &cfg.eps)) cfg.eps = 1e-5f;
    snprintf(key, sizeof key, "%s.rope.freq_base", arch);
    if (gguf_get_f32(&f, key, &cfg.rope_theta)) cfg.rope_theta = 10000.0f;
    const GGUFTensor* emb = gguf_tensor(&f, "token_embd.weight");
    if (!emb || emb->n_dims != 2)
        fatal("%s: tensor 'token_embd.weight' is missing or not a matrix", path);
    cfg.V = emb->ne[1] > INT_MAX ? -1 : (int)emb->ne[1];
    cfg.tied = gguf_tensor(&f, "output.weight") == NULL;
    cfg.qkv_bias = cfg.arch == ARCH_LLAMA && gguf_tensor(&f, "blk.0.attn_q.bias") != NULL;
    int hs = cfg.NH ? cfg.C / cfg.NH : 0;
    snprintf(key, sizeof key, "%s.rope.dimension_count", arch);
    uint64_t rdim;
    if (cfg.arch == ARCH_LLAMA && !gguf_get_u64(&f, key, &rdim) && (int)rdim != hs)
        fatal(
            "%s: partial rotary embeddings (rope.dimension_count %llu, head size %d) are not "
            "supported",
            path, (unsigned long long)rdim, hs);
    check_shape(path, &cfg, (double)f.size, 0.5); /* no supported type takes under 4 bits */
    model_build(m, &cfg, fc);
    Params* p = &m->params;
    const size_t C = cfg.C, Q = (size_t)(cfg.NH + 2 * cfg.NKV) * hs, F = cfg.F;
    const size_t FC = cfg.arch == ARCH_LLAMA ? 2 * F : F;
    if (!lean) gguf_load_tensor(&f, "token_embd.weight", p->wte, cfg.V, C);
    if (cfg.arch == ARCH_GPT2) gguf_load_tensor(&f, "position_embd.weight", p->wpe, cfg.maxT, C);
    for (int l = 0; l < cfg.L; l++) {
        char n[96];
#define T(fmt, dst, rows, cols) \
    (snprintf(n, sizeof n, "blk.%d." fmt, l), gguf_load_tensor(&f, n, dst, rows, cols))
        T("attn_norm.weight", p->ln1w + l * C, 1, C);
        T("ffn_norm.weight", p->ln2w + l * C, 1, C);
        if (!lean) T("attn_output.weight", p->attprojw + l * C * C, C, C);
        if (!lean) T("ffn_down.weight", p->fcprojw + l * C * F, C, F);
        float* qkv = p->qkvw + l * Q * C;
        if (cfg.arch == ARCH_LLAMA) {
            if (!lean) {
                T("attn_q.weight", qkv, (size_t)cfg.NH * hs, C);
                T("attn_k.weight", qkv + (size_t)cfg.NH * hs * C, (size_t)cfg.NKV * hs, C);
                T("attn_v.weight", qkv + (size_t)(cfg.NH + cfg.NKV) * hs * C, (size_t)cfg.NKV * hs,
                  C);
            }
            if (cfg.qkv_bias) {
                float* b = p->qkvb + l * Q;
                T("attn_q.bias", b, 1, (size_t)cfg.NH * hs);
                T("attn_k.bias", b + (size_t)cfg.NH * hs, 1, (size_t)cfg.NKV * hs);
                T("attn_v.bias", b + (size_t)(cfg.NH + cfg.NKV) * hs, 1, (size_t)cfg.NKV * hs);
            }
            if (!lean) {
                T("ffn_gate.weight", p->fcw + l * FC * C, F, C);
                T("ffn_up.weight", p->fcw + l * FC * C + F * C, F, C);
            }
        } else {
            T("attn_norm.bias", p->ln1b + l * C, 1, C);
            T("ffn_norm.bias", p->ln2b + l * C, 1, C);
            T("attn_qkv.weight", qkv, Q, C);
            T("attn_qkv.bias", p->qkvb + l * Q, 1, Q);
            T("attn_output.bias", p->attprojb + l * C, 1, C);
            T("ffn_up.weight", p->fcw + l * FC * C, F, C);
            T("ffn_up.bias", p->fcb + l * FC, 1, F);
            T("ffn_down.bias", p->fcprojb + l * C, 1, C);
        }
#undef T
    }
    gguf_load_tensor(&f, "output_norm.weight", p->lnfw, 1, C);
    if (cfg.arch == ARCH_GPT2) gguf_load_tensor(&f, "output_norm.bias", p->lnfb, 1, C);
    if (!cfg.tied && !lean) gguf_load_tensor(&f, "output.weight", p->lmhead, cfg.V, C);
    uint64_t nlen;
    const char* name = gguf_get_str(&f, "general.name", &nlen);
    snprintf(info->format, sizeof info->format, "gguf");
    snprintf(info->arch, sizeof info->arch, "%s", arch);
    if (name)
        snprintf(info->name, sizeof info->name, "%.*s", (int)(nlen < 127 ? nlen : 127), name);
    else
        snprintf(info->name, sizeof info->name, "%s", base_name(path));
    fatal_release(held);
}

/* ------------------------------------------------------------------ llm.c */

/* llm.c checkpoint: 256 int32 header (magic 20240326, version 3 = fp32 or 5 = bf16, maxT, V,
 * L, NH, C, padded V), then the GPT-2 parameters in llm.c order, which is the order of our
 * Params struct; wte has padded-V rows, of which the first V are kept. */
static void load_llmc(Model* m, const char* path, FILE* fp, const FocusConfig* fc,
                      ModelInfo* info) {
    int32_t h[256];
    if (fread(h, 4, 256, fp) != 256) fatal("%s: truncated llm.c header", path);
    if (h[1] != 3 && h[1] != 5)
        fatal("%s: llm.c version %d is not supported (3 = fp32, 5 = bf16)", path, h[1]);
    /* F = 4 C is formed only once C is known to be small (no signed overflow) */
    ModelConfig cfg = {
        ARCH_GPT2, h[4], h[6],  h[5], h[5], h[6] > 0 && h[6] <= 65536 ? 4 * h[6] : -1,
        h[3],      h[2], 1e-5f, 0,    0,    1,
        0,         0};
    int Vp = h[7];
    char err[512];
    if (model_config_check(&cfg, err, sizeof err) || Vp < cfg.V || Vp > (1 << 24))
        fatal("%s: llm.c header has inconsistent sizes (L=%d C=%d NH=%d V=%d Vp=%d maxT=%d)", path,
              cfg.L, cfg.C, cfg.NH, cfg.V, Vp, cfg.maxT);
    size_t esz = h[1] == 3 ? 4 : 2;
    size_t expect = 1024 + (model_param_count(&cfg) + (size_t)(Vp - cfg.V) * cfg.C) * esz;
    struct stat st;
    if (fstat(fileno(fp), &st) || (size_t)st.st_size != expect)
        fatal("%s: file is %lld bytes, the header implies %zu; truncated or corrupt", path,
              (long long)st.st_size, expect);
    model_build(m, &cfg, fc);
    real** ptrs = (real**)&m->params;
    size_t biggest = (size_t)Vp * cfg.C;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++)
        biggest = m->param_sizes[i] > biggest ? m->param_sizes[i] : biggest;
    uint16_t* tmp = mallocCheck(sizeof(uint16_t) * biggest);
    fatal_defer(free, tmp);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        if (!ptrs[i]) continue;
        size_t n = m->param_sizes[i], nfile = i == 0 ? (size_t)Vp * cfg.C : n;
        if (esz == 4) {
            if (fread(ptrs[i], 4, n, fp) != n) fatal("%s: truncated parameter data", path);
            if (nfile > n && fseek(fp, (long)((nfile - n) * 4), SEEK_CUR))
                fatal("%s: seek failed", path);
        } else {
            if (fread(tmp, 2, nfile, fp) != nfile) fatal("%s: truncated parameter data", path);
            for (size_t j = 0; j < n; j++) ptrs[i][j] = bf16_to_f32(tmp[j]);
        }
    }
    fatal_release(tmp);
    snprintf(info->format, sizeof info->format, "llm.c");
    snprintf(info->arch, sizeof info->arch, "gpt2");
    snprintf(info->name, sizeof info->name, "%s", base_name(path));
}

/* ------------------------------------------------------------------ safetensors */

typedef struct {
    const char* path;
    uint8_t* map;
    size_t size;
    cJSON* header;
    size_t data_start;
} SafeFile;

typedef struct {
    double begin, end;
    const char* name;
} Span;

static int span_cmp(const void* a, const void* b) {
    double x = ((const Span*)a)->begin, y = ((const Span*)b)->begin;
    return (x > y) - (x < y);
}

/* Every tensor entry of the header well formed (dtype text, shape of at most 4 non-negative
 * integer dimensions, two integer data offsets whose span is the shape's bytes), and the spans
 * tiling the data that follows the header exactly: sorted, they start at 0, each begins where
 * the one before ends (no overlap, no gap), and the last ends at the end of the file. */
static void safe_check_entries(const SafeFile* s) {
    int n = 0;
    const cJSON* t;
    cJSON_ArrayForEach(t, s->header) n++;
    Span* sp = mallocCheck(sizeof(Span) * (size_t)(n ? n : 1));
    fatal_defer(free, sp);
    int k = 0;
    cJSON_ArrayForEach(t, s->header) {
        if (!strcmp(t->string, "__metadata__")) continue;
        cJSON* dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
        cJSON* shape = cJSON_GetObjectItemCaseSensitive(t, "shape");
        cJSON* offs = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
        if (!cJSON_IsObject(t) || !cJSON_IsString(dt) || !cJSON_IsArray(shape) ||
            !cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || cJSON_GetArraySize(shape) > 4)
            fatal("%s: tensor '%s' has a malformed header entry", s->path, t->string);
        double nel = 1;
        const cJSON* d;
        cJSON_ArrayForEach(d, shape) {
            double v = cJSON_IsNumber(d) ? d->valuedouble : -1;
            if (!(v >= 0 && v <= 1099511627776.0) || v != floor(v))
                fatal("%s: tensor '%s' has an impossible shape", s->path, t->string);
            nel *= v;
        }
        if (nel > 1099511627776.0)
            fatal("%s: tensor '%s' has an impossible shape", s->path, t->string);
        const char* ty = dt->valuestring;
        double esz =
            !strcmp(ty, "F64") || !strcmp(ty, "I64") || !strcmp(ty, "U64")   ? 8
            : !strcmp(ty, "F32") || !strcmp(ty, "I32") || !strcmp(ty, "U32") ? 4
            : !strcmp(ty, "F16") || !strcmp(ty, "BF16") || !strcmp(ty, "I16") || !strcmp(ty, "U16")
                ? 2
            : !strcmp(ty, "I8") || !strcmp(ty, "U8") || !strcmp(ty, "BOOL") ||
                    !strcmp(ty, "F8_E4M3") || !strcmp(ty, "F8_E5M2")
                ? 1
                : 0;
        if (!esz) fatal("%s: tensor '%s' has an unknown dtype '%s'", s->path, t->string, ty);
        double b = cJSON_IsNumber(cJSON_GetArrayItem(offs, 0))
                       ? cJSON_GetArrayItem(offs, 0)->valuedouble
                       : -1,
               e = cJSON_IsNumber(cJSON_GetArrayItem(offs, 1))
                       ? cJSON_GetArrayItem(offs, 1)->valuedouble
                       : -1;
        if (!(b >= 0 && e >= b) || b != floor(b) || e != floor(e) || e - b != nel * esz)
            fatal("%s: tensor '%s' data_offsets [%.0f, %.0f) do not hold its %.0f bytes", s->path,
                  t->string, b, e, nel * esz);
        sp[k++] = (Span){b, e, t->string};
    }
    qsort(sp, (size_t)k, sizeof(Span), span_cmp);
    double at = 0, data = (double)(s->size - s->data_start);
    for (int i = 0; i < k; i++) {
        if (sp[i].begin != at)
            fatal("%s: tensor '%s' data at byte %.0f %s the tensor before (which ends at %.0f)",
                  s->path, sp[i].name, sp[i].begin,
                  sp[i].begin < at ? "overlaps" : "leaves a gap after", at);
        at = sp[i].end;
    }
    if (at != data)
        fatal(
            "%s: the tensors' data ends at byte %.0f of a %.0f-byte data section; truncated or "
            "corrupt",
            s->path, at, data);
    fatal_release(sp);
}

static void safe_open(SafeFile* s, const char* path) {
    memset(s, 0, sizeof(*s));
    s->path = path;
    int fd = open(path, O_RDONLY);
    if (fd < 0) fatal("%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        fatal("%s: not a regular file", path);
    }
    s->size = (size_t)st.st_size;
    if (s->size < 8) {
        close(fd);
        fatal("%s: truncated safetensors file (%zu bytes)", path, s->size);
    }
    s->map = mmap(NULL, s->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (s->map == MAP_FAILED) fatal("%s: cannot map: %s", path, strerror(errno));
    uint64_t hl;
    memcpy(&hl, s->map, 8);
    const char* bad = NULL;
    if (hl > s->size - 8 || hl > (100u << 20)) {
        bad = "does not fit in the file";
    } else {
        s->header = cJSON_ParseWithLength((const char*)s->map + 8, (size_t)hl);
        if (!s->header || !cJSON_IsObject(s->header)) bad = "is not a JSON object";
    }
    if (bad) {
        cJSON_Delete(s->header);
        munmap(s->map, s->size);
        fatal("%s: the safetensors header (%llu bytes) %s (%zu bytes)", path,
              (unsigned long long)hl, bad, s->size);
    }
    s->data_start = 8 + (size_t)hl;
}

static void safe_close(SafeFile* s) {
    cJSON_Delete(s->header);
    munmap(s->map, s->size);
}

static void safe_release(void* p) {
    safe_close(p);
    free(p);
}

static void json_release(void* p) { cJSON_Delete(p); }

/* Load tensor name (shape rows x cols in the file; 1-D when rows == 0) into dst; transposed
 * (stored as cols x rows, GPT-2's Conv1D) when transpose is set. Returns 0, or -1 if absent
 * and optional. */
static int safe_tensor(const SafeFile* s, const char* name, float* dst, size_t rows, size_t cols,
                       int transpose, int optional) {
    cJSON* t = cJSON_GetObjectItemCaseSensitive(s->header, name);
    if (!t) {
        if (optional) return -1;
        fatal("%s: tensor '%s' is missing", s->path, name);
    }
    cJSON* dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
    cJSON* shape = cJSON_GetObjectItemCaseSensitive(t, "shape");
    cJSON* offs = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(shape) || cJSON_GetArraySize(offs) != 2)
        fatal("%s: tensor '%s' has a malformed header entry", s->path, name);
    size_t n = 1;
    int nd = cJSON_GetArraySize(shape);
    size_t dims[4] = {0};
    for (int i = 0; i < nd && i < 4; i++) {
        dims[i] = (size_t)cJSON_GetArrayItem(shape, i)->valuedouble;
        n *= dims[i];
    }
    size_t want_r = transpose ? cols : rows, want_c = transpose ? rows : cols;
    int ok = rows == 0 ? (nd == 1 && dims[0] == cols)
                       : (nd == 2 && dims[0] == want_r && dims[1] == want_c);
    if (!ok)
        fatal("%s: tensor '%s' has shape [%zu, %zu], expected [%zu, %zu]", s->path, name, dims[0],
              nd > 1 ? dims[1] : 0, rows ? want_r : cols, rows ? want_c : 0);
    size_t esz = !strcmp(dt->valuestring, "F32")                                         ? 4
                 : (!strcmp(dt->valuestring, "F16") || !strcmp(dt->valuestring, "BF16")) ? 2
                                                                                         : 0;
    if (!esz)
        fatal("%s: tensor '%s' has dtype %s (supported: F32, F16, BF16)", s->path, name,
              dt->valuestring);
    double b = cJSON_GetArrayItem(offs, 0)->valuedouble,
           e = cJSON_GetArrayItem(offs, 1)->valuedouble;
    if (b < 0 || e < b || e - b != (double)(n * esz) || s->data_start + e > (double)s->size)
        fatal("%s: tensor '%s' data [%.0f, %.0f) lies outside the file or has the wrong size",
              s->path, name, b, e);
    const uint8_t* src = s->map + s->data_start + (size_t)b;
    for (size_t i = 0; i < n; i++) {
        float v;
        if (esz == 4)
            memcpy(&v, src + 4 * i, 4);
        else {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            v = dt->valuestring[0] == 'B' ? bf16_to_f32(h) : f16_to_f32(h);
        }
        size_t r = i / want_c, c = i % want_c; /* position in the file's layout */
        dst[transpose ? c * cols + r : i] = v;
    }
    return 0;
}

/* An integer of config.json, or dflt when absent; -1 (refused by model_config_check) when it is
 * not an integer that fits. */
static int json_int(cJSON* cfg, const char* key, int dflt) {
    cJSON* v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (!v) return dflt;
    if (!cJSON_IsNumber(v) || !(fabs(v->valuedouble) <= INT_MAX) ||
        v->valuedouble != floor(v->valuedouble))
        return -1;
    return (int)v->valuedouble;
}

static double json_num(cJSON* cfg, const char* key, double dflt) {
    cJSON* v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (!v) return dflt;
    return cJSON_IsNumber(v) ? v->valuedouble : NAN; /* NAN: refused by model_config_check */
}

/* HF LLaMA q/k rows use the half-split rotation; ours (GGUF's) rotates adjacent pairs.
 * Row (h, 2i + c) of ours is row (h, c * hs/2 + i) of the file. */
static void unpermute_rope(float* w, int heads, int hs, size_t cols) {
    float* tmp = mallocCheck(sizeof(float) * hs * cols);
    for (int h = 0; h < heads; h++) {
        float* blk = w + (size_t)h * hs * cols;
        memcpy(tmp, blk, sizeof(float) * hs * cols);
        for (int i = 0; i < hs / 2; i++)
            for (int c = 0; c < 2; c++)
                memcpy(blk + (size_t)(2 * i + c) * cols, tmp + (size_t)(c * hs / 2 + i) * cols,
                       sizeof(float) * cols);
    }
    free(tmp);
}

static void load_safetensors(Model* m, const char* path, const FocusConfig* fc, ModelInfo* info) {
    char file[4096], cfgpath[4096];
    struct stat st;
    if (!stat(path, &st) && S_ISDIR(st.st_mode)) {
        snprintf(file, sizeof file, "%s/model.safetensors", path);
        snprintf(cfgpath, sizeof cfgpath, "%s/config.json", path);
    } else {
        snprintf(file, sizeof file, "%s", path);
        const char* slash = strrchr(path, '/');
        snprintf(cfgpath, sizeof cfgpath, "%.*sconfig.json", slash ? (int)(slash - path + 1) : 0,
                 path);
    }
    SafeFile s;
    safe_open(&s, file);
    SafeFile* held = mallocCheck(sizeof *held); /* released by fatal_release at the end */
    *held = s;
    fatal_defer(safe_release, held);
    safe_check_entries(&s);
    char* cfgtext = read_file_opt(cfgpath, NULL);
    const int have_cfg = cfgtext != NULL;
    cJSON* hc = cfgtext ? cJSON_Parse(cfgtext) : NULL;
    free(cfgtext);
    if (hc)
        fatal_defer(json_release, hc);
    else if (have_cfg)
        fatal("%s: not valid JSON", cfgpath);
    /* Names may carry a "transformer." (GPT-2) prefix. */
    const char* pre =
        cJSON_GetObjectItemCaseSensitive(s.header, "transformer.wte.weight") ? "transformer." : "";
    char n[256];
    snprintf(n, sizeof n, "%swte.weight", pre);
    int gpt2 = cJSON_GetObjectItemCaseSensitive(s.header, n) != NULL;
    int llama = cJSON_GetObjectItemCaseSensitive(s.header, "model.embed_tokens.weight") != NULL;
    if (!gpt2 && !llama)
        fatal(
            "%s: neither GPT-2 ('wte.weight') nor LLaMA ('model.embed_tokens.weight') tensor names "
            "found",
            file);
    ModelConfig cfg = {0};
    cJSON* emb = cJSON_GetObjectItemCaseSensitive(s.header, gpt2 ? n : "model.embed_tokens.weight");
    cJSON* shp = cJSON_GetObjectItemCaseSensitive(emb, "shape");
    if (cJSON_GetArraySize(shp) != 2) fatal("%s: the token embedding is not a matrix", file);
    /* shapes are integers below 2^40 (safe_open); larger than an int is refused later */
    cfg.V = (int)fmin(cJSON_GetArrayItem(shp, 0)->valuedouble, -1.0 + INT_MAX);
    cfg.C = (int)fmin(cJSON_GetArrayItem(shp, 1)->valuedouble, -1.0 + INT_MAX);
    /* Count layers. */
    for (cfg.L = 0;; cfg.L++) {
        snprintf(n, sizeof n,
                 gpt2 ? "%sh.%d.ln_1.weight" : "%smodel.layers.%d.input_layernorm.weight",
                 gpt2 ? pre : "", cfg.L);
        if (!cJSON_GetObjectItemCaseSensitive(s.header, n)) break;
    }
    if (cfg.L == 0) fatal("%s: no transformer layers found", file);
    if (gpt2) {
        snprintf(n, sizeof n, "%swpe.weight", pre);
        cJSON* wpe = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(s.header, n),
                                                      "shape");
        if (cJSON_GetArraySize(wpe) != 2)
            fatal("%s: tensor '%s' is missing or not a matrix", file, n);
        if (!hc && cfg.C % 64)
            fatal(
                "%s: cannot infer the head count of a GPT-2 of width %d; put its config.json "
                "(n_head) beside it",
                file, cfg.C);
        cfg = (ModelConfig){ARCH_GPT2,
                            cfg.L,
                            cfg.C,
                            json_int(hc, "n_head", cfg.C / 64),
                            0,
                            4 * cfg.C,
                            cfg.V,
                            (int)fmin(cJSON_GetArrayItem(wpe, 0)->valuedouble, -1.0 + INT_MAX),
                            (float)json_num(hc, "layer_norm_epsilon", 1e-5),
                            0,
                            0,
                            1,
                            0,
                            0};
        cfg.NKV = cfg.NH;
        cfg.F = json_int(hc, "n_inner", 4 * cfg.C);
    } else {
        if (!hc)
            fatal("%s: a LLaMA safetensors model needs its config.json (looked for %s)", file,
                  cfgpath);
        cfg.arch = ARCH_LLAMA;
        cfg.NH = json_int(hc, "num_attention_heads", 0);
        cfg.NKV = json_int(hc, "num_key_value_heads", cfg.NH);
        cfg.F = json_int(hc, "intermediate_size", 0);
        cfg.maxT = json_int(hc, "max_position_embeddings", 2048);
        cfg.eps = (float)json_num(hc, "rms_norm_eps", 1e-5);
        cfg.rope_theta = (float)json_num(hc, "rope_theta", 10000);
        cfg.tied = cJSON_GetObjectItemCaseSensitive(s.header, "lm_head.weight") == NULL;
        /* biases on any of q, k, v, or a config that says so (Qwen2): all three are needed */
        cJSON* ab = cJSON_GetObjectItemCaseSensitive(hc, "attention_bias");
        cJSON* mt = cJSON_GetObjectItemCaseSensitive(hc, "model_type");
        cfg.qkv_bias =
            cJSON_IsTrue(ab) || (cJSON_IsString(mt) && !strcmp(mt->valuestring, "qwen2"));
        for (const char* const* b = (const char* const[]){"q", "k", "v", NULL}; *b; b++) {
            snprintf(n, sizeof n, "model.layers.0.self_attn.%s_proj.bias", *b);
            if (cJSON_GetObjectItemCaseSensitive(s.header, n)) cfg.qkv_bias = 1;
        }
    }
    check_shape(file, &cfg, (double)s.size, 2.0);
    model_build(m, &cfg, fc);
    Params* p = &m->params;
    const int hs = cfg.C / cfg.NH;
    const size_t C = cfg.C, F = cfg.F, Q = (size_t)(cfg.NH + 2 * cfg.NKV) * hs,
                 FC = gpt2 ? F : 2 * F;
    if (gpt2) {
        snprintf(n, sizeof n, "%swte.weight", pre);
        safe_tensor(&s, n, p->wte, cfg.V, C, 0, 0);
        snprintf(n, sizeof n, "%swpe.weight", pre);
        safe_tensor(&s, n, p->wpe, cfg.maxT, C, 0, 0);
        for (int l = 0; l < cfg.L; l++) {
#define G(fmt, dst, rows, cols, tr) \
    (snprintf(n, sizeof n, "%sh.%d." fmt, pre, l), safe_tensor(&s, n, dst, rows, cols, tr, 0))
            G("ln_1.weight", p->ln1w + l * C, 0, C, 0);
            G("ln_1.bias", p->ln1b + l * C, 0, C, 0);
            G("attn.c_attn.weight", p->qkvw + l * Q * C, Q, C, 1);
            G("attn.c_attn.bias", p->qkvb + l * Q, 0, Q, 0);
            G("attn.c_proj.weight", p->attprojw + l * C * C, C, C, 1);
            G("attn.c_proj.bias", p->attprojb + l * C, 0, C, 0);
            G("ln_2.weight", p->ln2w + l * C, 0, C, 0);
            G("ln_2.bias", p->ln2b + l * C, 0, C, 0);
            G("mlp.c_fc.weight", p->fcw + l * FC * C, F, C, 1);
            G("mlp.c_fc.bias", p->fcb + l * FC, 0, F, 0);
            G("mlp.c_proj.weight", p->fcprojw + l * C * F, C, F, 1);
            G("mlp.c_proj.bias", p->fcprojb + l * C, 0, C, 0);
#undef G
        }
        snprintf(n, sizeof n, "%sln_f.weight", pre);
        safe_tensor(&s, n, p->lnfw, 0, C, 0, 0);
        snprintf(n, sizeof n, "%sln_f.bias", pre);
        safe_tensor(&s, n, p->lnfb, 0, C, 0, 0);
    } else {
        safe_tensor(&s, "model.embed_tokens.weight", p->wte, cfg.V, C, 0, 0);
        for (int l = 0; l < cfg.L; l++) {
#define G(fmt, dst, rows, cols) \
    (snprintf(n, sizeof n, "model.layers.%d." fmt, l), safe_tensor(&s, n, dst, rows, cols, 0, 0))
            float* qkv = p->qkvw + l * Q * C;
            size_t nq = (size_t)cfg.NH * hs, nk = (size_t)cfg.NKV * hs;
            G("input_layernorm.weight", p->ln1w + l * C, 0, C);
            G("self_attn.q_proj.weight", qkv, nq, C);
            G("self_attn.k_proj.weight", qkv + nq * C, nk, C);
            G("self_attn.v_proj.weight", qkv + (nq + nk) * C, nk, C);
            unpermute_rope(qkv, cfg.NH, hs, C);
            unpermute_rope(qkv + nq * C, cfg.NKV, hs, C);
            if (cfg.qkv_bias) {
                float* b = p->qkvb + l * Q;
                G("self_attn.q_proj.bias", b, 0, nq);
                G("self_attn.k_proj.bias", b + nq, 0, nk);
                G("self_attn.v_proj.bias", b + nq + nk, 0, nk);
                unpermute_rope(b, cfg.NH, hs, 1);
                unpermute_rope(b + nq, cfg.NKV, hs, 1);
            }
            G("self_attn.o_proj.weight", p->attprojw + l * C * C, C, C);
            G("post_attention_layernorm.weight", p->ln2w + l * C, 0, C);
            G("mlp.gate_proj.weight", p->fcw + l * FC * C, F, C);
            G("mlp.up_proj.weight", p->fcw + l * FC * C + F * C, F, C);
            G("mlp.down_proj.weight", p->fcprojw + l * C * F, C, F);
#undef G
        }
        safe_tensor(&s, "model.norm.weight", p->lnfw, 0, C, 0, 0);
        if (!cfg.tied) safe_tensor(&s, "lm_head.weight", p->lmhead, cfg.V, C, 0, 0);
    }
    snprintf(info->format, sizeof info->format, "safetensors");
    snprintf(info->arch, sizeof info->arch, "%s", gpt2 ? "gpt2" : "llama");
    snprintf(info->name, sizeof info->name, "%s", base_name(path));
    if (hc) fatal_release(hc);
    fatal_release(held);
}

/* ------------------------------------------------------------------ dispatch */

static void model_load_any(Model* m, const char* path, const FocusConfig* fc, ModelInfo* info,
                           int lean);
static void close_file(void* fp) { fclose(fp); }

void model_load(Model* m, const char* path, const FocusConfig* fc, ModelInfo* info) {
    model_load_any(m, path, fc, info, 0);
    check_finite(m, path);
}

int model_load_lean(Model* m, const char* path, const FocusConfig* fc, ModelInfo* info, char* why,
                    size_t n) {
    /* a full load first only to learn the shape would cost what this avoids: read the header */
    GGUFFile f;
    char err[512];
    if (gguf_open(&f, path, err, sizeof err)) return snprintf(why, n, "%s", err), -1;
    uint64_t alen;
    const char* a = gguf_get_str(&f, "general.architecture", &alen);
    int llama =
        a && ((alen == 5 && !memcmp(a, "llama", 5)) || (alen == 5 && !memcmp(a, "qwen2", 5)));
    gguf_close(&f);
    if (!llama) return snprintf(why, n, "native weights are read for llama models only"), -1;
    model_load_any(m, path, fc, info, 1);
    if (model_load_native(m, path, why, n)) {
        model_free(m);
        return -1;
    }
    m->decode_only = 1;
    return 0;
}

static void model_load_any(Model* m, const char* path, const FocusConfig* fc, ModelInfo* info,
                           int lean) {
    ModelInfo local;
    if (!info) info = &local;
    memset(info, 0, sizeof(*info));
    struct stat st;
    if (stat(path, &st)) fatal("%s: cannot open model: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        load_safetensors(m, path, fc, info);
        return;
    }
    FILE* fp = fopen(path, "rb");
    if (!fp) fatal("%s: cannot open model: %s", path, strerror(errno));
    uint8_t head[9] = {0};
    size_t got = fread(head, 1, 9, fp);
    int32_t magic;
    memcpy(&magic, head, 4);
    if (got >= 4 && !memcmp(head, "GGUF", 4)) {
        fclose(fp);
        load_gguf(m, path, fc, info, lean);
    } else if (got >= 4 && magic == 20240326) {
        rewind(fp);
        fatal_defer(close_file, fp); /* closed on the way out of an error too */
        load_llmc(m, path, fp, fc, info);
        fatal_release(fp);
    } else if (got == 9 && head[8] == '{') {
        fclose(fp);
        load_safetensors(m, path, fc, info);
    } else {
        fclose(fp);
        fatal("%s: unrecognised model format (expected GGUF, safetensors or an llm.c checkpoint)",
              path);
    }
}

/* ------------------------------------------------------------------ native decode weights */

static void native_release(void* f) {
    gguf_close(f);
    free(f);
}

int model_load_native(Model* m, const char* path, char* why, size_t n) {
    const ModelConfig* c = &m->cfg;
    if (c->arch != ARCH_LLAMA)
        return snprintf(why, n, "native weights are read for llama models only"), -1;
    GGUFFile f;
    char err[512];
    if (gguf_open(&f, path, err, sizeof err)) return snprintf(why, n, "%s", err), -1;
    const int hs = c->C / c->NH, L = c->L;
    QMatrix* q = callocCheck((size_t)L * NATIVE_PER_LAYER + 2, sizeof(QMatrix));
    static const char* const names[NATIVE_PER_LAYER] = {
        "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
    for (int i = 0; i <= L * NATIVE_PER_LAYER + 1; i++) { /* the layers, the head, the embedding */
        const int l = i / NATIVE_PER_LAYER, k = i % NATIVE_PER_LAYER,
                  head = i >= L * NATIVE_PER_LAYER;
        const int rows = head               ? c->V
                         : k == NATIVE_Q    ? c->NH * hs
                         : k <= NATIVE_V    ? c->NKV * hs
                         : k == NATIVE_O    ? c->C
                         : k == NATIVE_DOWN ? c->C
                                            : c->F,
                  cols = !head && k == NATIVE_DOWN ? c->F : c->C;
        char name[96];
        if (head)
            snprintf(name, sizeof name, "%s",
                     c->tied || i > L * NATIVE_PER_LAYER ? "token_embd.weight" : "output.weight");
        else
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, names[k]);
        const GGUFTensor* t = gguf_tensor(&f, name);
        const char* bad =
            !t                                                                ? "is missing"
            : t->ne[0] != (uint64_t)cols || t->nelem != (uint64_t)rows * cols ? "has another shape"
            : !qtype_supported((int)t->type) ? "has a type decode cannot read in place"
                                             : NULL;
        if (bad) {
            snprintf(why, n,
                     "tensor '%s' %s (%s; native decode reads F32, F16, BF16, Q4_0, Q4_1, Q8_0, "
                     "Q4_K, Q5_K, Q6_K)",
                     name, bad, t ? ggml_type_name(t->type) : "-");
            free(q);
            gguf_close(&f);
            return -1;
        }
        q[i] = (QMatrix){(int)t->type, rows, cols, qtype_row_bytes((int)t->type, cols), t->data};
    }
    GGUFFile* owner = mallocCheck(sizeof *owner);
    *owner = f;
    free(m->native);
    if (m->native_release) m->native_release(m->native_owner);
    m->native = q, m->native_owner = owner, m->native_release = native_release;
    return 0;
}
