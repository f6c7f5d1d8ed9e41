/* quant.h: matrix-vector products that read GGUF block-quantised weights as they are stored,
 * dequantising in registers (quant.c): the decode path's weights stay at file size instead of
 * being expanded to fp32 (4 to 8 times the bytes a token has to stream). The block layouts are
 * documented next to the kernels; tests/test_quant.c checks each format against dequantise-then-
 * multiply, the AVX2 path against the scalar reference. */
#ifndef FOCUS_QUANT_H
#define FOCUS_QUANT_H

#include "common.h"

/* The GGUF type codes of the formats qmatvec reads (ggml's numbering). */
enum {
    QTYPE_F32 = 0,
    QTYPE_F16 = 1,
    QTYPE_Q4_0 = 2,
    QTYPE_Q4_1 = 3,
    QTYPE_Q5_0 = 6,
    QTYPE_Q8_0 = 8,
    QTYPE_Q4_K = 12,
    QTYPE_Q5_K = 13,
    QTYPE_Q6_K = 14,
    QTYPE_BF16 = 30
};

/* A (rows, cols) row-major matrix of one of the QTYPE formats: each row is cols / 32 blocks
 * (cols / 256 super-blocks for the K formats, cols elements for F32, F16, BF16) of row_bytes
 * bytes; `data` is not owned. */
typedef struct {
    int type, rows, cols;
    size_t row_bytes;
    const uint8_t* data;
    /* qmatrix_prepare's copy for the packed decode products (owned; NULL: none), and the
     * instruction-set level it was laid out for (its Q8_0 weights are signed at avx2) */
    uint8_t* packed;
    int packed_isa;
    uint8_t* arena; /* the block `packed` lies in, where this matrix frees it (NULL: another) */
} QMatrix;

/* Instruction-set levels of the kernels, chosen at run time: the best this CPU has, or the one
 * FOCUS_ISA names (scalar, avx2, avx_vnni, avx512_vnni; a level above the CPU's is refused), so
 * every level can be tested and measured on one machine. Per family: the decode products
 * (qmatvec) and the KV cache's half rows run the AVX2 + F16C code at avx2 and above (scalar
 * below); a prompt's products (qmatmul) run int8 panels with VPMADDUBSW at avx2, 256-bit
 * VPDPBUSD at avx_vnni, 512-bit VPDPBUSD at avx512_vnni, and fp32 panels through the BLAS at
 * scalar. */
enum {
    QUANT_ISA_SCALAR,
    QUANT_ISA_AVX2,
    QUANT_ISA_AVX_VNNI,
    QUANT_ISA_AVX512_VNNI,
    QUANT_ISA_COUNT
};
int quant_isa(void);          /* the level in use */
int quant_isa_detected(void); /* the best level this CPU has */
/* 1 when this CPU runs `level`'s instructions. The levels are not nested on every CPU: an
 * AVX-512 VNNI CPU may lack AVX-VNNI (Ice Lake, Zen 4, or a virtual machine that hides it). */
int quant_isa_has(int level);
void quant_set_isa(int level); /* force a level (tests, benchmarks); fatal where the CPU lacks it */
const char* quant_isa_name(int level);
int quant_isa_parse(const char* name); /* -1 for an unknown name */

/* 1 when qmatvec reads `type`. */
int qtype_supported(int type);
/* Bytes of one row of cols elements of `type` (cols a multiple of the block), or 0. */
size_t qtype_row_bytes(int type, int cols);
/* Row r of w as floats (cols of them): an embedding lookup from stored blocks. */
void qrow(float* out, const QMatrix* w, int r);
/* At the levels avx2 and above, a Q4_0, Q4_1 or Q8_0 matrix gets a second copy of its blocks
 * laid out in groups of 16 rows x 4 weights (4-bit weights stay 4-bit, fp16 scales; the same
 * bytes as the file's), which qmatvec then reads instead of the file's rows: 16 rows per
 * VPDPBUSD at avx512_vnni, 8 per VPDPBUSD (avx_vnni) or VPMADDUBSW (avx2) instead of one.
 * Nothing at the scalar level or for other formats; a copy made for one level is not read at
 * another. qmatrix_release frees it. */
