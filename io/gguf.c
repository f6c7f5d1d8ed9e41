/* gguf.c: GGUF parsing with bounds checks, and ggml block dequantisation (see gguf.h). */
#define _GNU_SOURCE
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../kernels/common.h"

/* ------------------------------------------------------------------ half floats */

static uint16_t rd16(const uint8_t* p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* ------------------------------------------------------------------ block formats */

typedef struct {
    uint32_t type;
    const char* name;
    uint32_t block; /* elements per block */
    uint32_t bytes; /* bytes per block */
} TypeInfo;

static const TypeInfo TYPES[] = {
    {GGML_F32, "F32", 1, 4},       {GGML_F16, "F16", 1, 2},       {GGML_BF16, "BF16", 1, 2},
    {GGML_Q4_0, "Q4_0", 32, 18},   {GGML_Q4_1, "Q4_1", 32, 20},   {GGML_Q5_0, "Q5_0", 32, 22},
    {GGML_Q5_1, "Q5_1", 32, 24},   {GGML_Q8_0, "Q8_0", 32, 34},   {GGML_Q4_K, "Q4_K", 256, 144},
    {GGML_Q5_K, "Q5_K", 256, 176}, {GGML_Q6_K, "Q6_K", 256, 210},
};

static const TypeInfo* type_info(uint32_t t) {
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++)
        if (TYPES[i].type == t) return &TYPES[i];
    return NULL;
}

const char* ggml_type_name(uint32_t type) {
    static const char* other[] = {
        [4] = "Q4_2 (removed)", [5] = "Q4_3 (removed)", [9] = "Q8_1",     [10] = "Q2_K",
        [11] = "Q3_K",          [15] = "Q8_K",          [16] = "IQ2_XXS", [17] = "IQ2_XS",
        [18] = "IQ3_XXS",       [19] = "IQ1_S",         [20] = "IQ4_NL",  [21] = "IQ3_S",
        [22] = "IQ2_S",         [23] = "IQ4_XS",        [24] = "I8",      [25] = "I16",
        [26] = "I32",           [27] = "I64",           [28] = "F64",     [29] = "IQ1_M"};
    const TypeInfo* ti = type_info(type);
    if (ti) return ti->name;
    if (type < sizeof other / sizeof other[0] && other[type]) return other[type];
    return "unknown";
}

size_t ggml_nbytes(uint32_t type, uint64_t n) {
    const TypeInfo* ti = type_info(type);
    if (!ti || n % ti->block) return 0;
    return (size_t)(n / ti->block) * ti->bytes;
}

/* Q4_0, 32 weights in 18 bytes: f16 d | 16 bytes of 4-bit q.
 * Element j < 16 is the low nibble of byte j, element j + 16 its high nibble; w = (q - 8) d. */
static void deq_q4_0(float* y, const uint8_t* b) {
    float d = f16_to_f32(rd16(b));
    const uint8_t* qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = ((qs[j] & 0xf) - 8) * d;
        y[j + 16] = ((qs[j] >> 4) - 8) * d;
    }
}

/* Q4_1, 32 weights in 20 bytes: f16 d | f16 m | 16 bytes of 4-bit q; w = q d + m. */
static void deq_q4_1(float* y, const uint8_t* b) {
    float d = f16_to_f32(rd16(b)), m = f16_to_f32(rd16(b + 2));
    const uint8_t* qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = (qs[j] & 0xf) * d + m;
        y[j + 16] = (qs[j] >> 4) * d + m;
    }
}

/* Q5_0, 32 weights in 22 bytes: f16 d | u32 qh (fifth bits) | 16 bytes of low nibbles.
 * Element j takes bit j of qh as bit 4, element j + 16 bit j + 16; w = (q - 16) d. */
static void deq_q5_0(float* y, const uint8_t* b) {
    float d = f16_to_f32(rd16(b));
    uint32_t qh =
        (uint32_t)b[2] | (uint32_t)b[3] << 8 | (uint32_t)b[4] << 16 | (uint32_t)b[5] << 24;
    const uint8_t* qs = b + 6;
    for (int j = 0; j < 16; j++) {
        int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
        y[j] = (((qs[j] & 0xf) | h0 << 4) - 16) * d;
        y[j + 16] = (((qs[j] >> 4) | h1 << 4) - 16) * d;
    }
}

