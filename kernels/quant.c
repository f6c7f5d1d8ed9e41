/* quant.c: block-quantised matrix-vector products (see quant.h).
 *
 * Each row is a run of 32-weight blocks (the K formats: 256-weight super-blocks of eight
 * 32-weight sub-blocks with integer sub-scales, read 32 at a time); a block's dot product with 32
 * activations is computed from its integers and scales without writing the weights out: the
 * activations are quantised to int8 per block once per product, the block sums are integer (exact).
 * The scalar functions are the reference; on x86 with AVX2 and FMA (checked at run time) the same
 * sums run 32 lanes wide. F32, F16 and BF16 rows are plain float dot products. A prompt's batched
 * product (qmatmul) expands panels of rows to fp32 for the BLAS instead. */
#include "quant.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif
#include <stdlib.h>

static uint16_t rd16(const uint8_t* p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* ------------------------------------------------------------------ instruction-set levels */

static const char* const isa_names[QUANT_ISA_COUNT] = {"scalar", "avx2", "avx_vnni", "avx512_vnni"};

const char* quant_isa_name(int level) {
    return level >= 0 && level < QUANT_ISA_COUNT ? isa_names[level] : "?";
}

int quant_isa_parse(const char* name) {
    for (int i = 0; i < QUANT_ISA_COUNT; i++)
        if (!strcmp(name, isa_names[i])) return i;
    return -1;
}

/* AVX-VNNI (the VEX-encoded VPDPBUSD): CPUID leaf 7, sub-leaf 1, EAX bit 4 */
static int has_avx_vnni(void) {
#if defined(__x86_64__)
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4));
#else
    return 0;
#endif
}

int quant_isa_has(int level) {
#if defined(__x86_64__)
    /* every AVX2 CPU has F16C too (clang cannot test for it with this builtin) */
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    switch (level) {
        case QUANT_ISA_SCALAR:
            return 1;
        case QUANT_ISA_AVX2:
            return avx2;
        case QUANT_ISA_AVX_VNNI:
            return avx2 && has_avx_vnni();
        case QUANT_ISA_AVX512_VNNI:
            return avx2 && __builtin_cpu_supports("avx512f") &&
                   __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
        default:
            return 0;
    }
#else
    return level == QUANT_ISA_SCALAR;
#endif
}

int quant_isa_detected(void) {
    int best = QUANT_ISA_COUNT - 1;
    while (best > QUANT_ISA_SCALAR && !quant_isa_has(best)) best--;
    return best;
}

static int isa_level = -1; /* -1: not chosen yet */

void quant_set_isa(int level) {
    if (level < 0 || level >= QUANT_ISA_COUNT)
        fatal("instruction-set level %d unknown (0 .. %d)", level, QUANT_ISA_COUNT - 1);
    if (!quant_isa_has(level))
        fatal("FOCUS_ISA=%s: this CPU does not have it (its best level is %s)", isa_names[level],
              isa_names[quant_isa_detected()]);
    isa_level = level;
}

int quant_isa(void) {
    if (isa_level < 0) {
        const char* want = getenv("FOCUS_ISA");
        if (want && *want) {
            const int level = quant_isa_parse(want);
            if (level < 0)
                fatal("FOCUS_ISA=%s: expected scalar, avx2, avx_vnni or avx512_vnni", want);
            quant_set_isa(level);
        } else {
            isa_level = quant_isa_detected();
        }
    }
    return isa_level;
}

/* Weights per block and bytes per block of the block formats; 0 for the others. */
static int block_elems(int type) {
    return type == QTYPE_Q4_0 || type == QTYPE_Q4_1 || type == QTYPE_Q5_0 || type == QTYPE_Q8_0 ? 32
           : type == QTYPE_Q4_K || type == QTYPE_Q5_K || type == QTYPE_Q6_K ? 256
                                                                            : 0;
}
static size_t block_bytes(int type) {
    switch (type) {
        case QTYPE_Q4_0:
            return 18;
        case QTYPE_Q4_1:
            return 20;
        case QTYPE_Q5_0:
            return 22;
        case QTYPE_Q8_0:
            return 34;
        case QTYPE_Q4_K:
            return 144;
        case QTYPE_Q5_K:
            return 176;
        case QTYPE_Q6_K:
            return 210;
        default:
            return 0;
    }
}

int qtype_supported(int type) {
    return type == QTYPE_F32 || type == QTYPE_F16 || type == QTYPE_BF16 || block_elems(type);
}

size_t qtype_row_bytes(int type, int cols) {
    if (type == QTYPE_F32) return (size_t)cols * 4;
    if (type == QTYPE_F16 || type == QTYPE_BF16) return (size_t)cols * 2;
    const int be = block_elems(type);
    if (!be || cols % be) return 0;
    return (size_t)(cols / be) * block_bytes(type);
}

/* 6-bit scale and min number j (0..7) of a Q4_K / Q5_K super-block (io/gguf.c's dequantiser
 * reads it too, written apart on purpose: it is the independent reference test_quant checks
 * these readers against), packed in its 12 scale bytes: j < 4 the low 6 bits of bytes j and j + 4;
 * otherwise the nibbles of byte j + 4 with the top two bits of bytes j - 4 (scale) and j (min). */
static void scale_min_k(int j, const uint8_t* q, int* sc, int* mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* The 32 weights 32 i .. 32 i + 31 of a block-format row as integers: w = s[j / 16] q[j] + off.
 * Every format reads as this (the K formats' sub-scales are integers under one f16 scale):
 *   Q4_0 (18 bytes: f16 d | 16 bytes, element j < 16 the low nibble of byte j, j + 16 its high
 *        nibble): q = nibble - 8, s = d
 *   Q4_1 (20 bytes: f16 d | f16 m | nibbles as Q4_0): q = nibble, s = d, off = m
 *   Q5_0 (22 bytes: f16 d | 32 bits qh | nibbles as Q4_0; bit j of qh is the fifth bit of
 *        element j): q = 5 bits - 16, s = d
 *   Q8_0 (34 bytes: f16 d | 32 x int8): q, s = d
 *   Q4_K (super-blocks of 256 in 144 bytes: f16 d | f16 dmin | 12 bytes of eight 6-bit scales
 *        and mins | 128 bytes of nibbles, each 32 bytes holding sub-blocks 2c (low nibbles) and
 *        2c + 1 (high)): sub-block j, q = nibble, s = d sc_j, off = -dmin mn_j
 *   Q5_K (256 in 176 bytes: as Q4_K with 32 bytes qh after the scales; bit j of qh[l] is the
 *        fifth bit of element l of sub-block j)
 *   Q6_K (256 in 210 bytes: 128 bytes ql | 64 bytes qh | 16 int8 scales | f16 d; halves of 128;
 *        in half n, part k = 0..3 of 32 takes the low (k < 2) or high nibble of ql[64 n + 32 (k
 *        & 1) + l] and bits 2k, 2k + 1 of qh[32 n + l]): q = 6 bits - 32, s = d scale[8 n + 2 k
 *        + l / 16]. */
typedef struct {
    int q[32];
    float s[2], off;
} Sub32;

static void sub32(Sub32* o, int type, const uint8_t* row, int i) {
    o->off = 0;
    if (block_elems(type) == 32) {
        const uint8_t* b = row + (size_t)i * block_bytes(type);
        o->s[0] = o->s[1] = f16_to_f32(rd16(b));
        if (type == QTYPE_Q8_0) {
            for (int j = 0; j < 32; j++) o->q[j] = (int8_t)b[2 + j];
            return;
        }
        if (type == QTYPE_Q5_0) {
            const uint32_t qh =
                (uint32_t)b[2] | (uint32_t)b[3] << 8 | (uint32_t)b[4] << 16 | (uint32_t)b[5] << 24;
            for (int j = 0; j < 16; j++) {
                o->q[j] = ((b[6 + j] & 0xf) | ((qh >> j) & 1) << 4) - 16;
                o->q[j + 16] = ((b[6 + j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - 16;
            }
            return;
        }
        const uint8_t* q = b + (type == QTYPE_Q4_1 ? 4 : 2);
        const int shift = type == QTYPE_Q4_0 ? 8 : 0;
        for (int j = 0; j < 16; j++) {
            o->q[j] = (q[j] & 0xf) - shift;
            o->q[j + 16] = (q[j] >> 4) - shift;
        }
        if (type == QTYPE_Q4_1) o->off = f16_to_f32(rd16(b + 2));
        return;
    }
    const uint8_t* sb = row + (size_t)(i / 8) * block_bytes(type);
    const int j = i % 8;
    if (type == QTYPE_Q6_K) {
        const int n = j / 4, k = j % 4;
        const uint8_t* ql = sb + 64 * n + 32 * (k & 1);
        const uint8_t* qh = sb + 128 + 32 * n;
        const int8_t* sc = (const int8_t*)(sb + 192) + 8 * n + 2 * k;
        const float d = f16_to_f32(rd16(sb + 208));
        for (int l = 0; l < 32; l++)
            o->q[l] = (((ql[l] >> (k < 2 ? 0 : 4)) & 0xf) | ((qh[l] >> (2 * k)) & 3) << 4) - 32;
        o->s[0] = d * sc[0], o->s[1] = d * sc[1];
        return;
    }
    int sc, mn;
    scale_min_k(j, sb + 4, &sc, &mn);
    const uint8_t* qs = sb + (type == QTYPE_Q5_K ? 48 : 16) + 32 * (j / 2);
    for (int l = 0; l < 32; l++) {
        o->q[l] = j & 1 ? qs[l] >> 4 : qs[l] & 0xf;
        if (type == QTYPE_Q5_K) o->q[l] |= ((sb[16 + l] >> j) & 1) << 4;
    }
    o->s[0] = o->s[1] = f16_to_f32(rd16(sb)) * sc;
    o->off = -(f16_to_f32(rd16(sb + 2)) * mn);
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
    Sub32 b;
    for (int i = 0; i < w->cols / 32; i++) {
        sub32(&b, w->type, row, i);
        for (int j = 0; j < 32; j++) out[32 * i + j] = b.s[j / 16] * (float)b.q[j] + b.off;
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
    int32_t qsum; /* the sum of q (for integer offsets of the weights) */
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
        xb[i].d = d, xb[i].sum = sum, xb[i].qsum = 0;
        for (int j = 0; j < 32; j++) {
            xb[i].q[j] = (int8_t)lrintf(v[j] * inv);
            xb[i].qsum += xb[i].q[j];
        }
    }
}

/* One row against quantised activations: integer sums per 16 weights (exact), then
 * dx (s0 sum0 + s1 sum1) + off sum(x) per block of 32 (sub32 above for the formats). */
/* GCC 12 with -march=native on CPUs with AVX-VNNI turns the int8 x int8 sum below into a
 * vectorised dot product that gives wrong sums (Q8_0 rows off by 10 %, found by test_quant):
 * the reference stays scalar. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-vectorize")))
#endif
static float
row_dot_q8_ref(const QMatrix* w, const uint8_t* row, const XBlock* xb) {
    float s = 0;
    Sub32 b;
    for (int i = 0; i < w->cols / 32; i++) {
        sub32(&b, w->type, row, i);
        const int8_t* qx = xb[i].q;
        int sum[2] = {0, 0};
        for (int j = 0; j < 32; j++) sum[j / 16] += b.q[j] * qx[j];
        s += xb[i].d * (b.s[0] * (float)sum[0] + b.s[1] * (float)sum[1]) + b.off * xb[i].sum;
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
/* byte j all ones where bit j of x is set (Q5_0's fifth bits) */
__attribute__((target("avx2"))) static __m256i bits32(uint32_t x) {
    const __m256i spread =
        _mm256_shuffle_epi8(_mm256_set1_epi32((int)x),
                            _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2,
                                             2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
}

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

/* quantize_x eight lanes at a time: the same scale, the same rounding (the current mode, as
 * lrintf), so the same integers; the float sum in another order. */
__attribute__((target("avx2,fma"))) static void quantize_x_avx2(XBlock* xb, const float* x,
                                                                int cols) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int i = 0; i < cols / 32; i++) {
        const float* v = x + 32 * i;
        __m256 a[4], mx = _mm256_setzero_ps(), sm = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            a[k] = _mm256_loadu_ps(v + 8 * k);
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, a[k]));
            sm = _mm256_add_ps(sm, a[k]);
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        const float d = _mm_cvtss_f32(m4) / 127, inv = d > 0 ? 1 / d : 0;
        const __m256 vi = _mm256_set1_ps(inv);
        __m256i q[4];
        for (int k = 0; k < 4; k++) q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(a[k], vi));
        /* int32 -> int16 -> int8 packs interleave the 128-bit halves: put them back in order */
        const __m256i p16a = _mm256_packs_epi32(q[0], q[1]), p16b = _mm256_packs_epi32(q[2], q[3]);
        __m256i p8 = _mm256_packs_epi16(p16a, p16b);
        p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i*)xb[i].q, p8);
        const __m256i qs =
            _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(qs), _mm256_extracti128_si256(qs, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        xb[i].d = d, xb[i].sum = hsum8(sm), xb[i].qsum = _mm_cvtsi128_si32(s4);
    }
}

