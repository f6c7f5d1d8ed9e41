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
    "wte",      "wpe",  "ln1w",   "ln1b",   "qkvw",   "qkvb",    "attprojw",
    "attprojb", "ln2w", "ln2b",   "fcw",    "fcb",    "fcprojw", "fcprojb",
    "lnfw",     "lnfb", "lmhead", "qnormw", "knormw", "pan",     "pfn"};

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
    if (v == 0) fatal("%s: metadata key '%s' = 0; a model needs at least 1", f->path, full);
    return (int)v;
}

typedef struct {
    const GGUFFile* f;
    ModelConfig cfg;
    int lean;
} GGUFSource;

/* Slab l of parameter tensor t (model_fill) from the GGUF tensors that hold it. lean: the
 * projection matrices and embeddings are left out (zero pages, never touched: they cost no
 * memory), for a model that decodes from the file's blocks. */
static void gguf_slab(void* ctx, int t, int l, real* dst) {
    const GGUFSource* s = ctx;
    const ModelConfig* c = &s->cfg;
    const ParamSpec* p = &model_params[t];
    if (s->lean && p->native) return;
    /* llama and gemma3 files hold q, k, v and gate, up apart (model_param_gguf) */
    const int split = c->arch != ARCH_GPT2, parts = split ? model_param_parts(t) : 1;
    for (int i = 0; i < parts; i++) {
        size_t rows, cols;
        if (split)
            model_param_part(c, t, i, &rows, &cols);
        else
            model_param_shape(c, t, &rows, &cols);
        const char* name = model_param_gguf(t, i, split);
        char n[96];
        if (p->per_layer)
            snprintf(n, sizeof n, "blk.%d.%s", l, name);
        else
            snprintf(n, sizeof n, "%s", name);
        gguf_load_tensor(s->f, n, dst, rows, cols);
        dst += rows * cols;
    }
}

/* A gemma3 file's own keys: the head size (key_length, which value_length must equal), the
 * sliding window and its RoPE base (freq_base_swa; 10000, Gemma 3's, when absent), the period of
 * the global layers (sliding_window_pattern; 6, Gemma 3's, when absent, as llama.cpp assumes).
 * A contradiction is refused naming the key. */
static void gemma3_config(const GGUFFile* f, const char* path, ModelConfig* c) {
    c->hs = gguf_need_int(f, "gemma3", "attention.key_length");
    uint64_t v;
    if (!gguf_get_u64(f, "gemma3.attention.value_length", &v) && v != (uint64_t)c->hs)
        fatal("%s: metadata key 'gemma3.attention.value_length' = %llu differs from key_length %d",
              path, (unsigned long long)v, c->hs);
    c->swa = gguf_need_int(f, "gemma3", "attention.sliding_window");
    c->swa_period = 6;
    if (!gguf_get_u64(f, "gemma3.attention.sliding_window_pattern", &v)) {
        if (v < 1 || v > 256)
            fatal("%s: metadata key 'gemma3.attention.sliding_window_pattern' = %llu (1 to 256)",
                  path, (unsigned long long)v);
        c->swa_period = (int)v;
    }
    if (gguf_get_f32(f, "gemma3.rope.freq_base_swa", &c->rope_local)) c->rope_local = 10000.0f;
    if (c->swa >= c->maxT)
        fatal(
            "%s: metadata key 'gemma3.attention.sliding_window' = %d is not below the context "
            "length %d",
            path, c->swa, c->maxT);
    if (c->NH % c->NKV)
        fatal(
            "%s: metadata key 'gemma3.attention.head_count' = %d is not a multiple of "
            "head_count_kv = %d",
            path, c->NH, c->NKV);
}