/* Q5_1, 32 weights in 24 bytes: f16 d | f16 m | u32 qh | 16 bytes; w = q d + m. */
static void deq_q5_1(float* y, const uint8_t* b) {
    float d = f16_to_f32(rd16(b)), m = f16_to_f32(rd16(b + 2));
    uint32_t qh =
        (uint32_t)b[4] | (uint32_t)b[5] << 8 | (uint32_t)b[6] << 16 | (uint32_t)b[7] << 24;
    const uint8_t* qs = b + 8;
    for (int j = 0; j < 16; j++) {
        int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
        y[j] = ((qs[j] & 0xf) | h0 << 4) * d + m;
        y[j + 16] = ((qs[j] >> 4) | h1 << 4) * d + m;
    }
}

/* Q8_0, 32 weights in 34 bytes: f16 d | 32 x int8 q; w = q d. */
static void deq_q8_0(float* y, const uint8_t* b) {
    float d = f16_to_f32(rd16(b));
    for (int j = 0; j < 32; j++) y[j] = (int8_t)b[2 + j] * d;
}

/* 6-bit scale and min number j (0..7) packed in the 12 scale bytes of Q4_K / Q5_K:
 * j < 4: low 6 bits of bytes j and j + 4; otherwise the nibbles of byte j + 4 with the top
 * two bits of bytes j - 4 (scale) and j (min). */
static void scale_min_k4(int j, const uint8_t* q, int* sc, int* mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Q4_K, 256 weights in 144 bytes: f16 d | f16 dmin | 12 scale bytes | 128 bytes of nibbles.
 * Eight sub-blocks of 32, each w = d sc q - dmin mn; each 32 bytes hold two sub-blocks
 * (low nibbles first).
 * Q5_K, 256 weights in 176 bytes: f16 d | f16 dmin | 12 scale bytes | 32 bytes qh | 128 bytes
 * of nibbles. As Q4_K, with a fifth bit: sub-block pair p uses bits 2p and 2p+1 of qh[l].
 * deq_k4_k5 does both; qh is NULL for Q4_K. */
static void deq_k4_k5(float* y, const uint8_t* b, const uint8_t* qh, const uint8_t* q) {
    float d = f16_to_f32(rd16(b)), dmin = f16_to_f32(rd16(b + 2));
    const uint8_t* sc = b + 4;
    for (int j = 0; j < 8; j += 2, q += 32) {
        int s0, m0, s1, m1;
        scale_min_k4(j, sc, &s0, &m0);
        scale_min_k4(j + 1, sc, &s1, &m1);
        uint8_t u0 = (uint8_t)(1u << j), u1 = (uint8_t)(2u << j);
        for (int l = 0; l < 32; l++)
            *y++ = d * s0 * ((q[l] & 0xf) + (qh && qh[l] & u0 ? 16 : 0)) - dmin * m0;
        for (int l = 0; l < 32; l++)
            *y++ = d * s1 * ((q[l] >> 4) + (qh && qh[l] & u1 ? 16 : 0)) - dmin * m1;
    }
}

static void deq_q4_k(float* y, const uint8_t* b) { deq_k4_k5(y, b, NULL, b + 16); }
static void deq_q5_k(float* y, const uint8_t* b) { deq_k4_k5(y, b, b + 16, b + 48); }

/* Q6_K, 256 weights in 210 bytes: 128 bytes ql (low 4 bits) | 64 bytes qh (high 2 bits) |
 * 16 x int8 scales | f16 d. Two halves of 128; in each, element l + 32 i (i = 0..3) takes
 * a nibble of ql[l] or ql[l + 32] and bits 2i..2i+1 of qh[l]; w = d scale (q - 32), with one
 * scale per 16 elements. */
static void deq_q6_k(float* y, const uint8_t* b) {
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const int8_t* sc = (const int8_t*)(b + 192);
    float d = f16_to_f32(rd16(b + 208));
    for (int n = 0; n < 2; n++, y += 128, ql += 64, qh += 32, sc += 8) {
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = ((ql[l] & 0xf) | ((qh[l] >> 0 & 3) << 4)) - 32;
            int q2 = ((ql[l + 32] & 0xf) | ((qh[l] >> 2 & 3) << 4)) - 32;
            int q3 = ((ql[l] >> 4) | ((qh[l] >> 4 & 3) << 4)) - 32;
            int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6 & 3) << 4)) - 32;
            y[l] = d * sc[is] * q1;
            y[l + 32] = d * sc[is + 2] * q2;
            y[l + 64] = d * sc[is + 4] * q3;
            y[l + 96] = d * sc[is + 6] * q4;
        }
    }
}

