/* quant.c: block-quantised matrix-vector products (see quant.h).
 *
 * Each row is a run of 32-weight blocks; a block's dot product with 32 activations is computed
 * from its integers and scales without writing the weights out. The scalar functions are the
 * reference; on x86 with AVX2 and FMA (checked at run time) the same sums run 8 lanes wide. */
#include "quant.h"

#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

static uint16_t rd16(const uint8_t* p) { return (uint16_t)(p[0] | (p[1] << 8)); }

int qtype_supported(int type) {
    return type == QTYPE_F32 || type == QTYPE_F16 || type == QTYPE_BF16 || type == QTYPE_Q4_0 ||
           type == QTYPE_Q4_1 || type == QTYPE_Q8_0;
}

size_t qtype_row_bytes(int type, int cols) {
    if (type == QTYPE_F32) return (size_t)cols * 4;
    if (type == QTYPE_F16 || type == QTYPE_BF16) return (size_t)cols * 2;
    if (cols % 32) return 0;
    size_t nb = (size_t)cols / 32;
    return type == QTYPE_Q4_0   ? nb * 18
           : type == QTYPE_Q4_1 ? nb * 20
           : type == QTYPE_Q8_0 ? nb * 34
                                : 0;
}

/* Q4_0, 32 weights in 18 bytes: f16 d | 16 bytes; element j < 16 is the low nibble of byte j,
 * element j + 16 its high nibble; w = (q - 8) d. */
static float dot_q4_0(const uint8_t* b, const float* x) {
    float d = f16_to_f32(rd16(b)), s = 0;
    const uint8_t* q = b + 2;
    for (int j = 0; j < 16; j++) s += ((q[j] & 0xf) - 8) * x[j] + ((q[j] >> 4) - 8) * x[j + 16];
    return d * s;
}

/* Q4_1, 32 weights in 20 bytes: f16 d | f16 m | 16 bytes of nibbles as Q4_0; w = q d + m, so
 * the dot product is d sum(q x) + m sum(x). */
static float dot_q4_1(const uint8_t* b, const float* x) {
    float d = f16_to_f32(rd16(b)), m = f16_to_f32(rd16(b + 2)), s = 0, sx = 0;
    const uint8_t* q = b + 4;
    for (int j = 0; j < 16; j++) {
        s += (q[j] & 0xf) * x[j] + (q[j] >> 4) * x[j + 16];
        sx += x[j] + x[j + 16];
    }
    return d * s + m * sx;
}

/* Q8_0, 32 weights in 34 bytes: f16 d | 32 x int8 q; w = q d. */
static float dot_q8_0(const uint8_t* b, const float* x) {
    float d = f16_to_f32(rd16(b)), s = 0;
    for (int j = 0; j < 32; j++) s += (int8_t)b[2 + j] * x[j];
    return d * s;
}

void qrow(float* out, const QMatrix* w, int r) {
    /* the dot product of the row with each unit vector would do; decoding the blocks is direct */
    const uint8_t* row = w->data + (size_t)r * w->row_bytes;
    if (w->type == QTYPE_F32) {
        memcpy(out, row, sizeof(float) * (size_t)w->cols);
        return;
    }
    if (w->type == QTYPE_F16 || w->type == QTYPE_BF16) {
        for (int j = 0; j < w->cols; j++) {
            uint16_t h = rd16(row + 2 * (size_t)j);
            out[j] = w->type == QTYPE_F16 ? f16_to_f32(h) : bf16_to_f32(h);
        }
        return;
    }
    const size_t bb = w->type == QTYPE_Q4_0 ? 18 : w->type == QTYPE_Q4_1 ? 20 : 34;
    for (int i = 0; i < w->cols / 32; i++) {
        const uint8_t* b = row + (size_t)i * bb;
        float* y = out + 32 * i;
        const float d = f16_to_f32(rd16(b));
        if (w->type == QTYPE_Q8_0) {
            for (int j = 0; j < 32; j++) y[j] = (int8_t)b[2 + j] * d;
            continue;
        }
        if (w->type == QTYPE_Q4_0) { /* the arithmetic of the dequantiser, to the bit */
            for (int j = 0; j < 16; j++) {
                y[j] = ((b[2 + j] & 0xf) - 8) * d;
                y[j + 16] = ((b[2 + j] >> 4) - 8) * d;
            }
            continue;
        }
        const float m = f16_to_f32(rd16(b + 2));
        for (int j = 0; j < 16; j++) {
            y[j] = (b[4 + j] & 0xf) * d + m;
            y[j + 16] = (b[4 + j] >> 4) * d + m;
        }
    }
}

static float row_dot_ref(const QMatrix* w, const uint8_t* row, const float* x) {
    if (w->type == QTYPE_F16 || w->type == QTYPE_BF16) {
        float s = 0;
        for (int j = 0; j < w->cols; j++) {
            uint16_t h = rd16(row + 2 * (size_t)j);
            s += (w->type == QTYPE_F16 ? f16_to_f32(h) : bf16_to_f32(h)) * x[j];
        }
        return s;
    }
    if (w->type == QTYPE_F32) {
        float s = 0;
        for (int j = 0; j < w->cols; j++) {
            float v;
            memcpy(&v, row + 4 * (size_t)j, 4);
            s += v * x[j];
        }
        return s;
    }
    const size_t bb = w->type == QTYPE_Q4_0 ? 18 : w->type == QTYPE_Q4_1 ? 20 : 34;
    float s = 0;
    for (int i = 0; i < w->cols / 32; i++) {
        const uint8_t* b = row + (size_t)i * bb;
        s += w->type == QTYPE_Q4_0   ? dot_q4_0(b, x + 32 * i)
             : w->type == QTYPE_Q4_1 ? dot_q4_1(b, x + 32 * i)
                                     : dot_q8_0(b, x + 32 * i);
    }
    return s;
}