static int has_avx2(void) { return quant_isa() >= QUANT_ISA_AVX2; }
#endif

/* The activations of one product, quantised (vector: the AVX2 code where the CPU has it). */
static void quantize_rows(XBlock* xb, const float* x, int cols, int vector) {
#if defined(__x86_64__)
    if (vector && has_avx2()) {
        quantize_x_avx2(xb, x, cols);
        return;
    }
#endif
    (void)vector;
    quantize_x(xb, x, cols);
}

#if defined(__x86_64__)
/* row_dot_q8_ref with the integer sums 32 lanes wide, one block of 32 per step; a format's
 * integer offset (Q4_0's 8, Q5_0's 16) taken off in the integers (on the float side, as
 * off d sum qx, it cancels against the block's sum: Gemma's activations have large means, and
 * its decode drifted from 0.018 to 0.033 nats of KL). The K formats' super-block scales are read
 * once per super-block, their integer sub-scales applied by the VPMADDWD that widens the pairs
 * (|pairs x sub-scale| fits int32). */
__attribute__((target("avx2,fma,f16c"))) static float row_dot_q8_avx2(const QMatrix* w,
                                                                      const uint8_t* row,
                                                                      const XBlock* xb) {
    __m256 acc = _mm256_setzero_ps();
    float extra = 0;
    const int type = w->type, nb = w->cols / 32;
    const size_t bb = block_bytes(type);
    const __m256i low4 = _mm256_set1_epi8(0xf), ones = _mm256_set1_epi8(1);
    if (type == QTYPE_Q4_K || type == QTYPE_Q5_K) {
        const int q5 = type == QTYPE_Q5_K;
        for (int sbi = 0; sbi < nb / 8; sbi++) {
            const uint8_t* sb = row + (size_t)sbi * bb;
            const XBlock* x = xb + 8 * sbi;
            const float d = f16_fast(sb), dmin = f16_fast(sb + 2);
            float mins = 0;
            for (int p = 0; p < 4; p++) { /* sub-blocks 2p (low nibbles) and 2p + 1 (high) */
                int sc0, mn0, sc1, mn1;
                scale_min_k(2 * p, sb + 4, &sc0, &mn0);
                scale_min_k(2 * p + 1, sb + 4, &sc1, &mn1);
                const __m256i q =
                    _mm256_loadu_si256((const __m256i*)(sb + (q5 ? 48 : 16) + 32 * p));
                __m256i lo = _mm256_and_si256(q, low4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
                if (q5) { /* bit j of qh[l] is the fifth bit of sub-block j's element l */
                    const __m256i qh = _mm256_loadu_si256((const __m256i*)(sb + 16));
                    const __m256i b0 = _mm256_set1_epi8((char)(1 << (2 * p)));
                    const __m256i b1 = _mm256_set1_epi8((char)(1 << (2 * p + 1)));
                    const __m256i f = _mm256_set1_epi8(16);
                    lo = _mm256_or_si256(
                        lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b0), b0), f));
                    hi = _mm256_or_si256(
                        hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b1), b1), f));
                }
                const XBlock *x0 = x + 2 * p, *x1 = x0 + 1;
                const __m256i s0 = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i*)x0->q)),
                    _mm256_set1_epi16((short)sc0));
                const __m256i s1 = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i*)x1->q)),
                    _mm256_set1_epi16((short)sc1));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d * x0->d), _mm256_cvtepi32_ps(s0), acc);
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d * x1->d), _mm256_cvtepi32_ps(s1), acc);
                mins += (float)mn0 * x0->sum + (float)mn1 * x1->sum;
            }
            extra -= dmin * mins;
        }
        return hsum8(acc) + extra;
    }
    if (type == QTYPE_Q6_K) {
        for (int sbi = 0; sbi < nb / 8; sbi++) {
            const uint8_t* sb = row + (size_t)sbi * bb;
            const float d = f16_fast(sb + 208);
            for (int n = 0; n < 2; n++) { /* halves of 128 */
                const __m256i hb = _mm256_loadu_si256((const __m256i*)(sb + 128 + 32 * n));
                const __m256i l0 = _mm256_loadu_si256((const __m256i*)(sb + 64 * n));
                const __m256i l1 = _mm256_loadu_si256((const __m256i*)(sb + 64 * n + 32));
                for (int k = 0; k < 4; k++) {
                    const XBlock* x = xb + 8 * sbi + 4 * n + k;
                    const __m256i lo = k & 1 ? l1 : l0;
                    const __m256i lq = k >= 2 ? _mm256_srli_epi16(lo, 4) : lo;
                    const __m256i hi =
                        _mm256_and_si256(_mm256_srli_epi16(hb, 2 * k), _mm256_set1_epi8(3));
                    const __m256i q = _mm256_sub_epi8(
                        _mm256_or_si256(_mm256_and_si256(lq, low4), _mm256_slli_epi16(hi, 4)),
                        _mm256_set1_epi8(32));
                    /* q in [-32, 31]: pairs of |q| x (+-qx) fit int16; then each 16's own scale */
                    const __m256i qx = _mm256_loadu_si256((const __m256i*)x->q);
                    const __m256i pairs =
                        _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(qx, q));
                    const int8_t* sc = (const int8_t*)(sb + 192) + 8 * n + 2 * k;
                    const __m256i sum = _mm256_madd_epi16(
                        pairs, _mm256_set_m128i(_mm_set1_epi16(sc[1]), _mm_set1_epi16(sc[0])));
                    acc = _mm256_fmadd_ps(_mm256_set1_ps(d * x->d), _mm256_cvtepi32_ps(sum), acc);
                }
            }
        }
        return hsum8(acc);
    }
    for (int i = 0; i < nb; i++) { /* the formats of one block per 32 weights */
        const uint8_t* b = row + (size_t)i * bb;
        const __m256i qx = _mm256_loadu_si256((const __m256i*)xb[i].q);
        const float d = f16_fast(b), dd = d * xb[i].d;
        __m256i sum;
        if (type == QTYPE_Q5_0) { /* the nibbles with their fifth bits, then - 16 sum qx */
            uint32_t qh;
            memcpy(&qh, b + 2, 4);
            const __m256i q = _mm256_or_si256(nibbles32(b + 6),
                                              _mm256_and_si256(bits32(qh), _mm256_set1_epi8(16)));
            sum = _mm256_sub_epi32(dot_u8s8(q, qx), _mm256_slli_epi32(dot_u8s8(ones, qx), 4));
        } else if (type == QTYPE_Q8_0) { /* s8 x s8: |w| as u8, the sign moved onto x */
            const __m256i q = _mm256_loadu_si256((const __m256i*)(b + 2));
            sum = dot_u8s8(_mm256_sign_epi8(q, q), _mm256_sign_epi8(qx, q));
        } else { /* Q4_0 (then - 8 sum qx), Q4_1 (+ m sum x) */
            sum = dot_u8s8(nibbles32(b + (type == QTYPE_Q4_1 ? 4 : 2)), qx);
            if (type == QTYPE_Q4_1)
                extra += f16_fast(b + 2) * xb[i].sum;
            else
                sum = _mm256_sub_epi32(sum, _mm256_slli_epi32(dot_u8s8(ones, qx), 3));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dd), _mm256_cvtepi32_ps(sum), acc);
    }
    return hsum8(acc) + extra;
}
#endif

/* ------------------------------------------------------------------ the VNNI decode product */

/* What the unsigned weights u = q + off of the int8 products add to the signed q (Q4_0's -8..7,
 * Q8_0's -127..127 unless kept signed); 0 for the formats whose q is unsigned. */