int ggml_dequantize(float* out, const void* data, uint32_t type, uint64_t n) {
    const TypeInfo* ti = type_info(type);
    if (!ti || n % ti->block) return -1;
    const uint8_t* p = data;
    uint64_t nb = n / ti->block;
    void (*blockfn)(float*, const uint8_t*) = NULL;
    switch (type) {
        case GGML_F32:
            memcpy(out, data, n * 4);
            return 0;
        case GGML_F16:
            for (uint64_t i = 0; i < n; i++) out[i] = f16_to_f32(rd16(p + 2 * i));
            return 0;
        case GGML_BF16:
            for (uint64_t i = 0; i < n; i++) out[i] = bf16_to_f32(rd16(p + 2 * i));
            return 0;
        case GGML_Q4_0:
            blockfn = deq_q4_0;
            break;
        case GGML_Q4_1:
            blockfn = deq_q4_1;
            break;
        case GGML_Q5_0:
            blockfn = deq_q5_0;
            break;
        case GGML_Q5_1:
            blockfn = deq_q5_1;
            break;
        case GGML_Q8_0:
            blockfn = deq_q8_0;
            break;
        case GGML_Q4_K:
            blockfn = deq_q4_k;
            break;
        case GGML_Q5_K:
            blockfn = deq_q5_k;
            break;
        case GGML_Q6_K:
            blockfn = deq_q6_k;
            break;
        default:
            return -1;
    }
#pragma omp parallel for
    for (uint64_t i = 0; i < nb; i++) blockfn(out + i * ti->block, p + i * ti->bytes);
    return 0;
}

/* ------------------------------------------------------------------ parsing */

typedef struct {
    const uint8_t* p;
    const uint8_t* end;
    const uint8_t* base;
    char* err;
    size_t errlen;
    int failed;
} Cursor;

static int fail(Cursor* c, const char* fmt, ...) {
    if (!c->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, c->errlen, fmt, ap);
        va_end(ap);
    }
    c->failed = 1;
    return -1;
}

static int need(Cursor* c, uint64_t n, const char* what) {
    if (c->failed) return -1;
    if ((uint64_t)(c->end - c->p) < n)
        return fail(c, "truncated file: %s at byte %zu needs %llu bytes, only %zu remain", what,
                    (size_t)(c->p - c->base), (unsigned long long)n, (size_t)(c->end - c->p));
    return 0;
}

/* n bytes into v (left as it is when the file ends first: the cursor records the error) */
static void rd_bytes(Cursor* c, void* v, size_t n, const char* what) {
    if (need(c, n, what)) return;
    memcpy(v, c->p, n);
    c->p += n;
}

static uint32_t rd_u32(Cursor* c, const char* what) {
    uint32_t v = 0;
    rd_bytes(c, &v, 4, what);
    return v;
}

static uint64_t rd_u64(Cursor* c, const char* what) {
    uint64_t v = 0;
    rd_bytes(c, &v, 8, what);
    return v;
}

