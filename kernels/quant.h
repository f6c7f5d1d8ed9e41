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
} QMatrix;

/* 1 when qmatvec reads `type`. */
int qtype_supported(int type);
/* Bytes of one row of cols elements of `type` (cols a multiple of the block), or 0. */
size_t qtype_row_bytes(int type, int cols);
/* Row r of w as floats (cols of them): an embedding lookup from stored blocks. */
void qrow(float* out, const QMatrix* w, int r);
/* y (rows) = W x (cols) + bias (may be NULL); rows split over the OpenMP threads. */
void qmatvec(float* y, const QMatrix* w, const float* x, const float* bias);
/* The same with the portable scalar code only (the reference of the vectorised path). */
void qmatvec_ref(float* y, const QMatrix* w, const float* x, const float* bias);

/* y (n, ldy: columns 0 .. rows - 1 written) = X W^T + bias for the n rows of x (n, cols): the
 * batched product of a prompt. Fewer than 8 rows take qmatvec per row; more take int8 products
 * (activations quantised per block as in qmatvec) on CPUs with AVX-512 VNNI for the formats
 * with one scale per 32 weights (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K), and otherwise, or when
 * `exact`, the BLAS on panels of W expanded to fp32 (a few MB, never the whole matrix): the
 * product to fp32 round-off, at about 0.7 times the int8 path's speed (docs/RESULTS.md). */
void qmatmul(float* y, int ldy, const QMatrix* w, const float* x, int n, const float* bias,
             int exact);
/* 1 when this CPU has the int8 dot products (AVX-512 VNNI) of qmatmul's integer path. */
int qmatmul_int8_available(void);
/* qmatmul's integer path in portable scalar code (its reference, on any CPU). */
void qmatmul_int8_ref(float* y, int ldy, const QMatrix* w, const float* x, int n,
                      const float* bias);

/* Rows of IEEE half-precision values (the KV cache): dst := src rounded to nearest, saturating
 * at +-65504; the dot product of q with n halves; o += p times n halves. F16C where the CPU has
 * AVX2, portable conversions elsewhere. */
void f16_row_put(uint16_t* dst, const float* src, int n);
float f16_row_dot(const float* q, const uint16_t* k, int n);
void f16_row_axpy(float* o, float p, const uint16_t* v, int n);

#endif