static int panel_offset(int type, int is_signed) {
    return type == QTYPE_Q8_0   ? (is_signed ? 0 : 128)
           : type == QTYPE_Q4_0 ? 8
           : type == QTYPE_Q5_0 ? 16
                                : 0;
}

/* qmatrix_prepare's layout: per group of 16 rows and block of 32 weights, the weights as
 * unsigned u = q + off (Q4 and Q5_0: 4 bytes per row and t = 0..3, byte e holding the low four
 * bits of weight 8t + e in its low nibble and of 8t + 4 + e in its high one; Q8_0: 4 bytes per
 * row and t = 0..7); Q5_0's fifth bits next, 16 bytes per t, byte L holding row L's bits of
 * weights 8t .. 8t + 7 (bit e: weight 8t + e); then the 16 rows' scales and offsets (Q4_1's
 * minimum; 0 otherwise) as fp16, copied from the blocks. */
static int vnni_format(int type) {
    return type == QTYPE_Q4_0 || type == QTYPE_Q4_1 || type == QTYPE_Q5_0 || type == QTYPE_Q8_0;
}
static size_t packed_scales_at(int type) {
    return type == QTYPE_Q8_0 ? 512 : type == QTYPE_Q5_0 ? 320 : 256;
}
static size_t vnni_block_bytes(int type) { return packed_scales_at(type) + 64; }

/* The bytes of w's packed copy at this level, a multiple of 64; 0: w gets none. */
static size_t packed_bytes(const QMatrix* w) {
    if (w->packed || !vnni_format(w->type) || quant_isa() < QUANT_ISA_AVX2) return 0;
    return ((size_t)(w->rows + 15) / 16 * (size_t)(w->cols / 32) * vnni_block_bytes(w->type) + 63) /
           64 * 64;
}

/* w's packed copy laid out into v (packed_bytes(w) zeroed bytes) */
static void pack_into(QMatrix* w, uint8_t* v) {
    const int level = quant_isa();
    const int nb = w->cols / 32, groups = (w->rows + 15) / 16;
    const size_t S = vnni_block_bytes(w->type);
    /* VPMADDUBSW saturates its int16 pairs: at avx2, Q8_0 stays signed (the sign trick) */
    const int off = panel_offset(w->type, level == QUANT_ISA_AVX2), q8 = w->type == QTYPE_Q8_0;
    const size_t bb = block_bytes(w->type);
#pragma omp parallel for schedule(static)
    for (int g = 0; g < groups; g++) {
        Sub32 b;
        for (int L = 0; L < 16 && 16 * g + L < w->rows; L++) {
            const uint8_t* row = w->data + (size_t)(16 * g + L) * w->row_bytes;
            for (int k = 0; k < nb; k++) {
                uint8_t* blk = v + ((size_t)g * nb + k) * S;
                sub32(&b, w->type, row, k);
                for (int t = 0; t < (q8 ? 8 : 4); t++)
                    for (int e = 0; e < 4; e++) {
                        uint8_t* at = blk + 64 * t + 4 * L + e;
                        if (q8) {
                            *at = (uint8_t)(b.q[4 * t + e] + off);
                            continue;
                        }
                        const int lo = b.q[8 * t + e] + off, hi = b.q[8 * t + 4 + e] + off;
                        *at = (uint8_t)((lo & 15) | ((hi & 15) << 4));
                        if (w->type == QTYPE_Q5_0)
                            blk[256 + 16 * t + L] |=
                                (uint8_t)(((lo >> 4) << e) | ((hi >> 4) << (4 + e)));
                    }
                /* the scales as the file has them: d (and Q4_1's m) are its fp16 values */
                const uint8_t* fb = row + (size_t)k * bb;
                uint8_t* sc = blk + packed_scales_at(w->type);
                memcpy(sc + 2 * L, fb, 2);
                if (w->type == QTYPE_Q4_1) memcpy(sc + 32 + 2 * L, fb + 2, 2);
            }
        }
    }
    w->packed = v;
    w->packed_isa = level;
}

void qmatrix_prepare(QMatrix* w) { qmatrix_prepare_all(w, 1); }

void qmatrix_prepare_all(QMatrix* w, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += packed_bytes(&w[i]);
    if (!total) return;
    uint8_t* v = mallocPages(total); /* (in 2 MiB pages: mallocPages) */
    memset(v, 0, total);
    uint8_t* owner = v;
    for (int i = 0; i < n; i++) {
        const size_t b = packed_bytes(&w[i]);
        if (!b) continue;
        pack_into(&w[i], v);
        w[i].arena = owner, owner = NULL; /* the first one frees the block */
        v += b;
    }
}

void qmatrix_release(QMatrix* w) {
    free(w->arena);
    w->arena = w->packed = NULL;
}

#if defined(__x86_64__)
/* How many blocks ahead a 16-row group's product asks for its weights (past the group's last
 * block the next group's: the rows are read in order) */
enum { GEMV_AHEAD = 8 };

/* y = W x from the VNNI copy: per 16-row group, per block, 4 (Q4: low and high nibbles) or 8
 * VPDPBUSD of 16 rows x 4 weights against a broadcast quadruple of x; two blocks at a time on
 * separate chains, so the dependent instructions of one block do not wait on each other. */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void gemv_vnni_group(
    float* y, const QMatrix* w, const XBlock* xb, const float* bias, int g) {
    const int nb = w->cols / 32, q8 = w->type == QTYPE_Q8_0, q5 = w->type == QTYPE_Q5_0;
    const size_t S = vnni_block_bytes(w->type), so = packed_scales_at(w->type);
    const int off = panel_offset(w->type, 0), q41 = w->type == QTYPE_Q4_1;
    const __m512i m4 = _mm512_set1_epi8(0x0f), f16 = _mm512_set1_epi8(16);
    /* Q5_0: byte p of a register is row p / 4's weight e = p % 4 (low nibble) and 4 + e */
    const __m512i spread =
        _mm512_set_epi8(15, 15, 15, 15, 14, 14, 14, 14, 13, 13, 13, 13, 12, 12, 12, 12, 11, 11, 11,
                        11, 10, 10, 10, 10, 9, 9, 9, 9, 8, 8, 8, 8, 7, 7, 7, 7, 6, 6, 6, 6, 5, 5, 5,
                        5, 4, 4, 4, 4, 3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m512i elo = _mm512_set1_epi32(0x08040201), ehi = _mm512_set1_epi32((int)0x80402010);
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    __m512 cacc = _mm512_setzero_ps();
    const uint8_t* base = w->packed + (size_t)g * nb * S;
    for (int k = 0; k < nb; k++) {
        const uint8_t* blk = base + (size_t)k * S;
        const XBlock* x = xb + k;
        for (size_t b = 0; b < S; b += 64) /* a few blocks ahead */
            _mm_prefetch((const char*)(blk + GEMV_AHEAD * S + b), _MM_HINT_T0);
        __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
        if (q8) {
            for (int t = 0; t < 8; t += 2) {
                int32_t a0, a1;
                memcpy(&a0, x->q + 4 * t, 4);
                memcpy(&a1, x->q + 4 * t + 4, 4);
                s0 = _mm512_dpbusd_epi32(s0, _mm512_loadu_si512(blk + 64 * t),
                                         _mm512_set1_epi32(a0));
                s1 = _mm512_dpbusd_epi32(s1, _mm512_loadu_si512(blk + 64 * t + 64),
                                         _mm512_set1_epi32(a1));
            }
        } else {
            for (int t = 0; t < 4; t++) {
                const __m512i v = _mm512_loadu_si512(blk + 64 * t);
                int32_t a0, a1;
                memcpy(&a0, x->q + 8 * t, 4);
                memcpy(&a1, x->q + 8 * t + 4, 4);
                __m512i lo = _mm512_and_si512(v, m4),
                        hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                if (q5) { /* the fifth bits: row L's byte to its 4 bytes, bit e / 4 + e of each */
                    const __m512i b = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((
                                                              const __m128i*)(blk + 256 + 16 * t))),
                                                          spread);
                    lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(b, elo), lo, f16);
                    hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(b, ehi), hi, f16);
                }
                s0 = _mm512_dpbusd_epi32(s0, lo, _mm512_set1_epi32(a0));
                s1 = _mm512_dpbusd_epi32(s1, hi, _mm512_set1_epi32(a1));
            }
        }
        const __m512i isum =
            _mm512_sub_epi32(_mm512_add_epi32(s0, s1), _mm512_set1_epi32(off * x->qsum));
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(blk + so)));
        acc[k & 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum),
                                     _mm512_mul_ps(d, _mm512_set1_ps(x->d)), acc[k & 1]);
        if (q41) {
            const __m512 mn = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(blk + so + 32)));
            cacc = _mm512_fmadd_ps(mn, _mm512_set1_ps(x->sum), cacc);
        }
    }
    __m512 r = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), cacc);
    const int nr = w->rows - 16 * g < 16 ? w->rows - 16 * g : 16;
    const __mmask16 m = (__mmask16)((1u << nr) - 1);
    if (bias) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(m, bias + 16 * g));
    _mm512_mask_storeu_ps(y + 16 * g, m, r);
}

/* The same layout in 256-bit registers: rows 0-7 and 8-15 of a group in two halves of 32 bytes.
 * A block's integer sums per level: with AVX-VNNI, VPDPBUSD as above; with AVX2, VPMADDUBSW
 * (pairs of u8 x s8 to int16) and VPMADDWD by ones (to int32). For 4-bit weights the eight
 * pair sums of a block stay in int16 (8 x 2 x 15 x 127 = 30,480 < 32,767), so one VPMADDWD per
 * block; Q8_0 is kept signed at avx2 and goes through the sign trick, |w| x (x sign w). */
__attribute__((target("avx2"))) static inline void q4_sums_avx2(__m256i s[2], const uint8_t* blk,
                                                                const int8_t* xq) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i p0 = _mm256_setzero_si256(), p1 = _mm256_setzero_si256();
    for (int t = 0; t < 4; t++) {
        int32_t a0, a1;
        memcpy(&a0, xq + 8 * t, 4);
        memcpy(&a1, xq + 8 * t + 4, 4);
        const __m256i x0 = _mm256_set1_epi32(a0), x1 = _mm256_set1_epi32(a1);
        const __m256i v0 = _mm256_loadu_si256((const __m256i*)(blk + 64 * t));
        const __m256i v1 = _mm256_loadu_si256((const __m256i*)(blk + 64 * t + 32));
        p0 = _mm256_add_epi16(p0, _mm256_maddubs_epi16(_mm256_and_si256(v0, m4), x0));
        p1 = _mm256_add_epi16(p1, _mm256_maddubs_epi16(_mm256_and_si256(v1, m4), x0));
        p0 = _mm256_add_epi16(
            p0, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v0, 4), m4), x1));
        p1 = _mm256_add_epi16(
            p1, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v1, 4), m4), x1));
    }
    const __m256i ones = _mm256_set1_epi16(1);
    s[0] = _mm256_madd_epi16(p0, ones), s[1] = _mm256_madd_epi16(p1, ones);
}