static void load_gguf(Model* m, const char* path, const FocusConfig* fc, ModelInfo* info, int lean,
                      const ModelLayout* lay) {
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
    else if (!strcmp(arch, "gemma3"))
        cfg.arch = ARCH_GEMMA3;
    else
        fatal("%s: architecture '%s' is not supported (supported: llama, qwen2, gpt2, gemma3)",
              path, arch);
    cfg.L = gguf_need_int(&f, arch, "block_count");
    cfg.C = gguf_need_int(&f, arch, "embedding_length");
    cfg.NH = gguf_need_int(&f, arch, "attention.head_count");
    uint64_t nkv;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.head_count_kv", arch);
    cfg.NKV = gguf_get_u64(&f, key, &nkv) ? cfg.NH : nkv > INT_MAX ? -1 : (int)nkv;
    if (cfg.NKV == 0) fatal("%s: metadata key '%s' = 0; a model needs at least 1", path, key);
    cfg.F = gguf_need_int(&f, arch, "feed_forward_length");
    cfg.maxT = gguf_need_int(&f, arch, "context_length");
    snprintf(key, sizeof key, "%s.attention.layer_norm_%s", arch,
             cfg.arch != ARCH_GPT2 ? "rms_epsilon" : "epsilon");
    if (gguf_get_f32(&f, key, &cfg.eps)) cfg.eps = 1e-5f;
    snprintf(key, sizeof key, "%s.rope.freq_base", arch);
    if (gguf_get_f32(&f, key, &cfg.rope_theta)) cfg.rope_theta = 10000.0f;
    const GGUFTensor* emb = gguf_tensor(&f, "token_embd.weight");
    if (!emb || emb->n_dims != 2)
        fatal("%s: tensor 'token_embd.weight' is missing or not a matrix", path);
    cfg.V = emb->ne[1] > INT_MAX ? -1 : (int)emb->ne[1];
    cfg.tied = gguf_tensor(&f, "output.weight") == NULL;
    cfg.qkv_bias = cfg.arch == ARCH_LLAMA && gguf_tensor(&f, "blk.0.attn_q.bias") != NULL;
    if (cfg.arch == ARCH_GEMMA3) gemma3_config(&f, path, &cfg);
    int hs = cfg.NH ? model_head_size(&cfg) : 0;
    snprintf(key, sizeof key, "%s.rope.dimension_count", arch);
    uint64_t rdim;
    if (cfg.arch != ARCH_GPT2 && !gguf_get_u64(&f, key, &rdim) && (int)rdim != hs)
        fatal(
            "%s: partial rotary embeddings (rope.dimension_count %llu, head size %d) are not "
            "supported",
            path, (unsigned long long)rdim, hs);
    check_shape(path, &cfg, (double)f.size, 0.5); /* no supported type takes under 4 bits */
    model_build_slice(m, &cfg, fc, lay);
    GGUFSource src = {&f, cfg, lean};
    model_fill(m, &cfg, &(WeightSource){&src, gguf_slab});
    uint64_t add_bos = 0, bos;
    if (!gguf_get_u64(&f, "tokenizer.ggml.add_bos_token", &add_bos) && add_bos &&
        !gguf_get_u64(&f, "tokenizer.ggml.bos_token_id", &bos) && bos < (uint64_t)cfg.V)
        m->bos = (int)bos;
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
typedef struct {
    FILE* fp;
    const char* path;
    ModelConfig cfg;
    int Vp;
    size_t esz;
    uint16_t* tmp;
} LlmcSource;

/* The file holds the slabs in the order model_fill asks for them (llm.c's order is ours): read
 * on. wte has Vp rows, of which the first V are kept. */
static void llmc_slab(void* ctx, int t, int l, real* dst) {
    (void)l;
    LlmcSource* s = ctx;
    const size_t n = model_param_slab(&s->cfg, t),
                 nfile = t == P_WTE ? (size_t)s->Vp * s->cfg.C : n;
    if (s->esz == 4) {
        if (fread(dst, 4, n, s->fp) != n) fatal("%s: truncated parameter data", s->path);
        if (nfile > n && fseek(s->fp, (long)((nfile - n) * 4), SEEK_CUR))
            fatal("%s: seek failed", s->path);
        return;
    }
    if (fread(s->tmp, 2, nfile, s->fp) != nfile) fatal("%s: truncated parameter data", s->path);
    for (size_t j = 0; j < n; j++) dst[j] = bf16_to_f32(s->tmp[j]);
}

static void load_llmc(Model* m, const char* path, FILE* fp, const FocusConfig* fc, ModelInfo* info,
                      const ModelLayout* lay) {
    int32_t h[256];
    if (fread(h, 4, 256, fp) != 256) fatal("%s: truncated llm.c header", path);
    if (h[1] != 3 && h[1] != 5)
        fatal("%s: llm.c version %d is not supported (3 = fp32, 5 = bf16)", path, h[1]);
    /* F = 4 C is formed only once C is known to be small (no signed overflow) */
    ModelConfig cfg = {.arch = ARCH_GPT2,
                       .L = h[4],
                       .C = h[6],
                       .NH = h[5],
                       .NKV = h[5],
                       .F = h[6] > 0 && h[6] <= 65536 ? 4 * h[6] : -1,
                       .V = h[3],
                       .maxT = h[2],
                       .eps = 1e-5f,
                       .tied = 1};
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
    model_build_slice(m, &cfg, fc, lay);
    size_t biggest = (size_t)Vp * cfg.C; /* the bf16 staging of the largest slab */
    for (int t = 0; t < NUM_PARAM_TENSORS; t++)
        if (model_param_slab(&cfg, t) > biggest) biggest = model_param_slab(&cfg, t);
    LlmcSource src = {fp, path, cfg, Vp, esz, mallocCheck(sizeof(uint16_t) * biggest)};
    fatal_defer(free, src.tmp);
    model_fill(m, &cfg, &(WeightSource){&src, llmc_slab});
    fatal_release(src.tmp);
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
    int fd = open(path, O_RDONLY | O_NONBLOCK); /* a FIFO must not block: refused below */
    if (fd < 0) fatal("%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        fatal("%s: not a regular file (a FIFO or device)", path);
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

static void json_release(void* p) { cJSON_Delete(p); }

/* Load tensor name (shape rows x cols in the file; 1-D when rows == 0) into dst; transposed
 * (stored as cols x rows, GPT-2's Conv1D) when transpose is set. Returns 0, or -1 if absent
 * and optional. */
/* The files of one checkpoint: one, or the shards a model.safetensors.index.json names. */
typedef struct {
    int n;
    SafeFile* f;
    const char* name; /* what errors name for the whole checkpoint */
    int own_paths;    /* the files' paths were allocated here (an index's shards) */
} SafeSet;

/* Tensor `name`'s header entry, and the file that holds it in *in; NULL when no file has it. */
static cJSON* safe_entry(const SafeSet* set, const char* name, const SafeFile** in) {
    for (int i = 0; i < set->n; i++) {
        cJSON* t = cJSON_GetObjectItemCaseSensitive(set->f[i].header, name);
        if (t && strcmp(name, "__metadata__")) {
            if (in) *in = &set->f[i];
            return t;
        }
    }
    return NULL;
}

static int safe_tensor(const SafeSet* set, const char* name, float* dst, size_t rows, size_t cols,
                       int transpose, int optional) {
    const SafeFile* s = NULL;
    cJSON* t = safe_entry(set, name, &s);
    if (!t) {
        if (optional) return -1;
        fatal("%s: tensor '%s' is missing", set->name, name);
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

typedef struct {
    const SafeSet* set;
    ModelConfig cfg;
    const char* pre; /* GPT-2 names' prefix: "" or "transformer." */
} SafeSource;

/* Slab l of parameter tensor t (model_fill) from the safetensors tensors that hold it, named in
 * model_params: GPT-2's Conv1D matrices transposed, LLaMA's q and k rows from the half-split
 * rotation to ours. */
static void safe_slab(void* ctx, int t, int l, real* dst) {
    const SafeSource* s = ctx;
    const SafeSet* set = s->set;
    const ModelConfig* c = &s->cfg;
    const ParamSpec* p = &model_params[t];
    const int gpt2 = c->arch == ARCH_GPT2, parts = gpt2 ? 1 : model_param_parts(t);
    if (gpt2 ? !p->hf_gpt2 : !p->hf_part[0])
        fatal("%s: internal: %s has no tensor %s", set->name, gpt2 ? "GPT-2" : "LLaMA", p->name);
    real* d = dst;
    for (int i = 0; i < parts; i++) {
        size_t rows, cols;
        if (gpt2)
            model_param_shape(c, t, &rows, &cols);
        else
            model_param_part(c, t, i, &rows, &cols);
        char n[256];
        const char* name = gpt2 ? p->hf_gpt2 : p->hf_part[i];
        if (p->per_layer)
            snprintf(n, sizeof n, gpt2 ? "%sh.%d.%s" : "%smodel.layers.%d.%s", gpt2 ? s->pre : "",
                     l, name);
        else
            snprintf(n, sizeof n, "%s%s", gpt2 ? s->pre : "", name);
        /* a vector's shape is (0, n) here; GPT-2's Conv1D projections are stored transposed */
        safe_tensor(set, n, d, rows == 1 ? 0 : rows, cols, gpt2 && p->proj >= 0, 0);
        d += rows * cols;
    }
    if (!gpt2 && (t == P_QKVW || t == P_QKVB)) { /* q and k heads: to our rotation's rows */
        const size_t hs = model_head_size(c), C = t == P_QKVW ? (size_t)c->C : 1;
        unpermute_rope(dst, c->NH, (int)hs, C);
        unpermute_rope(dst + (size_t)c->NH * hs * C, c->NKV, (int)hs, C);
    }
}

static void safe_set_release(void* p) {
    SafeSet* set = p;
    for (int i = 0; i < set->n; i++) {
        safe_close(&set->f[i]);
        if (set->own_paths) free((char*)set->f[i].path);
    }
    free(set->f);
    free(set);
}

/* The shards a model.safetensors.index.json names in its weight_map (each once), opened and
 * checked, into set. */
static void safe_open_index(SafeSet* set, const char* index, const char* dir) {
    char* text = read_file_opt(index, NULL);
    if (!text) fatal("%s: cannot read: %s", index, strerror(errno));
    cJSON* j = cJSON_Parse(text);
    free(text);
    if (!j) fatal("%s: not valid JSON", index);
    fatal_defer(json_release, j);
    cJSON* map = cJSON_GetObjectItemCaseSensitive(j, "weight_map");
    if (!cJSON_IsObject(map) || !map->child)
        fatal("%s: no weight_map naming the checkpoint's files", index);
    const cJSON* e;
    cJSON_ArrayForEach(e, map) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || !e->valuestring[0])
            fatal("%s: weight_map entry '%s' is not a file name in the same folder", index,
                  e->string);
        int seen = 0;
        for (int i = 0; i < set->n && !seen; i++)
            seen = !strcmp(base_name(set->f[i].path), e->valuestring);
        if (seen) continue;
        char* path = mallocCheck(strlen(dir) + strlen(e->valuestring) + 2);
        sprintf(path, "%s/%s", dir, e->valuestring);
        set->f = reallocCheck(set->f, sizeof(SafeFile) * (size_t)(set->n + 1));
        set->own_paths = 1;
        fatal_defer(free, path); /* until the set holds it */
        safe_open(&set->f[set->n], path);
        fatal_forget(path);
        set->n++;
        safe_check_entries(&set->f[set->n - 1]);
    }
    cJSON_ArrayForEach(e, map) { /* each tensor in the file the index says */
        const SafeFile* in = NULL;
        if (!safe_entry(set, e->string, &in) || strcmp(base_name(in->path), e->valuestring))
            fatal("%s: tensor '%s' is not in %s, where the index puts it", index, e->string,
                  e->valuestring);
    }
    fatal_release(j);
}

static void load_safetensors(Model* m, const char* path, const FocusConfig* fc, ModelInfo* info,
                             const ModelLayout* lay) {
    char file[4096], cfgpath[4096], index[4096];
    struct stat st;
    const int dir = !stat(path, &st) && S_ISDIR(st.st_mode);
    const size_t plen = strlen(path);
    const int is_index = !dir && plen >= 11 && !strcmp(path + plen - 11, ".index.json");
    if (dir) {
        snprintf(file, sizeof file, "%s/model.safetensors", path);
        snprintf(index, sizeof index, "%s/model.safetensors.index.json", path);
        snprintf(cfgpath, sizeof cfgpath, "%s/config.json", path);
    } else {
        snprintf(file, sizeof file, "%s", path);
        snprintf(index, sizeof index, "%s", path);
        const char* slash = strrchr(path, '/');
        snprintf(cfgpath, sizeof cfgpath, "%.*sconfig.json", slash ? (int)(slash - path + 1) : 0,
                 path);
    }
    SafeSet* set = callocCheck(1, sizeof *set); /* released by fatal_release at the end */
    fatal_defer(safe_set_release, set);
    if (is_index || (dir && access(file, F_OK) && !access(index, F_OK))) {
        char folder[4096];
        const char* slash = strrchr(index, '/');
        snprintf(folder, sizeof folder, "%.*s", slash ? (int)(slash - index) : 1,
                 slash ? index : ".");
        set->name = index;
        safe_open_index(set, index, folder);
        snprintf(file, sizeof file, "%s", index);
    } else {
        set->name = file;
        set->f = mallocCheck(sizeof(SafeFile));
        safe_open(&set->f[0], file);
        set->n = 1;
        safe_check_entries(&set->f[0]);
    }
    size_t total = 0;
    for (int i = 0; i < set->n; i++) total += set->f[i].size;
    char* cfgtext = read_file_opt(cfgpath, NULL);
    const int have_cfg = cfgtext != NULL;
    cJSON* hc = cfgtext ? cJSON_Parse(cfgtext) : NULL;
    free(cfgtext);
    if (hc)
        fatal_defer(json_release, hc);
    else if (have_cfg)
        fatal("%s: not valid JSON", cfgpath);
    /* Names may carry a "transformer." (GPT-2) prefix. */
    const char* pre = safe_entry(set, "transformer.wte.weight", NULL) ? "transformer." : "";
    char n[256];
    snprintf(n, sizeof n, "%swte.weight", pre);
    int gpt2 = safe_entry(set, n, NULL) != NULL;
    int llama = safe_entry(set, "model.embed_tokens.weight", NULL) != NULL;
    if (!gpt2 && !llama)
        fatal(
            "%s: neither GPT-2 ('wte.weight') nor LLaMA ('model.embed_tokens.weight') tensor names "
            "found",
            file);
    ModelConfig cfg = {0};
    cJSON* emb = safe_entry(set, gpt2 ? n : "model.embed_tokens.weight", NULL);
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
        if (!safe_entry(set, n, NULL)) break;
    }
    if (cfg.L == 0) fatal("%s: no transformer layers found", file);
    if (gpt2) {
        snprintf(n, sizeof n, "%swpe.weight", pre);
        cJSON* wpe = cJSON_GetObjectItemCaseSensitive(safe_entry(set, n, NULL), "shape");
        if (cJSON_GetArraySize(wpe) != 2)
            fatal("%s: tensor '%s' is missing or not a matrix", file, n);
        if (!hc && cfg.C % 64)
            fatal(
                "%s: cannot infer the head count of a GPT-2 of width %d; put its config.json "
                "(n_head) beside it",
                file, cfg.C);
        cfg = (ModelConfig){
            .arch = ARCH_GPT2,
            .L = cfg.L,
            .C = cfg.C,
            .NH = json_int(hc, "n_head", cfg.C / 64),
            .F = 4 * cfg.C,
            .V = cfg.V,
            .maxT = (int)fmin(cJSON_GetArrayItem(wpe, 0)->valuedouble, -1.0 + INT_MAX),
            .eps = (float)json_num(hc, "layer_norm_epsilon", 1e-5),
            .tied = 1};
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
        cfg.tied = safe_entry(set, "lm_head.weight", NULL) == NULL;
        /* biases on any of q, k, v, or a config that says so (Qwen2): all three are needed */
        cJSON* ab = cJSON_GetObjectItemCaseSensitive(hc, "attention_bias");
        cJSON* mt = cJSON_GetObjectItemCaseSensitive(hc, "model_type");
        cfg.qkv_bias =
            cJSON_IsTrue(ab) || (cJSON_IsString(mt) && !strcmp(mt->valuestring, "qwen2"));
        for (const char* const* b = (const char* const[]){"q", "k", "v", NULL}; *b; b++) {
            snprintf(n, sizeof n, "model.layers.0.self_attn.%s_proj.bias", *b);
            if (safe_entry(set, n, NULL)) cfg.qkv_bias = 1;
        }
    }
    check_shape(file, &cfg, (double)total, 2.0);
    model_build_slice(m, &cfg, fc, lay);
    SafeSource src = {set, cfg, pre};
    model_fill(m, &cfg, &(WeightSource){&src, safe_slab});
    snprintf(info->format, sizeof info->format, "safetensors");
    snprintf(info->arch, sizeof info->arch, "%s", gpt2 ? "gpt2" : "llama");
    snprintf(info->name, sizeof info->name, "%s", base_name(path));
    if (hc) fatal_release(hc);
    fatal_release(set);
}

/* ------------------------------------------------------------------ dispatch */

static void model_load_any(Model* m, const char* path, const FocusConfig* fc, ModelInfo* info,
                           int lean, const ModelLayout* lay);
static void close_file(void* fp) { fclose(fp); }

void model_load(Model* m, const char* path, const FocusConfig* fc, ModelInfo* info) {
    model_load_slice(m, path, fc, info, NULL);
}

void model_load_slice(Model* m, const char* path, const FocusConfig* fc, ModelInfo* info,
                      const ModelLayout* lay) {
    model_load_any(m, path, fc, info, 0, lay);
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
    model_load_any(m, path, fc, info, 1, NULL);
    if (model_load_native(m, path, why, n)) {
        model_free(m);
        return -1;
    }
    m->decode_only = 1;
    return 0;
}

static void model_load_any(Model* m, const char* path, const FocusConfig* fc, ModelInfo* info,
                           int lean, const ModelLayout* lay) {
    ModelInfo local;
    if (!info) info = &local;
    memset(info, 0, sizeof(*info));
    struct stat st;
    if (stat(path, &st)) fatal("%s: cannot open model: %s", path, strerror(errno));
    const size_t plen = strlen(path);
    if (S_ISDIR(st.st_mode) || (plen >= 11 && !strcmp(path + plen - 11, ".index.json"))) {
        load_safetensors(m, path, fc, info, lay); /* a folder, or a sharded checkpoint's index */
        snprintf(m->source, sizeof m->source, "%s", path);
        return;
    }
    FILE* fp = fopen_regular(path, "rb");
    if (!fp) fatal("%s: cannot open model: %s", path, strerror(errno));
    uint8_t head[9] = {0};
    size_t got = fread(head, 1, 9, fp);
    int32_t magic;
    memcpy(&magic, head, 4);
    if (got >= 4 && !memcmp(head, "GGUF", 4)) {
        fclose(fp);
        load_gguf(m, path, fc, info, lean, lay);
    } else if (got >= 4 && magic == 20240326) {
        rewind(fp);
        fatal_defer(close_file, fp); /* closed on the way out of an error too */
        load_llmc(m, path, fp, fc, info, lay);
        fatal_release(fp);
    } else if (got == 9 && head[8] == '{') {
        fclose(fp);
        load_safetensors(m, path, fc, info, lay);
    } else {
        fclose(fp);
        fatal("%s: unrecognised model format (expected GGUF, safetensors or an llm.c checkpoint)",
              path);
    }
    snprintf(m->source, sizeof m->source, "%s", path);
}

/* ------------------------------------------------------------------ native decode weights */

static void native_release(void* f) {
    gguf_close(f);
    free(f);
}

int model_load_native(Model* m, const char* path, char* why, size_t n) {
    const ModelConfig* c = &m->cfg;
    if (c->arch == ARCH_GPT2)
        return snprintf(why, n, "native weights are read for llama and gemma3 models only"), -1;
    GGUFFile f;
    char err[512];
    if (gguf_open(&f, path, err, sizeof err)) return snprintf(why, n, "%s", err), -1;
    const int L = c->L;
    QMatrix* q = callocCheck((size_t)L * NATIVE_PER_LAYER + 2, sizeof(QMatrix));
    for (int i = 0; i <= L * NATIVE_PER_LAYER + 1; i++) { /* the layers, the head, the embedding */
        const int l = i / NATIVE_PER_LAYER, head = i >= L * NATIVE_PER_LAYER;
        const NativePart np = model_native[i % NATIVE_PER_LAYER];
        size_t r = (size_t)c->V, k = (size_t)c->C;
        if (!head) model_param_part(c, np.t, np.part, &r, &k);
        const int rows = (int)r, cols = (int)k;
        char name[96];
        if (head)
            snprintf(name, sizeof name, "%s",
                     c->tied || i > L * NATIVE_PER_LAYER ? "token_embd.weight" : "output.weight");
        else
            snprintf(name, sizeof name, "blk.%d.%s", l, model_param_gguf(np.t, np.part, 1));
        const GGUFTensor* t = gguf_tensor(&f, name);
        const char* bad =
            !t                                                                ? "is missing"
            : t->ne[0] != (uint64_t)cols || t->nelem != (uint64_t)rows * cols ? "has another shape"
            : !qtype_supported((int)t->type) ? "has a type decode cannot read in place"
                                             : NULL;
        if (bad) {
            snprintf(why, n,
                     "tensor '%s' %s (%s; native decode reads F32, F16, BF16, Q4_0, Q4_1, Q5_0, "
                     "Q8_0, Q4_K, Q5_K, Q6_K)",
                     name, bad, t ? ggml_type_name(t->type) : "-");
            free(q);
            gguf_close(&f);
            return -1;
        }
        q[i] = (QMatrix){.type = (int)t->type,
                         .rows = rows,
                         .cols = cols,
                         .row_bytes = qtype_row_bytes((int)t->type, cols),
                         .data = t->data};
    }
    /* the products' packed copies for the decode, in one block (the embedding, last, is only
     * looked up by row) */
    qmatrix_prepare_all(q, L * NATIVE_PER_LAYER + 1);
    GGUFFile* owner = mallocCheck(sizeof *owner);
    *owner = f;
    free(m->native);
    if (m->native_release) m->native_release(m->native_owner);
    m->native = q, m->native_owner = owner, m->native_release = native_release;
    return 0;
}