static const char* rd_str(Cursor* c, uint64_t* len, const char* what) {
    *len = rd_u64(c, what);
    if (c->failed) return NULL;
    if (*len > (1ull << 30)) {
        fail(c, "corrupt header: %s has length %llu", what, (unsigned long long)*len);
        return NULL;
    }
    if (need(c, *len, what)) return NULL;
    const char* s = (const char*)c->p;
    c->p += *len;
    return s;
}

static uint64_t scalar_size(uint32_t t) {
    switch (t) {
        case GGUF_VAL_UINT8:
        case GGUF_VAL_INT8:
        case GGUF_VAL_BOOL:
            return 1;
        case GGUF_VAL_UINT16:
        case GGUF_VAL_INT16:
            return 2;
        case GGUF_VAL_UINT32:
        case GGUF_VAL_INT32:
        case GGUF_VAL_FLOAT32:
            return 4;
        case GGUF_VAL_UINT64:
        case GGUF_VAL_INT64:
        case GGUF_VAL_FLOAT64:
            return 8;
        default:
            return 0;
    }
}

/* Skip one value of type t (arrays of arrays are rejected). */
static int skip_value(Cursor* c, uint32_t t, GGUFKV* kv, int depth) {
    if (t == GGUF_VAL_STRING) {
        uint64_t len;
        rd_str(c, &len, "string value");
        return c->failed ? -1 : 0;
    }
    if (t == GGUF_VAL_ARRAY) {
        if (depth > 0) return fail(c, "corrupt header: nested arrays are not supported");
        uint32_t at = rd_u32(c, "array type");
        uint64_t n = rd_u64(c, "array length");
        if (c->failed) return -1;
        if (kv) {
            kv->arr_type = at;
            kv->arr_n = n;
        }
        if (at == GGUF_VAL_STRING) {
            for (uint64_t i = 0; i < n; i++)
                if (skip_value(c, at, NULL, depth + 1)) return -1;
            return 0;
        }
        uint64_t es = scalar_size(at);
        if (!es) return fail(c, "corrupt header: array of unknown value type %u", at);
        if (n > (uint64_t)(c->end - c->p) / es)
            return fail(c, "truncated file: an array of %llu values runs past the end of the file",
                        (unsigned long long)n);
        c->p += n * es;
        return 0;
    }
    uint64_t s = scalar_size(t);
    if (!s) return fail(c, "corrupt header: unknown value type %u", t);
    if (need(c, s, "value")) return -1;
    c->p += s;
    return 0;
}

