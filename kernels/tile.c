/* tile.c: the attention tiles' small products, each element one chain of fused multiply-adds
 * (see tile.h). Rows six at a time against 16 columns (AVX2), or eight against 32 (AVX-512), held
 * in registers; the columns past the last whole chunk and the CPUs without AVX2 take the same chain
 * one element at a time (fmaf rounds as the vector instruction does). */
#include "tile.h"

#include <math.h>
#include <stddef.h>

#include "quant.h" /* quant_isa: the instruction-set level in use */

#if defined(__x86_64__) && !defined(FOCUS_DOUBLE)
#include <immintrin.h>
#define TILE_X86 1
#endif

#ifdef FOCUS_DOUBLE
#define FMA_R fma
#else
#define FMA_R fmaf
#endif

enum { SET, ADD_TO, SCALED }; /* an element: s, c + s, or alpha s */

/* columns [j0, n) of one row, an element at a time */
static void row_tail(real* c, const real* a, const real* bk, int ldb, int j0, int n, int k,
                     int mode, real alpha) {
    for (int j = j0; j < n; j++) {
        real s = 0;
        for (int e = 0; e < k; e++) s = FMA_R(a[e], bk[(size_t)e * ldb + j], s);
        c[j] = mode == SCALED ? alpha * s : mode == ADD_TO ? c[j] + s : s;
    }
}

