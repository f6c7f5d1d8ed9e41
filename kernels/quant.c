/* quant.c: block-quantised matrix-vector products (see quant.h).
 *
 * Each row is a run of 32-weight blocks; a block's dot product with 32 activations is computed
 * from its integers and scales without writing the weights out: the activations are quantised
 * to int8 per block once per product, the block sums are integer (exact). The scalar functions
 * are the reference; on x86 with AVX2 and FMA (checked at run time) the same sums run 32 lanes
 * wide. F32, F16 and BF16 rows are plain float dot products. */
#include "quant.h"

#include <math.h>
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
    return 0; /* block formats take the integer path (row_dot_q8_ref) */
}

/* The activations of a block-format product, quantised like the weights: per 32 values a scale
 * d = max|x| / 127, q = round(x / d) in int8, and the exact sum of the 32 values (for the Q4_1
 * offset and the Q4_0 shift). The error this adds is about 0.4 % of a block's largest value,
 * as in llama.cpp's q8 activations; test_quant measures it. */
typedef struct {
    float d, sum;
    int8_t q[32];
} XBlock;

static void quantize_x(XBlock* xb, const float* x, int cols) {
    for (int i = 0; i < cols / 32; i++) {
        const float* v = x + 32 * i;
        float amax = 0, sum = 0;
        for (int j = 0; j < 32; j++) {
            amax = fmaxf(amax, fabsf(v[j]));
            sum += v[j];
        }
        const float d = amax / 127, inv = d > 0 ? 1 / d : 0;
        xb[i].d = d, xb[i].sum = sum;
        for (int j = 0; j < 32; j++) xb[i].q[j] = (int8_t)lrintf(v[j] * inv);
    }
}

/* One row against quantised activations, integer sums per block:
 *   Q4_0 (18 bytes: f16 d | 16 bytes, element j < 16 the low nibble of byte j, j + 16 its high
 *        nibble; w = (q - 8) d):   d dx (sum q qx - 8 sum qx)
 *   Q4_1 (20 bytes: f16 d | f16 m | nibbles as Q4_0; w = q d + m):   d dx sum q qx + m sum x
 *   Q8_0 (34 bytes: f16 d | 32 x int8 q; w = q d):   d dx sum q qx */
/* GCC 12 with -march=native on CPUs with AVX-VNNI turns the int8 x int8 sum below into a
 * vectorised dot product that gives wrong sums (Q8_0 rows off by 10 %, found by test_quant):
 * the reference stays scalar. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-vectorize")))
#endif
static float
row_dot_q8_ref(const QMatrix* w, const uint8_t* row, const XBlock* xb) {
    const size_t bb = w->type == QTYPE_Q4_0 ? 18 : w->type == QTYPE_Q4_1 ? 20 : 34;
    float s = 0;
    for (int i = 0; i < w->cols / 32; i++) {
        const uint8_t* b = row + (size_t)i * bb;
        const int8_t* qx = xb[i].q;
        const float d = f16_to_f32(rd16(b)) * xb[i].d;
        int sum = 0, sumx = 0;
        if (w->type == QTYPE_Q8_0) {
            for (int j = 0; j < 32; j++) sum += (int8_t)b[2 + j] * qx[j];
            s += d * (float)sum;
            continue;
        }
        const uint8_t* q = b + (w->type == QTYPE_Q4_1 ? 4 : 2);
        for (int j = 0; j < 16; j++) {
            sum += (q[j] & 0xf) * qx[j] + (q[j] >> 4) * qx[j + 16];
            sumx += qx[j] + qx[j + 16];
        }
        if (w->type == QTYPE_Q4_1)
            s += d * (float)sum + f16_to_f32(rd16(b + 2)) * xb[i].sum;
        else
            s += d * (float)(sum - 8 * sumx);
    }
    return s;
}

#if defined(__x86_64__)
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
    (void)nb;
    return hsum8(acc);
}

/* A half-precision scale with the F16C instruction (the portable f16_to_f32 took a quarter of
 * the decode time). */
__attribute__((target("avx2,f16c"))) static inline float f16_fast(const uint8_t* p) {
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(rd16(p))));
}