int gguf_open(GGUFFile* f, const char* path, char* err, size_t errlen) {
    memset(f, 0, sizeof(*f));
    f->path = path;
    int fd = open(path, O_RDONLY | O_NONBLOCK); /* a FIFO must not block: refused below */
    if (fd < 0) {
        snprintf(err, errlen, "cannot open: %s", strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "not a regular file (a FIFO or device)");
        close(fd);
        return -1;
    }
    f->size = (size_t)st.st_size;
    if (f->size < 24) {
        snprintf(err, errlen, "truncated file: %zu bytes is smaller than a GGUF header", f->size);
        close(fd);
        return -1;
    }
    f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        snprintf(err, errlen, "cannot map the file: %s", strerror(errno));
        return -1;
    }
    Cursor c = {f->map, f->map + f->size, f->map, err, errlen, 0};
    if (memcmp(f->map, "GGUF", 4)) {
        snprintf(err, errlen, "wrong magic: expected 'GGUF', found bytes %02x %02x %02x %02x",
                 f->map[0], f->map[1], f->map[2], f->map[3]);
        gguf_close(f);
        return -1;
    }
    c.p += 4;
    f->version = rd_u32(&c, "version");
    if (f->version != 2 && f->version != 3) {
        snprintf(err, errlen, "unsupported GGUF version %u (this reader handles 2 and 3)",
                 f->version);
        gguf_close(f);
        return -1;
    }
    f->n_tensors = rd_u64(&c, "tensor count");
    f->n_kv = rd_u64(&c, "key/value count");
    if (f->n_tensors > f->size / 24 || f->n_kv > f->size / 12) {
        snprintf(err, errlen, "corrupt header: %llu tensors and %llu keys cannot fit in %zu bytes",
                 (unsigned long long)f->n_tensors, (unsigned long long)f->n_kv, f->size);
        gguf_close(f);
        return -1;
    }
    f->kv = calloc(f->n_kv ? f->n_kv : 1, sizeof(GGUFKV));
    f->tensors = calloc(f->n_tensors ? f->n_tensors : 1, sizeof(GGUFTensor));
    if (!f->kv || !f->tensors) {
        snprintf(err, errlen, "out of memory reading the header");
        gguf_close(f);
        return -1;
    }
    f->alignment = 32;
    for (uint64_t i = 0; i < f->n_kv && !c.failed; i++) {
        GGUFKV* kv = &f->kv[i];
        kv->key = rd_str(&c, &kv->key_len, "key");
        kv->type = rd_u32(&c, "value type");
        kv->val = c.p;
        if (c.failed) break;
        skip_value(&c, kv->type, kv, 0);
    }
    uint64_t al;
    if (!c.failed && gguf_get_u64(f, "general.alignment", &al) == 0) {
        if (al == 0 || (al & (al - 1)) || al > 65536)
            fail(&c, "corrupt header: general.alignment %llu is not a power of two",
                 (unsigned long long)al);
        else
            f->alignment = al;
    }
    for (uint64_t i = 0; i < f->n_tensors && !c.failed; i++) {
        GGUFTensor* t = &f->tensors[i];
        uint64_t nl;
        const char* name = rd_str(&c, &nl, "tensor name");
        if (c.failed) break;
        if (nl >= sizeof t->name) {
            fail(&c, "corrupt header: tensor name of %llu bytes", (unsigned long long)nl);
            break;
        }
        memcpy(t->name, name, nl);
        t->name[nl] = 0;
        t->n_dims = rd_u32(&c, "tensor dimension count");
        if (!c.failed && (t->n_dims < 1 || t->n_dims > 4)) {
            fail(&c, "corrupt header: tensor '%s' has %u dimensions", t->name, t->n_dims);
            break;
        }
        t->nelem = 1;
        for (uint32_t d = 0; d < 4; d++) {
            t->ne[d] = d < t->n_dims ? rd_u64(&c, "tensor shape") : 1;
            if (c.failed) break;
            if (t->ne[d] == 0 || t->ne[d] > (1ull << 40) || t->nelem > (1ull << 40) / t->ne[d]) {
                fail(&c, "corrupt header: tensor '%s' has an impossible shape", t->name);
                break;
            }
            t->nelem *= t->ne[d];
        }
        t->type = rd_u32(&c, "tensor type");
        t->offset = rd_u64(&c, "tensor offset");
    }
    if (c.failed) {
        gguf_close(f);
        return -1;
    }
    size_t hdr = (size_t)(c.p - f->map);
    f->data_offset = (hdr + f->alignment - 1) / f->alignment * f->alignment;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        GGUFTensor* t = &f->tensors[i];
        if (!type_info(t->type)) continue; /* reported when the tensor is used */
        t->nbytes = ggml_nbytes(t->type, t->nelem);
        if (!t->nbytes) {
            snprintf(err, errlen, "tensor '%s': %llu elements is not a whole number of %s blocks",
                     t->name, (unsigned long long)t->nelem, ggml_type_name(t->type));
            gguf_close(f);
            return -1;
        }
        if (t->offset % f->alignment || f->data_offset > f->size ||
            t->offset > f->size - f->data_offset ||
            t->nbytes > f->size - f->data_offset - t->offset) {
            snprintf(err, errlen,
                     "tensor '%s': data at offset %llu (+%zu bytes) lies beyond the end of the "
                     "file (%zu bytes) or is misaligned; the file is truncated or corrupt",
                     t->name, (unsigned long long)t->offset, t->nbytes, f->size);
            gguf_close(f);
            return -1;
        }
        t->data = f->map + f->data_offset + t->offset;
    }
    /* The data section ends with the last tensor (padded to the alignment at most): more bytes
     * after it mean the offsets were computed from another alignment or another header, and
     * every tensor would be read from the wrong place. */
    uint64_t end = 0;
    int known = 1;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const GGUFTensor* t = &f->tensors[i];
        if (!type_info(t->type))
            known = 0;
        else if (t->offset + t->nbytes > end)
            end = t->offset + t->nbytes;
    }
    if (known && f->n_tensors && f->size - f->data_offset - end >= f->alignment) {
        snprintf(err, errlen,
                 "%llu bytes follow the last tensor's data (alignment %llu); the header's offsets "
                 "or alignment do not match the data, or the file has trailing bytes",
                 (unsigned long long)(f->size - f->data_offset - end),
                 (unsigned long long)f->alignment);
        gguf_close(f);
        return -1;
    }
    return 0;
}