#ifdef TILE_X86
/* NR rows (a, c: their pointers) by the 16 columns from j0 */
__attribute__((target("avx2,fma"))) static inline __attribute__((always_inline)) void block16(
    real* const* c, const real* const* a, const real* bk, int ldb, int j0, int k, const int NR,
    int mode, real alpha) {
    __m256 acc[6][2];
    for (int r = 0; r < NR; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int e = 0; e < k; e++) {
        const real* b = bk + (size_t)e * ldb + j0;
        const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
        for (int r = 0; r < NR; r++) {
            const __m256 x = _mm256_broadcast_ss(a[r] + e);
            acc[r][0] = _mm256_fmadd_ps(x, b0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(x, b1, acc[r][1]);
        }
    }
    for (int r = 0; r < NR; r++)
        for (int v = 0; v < 2; v++) {
            real* o = c[r] + j0 + 8 * v;
            __m256 s = acc[r][v];
            if (mode == SCALED) s = _mm256_mul_ps(_mm256_set1_ps(alpha), s);
            if (mode == ADD_TO) s = _mm256_add_ps(_mm256_loadu_ps(o), s);
            _mm256_storeu_ps(o, s);
        }
}

/* NR rows by the 32 columns from j0 */
__attribute__((target("avx512f"))) static inline __attribute__((always_inline)) void block32(
    real* const* c, const real* const* a, const real* bk, int ldb, int j0, int k, const int NR,
    int mode, real alpha) {
    __m512 acc[8][2];
    for (int r = 0; r < NR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int e = 0; e < k; e++) {
        const real* b = bk + (size_t)e * ldb + j0;
        const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
        for (int r = 0; r < NR; r++) {
            const __m512 x = _mm512_set1_ps(a[r][e]);
            acc[r][0] = _mm512_fmadd_ps(x, b0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(x, b1, acc[r][1]);
        }
    }
    for (int r = 0; r < NR; r++)
        for (int v = 0; v < 2; v++) {
            real* o = c[r] + j0 + 16 * v;
            __m512 s = acc[r][v];
            if (mode == SCALED) s = _mm512_mul_ps(_mm512_set1_ps(alpha), s);
            if (mode == ADD_TO) s = _mm512_add_ps(_mm512_loadu_ps(o), s);
            _mm512_storeu_ps(o, s);
        }
}

/* the cases of a switch on nr for the row counts 1 to 6 a block is compiled for */
#define TILE_ROWS6(CALL) \
    case 6:              \
        CALL(6);         \
        break;           \
    case 5:              \
        CALL(5);         \
        break;           \
    case 4:              \
        CALL(4);         \
        break;           \
    case 3:              \
        CALL(3);         \
        break;           \
    case 2:              \
        CALL(2);         \
        break;           \
    default:             \
        CALL(1);         \
        break;

/* nr (at most 6) rows by the columns [j0, j1) in 16s */
__attribute__((target("avx2,fma"))) static void rows16(real* const* c, const real* const* a, int nr,
                                                       const real* bk, int ldb, int j0, int j1,
                                                       int k, int mode, real alpha) {
    for (int j = j0; j + 16 <= j1; j += 16) {
#define CALL16(R) block16(c, a, bk, ldb, j, k, R, mode, alpha)
        switch (nr) { TILE_ROWS6(CALL16) }
#undef CALL16
    }
}

/* nr (at most 8) rows by the columns [0, j1) in 32s */
__attribute__((target("avx512f"))) static void rows32(real* const* c, const real* const* a, int nr,
                                                      const real* bk, int ldb, int j1, int k,
                                                      int mode, real alpha) {
    for (int j = 0; j + 32 <= j1; j += 32) {
#define CALL32(R) block32(c, a, bk, ldb, j, k, R, mode, alpha)
        switch (nr) {
            case 8:
                CALL32(8);
                break;
            case 7:
                CALL32(7);
                break;
                TILE_ROWS6(CALL32)
        }
#undef CALL32
    }
}
#endif

/* C's listed rows from A's and bk (k x n, ldb): each element's chain, then its finish */
static void rows_by_k(real* C, int ldc, const real* A, int lda, const real* bk, int ldb, int m,
                      int n, int k, int mode, real alpha, const int* rows, int nrows) {
    const int count = rows ? nrows : m;
    int wide = 0, narrow = 0; /* the columns in 32s and in 16s */
#ifdef TILE_X86
    const int isa = quant_isa();
    if (isa >= QUANT_ISA_AVX512_VNNI) wide = n / 32 * 32;
    if (isa >= QUANT_ISA_AVX2) narrow = n / 16 * 16;
#else
    (void)wide;
#endif
    const int step = wide ? 8 : narrow ? 6 : 1; /* rows a block holds in registers */
    for (int x0 = 0; x0 < count; x0 += step) {
        const int nr = count - x0 < step ? count - x0 : step;
        real* c[8];
        const real* a[8];
        for (int r = 0; r < nr; r++) {
            const int R = rows ? rows[x0 + r] : x0 + r;
            c[r] = C + (size_t)R * ldc;
            a[r] = A + (size_t)R * lda;
        }
#ifdef TILE_X86
        if (wide) rows32(c, a, nr, bk, ldb, wide, k, mode, alpha);
        for (int r0 = 0; narrow > wide && r0 < nr; r0 += 6) /* (16 columns: 6 rows a block) */
            rows16(c + r0, a + r0, nr - r0 < 6 ? nr - r0 : 6, bk, ldb, wide, narrow, k, mode,
                   alpha);
#endif
        for (int r = 0; r < nr; r++) row_tail(c[r], a[r], bk, ldb, narrow, n, k, mode, alpha);
    }
}

#ifdef TILE_X86
/* bt (k x n) = B^T for B (n x k, ldb), both multiples of 8: 8 x 8 blocks in registers */
__attribute__((target("avx2"))) static void transpose8(real* bt, const real* B, int ldb, int n,
                                                       int k) {
    for (int j0 = 0; j0 < n; j0 += 8)
        for (int e0 = 0; e0 < k; e0 += 8) {
            __m256 r[8], t[8];
            for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(B + (size_t)(j0 + i) * ldb + e0);
            for (int i = 0; i < 8; i += 2) {
                t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
                t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
            }
            for (int i = 0; i < 8; i += 4) {
                r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
                r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
                r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
                r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
            }
            /* r[0..3]: columns e0 .. e0 + 3 of rows j0 .. j0 + 3 (low half) and e0 + 4 .. e0 + 7
             * (high half); r[4..7]: the same for rows j0 + 4 .. j0 + 7 */
            for (int i = 0; i < 4; i++) {
                _mm256_storeu_ps(bt + (size_t)(e0 + i) * n + j0,
                                 _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
                _mm256_storeu_ps(bt + (size_t)(e0 + i + 4) * n + j0,
                                 _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
            }
        }
}
#endif

void tile_abt(real* C, int ldc, const real* A, int lda, const real* B, int ldb, int m, int n, int k,
              real alpha, const int* rows, int nrows, real* bt) {
    if (m == 0 || n == 0) return;
#ifdef TILE_X86
    if (n % 8 == 0 && k % 8 == 0 && quant_isa() >= QUANT_ISA_AVX2)
        transpose8(bt, B, ldb, n, k);
    else
#endif
        for (int j0 = 0; j0 < n; j0 += 16) { /* B^T (k x n), 16 columns at a time */
            const int j1 = j0 + 16 < n ? j0 + 16 : n;
            for (int e = 0; e < k; e++)
                for (int j = j0; j < j1; j++) bt[(size_t)e * n + j] = B[(size_t)j * ldb + e];
        }
    rows_by_k(C, ldc, A, lda, bt, n, m, n, k, SCALED, alpha, rows, nrows);
}

void tile_ab(real* C, int ldc, const real* A, int lda, const real* B, int ldb, int m, int n, int k,
             int accumulate, const int* rows, int nrows) {
    if (m == 0 || n == 0) return;
    rows_by_k(C, ldc, A, lda, B, ldb, m, n, k, accumulate ? ADD_TO : SET, 1, rows, nrows);
}
