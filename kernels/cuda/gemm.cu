/* gemm.cu: cuBLAS GEMMs and the linear layer (matmul_forward / matmul_backward of
 * kernels/cpu.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"
#include "cuda.h"

extern "C" void gemm_cuda(int ta, int tb, int M, int N, int K, float alpha, const float* A, int lda,
                          const float* B, int ldb, float beta, float* C, int ldc) {
    if (M == 0 || N == 0) return;
    CUBLAS_CHECK(cublasSgemm(focus_cublas(), tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                             ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, ldb, A, lda, &beta,
                             C, ldc));
}

__global__ void bias_rows_kernel(float* out, const float* bias, size_t N, int OC) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < N * OC) out[i] = bias[i % OC];
}

extern "C" void matmul_forward_cuda(float* out, const float* inp, const float* weight,
                                    const float* bias, size_t N, int IC, int OC) {
    if (bias) {
        bias_rows_kernel<<<cdiv(N * OC, 256), 256>>>(out, bias, N, OC);
        LAUNCH_CHECK();
    }
    gemm_cuda(0, 1, (int)N, OC, IC, 1.f, inp, IC, weight, IC, bias ? 1.f : 0.f, out, OC);
}

/* dbias[c] += sum_n dout[n, c]: one block per 32 columns, deterministic. */
__global__ void colsum_kernel(float* dbias, const float* dout, size_t N, int OC) {
    __shared__ float part[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    float s = 0;
    if (c < OC)
        for (size_t n = threadIdx.y; n < N; n += 8) s += dout[n * OC + c];
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < OC) {
        for (int y = 1; y < 8; y++) s += part[y][threadIdx.x];
        dbias[c] += s;
    }
}

extern "C" void matmul_backward_cuda(float* dinp, float* dweight, float* dbias, const float* dout,
                                     const float* inp, const float* weight, size_t N, int IC,
                                     int OC) {
    if (dinp) gemm_cuda(0, 0, (int)N, IC, OC, 1.f, dout, OC, weight, IC, 1.f, dinp, IC);
    if (dweight) gemm_cuda(1, 0, OC, IC, (int)N, 1.f, dout, OC, inp, IC, 1.f, dweight, IC);
    if (dbias) {
        colsum_kernel<<<cdiv(OC, 32), dim3(32, 8)>>>(dbias, dout, N, OC);
        LAUNCH_CHECK();
    }
}