/* Q5_0's u of t's register in half h: the nibbles, and 16 where row 8h + p / 4's fifth bit of
 * weight e = p % 4 (low) or 4 + e (high) is set */
__attribute__((target("avx2"))) static inline void q5_u_avx2(__m256i u[2], const uint8_t* blk,
                                                             int t, int h) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), f16 = _mm256_set1_epi8(16);
    const __m256i v = _mm256_loadu_si256((const __m256i*)(blk + 64 * t + 32 * h));
    const __m256i idx =
        _mm256_add_epi8(_mm256_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4,
                                         5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7),
                        _mm256_set1_epi8((char)(8 * h)));
    const __m256i b = _mm256_shuffle_epi8(
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(blk + 256 + 16 * t))), idx);
    const __m256i elo = _mm256_set1_epi32(0x08040201), ehi = _mm256_set1_epi32((int)0x80402010);
    u[0] = _mm256_or_si256(_mm256_and_si256(v, m4),
                           _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(b, elo), elo), f16));
    u[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4),
                           _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(b, ehi), ehi), f16));
}

/* u <= 31: the pairs of two registers (t, t + 1) stay in int16 (4 x 2 x 31 x 127 = 31,496) */
__attribute__((target("avx2"))) static inline void q5_sums_avx2(__m256i s[2], const uint8_t* blk,
                                                                const int8_t* xq) {
    const __m256i ones = _mm256_set1_epi16(1);
    s[0] = s[1] = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++)
        for (int t = 0; t < 4; t += 2) {
            __m256i p = _mm256_setzero_si256();
            for (int tt = t; tt < t + 2; tt++) {
                __m256i u[2];
                q5_u_avx2(u, blk, tt, h);
                int32_t a0, a1;
                memcpy(&a0, xq + 8 * tt, 4);
                memcpy(&a1, xq + 8 * tt + 4, 4);
                p = _mm256_add_epi16(p, _mm256_maddubs_epi16(u[0], _mm256_set1_epi32(a0)));
                p = _mm256_add_epi16(p, _mm256_maddubs_epi16(u[1], _mm256_set1_epi32(a1)));
            }
            s[h] = _mm256_add_epi32(s[h], _mm256_madd_epi16(p, ones));
        }
}

__attribute__((target("avx2,avxvnni"))) static inline void q5_sums_avxvnni(__m256i s[2],
                                                                           const uint8_t* blk,
                                                                           const int8_t* xq) {
    s[0] = s[1] = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++)
        for (int t = 0; t < 4; t++) {
            __m256i u[2];
            q5_u_avx2(u, blk, t, h);
            int32_t a0, a1;
            memcpy(&a0, xq + 8 * t, 4);
            memcpy(&a1, xq + 8 * t + 4, 4);
            s[h] = _mm256_dpbusd_avx_epi32(s[h], u[0], _mm256_set1_epi32(a0));
            s[h] = _mm256_dpbusd_avx_epi32(s[h], u[1], _mm256_set1_epi32(a1));
        }
}

__attribute__((target("avx2"))) static inline void q8_sums_avx2(__m256i s[2], const uint8_t* blk,
                                                                const int8_t* xq) {
    const __m256i ones = _mm256_set1_epi16(1);
    s[0] = s[1] = _mm256_setzero_si256();
    for (int t = 0; t < 8; t++) {
        int32_t a;
        memcpy(&a, xq + 4 * t, 4);
        const __m256i x = _mm256_set1_epi32(a);
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i*)(blk + 64 * t + 32 * h));
            const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(x, v));
            s[h] = _mm256_add_epi32(s[h], _mm256_madd_epi16(p, ones));
        }
    }
}

__attribute__((target("avx2,avxvnni"))) static inline void q4_sums_avxvnni(__m256i s[2],
                                                                           const uint8_t* blk,
                                                                           const int8_t* xq) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    s[0] = s[1] = _mm256_setzero_si256();
    for (int t = 0; t < 4; t++) {
        int32_t a0, a1;
        memcpy(&a0, xq + 8 * t, 4);
        memcpy(&a1, xq + 8 * t + 4, 4);
        const __m256i x0 = _mm256_set1_epi32(a0), x1 = _mm256_set1_epi32(a1);
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i*)(blk + 64 * t + 32 * h));
            s[h] = _mm256_dpbusd_avx_epi32(s[h], _mm256_and_si256(v, m4), x0);
            s[h] = _mm256_dpbusd_avx_epi32(s[h], _mm256_and_si256(_mm256_srli_epi16(v, 4), m4), x1);
        }
    }
}

__attribute__((target("avx2,avxvnni"))) static inline void q8_sums_avxvnni(__m256i s[2],
                                                                           const uint8_t* blk,
                                                                           const int8_t* xq) {
    s[0] = s[1] = _mm256_setzero_si256();
    for (int t = 0; t < 8; t++) {
        int32_t a;
        memcpy(&a, xq + 4 * t, 4);
        const __m256i x = _mm256_set1_epi32(a);
        for (int h = 0; h < 2; h++)
            s[h] = _mm256_dpbusd_avx_epi32(
                s[h], _mm256_loadu_si256((const __m256i*)(blk + 64 * t + 32 * h)), x);
    }
}

/* One 16-row group of y = W x from the packed copy at a 256-bit level: the block sums less the
 * offset's (off sum qx), times d_w d_x, on two chains (even and odd blocks) per half; Q4_1's
 * minimums times sum x on a chain of their own. */
#define GEMV_GROUP_256(NAME, TARGET, Q4SUMS, Q5SUMS, Q8SUMS)                                       \
    __attribute__((target(TARGET))) static void NAME(float* y, const QMatrix* w, const XBlock* xb, \
                                                     const float* bias, int g) {                   \
        const int nb = w->cols / 32, q8 = w->type == QTYPE_Q8_0, q41 = w->type == QTYPE_Q4_1;      \
        const size_t S = vnni_block_bytes(w->type), so = packed_scales_at(w->type);                \
        const int off = panel_offset(w->type, w->packed_isa == QUANT_ISA_AVX2);                    \
        __m256 acc[2][2], cacc[2];                                                                 \
        for (int h = 0; h < 2; h++) acc[0][h] = acc[1][h] = cacc[h] = _mm256_setzero_ps();         \
        const uint8_t* base = w->packed + (size_t)g * nb * S;                                      \
        for (int k = 0; k < nb; k++) {                                                             \
            const uint8_t* blk = base + (size_t)k * S;                                             \
            const XBlock* x = xb + k;                                                              \
            for (size_t b = 0; b < S; b += 64) /* a few blocks ahead */                            \
                _mm_prefetch((const char*)(blk + GEMV_AHEAD * S + b), _MM_HINT_T0);                \
            __m256i s[2];                                                                          \
            if (q8)                                                                                \
                Q8SUMS(s, blk, x->q);                                                              \
            else if (w->type == QTYPE_Q5_0)                                                        \
                Q5SUMS(s, blk, x->q);                                                              \
            else                                                                                   \
                Q4SUMS(s, blk, x->q);                                                              \
            const __m256i corr = _mm256_set1_epi32(off * x->qsum);                                 \
            const __m256 dx = _mm256_set1_ps(x->d);                                                \
            for (int h = 0; h < 2; h++) {                                                          \
                const __m256 d =                                                                   \
                    _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(blk + so + 16 * h)));         \
                acc[k & 1][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(s[h], corr)),  \
                                                _mm256_mul_ps(d, dx), acc[k & 1][h]);              \
                if (q41)                                                                           \
                    cacc[h] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(                     \
                                                  (const __m128i*)(blk + so + 32 + 16 * h))),      \
                                              _mm256_set1_ps(x->sum), cacc[h]);                    \
            }                                                                                      \
        }                                                                                          \
        float r[16];                                                                               \
        for (int h = 0; h < 2; h++)                                                                \
            _mm256_storeu_ps(r + 8 * h,                                                            \
                             _mm256_add_ps(_mm256_add_ps(acc[0][h], acc[1][h]), cacc[h]));         \
        const int nr = w->rows - 16 * g < 16 ? w->rows - 16 * g : 16;                              \
        for (int i = 0; i < nr; i++) y[16 * g + i] = r[i] + (bias ? bias[16 * g + i] : 0.0f);      \
    }

GEMV_GROUP_256(gemv_avx2_group, "avx2,fma,f16c", q4_sums_avx2, q5_sums_avx2, q8_sums_avx2)
GEMV_GROUP_256(gemv_avxvnni_group, "avx2,fma,f16c,avxvnni", q4_sums_avxvnni, q5_sums_avxvnni,
               q8_sums_avxvnni)

typedef void (*GemvGroup)(float* y, const QMatrix* w, const XBlock* xb, const float* bias, int g);

#endif

/* The n rows of x (n, cols) against W into the rows of y (ldy apart), each row's arithmetic
 * exactly that of a product of that row alone (the same kernels, the same order), but each
 * weight row or 16-row group read from memory once for all n rows: the n dot products of a row
 * follow each other while it is in the cache (decode steps of several sequences at once). */