/* The 32 weights of a Q4 block as unsigned bytes: elements 0-15 (low nibbles), 16-31 (high). */
__attribute__((target("avx2"))) static __m256i nibbles32(const uint8_t* q) {
    const __m128i bytes = _mm_loadu_si128((const __m128i*)q);
    const __m128i lo = _mm_and_si128(bytes, _mm_set1_epi8(0xf));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0xf));
    return _mm256_set_m128i(hi, lo);
}

/* sum over 32 lanes of u8 a x s8 b, as 8 int32 lanes (u8 x s8 pairs to int16, then to int32;
 * |15 * 127 * 2| and |127 * 127 * 2| fit int16) */
__attribute__((target("avx2"))) static __m256i dot_u8s8(__m256i a, __m256i b) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
}

/* row_dot_q8_ref with the integer sums 32 lanes wide. */
__attribute__((target("avx2,fma,f16c"))) static float row_dot_q8_avx2(const QMatrix* w,
                                                                      const uint8_t* row,
                                                                      const XBlock* xb) {
    __m256 acc = _mm256_setzero_ps();
    float extra = 0;
    const size_t bb = w->type == QTYPE_Q4_0 ? 18 : w->type == QTYPE_Q4_1 ? 20 : 34;
    const __m256i ones = _mm256_set1_epi8(1);
    for (int i = 0; i < w->cols / 32; i++) {
        const uint8_t* b = row + (size_t)i * bb;
        const __m256i qx = _mm256_loadu_si256((const __m256i*)xb[i].q);
        const float d = f16_fast(b) * xb[i].d;
        __m256i sum;
        if (w->type == QTYPE_Q8_0) { /* s8 x s8: |w| as u8, the sign moved onto x */
            const __m256i q = _mm256_loadu_si256((const __m256i*)(b + 2));
            sum = dot_u8s8(_mm256_sign_epi8(q, q), _mm256_sign_epi8(qx, q));
        } else {
            const __m256i q = nibbles32(b + (w->type == QTYPE_Q4_1 ? 4 : 2));
            sum = dot_u8s8(q, qx);
            if (w->type == QTYPE_Q4_1)
                extra += f16_fast(b + 2) * xb[i].sum;
            else /* - 8 sum qx */
                sum = _mm256_sub_epi32(sum, _mm256_slli_epi32(dot_u8s8(ones, qx), 3));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sum), acc);
    }
    return hsum8(acc) + extra;
}
#endif

static void matvec(float* y, const QMatrix* w, const float* x, const float* bias, int vector) {
#if defined(__x86_64__)
    /* every AVX2 CPU has F16C too (clang cannot test for it with this builtin) */
    vector = vector && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    vector = 0;
#endif
    const int blocks = w->type == QTYPE_Q4_0 || w->type == QTYPE_Q4_1 || w->type == QTYPE_Q8_0;
    /* decode calls this a few hundred times a token: the quantised activations live on the
     * stack up to 8,192 columns */
    XBlock stack[256], *xb = NULL;
    if (blocks) {
        xb = w->cols <= 32 * 256 ? stack : mallocCheck(sizeof(XBlock) * (size_t)(w->cols / 32));
        quantize_x(xb, x, w->cols);
    }
#pragma omp parallel for schedule(static)
    for (int r = 0; r < w->rows; r++) {
        const uint8_t* row = w->data + (size_t)r * w->row_bytes;
        float s;
#if defined(__x86_64__)
        if (blocks)
            s = vector ? row_dot_q8_avx2(w, row, xb) : row_dot_q8_ref(w, row, xb);
        else
            s = vector ? row_dot_avx2(w, row, x) : row_dot_ref(w, row, x);
#else
        s = blocks ? row_dot_q8_ref(w, row, xb) : row_dot_ref(w, row, x);
#endif
        y[r] = s + (bias ? bias[r] : 0.0f);
    }
    if (xb != stack) free(xb);
}

void qmatvec(float* y, const QMatrix* w, const float* x, const float* bias) {
    matvec(y, w, x, bias, 1);
}

void qmatvec_ref(float* y, const QMatrix* w, const float* x, const float* bias) {
    matvec(y, w, x, bias, 0);
}