void qmatrix_prepare(QMatrix* w);
/* The packed copies of n matrices in one block of memory (mallocPages: in 2 MiB pages where the
 * kernel gives them; a decode step streams every copy once, and with 4 KiB pages it missed the
 * TLB at every page). qmatrix_release of the first matrix that got a copy frees the block: the
 * set is released together. */
void qmatrix_prepare_all(QMatrix* w, int n);
void qmatrix_release(QMatrix* w);
/* y (rows) = W x (cols) + bias (may be NULL); rows split over the OpenMP threads. */
void qmatvec(float* y, const QMatrix* w, const float* x, const float* bias);
/* The same with the portable scalar code only (the reference of the vectorised path). */
void qmatvec_ref(float* y, const QMatrix* w, const float* x, const float* bias);
/* qmatvec of each of the n rows of x (n, cols) into the rows of y (ldy apart), bit for bit, with
 * the weights read from memory once for all rows (decode steps of several sequences). */
void qmatvec_rows(float* y, int ldy, const QMatrix* w, const float* x, int n, const float* bias);

/* y (n, ldy: columns 0 .. rows - 1 written) = X W^T + bias for the n rows of x (n, cols): the
 * batched product of a prompt: int8 products
 * (activations quantised per block as in qmatvec) at the levels avx2 and above for the formats
 * with one scale per 32 weights (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K), and otherwise, or when
 * `exact`, the BLAS on panels of W expanded to fp32 (a few MB, never the whole matrix): the
 * product to fp32 round-off, at about 0.7 times the int8 path's speed (docs/RESULTS.md). */
void qmatmul(float* y, int ldy, const QMatrix* w, const float* x, int n, const float* bias,
             int exact);
/* 1 when qmatmul of w runs the integer path, whose rows do not depend on n (the BLAS's can). */
int qmatmul_rows_alike(const QMatrix* w, int exact);
/* 1 when qmatmul's integer path runs at the level in use (avx2 and above). */
int qmatmul_int8_available(void);
/* qmatmul's integer path in portable scalar code (its reference, on any CPU). */
void qmatmul_int8_ref(float* y, int ldy, const QMatrix* w, const float* x, int n,
                      const float* bias);

/* Rows of IEEE half-precision values (the KV cache): dst := src rounded to nearest, saturating
 * at +-65504; dst := n halves as floats; the dot product of q with n halves; o += p times n halves.
 * F16C where the CPU has AVX2, portable conversions elsewhere. */
void f16_row_put(uint16_t* dst, const float* src, int n);
void f16_row_get(float* dst, const uint16_t* src, int n); /* exact: every half is a float */
float f16_row_dot(const float* q, const uint16_t* k, int n);
void f16_row_axpy(float* o, float p, const uint16_t* v, int n);
/* The nq query heads that share one KV head, over the half rows keys[t0 .. t1) (row j at
 * base + j * stride halves), each row converted once for all of them: scores sc[r * ld + t] =
 * scale (q_r . k_t) for q_r = q + r n; and mix o_r += sum_t w[r * ld + t] v_t for
 * o_r = o + r ostride. vpre (NULL: none): the value rows the mix will read (row j at vpre + j
 * stride), asked for into the core's second-level cache as the scores read the keys, so that
 * the keys' and the values' misses overlap (a hint: the same arithmetic). */
void f16_rows_scores(float* sc, size_t ld, const float* q, int nq, const uint16_t* base,
                     size_t stride, const int* keys, int t0, int t1, int n, float scale,
                     const uint16_t* vpre);
void f16_rows_mix(float* o, size_t ostride, const float* w, size_t ld, int nq, const uint16_t* base,
                  size_t stride, const int* keys, int t0, int t1, int n);

#endif