static void matvec(float* y, size_t ldy, const QMatrix* w, const float* x, int n, const float* bias,
                   int vector) {
#if defined(__x86_64__)
    vector = vector && has_avx2();
#else
    vector = 0;
#endif
    const int blocks = block_elems(w->type) > 0, nb = w->cols / 32;
    /* decode calls this a few hundred times a token: the quantised activations live on the
     * stack up to 8,192 values */
    XBlock stack[256], *xb = NULL;
    if (blocks) {
        const size_t need = (size_t)n * nb;
        xb = need <= 256 ? stack : mallocCheck(sizeof(XBlock) * need);
        for (int i = 0; i < n; i++)
            quantize_rows(xb + (size_t)i * nb, x + (size_t)i * w->cols, w->cols, vector);
    }
#if defined(__x86_64__)
    if (vector && w->packed && quant_isa() == w->packed_isa) {
        /* the loop stays apart from the target-specific body: clang outlines an OpenMP region
         * into a function of its own, without the target attribute */
        static const GemvGroup group_at[QUANT_ISA_COUNT] = {NULL, gemv_avx2_group,
                                                            gemv_avxvnni_group, gemv_vnni_group};
        const GemvGroup group = group_at[w->packed_isa];
        const int groups = (w->rows + 15) / 16;
#pragma omp parallel for schedule(static)
        for (int g = 0; g < groups; g++)
            for (int i = 0; i < n; i++) group(y + (size_t)i * ldy, w, xb + (size_t)i * nb, bias, g);
        if (xb != stack) free(xb);
        return;
    }
#endif
#pragma omp parallel for schedule(static)
    for (int r = 0; r < w->rows; r++) {
        const uint8_t* row = w->data + (size_t)r * w->row_bytes;
        for (int i = 0; i < n; i++) {
            const XBlock* xi = blocks ? xb + (size_t)i * nb : NULL;
            const float* xr = x + (size_t)i * w->cols;
            float s;
#if defined(__x86_64__)
            if (blocks)
                s = vector ? row_dot_q8_avx2(w, row, xi) : row_dot_q8_ref(w, row, xi);
            else
                s = vector ? row_dot_avx2(w, row, xr) : row_dot_ref(w, row, xr);
#else
            s = blocks ? row_dot_q8_ref(w, row, xi) : row_dot_ref(w, row, xr);
#endif
            y[(size_t)i * ldy + r] = s + (bias ? bias[r] : 0.0f);
        }
    }
    if (xb != stack) free(xb);
}

void qmatvec(float* y, const QMatrix* w, const float* x, const float* bias) {
    matvec(y, 0, w, x, 1, bias, 1);
}

void qmatvec_ref(float* y, const QMatrix* w, const float* x, const float* bias) {
    matvec(y, 0, w, x, 1, bias, 0);
}

void qmatvec_rows(float* y, int ldy, const QMatrix* w, const float* x, int n, const float* bias) {
    matvec(y, (size_t)ldy, w, x, n, bias, 1);
}

/* ------------------------------------------------------------------ half-precision rows */

#if defined(__x86_64__)
/* every AVX2 CPU has F16C: 8 halves at a time; values beyond the half range saturate */
__attribute__((target("avx2,fma,f16c"))) static void f16_put_avx2(uint16_t* dst, const float* src,
                                                                  int n) {
    const __m256 hi = _mm256_set1_ps(65504.0f), lo = _mm256_set1_ps(-65504.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_max_ps(_mm256_min_ps(_mm256_loadu_ps(src + i), hi), lo);
        _mm_storeu_si128((__m128i*)(dst + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < n; i++) dst[i] = f32_to_f16(src[i], 1);
}

__attribute__((target("avx2,fma,f16c"))) static void f16_get_avx2(float* dst, const uint16_t* src,
                                                                  int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(src + i))));
    for (; i < n; i++) dst[i] = f16_to_f32(src[i]);
}

__attribute__((target("avx2,fma,f16c"))) static float f16_dot_avx2(const float* q,
                                                                   const uint16_t* k, int n) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i),
                              _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(k + i))), acc);
    float r = hsum8(acc);
    for (; i < n; i++) r += q[i] * f16_to_f32(k[i]);
    return r;
}

__attribute__((target("avx2,fma,f16c"))) static void f16_axpy_avx2(float* o, float p,
                                                                   const uint16_t* v, int n) {
    const __m256 pv = _mm256_set1_ps(p);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 vv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(v + i)));
        _mm256_storeu_ps(o + i, _mm256_fmadd_ps(pv, vv, _mm256_loadu_ps(o + i)));
    }
    for (; i < n; i++) o[i] += p * f16_to_f32(v[i]);
}
#endif

void f16_row_put(uint16_t* dst, const float* src, int n) {
#if defined(__x86_64__)
    if (has_avx2()) {
        f16_put_avx2(dst, src, n);
        return;
    }
#endif
    for (int i = 0; i < n; i++) dst[i] = f32_to_f16(src[i], 1);
}

void f16_row_get(float* dst, const uint16_t* src, int n) {
#if defined(__x86_64__)
    if (has_avx2()) {
        f16_get_avx2(dst, src, n);
        return;
    }
#endif
    for (int i = 0; i < n; i++) dst[i] = f16_to_f32(src[i]);
}

float f16_row_dot(const float* q, const uint16_t* k, int n) {
#if defined(__x86_64__)
    if (has_avx2()) return f16_dot_avx2(q, k, n);
#endif
    float s = 0;
    for (int i = 0; i < n; i++) s += q[i] * f16_to_f32(k[i]);
    return s;
}

void f16_row_axpy(float* o, float p, const uint16_t* v, int n) {
#if defined(__x86_64__)
    if (has_avx2()) {
        f16_axpy_avx2(o, p, v, n);
        return;
    }
#endif
    for (int i = 0; i < n; i++) o[i] += p * f16_to_f32(v[i]);
}

#if defined(__x86_64__)
/* The 8-lane sums of a, b, c and d in lanes 0..3 (each vector's lanes added in the same order). */
__attribute__((target("avx2"))) static inline __m128 hsum4x8(__m256 a, __m256 b, __m256 c,
                                                             __m256 d) {
    const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* How many keys ahead the decode kernels ask for a key's row (each of its cache lines): a key list
 * jumps between blocks, where the hardware's prefetcher loses the stride. */
enum { KEY_AHEAD = 32 };

/* 1 when keys [t0, t1) are not one run of positions (chosen blocks, sinks before a window, group
 * runs): their rows are then asked for into L2 (T1), not L1. The requests of a list that jumps
 * each wait for memory, and L1 holds fewer outstanding misses than L2: measured on a Zen 4 (one
 * process switching paths step by step, docs/RESULTS.md), the learned selector's decode
 * attention 2-4 % faster, Quest's 7-10 %, runs of 64 rows in `bench keys` 1.01-1.08 times one
 * run (1.43 before). One run keeps T0: the hardware's prefetcher streams it into L2. */
static inline int keys_jump(const int* keys, int t0, int t1) {
    return t1 > t0 && keys[t1 - 1] - keys[t0] != t1 - 1 - t0;
}

/* Before the loop over keys [t0, t1): the value rows of the first KEY_AHEAD keys (the loop asks
 * for a value row KEY_AHEAD keys ahead, so these would come from memory one by one in the values'
 * pass) and the key rows of keys 4 .. 15 (the first four are loaded at once), into L2. A decode
 * step starts such a list for every part and head, some hundred times a token: measured on a Zen 4
 * (`bench keys`, one thread), 64 keys a list 35.2 -> 27.4 ns a key and head, 256 keys 20.5 ->
 * 18.3, 1024 keys 16.3 -> 15.4; one process switching step by step (docs/RESULTS.md), the
 * selector's decode attention 0.95 times as long, Quest's 0.96-0.99, the window's 0.96-1.02,
 * dense's 0.98-0.99. (Key rows 4 .. 31 into L2 measured the same; into L1 slower: the requests
 * at once fill its queue.) */
__attribute__((target("avx2"))) static inline void keys_start(const uint16_t* base, size_t stride,
                                                              const uint16_t* vpre, const int* keys,
                                                              int t0, int t1, int n) {
    const int te = t0 + KEY_AHEAD < t1 ? t0 + KEY_AHEAD : t1;
    for (int t = t0; t < te; t++) {
        const size_t at = (size_t)keys[t] * stride;
        for (int e = 0; e < n; e += 32) {
            if (vpre) _mm_prefetch((const char*)(vpre + at + e), _MM_HINT_T1);
            if (t >= t0 + 4 && t < t0 + 16) _mm_prefetch((const char*)(base + at + e), _MM_HINT_T1);
        }
    }
}

/* f16_scores4_avx2's heads r0 .. r0 + NR - 1 against four keys at a time */
__attribute__((target("avx2,fma,f16c"))) static inline __attribute__((always_inline)) void
f16_scores4_rows(float* sc, size_t ld, const float* q, int r0, const int NR, const uint16_t* base,
                 size_t stride, const int* keys, int t0, int t1, int n, __m128 sv,
                 const uint16_t* vpre) {
    const int jumps = keys_jump(keys, t0, t1);
    if (r0 == 0) /* the list's start: what the loop's requests, KEY_AHEAD on, leave to memory */
        keys_start(base, stride, vpre, keys, t0, t1, n);
    for (int t = t0; t < t1; t += 4) {
        const uint16_t* kp[4];
        for (int u = 0; u < 4; u++)
            kp[u] = base + (size_t)keys[t + u < t1 ? t + u : t1 - 1] * stride;
        for (int u = 0; u < 4 && r0 == 0 && t + KEY_AHEAD + u < t1; u++) {
            const size_t at = (size_t)keys[t + KEY_AHEAD + u] * stride;
            for (int e = 0; e < n; e += 32) {
                if (jumps)
                    _mm_prefetch((const char*)(base + at + e), _MM_HINT_T1);
                else
                    _mm_prefetch((const char*)(base + at + e), _MM_HINT_T0);
                if (vpre) _mm_prefetch((const char*)(vpre + at + e), _MM_HINT_T1);
            }
        }
        __m256 acc[3][4];
        for (int r = 0; r < NR; r++)
            for (int u = 0; u < 4; u++) acc[r][u] = _mm256_setzero_ps();
        for (int e = 0; e < n; e += 8) {
            __m256 kv[4];
            for (int u = 0; u < 4; u++)
                kv[u] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(kp[u] + e)));
            for (int r = 0; r < NR; r++) {
                const __m256 qv = _mm256_loadu_ps(q + (size_t)(r0 + r) * n + e);
                for (int u = 0; u < 4; u++) acc[r][u] = _mm256_fmadd_ps(qv, kv[u], acc[r][u]);
            }
        }
        for (int r = 0; r < NR; r++) {
            float s4[4];
            _mm_storeu_ps(s4, _mm_mul_ps(hsum4x8(acc[r][0], acc[r][1], acc[r][2], acc[r][3]), sv));
            for (int u = 0; u < 4 && t + u < t1; u++) sc[(size_t)(r0 + r) * ld + t + u] = s4[u];
        }
    }
}

/* f16_rows_scores for n a multiple of 8: four keys at a time for up to three heads (a key row
 * converted once for them), the four sums reduced together (a key's arithmetic is the same in
 * any group and beside any heads: the last group repeats its last key) */