#if defined(__x86_64__)
/* The 32 nibbles of a Q4 block as floats in four registers of 8: elements 0-7, 8-15 (the low
 * nibbles of bytes 0-15), 16-23, 24-31 (their high nibbles). */
__attribute__((target("avx2,fma"))) static void nibbles8(const uint8_t* q, __m256 v[4]) {
    __m128i bytes = _mm_loadu_si128((const __m128i*)q);
    __m128i lo = _mm_and_si128(bytes, _mm_set1_epi8(0xf));
    __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0xf));
    v[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
    v[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
    v[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
    v[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
}

__attribute__((target("avx2,fma"))) static float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* One row: per block, sum(q x) in 8 lanes, scaled by d (and m sum(x) for Q4_1) with one FMA. */
__attribute__((target("avx2,fma,f16c"))) static float row_dot_avx2(const QMatrix* w,
                                                                   const uint8_t* row,
                                                                   const float* x) {
    __m256 acc = _mm256_setzero_ps();
    const int nb = w->cols / 32;
    if (w->type == QTYPE_F16 || w->type == QTYPE_BF16) {
        int j = 0;
        for (; j + 8 <= w->cols; j += 8) {
            __m128i h = _mm_loadu_si128((const __m128i*)(row + 2 * (size_t)j));
            __m256 v = w->type == QTYPE_F16
                           ? _mm256_cvtph_ps(h)
                           : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
            acc = _mm256_fmadd_ps(v, _mm256_loadu_ps(x + j), acc);
        }
        float s = hsum8(acc);
        for (; j < w->cols; j++) {
            uint16_t h = rd16(row + 2 * (size_t)j);
            s += (w->type == QTYPE_F16 ? f16_to_f32(h) : bf16_to_f32(h)) * x[j];
        }
        return s;
    }
    if (w->type == QTYPE_F32) {
        for (int j = 0; j + 8 <= w->cols; j += 8)
            acc = _mm256_fmadd_ps(_mm256_loadu_ps((const float*)(row + 4 * (size_t)j)),
                                  _mm256_loadu_ps(x + j), acc);
        float s = hsum8(acc);
        for (int j = w->cols / 8 * 8; j < w->cols; j++) {
            float v;
            memcpy(&v, row + 4 * (size_t)j, 4);
            s += v * x[j];
        }
        return s;
    }
    for (int i = 0; i < nb; i++) {
        const float* xb = x + 32 * i;
        __m256 x0 = _mm256_loadu_ps(xb), x1 = _mm256_loadu_ps(xb + 8),
               x2 = _mm256_loadu_ps(xb + 16), x3 = _mm256_loadu_ps(xb + 24);
        if (w->type == QTYPE_Q8_0) {
            const uint8_t* b = row + (size_t)i * 34;
            const __m128i q0 = _mm_loadu_si128((const __m128i*)(b + 2)),
                          q1 = _mm_loadu_si128((const __m128i*)(b + 18));
            __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q0)), x0);
            s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q0, 8))), x1,
                                s);
            s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q1)), x2, s);
            s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q1, 8))), x3,
                                s);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_to_f32(rd16(b))), s, acc);
            continue;
        }
        const int q41 = w->type == QTYPE_Q4_1;
        const uint8_t* b = row + (size_t)i * (q41 ? 20 : 18);
        __m256 v[4];
        nibbles8(b + (q41 ? 4 : 2), v);
        __m256 s = _mm256_mul_ps(v[0], x0);
        s = _mm256_fmadd_ps(v[1], x1, s);
        s = _mm256_fmadd_ps(v[2], x2, s);
        s = _mm256_fmadd_ps(v[3], x3, s);
        const __m256 d = _mm256_set1_ps(f16_to_f32(rd16(b)));
        __m256 sx = _mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3));
        if (q41) { /* + m sum(x) */
            acc = _mm256_fmadd_ps(d, s, acc);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_to_f32(rd16(b + 2))), sx, acc);
        } else { /* (q - 8): d (sum(q x) - 8 sum(x)) */
            acc = _mm256_fmadd_ps(d, _mm256_fnmadd_ps(_mm256_set1_ps(8.0f), sx, s), acc);
        }
    }
    return hsum8(acc);
}
#endif

static void matvec(float* y, const QMatrix* w, const float* x, const float* bias, int vector) {
#if defined(__x86_64__)
    vector = vector && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
#else
    vector = 0;
#endif
#pragma omp parallel for schedule(static)
    for (int r = 0; r < w->rows; r++) {
        const uint8_t* row = w->data + (size_t)r * w->row_bytes;
        float s;
#if defined(__x86_64__)
        s = vector ? row_dot_avx2(w, row, x) : row_dot_ref(w, row, x);
#else
        s = row_dot_ref(w, row, x);
#endif
        y[r] = s + (bias ? bias[r] : 0.0f);
    }
}

void qmatvec(float* y, const QMatrix* w, const float* x, const float* bias) {
    matvec(y, w, x, bias, 1);
}

void qmatvec_ref(float* y, const QMatrix* w, const float* x, const float* bias) {
    matvec(y, w, x, bias, 0);
}
