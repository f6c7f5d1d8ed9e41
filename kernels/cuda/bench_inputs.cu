/* bench_inputs.cu: inputs of the GPU attention benchmarks and tests: bf16 conversion, random
 * bf16 tensors and random top-k masks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"
#include "cuda.h"

__global__ void f2bf_kernel(uint16_t* dst, const float* src, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned u = __float_as_uint(src[i]);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    dst[i] = (uint16_t)(u >> 16);
}

extern "C" void float_to_bf16_cuda(uint16_t* dst, const float* src, size_t n) {
    f2bf_kernel<<<cdiv(n, 256), 256>>>(dst, src, n);
    LAUNCH_CHECK();
}

/* ---- benchmark inputs ---- */
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__global__ void fill_normal_bf16_kernel(uint16_t* x, size_t n, uint64_t seed) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    uint64_t r = mix64(seed ^ mix64(i));
    float u1 = ((r >> 40) + 1) * (1.f / 16777217.f),
          u2 = ((r >> 16) & 0xffffff) * (1.f / 16777216.f);
    float z = sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
    unsigned u = __float_as_uint(z);
    u += 0x7fffu + ((u >> 16) & 1u);
    x[i] = (uint16_t)(u >> 16);
}

extern "C" void cuda_fill_normal_bf16(uint16_t* x, size_t n, uint64_t seed) {
    fill_normal_bf16_kernel<<<cdiv(n, 256), 256>>>(x, n, seed);
    LAUNCH_CHECK();
}

__global__ void random_masks_kernel(uint32_t* mask, size_t n, int K, int topk, uint64_t seed) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    uint64_t r = mix64(seed ^ mix64(i));
    uint32_t m = 0;
    while (__popc(m) < topk) {
        m |= 1u << (r % (uint64_t)K);
        r = mix64(r);
    }
    mask[i] = m;
}

extern "C" void cuda_random_masks(uint32_t* mask, size_t n, int K, int topk, uint64_t seed) {
    random_masks_kernel<<<cdiv(n, 256), 256>>>(mask, n, K, topk, seed);
    LAUNCH_CHECK();
}