__attribute__((target("avx2,fma,f16c"))) static inline __attribute__((always_inline)) void
f16_scores4_heads(float* sc, size_t ld, const float* q, int nq, const uint16_t* base, size_t stride,
                  const int* keys, int t0, int t1, const int n, __m128 sv, const uint16_t* vpre) {
    for (int r0 = 0; r0 < nq; r0 += 3) {
        const int nr = nq - r0 < 3 ? nq - r0 : 3;
        if (nr == 3)
            f16_scores4_rows(sc, ld, q, r0, 3, base, stride, keys, t0, t1, n, sv, vpre);
        else if (nr == 2)
            f16_scores4_rows(sc, ld, q, r0, 2, base, stride, keys, t0, t1, n, sv, vpre);
        else
            f16_scores4_rows(sc, ld, q, r0, 1, base, stride, keys, t0, t1, n, sv, vpre);
    }
}

/* (the common head sizes as constants: the loop over a row's lanes unrolled whole, 1.2-1.4x
 * faster at 64; the same arithmetic) */
__attribute__((target("avx2,fma,f16c"))) static void f16_scores4_avx2(
    float* sc, size_t ld, const float* q, int nq, const uint16_t* base, size_t stride,
    const int* keys, int t0, int t1, int n, float scale, const uint16_t* vpre) {
    const __m128 sv = _mm_set1_ps(scale);
    if (n == 64)
        f16_scores4_heads(sc, ld, q, nq, base, stride, keys, t0, t1, 64, sv, vpre);
    else if (n == 128)
        f16_scores4_heads(sc, ld, q, nq, base, stride, keys, t0, t1, 128, sv, vpre);
    else if (n == 256)
        f16_scores4_heads(sc, ld, q, nq, base, stride, keys, t0, t1, 256, sv, vpre);
    else
        f16_scores4_heads(sc, ld, q, nq, base, stride, keys, t0, t1, n, sv, vpre);
}

/* up to 4 heads at a time: a key's 8-lane chunks against each head's, one conversion (n a
 * multiple of 8: f16_scores4_avx2) */
__attribute__((target("avx2,fma,f16c"))) static void f16_scores_avx2(
    float* sc, size_t ld, const float* q, int nq, const uint16_t* base, size_t stride,
    const int* keys, int t0, int t1, int n, float scale, const uint16_t* vpre) {
    if (n % 8 == 0) {
        f16_scores4_avx2(sc, ld, q, nq, base, stride, keys, t0, t1, n, scale, vpre);
        return;
    }
    for (int r0 = 0; r0 < nq; r0 += 4) {
        const int nr = nq - r0 < 4 ? nq - r0 : 4;
        for (int t = t0; t < t1; t++) {
            const uint16_t* k = base + (size_t)keys[t] * stride;
            __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                             _mm256_setzero_ps()};
            int e = 0;
            for (; e + 8 <= n; e += 8) {
                const __m256 kv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(k + e)));
                for (int r = 0; r < nr; r++)
                    acc[r] =
                        _mm256_fmadd_ps(_mm256_loadu_ps(q + (size_t)(r0 + r) * n + e), kv, acc[r]);
            }
            for (int r = 0; r < nr; r++) {
                float s = hsum8(acc[r]);
                for (int j = e; j < n; j++) s += q[(size_t)(r0 + r) * n + j] * f16_to_f32(k[j]);
                sc[(size_t)(r0 + r) * ld + t] = s * scale;
            }
        }
    }
}

/* f16_mix_avx2's rows r0 .. r0 + NR - 1 over the 32 columns from e0: their sums held in
 * registers across the keys (the same fused products, in the same order, as one row at a time
 * through memory). */
__attribute__((target("avx2,fma,f16c"))) static inline __attribute__((always_inline)) void
f16_mix32_avx2(float* o, size_t ostride, const float* w, size_t ld, int r0, const int NR,
               const uint16_t* base, size_t stride, const int* keys, int t0, int t1, int e0) {
    __m256 acc[3][4];
    for (int r = 0; r < NR; r++)
        for (int u = 0; u < 4; u++)
            acc[r][u] = _mm256_loadu_ps(o + (size_t)(r0 + r) * ostride + e0 + 8 * u);
    for (int t = t0; t < t1; t++) {
        if (t + KEY_AHEAD < t1)
            _mm_prefetch((const char*)(base + (size_t)keys[t + KEY_AHEAD] * stride + e0),
                         _MM_HINT_T0);
        const uint16_t* v = base + (size_t)keys[t] * stride + e0;
        __m256 vv[4];
        for (int u = 0; u < 4; u++)
            vv[u] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(v + 8 * u)));
        for (int r = 0; r < NR; r++) {
            const __m256 p = _mm256_set1_ps(w[(size_t)(r0 + r) * ld + t]);
            for (int u = 0; u < 4; u++) acc[r][u] = _mm256_fmadd_ps(p, vv[u], acc[r][u]);
        }
    }
    for (int r = 0; r < NR; r++)
        for (int u = 0; u < 4; u++)
            _mm256_storeu_ps(o + (size_t)(r0 + r) * ostride + e0 + 8 * u, acc[r][u]);
}

__attribute__((target("avx2,fma,f16c"))) static void f16_mix_avx2(float* o, size_t ostride,
                                                                  const float* w, size_t ld, int nq,
                                                                  const uint16_t* base,
                                                                  size_t stride, const int* keys,
                                                                  int t0, int t1, int n) {
    /* the columns in chunks of 32 (a value row's cache line), up to 3 rows at a time */
    const int n32 = n / 32 * 32;
    for (int r0 = 0; r0 < nq && n32; r0 += 3) {
        const int nr = nq - r0 < 3 ? nq - r0 : 3;
        for (int e0 = 0; e0 < n32; e0 += 32) {
            if (nr == 3)
                f16_mix32_avx2(o, ostride, w, ld, r0, 3, base, stride, keys, t0, t1, e0);
            else if (nr == 2)
                f16_mix32_avx2(o, ostride, w, ld, r0, 2, base, stride, keys, t0, t1, e0);
            else
                f16_mix32_avx2(o, ostride, w, ld, r0, 1, base, stride, keys, t0, t1, e0);
        }
    }
    for (int t = t0; t < t1 && n32 < n; t++) {
        const uint16_t* v = base + (size_t)keys[t] * stride;
        int e = n32;
        for (; e + 8 <= n; e += 8) {
            const __m256 vv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(v + e)));
            for (int r = 0; r < nq; r++) {
                float* orow = o + (size_t)r * ostride + e;
                _mm256_storeu_ps(orow, _mm256_fmadd_ps(_mm256_set1_ps(w[(size_t)r * ld + t]), vv,
                                                       _mm256_loadu_ps(orow)));
            }
        }
        for (; e < n; e++)
            for (int r = 0; r < nq; r++)
                o[(size_t)r * ostride + e] += w[(size_t)r * ld + t] * f16_to_f32(v[e]);
    }
}
#endif

void f16_rows_scores(float* sc, size_t ld, const float* q, int nq, const uint16_t* base,
                     size_t stride, const int* keys, int t0, int t1, int n, float scale,
                     const uint16_t* vpre) {
#if defined(__x86_64__)
    if (has_avx2()) {
        f16_scores_avx2(sc, ld, q, nq, base, stride, keys, t0, t1, n, scale, vpre);
        return;
    }
#endif
    (void)vpre; /* (a hint) */
    for (int r = 0; r < nq; r++)
        for (int t = t0; t < t1; t++) {
            const uint16_t* k = base + (size_t)keys[t] * stride;
            float s = 0;
            for (int e = 0; e < n; e++) s += q[(size_t)r * n + e] * f16_to_f32(k[e]);
            sc[(size_t)r * ld + t] = s * scale;
        }
}

void f16_rows_mix(float* o, size_t ostride, const float* w, size_t ld, int nq, const uint16_t* base,
                  size_t stride, const int* keys, int t0, int t1, int n) {
#if defined(__x86_64__)
    if (has_avx2()) {
        f16_mix_avx2(o, ostride, w, ld, nq, base, stride, keys, t0, t1, n);
        return;
    }
#endif
    for (int t = t0; t < t1; t++) {
        const uint16_t* v = base + (size_t)keys[t] * stride;
        for (int r = 0; r < nq; r++)
            for (int e = 0; e < n; e++)
                o[(size_t)r * ostride + e] += w[(size_t)r * ld + t] * f16_to_f32(v[e]);
    }
}

/* ------------------------------------------------------------------ int8 products of a prompt */

/* The weights of a panel of 16-row groups in the layout of the VNNI dot product: for group g,
 * block b and k-quad t, 64 bytes = 16 rows x 4 consecutive weights as unsigned bytes u, with
 * w = s (u - off) + c per (row, block); the activations' int8 quadruples are broadcast against
 * them. The offset (8 for Q4_0, 128 for Q8_0) is taken off with the quantised activations'
 * own sum, as qmatvec does, c with the exact sum. */
typedef struct {
    uint8_t* u;   /* (groups, nb, 8, 16, 4) */
    float *s, *c; /* (groups, nb, 16) */
    int off;
    int is_signed; /* u holds the signed int8 weights themselves (off 0): Q8_0 for AVX2's
                    * maddubs, whose u8 x s8 pairs would overflow int16 with 255 */
    int quads16;   /* how many of a block's maddubs results (int16 sums of two u8 x s8
                    * products) add up within int16: 8 for 4-bit weights, 4 for 5-bit, 1 */
} Panel;

/* Of a panel's weights u (at most 15 for the 4-bit formats, 31 for the 5-bit ones) against
 * int8 activations (|x| <= 127), how many quads' maddubs pairs add up within int16: 8 x 2 x 15 x
 * 127 = 30480 and 4 x 2 x 31 x 127 = 31496 stay below 32767; 8-bit weights one at a time. */
static int panel_quads16(int type) {
    return type == QTYPE_Q4_0 || type == QTYPE_Q4_1 || type == QTYPE_Q4_K ? 8
           : type == QTYPE_Q5_0 || type == QTYPE_Q5_K                     ? 4
                                                                          : 1;
}

/* 1 when a block format has one scale per 32 weights (what the panel holds; Q6_K has two) */
static int int8_panel_format(int type) { return block_elems(type) && type != QTYPE_Q6_K; }

