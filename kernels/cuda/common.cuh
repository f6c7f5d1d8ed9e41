/* common.cuh: error checks and small device helpers shared by the .cu files. */
#ifndef FOCUS_CUDA_COMMON_CUH
#define FOCUS_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>

extern "C" {
#include "../common.h"
}

#define CUDA_CHECK(call)                                                                    \
    do {                                                                                    \
        cudaError_t err_ = (call);                                                          \
        if (err_ != cudaSuccess)                                                            \
            fatal("CUDA error at %s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(err_)); \
    } while (0)

#define CUBLAS_CHECK(call)                                                   \
    do {                                                                     \
        cublasStatus_t st_ = (call);                                         \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                    \
            fatal("cuBLAS error %d at %s:%d", (int)st_, __FILE__, __LINE__); \
    } while (0)

/* Checks the launch (not the kernel's completion; cuda_sync does that). */
#define LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

static inline unsigned cdiv(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
 * sh: 32 floats of shared memory. */
__device__ __forceinline__ float block_sum(float v, float* sh) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* sh) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -INFINITY;
    return warp_max(v);
}

/* log(sigmoid(x)) without overflow, as log_sigmoid in kernels/cpu.h. */
__device__ __forceinline__ float log_sigmoidf_dev(float x) {
    return x < 0.f ? x - log1pf(expf(x)) : -log1pf(expf(-x));
}

cublasHandle_t focus_cublas(void);

/* log sum_v exp(x[v]) over a row of V, the block's threads striding over it; every thread gets
 * the result. sh: 32 floats of shared memory. */
__device__ __forceinline__ float row_logsumexp(const float* x, int V, float* sh) {
    float m = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, x[v]);
    m = block_max(m, sh);
    float s = 0;
    for (int v = threadIdx.x; v < V; v += blockDim.x) s += expf(x[v] - m);
    return m + logf(block_sum(s, sh));
}

/* Sum of each thread's s over the block in double precision (blockDim.x a power of two, at most
 * the size of sh); thread 0 gets the result. */
__device__ __forceinline__ double block_sum_double(double s, double* sh) {
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if ((int)threadIdx.x < k) sh[threadIdx.x] += sh[threadIdx.x + k];
        __syncthreads();
    }
    return sh[0];
}

#endif