void gguf_close(GGUFFile* f) {
    if (f->map) munmap(f->map, f->size);
    free(f->kv);
    free(f->tensors);
    memset(f, 0, sizeof(*f));
}

static void gguf_release(void* p) {
    gguf_close(p);
    free(p);
}

GGUFFile* gguf_hold(const GGUFFile* f) {
    GGUFFile* h = mallocCheck(sizeof *h);
    *h = *f;
    fatal_defer(gguf_release, h);
    return h;
}

const GGUFKV* gguf_find(const GGUFFile* f, const char* key) {
    size_t n = strlen(key);
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (f->kv[i].key_len == n && !memcmp(f->kv[i].key, key, n)) return &f->kv[i];
    return NULL;
}

int gguf_get_u64(const GGUFFile* f, const char* key, uint64_t* out) {
    const GGUFKV* kv = gguf_find(f, key);
    if (!kv) return -1;
    const uint8_t* v = kv->val;
    switch (kv->type) {
        case GGUF_VAL_UINT8:
        case GGUF_VAL_BOOL:
            *out = v[0];
            return 0;
        case GGUF_VAL_INT8:
            *out = (uint64_t)(int64_t)(int8_t)v[0];
            return 0;
        case GGUF_VAL_UINT16:
            *out = rd16(v);
            return 0;
        case GGUF_VAL_INT16:
            *out = (uint64_t)(int64_t)(int16_t)rd16(v);
            return 0;
        case GGUF_VAL_UINT32:
        case GGUF_VAL_INT32: {
            uint32_t x;
            memcpy(&x, v, 4);
            *out = kv->type == GGUF_VAL_INT32 ? (uint64_t)(int64_t)(int32_t)x : x;
            return 0;
        }
        case GGUF_VAL_UINT64:
        case GGUF_VAL_INT64:
            memcpy(out, v, 8);
            return 0;
        default:
            return -1;
    }
}

int gguf_get_f32(const GGUFFile* f, const char* key, float* out) {
    const GGUFKV* kv = gguf_find(f, key);
    if (!kv) return -1;
    if (kv->type == GGUF_VAL_FLOAT32) {
        memcpy(out, kv->val, 4);
        return 0;
    }
    if (kv->type == GGUF_VAL_FLOAT64) {
        double d;
        memcpy(&d, kv->val, 8);
        *out = (float)d;
        return 0;
    }
    uint64_t u;
    if (gguf_get_u64(f, key, &u)) return -1;
    *out = (float)u;
    return 0;
}

const char* gguf_get_str(const GGUFFile* f, const char* key, uint64_t* len) {
    const GGUFKV* kv = gguf_find(f, key);
    if (!kv || kv->type != GGUF_VAL_STRING) return NULL;
    memcpy(len, kv->val, 8);
    return (const char*)kv->val + 8;
}

const char* gguf_arr_str_next(const GGUFFile* f, const GGUFKV* kv, const uint8_t** pos,
                              uint64_t* len) {
    (void)f;
    if (!*pos) *pos = kv->val + 12; /* skip u32 type + u64 count */
    memcpy(len, *pos, 8);
    const char* s = (const char*)*pos + 8;
    *pos += 8 + *len;
    return s;
}

const GGUFTensor* gguf_tensor(const GGUFFile* f, const char* name) {
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (!strcmp(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}