/* pack_panel from qmatrix_prepare's copy, which holds the same unsigned weights per 16-row
 * group and block (Q4: two to a byte, quads 2t and 2t + 1 in the low and high nibbles of its
 * quad t; Q8_0: the panel's bytes themselves) and the scales as fp16: the same panel, bit for
 * bit, at a fraction of the cost of decoding every block again (a prompt fed in chunks packs
 * every weight once per chunk). 0 where the copy does not fit the panel. */
static int pack_panel_packed(Panel* p, const QMatrix* w, int r0, int nr) {
    const int q4 = w->type == QTYPE_Q4_0 || w->type == QTYPE_Q4_1, q8 = w->type == QTYPE_Q8_0;
    if (!w->packed || w->packed_isa != quant_isa() || !(q4 || q8) || r0 % 16 ||
        (q8 && p->off != panel_offset(w->type, w->packed_isa == QUANT_ISA_AVX2)))
        return 0;
    const int nb = w->cols / 32, groups = (nr + 15) / 16;
    const size_t S = vnni_block_bytes(w->type), at = packed_scales_at(w->type);
#pragma omp parallel for schedule(static)
    for (int g = 0; g < groups; g++) {
        for (int k = 0; k < nb; k++) {
            const uint8_t* blk = w->packed + ((size_t)(r0 / 16 + g) * nb + k) * S;
            uint8_t* u = p->u + ((size_t)g * nb + k) * 512;
            if (q8) {
                memcpy(u, blk, 512);
            } else {
                for (int t = 0; t < 4; t++)
                    for (int i = 0; i < 64; i++) {
                        u[128 * t + i] = blk[64 * t + i] & 15;
                        u[128 * t + 64 + i] = blk[64 * t + i] >> 4;
                    }
            }
            const size_t sc = ((size_t)g * nb + k) * 16;
            for (int L = 0; L < 16; L++) {
                const int live = 16 * g + L < nr; /* rows past nr zero, as pack_panel has them */
                p->s[sc + L] = live ? f16_to_f32(rd16(blk + at + 2 * L)) : 0.0f;
                p->c[sc + L] =
                    live && w->type == QTYPE_Q4_1 ? f16_to_f32(rd16(blk + at + 32 + 2 * L)) : 0.0f;
                if (!live)
                    for (int t = 0; t < 8; t++) memset(u + 64 * t + 4 * L, 0, 4);
            }
        }
    }
    return 1;
}

/* Rows r0 .. r0 + nr - 1 of w into panel groups (rows past nr zero). */
static void pack_panel(Panel* p, const QMatrix* w, int r0, int nr) {
    if (pack_panel_packed(p, w, r0, nr)) return;
    const int nb = w->cols / 32, groups = (nr + 15) / 16;
#pragma omp parallel for schedule(static)
    for (int g = 0; g < groups; g++) {
        Sub32 b;
        for (int L = 0; L < 16; L++) {
            const int r = 16 * g + L;
            const uint8_t* row = r < nr ? w->data + (size_t)(r0 + r) * w->row_bytes : NULL;
            for (int k = 0; k < nb; k++) {
                const size_t sc = ((size_t)g * nb + k) * 16 + L;
                uint8_t* u = p->u + ((size_t)g * nb + k) * 512 + 4 * L;
                if (!row) {
                    p->s[sc] = p->c[sc] = 0;
                    for (int t = 0; t < 8; t++) memset(u + 64 * t, 0, 4);
                    continue;
                }
                sub32(&b, w->type, row, k);
                const int off = p->off; /* q is signed for Q4_0 and Q8_0 */
                p->s[sc] = b.s[0];
                p->c[sc] = b.off;
                for (int t = 0; t < 8; t++)
                    for (int e = 0; e < 4; e++) u[64 * t + e] = (uint8_t)(b.q[4 * t + e] + off);
            }
        }
    }
}

/* out (4, 32) = rows i0 .. i0 + 3 of x (quantised: xb holds nb blocks per row) against the 32
 * weight rows of panel groups g and g + 1 (columns at or past ncols - 16 g left as they are):
 * the scalar reference of panel_tile_vnni, the same integer sums, scaled per block. */
static void panel_tile_ref(float out[4][32], const Panel* p, const XBlock* xb, int nb, int i0,
                           int g, int ncols) {
    for (int r = 0; r < 4; r++)
        for (int j = 0; j < 32 && 16 * g + j < ncols; j++) {
            const int gg = g + j / 16, L = j % 16;
            float acc = 0;
            for (int k = 0; k < nb; k++) {
                const XBlock* x = xb + (size_t)(i0 + r) * nb + k;
                const uint8_t* u = p->u + ((size_t)gg * nb + k) * 512 + 4 * L;
                int32_t sum = 0;
                for (int t = 0; t < 8; t++)
                    for (int e = 0; e < 4; e++)
                        sum += (p->is_signed ? (int8_t)u[64 * t + e] : u[64 * t + e]) *
                               x->q[4 * t + e];
                sum -= p->off * x->qsum;
                const size_t sc = ((size_t)gg * nb + k) * 16 + L;
                acc = (float)sum * (p->s[sc] * x->d) + (p->c[sc] * x->sum + acc);
            }
            out[r][j] = acc;
        }
}

#if defined(__x86_64__)
/* panel_tile_ref with AVX-512 VNNI: per block, eight 4-byte broadcasts of each row's int8
 * activations, each against 16 weight rows x 4 bytes in one VPDPBUSD (u8 x s8, 64 products
 * into 16 int32 sums), then per 16 lanes the block's scale and offset terms in fp32. */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void panel_tile_vnni(
    float out[4][32], const Panel* p, const XBlock* xb, int nb, int i0, int g, int ncols) {
    __m512 acc[4][2];
    for (int r = 0; r < 4; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    const int two = 16 * (g + 1) < ncols;
    for (int k = 0; k < nb; k++) {
        __m512i isum[4][2];
        for (int r = 0; r < 4; r++) isum[r][0] = isum[r][1] = _mm512_setzero_si512();
        const uint8_t* u0 = p->u + ((size_t)g * nb + k) * 512;
        const uint8_t* u1 = u0 + (size_t)nb * 512;
        for (int t = 0; t < 8; t++) {
            const __m512i b0 = _mm512_loadu_si512(u0 + 64 * t);
            const __m512i b1 = two ? _mm512_loadu_si512(u1 + 64 * t) : _mm512_setzero_si512();
            for (int r = 0; r < 4; r++) {
                int32_t quad;
                memcpy(&quad, xb[(size_t)(i0 + r) * nb + k].q + 4 * t, 4);
                const __m512i a = _mm512_set1_epi32(quad);
                isum[r][0] = _mm512_dpbusd_epi32(isum[r][0], b0, a);
                isum[r][1] = _mm512_dpbusd_epi32(isum[r][1], b1, a);
            }
        }
        const size_t sc = ((size_t)g * nb + k) * 16;
        const __m512 s0 = _mm512_loadu_ps(p->s + sc), c0 = _mm512_loadu_ps(p->c + sc);
        const __m512 s1 = two ? _mm512_loadu_ps(p->s + sc + (size_t)nb * 16) : s0;
        const __m512 c1 = two ? _mm512_loadu_ps(p->c + sc + (size_t)nb * 16) : c0;
        for (int r = 0; r < 4; r++) {
            const XBlock* x = xb + (size_t)(i0 + r) * nb + k;
            const __m512 dx = _mm512_set1_ps(x->d), sx = _mm512_set1_ps(x->sum);
            const __m512i corr = _mm512_set1_epi32(p->off * x->qsum);
            isum[r][0] = _mm512_sub_epi32(isum[r][0], corr);
            isum[r][1] = _mm512_sub_epi32(isum[r][1], corr);
            acc[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][0]), _mm512_mul_ps(s0, dx),
                                        _mm512_fmadd_ps(c0, sx, acc[r][0]));
            acc[r][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][1]), _mm512_mul_ps(s1, dx),
                                        _mm512_fmadd_ps(c1, sx, acc[r][1]));
        }
    }
    for (int r = 0; r < 4; r++) {
        _mm512_storeu_ps(out[r], acc[r][0]);
        _mm512_storeu_ps(out[r] + 16, acc[r][1]);
    }
}
#endif

#if defined(__x86_64__)
/* A 256-bit tile's block k of 16-row group gg done: the four rows' integer sums isum (rows 0-7
 * and 8-15) scaled into acc, w = s (u - off) + c against x = d q (exact sum `sum`). */
__attribute__((target("avx2,fma"))) static inline __attribute__((always_inline)) void tile256_scale(
    __m256 acc[4][2], __m256i isum[4][2], const Panel* p, const XBlock* xb, int nb, int i0, int gg,
    int k) {
    const size_t sc = ((size_t)gg * nb + k) * 16;
    const __m256 s0 = _mm256_loadu_ps(p->s + sc), s1 = _mm256_loadu_ps(p->s + sc + 8);
    const __m256 c0 = _mm256_loadu_ps(p->c + sc), c1 = _mm256_loadu_ps(p->c + sc + 8);
    for (int r = 0; r < 4; r++) {
        const XBlock* x = xb + (size_t)(i0 + r) * nb + k;
        const __m256 dx = _mm256_set1_ps(x->d), sx = _mm256_set1_ps(x->sum);
        const __m256i corr = _mm256_set1_epi32(p->off * x->qsum);
        acc[r][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(isum[r][0], corr)),
                                    _mm256_mul_ps(s0, dx), _mm256_fmadd_ps(c0, sx, acc[r][0]));
        acc[r][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(isum[r][1], corr)),
                                    _mm256_mul_ps(s1, dx), _mm256_fmadd_ps(c1, sx, acc[r][1]));
    }
}

/* The AVX-VNNI tile (its loops and panel_tile_avx2's are the same; the inner products need
 * different target instruction sets, so the two are written out): one 16-row group at a time (rows
 * 0-7 and 8-15 of it in two registers of 8 rows x 4 bytes), four rows of x, a block's integer sums
 * by VPDPBUSD (the u8 x s8 product of four bytes into each int32 lane; the weights unsigned, as
 * panel_tile_vnni takes them) then its scales in fp32. AVX2 has its own tile below,
 * panel_tile_avx2. */
__attribute__((target("avx2,fma,avxvnni"))) static void panel_tile_avxvnni(
    float out[4][32], const Panel* p, const XBlock* xb, int nb, int i0, int g, int ncols) {
    for (int half = 0; half < 2 && 16 * (g + half) < ncols; half++) {
        const int gg = g + half;
        __m256 acc[4][2];
        for (int r = 0; r < 4; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        for (int k = 0; k < nb; k++) {
            __m256i isum[4][2];
            for (int r = 0; r < 4; r++) isum[r][0] = isum[r][1] = _mm256_setzero_si256();
            const uint8_t* u = p->u + ((size_t)gg * nb + k) * 512;
            for (int t = 0; t < 8; t++) {
                const __m256i b0 = _mm256_loadu_si256((const __m256i*)(u + 64 * t));
                const __m256i b1 = _mm256_loadu_si256((const __m256i*)(u + 64 * t + 32));
                for (int r = 0; r < 4; r++) {
                    int32_t quad;
                    memcpy(&quad, xb[(size_t)(i0 + r) * nb + k].q + 4 * t, 4);
                    const __m256i a = _mm256_set1_epi32(quad);
                    isum[r][0] = _mm256_dpbusd_avx_epi32(isum[r][0], b0, a);
                    isum[r][1] = _mm256_dpbusd_avx_epi32(isum[r][1], b1, a);
                }
            }
            tile256_scale(acc, isum, p, xb, nb, i0, gg, k);
        }
        for (int r = 0; r < 4; r++) {
            _mm256_storeu_ps(out[r] + 16 * half, acc[r][0]);
            _mm256_storeu_ps(out[r] + 16 * half + 8, acc[r][1]);
        }
    }
}

/* The AVX2 tile, of panel_tile_avxvnni's shape without VNNI: VPMADDUBSW gives each int16 lane the
 * sum of two u8 x s8 products, and G quads of a block are added in int16 (p->quads16: no overflow)
 * before one VPMADDWD by ones widens them to int32. The same integer sums as a widening per
 * quad, with 9 multiplies in place of 16 for 4-bit weights. */
__attribute__((target("avx2,fma"))) static inline __attribute__((always_inline)) void
panel_tile_avx2_g(float out[4][32], const Panel* p, const XBlock* xb, int nb, int i0, int g,
                  int ncols, const int G) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int half = 0; half < 2 && 16 * (g + half) < ncols; half++) {
        const int gg = g + half;
        __m256 acc[4][2];
        for (int r = 0; r < 4; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        for (int k = 0; k < nb; k++) {
            __m256i isum[4][2];
            for (int r = 0; r < 4; r++) isum[r][0] = isum[r][1] = _mm256_setzero_si256();
            const uint8_t* u = p->u + ((size_t)gg * nb + k) * 512;
            for (int t0 = 0; t0 < 8; t0 += G) {
                __m256i s16[4][2];
                for (int r = 0; r < 4; r++) s16[r][0] = s16[r][1] = _mm256_setzero_si256();
                for (int t = t0; t < t0 + G; t++) {
                    const __m256i b0 = _mm256_loadu_si256((const __m256i*)(u + 64 * t));
                    const __m256i b1 = _mm256_loadu_si256((const __m256i*)(u + 64 * t + 32));
                    for (int r = 0; r < 4; r++) {
                        int32_t quad;
                        memcpy(&quad, xb[(size_t)(i0 + r) * nb + k].q + 4 * t, 4);
                        const __m256i a = _mm256_set1_epi32(quad);
                        if (p->is_signed) { /* |w| x (x sign w): the pairs stay within int16 */
                            s16[r][0] = _mm256_add_epi16(
                                s16[r][0], _mm256_maddubs_epi16(_mm256_sign_epi8(b0, b0),
                                                                _mm256_sign_epi8(a, b0)));
                            s16[r][1] = _mm256_add_epi16(
                                s16[r][1], _mm256_maddubs_epi16(_mm256_sign_epi8(b1, b1),
                                                                _mm256_sign_epi8(a, b1)));
                        } else {
                            s16[r][0] = _mm256_add_epi16(s16[r][0], _mm256_maddubs_epi16(b0, a));
                            s16[r][1] = _mm256_add_epi16(s16[r][1], _mm256_maddubs_epi16(b1, a));
                        }
                    }
                }
                for (int r = 0; r < 4; r++)
                    for (int h = 0; h < 2; h++)
                        isum[r][h] =
                            _mm256_add_epi32(isum[r][h], _mm256_madd_epi16(s16[r][h], ones));
            }
            tile256_scale(acc, isum, p, xb, nb, i0, gg, k);
        }
        for (int r = 0; r < 4; r++) {
            _mm256_storeu_ps(out[r] + 16 * half, acc[r][0]);
            _mm256_storeu_ps(out[r] + 16 * half + 8, acc[r][1]);
        }
    }
}

__attribute__((target("avx2,fma"))) static void panel_tile_avx2(float out[4][32], const Panel* p,
                                                                const XBlock* xb, int nb, int i0,
                                                                int g, int ncols) {
    if (p->quads16 == 8)
        panel_tile_avx2_g(out, p, xb, nb, i0, g, ncols, 8);
    else if (p->quads16 == 4)
        panel_tile_avx2_g(out, p, xb, nb, i0, g, ncols, 4);
    else
        panel_tile_avx2_g(out, p, xb, nb, i0, g, ncols, 1);
}
#endif

typedef void (*PanelTile)(float out[4][32], const Panel* p, const XBlock* xb, int nb, int i0, int g,
                          int ncols);

/* The prompt's int8 products at each instruction-set level (NULL: the fp32 panels and the
 * BLAS, faster than portable integer code). */
static PanelTile panel_tile_at(int level) {
#if defined(__x86_64__)
    static const PanelTile tiles[QUANT_ISA_COUNT] = {NULL, panel_tile_avx2, panel_tile_avxvnni,
                                                     panel_tile_vnni};
    return tiles[level];
#else
    (void)level;
    return NULL;
#endif
}

int qmatmul_int8_available(void) { return panel_tile_at(quant_isa()) != NULL; }

int qmatmul_rows_alike(const QMatrix* w, int exact) {
    return int8_panel_format(w->type) && qmatmul_int8_available() && !exact;
}

static void matmul_int8(float* y, int ldy, const QMatrix* w, const float* x, int n,
                        const float* bias, int vector) {
    const int nb = w->cols / 32;
    const int n4 = (n + 3) / 4 * 4; /* rows past n: zero activations */
    XBlock* xb = mallocCheck(sizeof(XBlock) * (size_t)n4 * nb);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n4; i++) {
        if (i < n)
            quantize_rows(xb + (size_t)i * nb, x + (size_t)i * w->cols, w->cols, vector);
        else
            memset(xb + (size_t)i * nb, 0, sizeof(XBlock) * (size_t)nb);
    }
    /* panels of up to 512 rows (a few hundred kB: they stay in the caches while every tile of
     * x passes over them) */
    const int pr = w->rows < 512 ? (w->rows + 31) / 32 * 32 : 512;
    const PanelTile tile_fn = vector ? panel_tile_at(quant_isa()) : NULL;
    Panel p;
    /* the maddubs tile takes Q8_0 signed; the others (and the reference) either form */
    p.is_signed = w->type == QTYPE_Q8_0 && tile_fn != NULL && quant_isa() < QUANT_ISA_AVX_VNNI;
    p.off = panel_offset(w->type, p.is_signed);
    p.quads16 = panel_quads16(w->type);
    p.u = mallocCheck((size_t)pr * nb * 32);
    p.s = mallocCheck(sizeof(float) * (size_t)pr * nb);
    p.c = mallocCheck(sizeof(float) * (size_t)pr * nb);
    for (int r0 = 0; r0 < w->rows; r0 += pr) {
        const int nr = w->rows - r0 < pr ? w->rows - r0 : pr, pairs = (nr + 31) / 32;
        pack_panel(&p, w, r0, nr);
#pragma omp parallel for schedule(dynamic, 8)
        for (int tile = 0; tile < n4 / 4 * pairs; tile++) {
            const int i0 = 4 * (tile / pairs), g = 2 * (tile % pairs);
            float out[4][32];
            if (tile_fn)
                tile_fn(out, &p, xb, nb, i0, g, nr);
            else
                panel_tile_ref(out, &p, xb, nb, i0, g, nr);
            const int nj = nr - 16 * g < 32 ? nr - 16 * g : 32;
            for (int r = 0; r < 4 && i0 + r < n; r++) {
                float* yr = y + (size_t)(i0 + r) * ldy + r0 + 16 * g;
                for (int j = 0; j < nj; j++)
                    yr[j] = out[r][j] + (bias ? bias[r0 + 16 * g + j] : 0.0f);
            }
        }
    }
    free(p.u), free(p.s), free(p.c), free(xb);
}

void qmatmul(float* y, int ldy, const QMatrix* w, const float* x, int n, const float* bias,
             int exact) {
    /* (the same path for any n, a single row included: a row's products do not depend on the
     * rows beside it, so a prompt fed in any chunks gives the same bits) */
    if (int8_panel_format(w->type) && qmatmul_int8_available() && !exact) {
        matmul_int8(y, ldy, w, x, n, bias, 1);
        return;
    }
    /* Many rows (a prompt) without VNNI, or exact: expanding a panel of weight rows to fp32 costs
     * once what the n rows then reuse, and the fp32 product of the BLAS is faster than int8
     * products without VNNI. The panel (about 4 MB) is the only fp32 copy of the weights that
     * exists. */
    int pr = (1 << 20) / w->cols;
    pr = pr < 16 ? 16 : pr - pr % 16;
    if (pr > w->rows) pr = w->rows;
    float* panel = mallocCheck(sizeof(float) * (size_t)pr * w->cols);
    for (int r0 = 0; r0 < w->rows; r0 += pr) {
        const int nr = w->rows - r0 < pr ? w->rows - r0 : pr;
#pragma omp parallel for schedule(static)
        for (int r = 0; r < nr; r++) qrow(panel + (size_t)r * w->cols, w, r0 + r);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, nr, w->cols, 1.0f, x, w->cols,
                    panel, w->cols, 0.0f, y + r0, ldy);
    }
    free(panel);
    if (bias) {
#pragma omp parallel for schedule(static)
        for (int i = 0; i < n; i++)
            for (int r = 0; r < w->rows; r++) y[(size_t)i * ldy + r] += bias[r];
    }
}

void qmatmul_int8_ref(float* y, int ldy, const QMatrix* w, const float* x, int n,
                      const float* bias) {
    matmul_int8(y, ldy, w, x, n, bias, 0);
}
