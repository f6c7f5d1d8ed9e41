/* rowhalf.cuh: the fp32 flash kernels' row layout. A block takes ROWS rows, two threads per
 * row; thread `part` (0 or 1) holds the row's dims 4c..4c+3 for chunks c = 2 cc + part, so the
 * two threads of a row read different shared-memory banks and use 16-byte loads. The other side
 * of the product streams through shared memory in tiles of TILE rows. */
#ifndef FOCUS_CUDA_ROWHALF_CUH
#define FOCUS_CUDA_ROWHALF_CUH

#define ROWS 64 /* rows per block */
#define TILE 32 /* streamed rows per tile */

/* Thread `part` (0 or 1) of a row holds dims 4c..4c+3 for chunks c = 2 cc + part. */
template <int HD>
__device__ __forceinline__ void load_half(float* dst, const float* row, int part, float s) {
#pragma unroll
    for (int cc = 0; cc < HD / 8; cc++) {
        float4 v = *(const float4*)(row + 4 * (2 * cc + part));
        dst[4 * cc] = v.x * s;
        dst[4 * cc + 1] = v.y * s;
        dst[4 * cc + 2] = v.z * s;
        dst[4 * cc + 3] = v.w * s;
    }
}

template <int HD>
__device__ __forceinline__ float dot_half(const float* x, const float* row, int part) {
    float s = 0;
#pragma unroll
    for (int cc = 0; cc < HD / 8; cc++) {
        float4 v = *(const float4*)(row + 4 * (2 * cc + part));
        s += x[4 * cc] * v.x + x[4 * cc + 1] * v.y + x[4 * cc + 2] * v.z + x[4 * cc + 3] * v.w;
    }
    return s + __shfl_xor_sync(0xffffffffu, s, 1);
}

template <int HD>
__device__ __forceinline__ void axpy_half(float* y, float a, const float* row, int part) {
#pragma unroll
    for (int cc = 0; cc < HD / 8; cc++) {
        float4 v = *(const float4*)(row + 4 * (2 * cc + part));
        y[4 * cc] += a * v.x;
        y[4 * cc + 1] += a * v.y;
        y[4 * cc + 2] += a * v.z;
        y[4 * cc + 3] += a * v.w;
    }
}

template <int HD>
__device__ __forceinline__ void store_half(float* row, const float* x, int part, float s,
                                           int accumulate) {
#pragma unroll
    for (int cc = 0; cc < HD / 8; cc++) {
        float4* p = (float4*)(row + 4 * (2 * cc + part));
        float4 v = accumulate ? *p : make_float4(0.f, 0.f, 0.f, 0.f);
        v.x += x[4 * cc] * s;
        v.y += x[4 * cc + 1] * s;
        v.z += x[4 * cc + 2] * s;
        v.w += x[4 * cc + 3] * s;
        *p = v;
    }
}

/* Copy n rows of HD floats (row stride ld in the source) into shared memory; rows past n
 * are zero. */
template <int HD>
__device__ __forceinline__ void load_tile(float* dst, const float* src, size_t ld, int n) {
    for (int idx = threadIdx.x; idx < TILE * HD / 4; idx += blockDim.x) {
        int r = idx / (HD / 4), c = idx % (HD / 4);
        float4 v = r < n ? *(const float4*)(src + r * ld + 4 * c) : make_float4(0.f, 0.f, 0.f, 0.f);
        *(float4*)(dst + r * HD + 4 * c) = v;
    }
}

/* As load_tile, with row r read from src + rows[r] * ld (rows[r] < 0: a zero row). */
template <int HD>
__device__ __forceinline__ void load_tile_rows(float* dst, const float* src, size_t ld,
                                               const int* rows, int n) {
    for (int idx = threadIdx.x; idx < TILE * HD / 4; idx += blockDim.x) {
        int r = idx / (HD / 4), c = idx % (HD / 4);
        int row = r < n ? rows[r] : -1;
        float4 v = row >= 0 ? *(const float4*)(src + (size_t)row * ld + 4 * c)
                            : make_float4(0.f, 0.f, 0.f, 0.f);
        *(float4*)(dst + r * HD + 4 * c) = v;
    }
}

/* Online softmax over 8 streamed rows: s[u] are the scores of rows V[u] (-inf where masked),
 * cmax their maximum; (m, l) the running maximum and sum, o the running output. */
template <int HD>
__device__ __forceinline__ void online_update8(float* o, float& m, float& l, const float* s,
                                               float cmax, const float* V, int part) {
    float mnew = fmaxf(m, cmax);
    if (mnew == -INFINITY) return;
    float corr = __expf(m - mnew);
    l *= corr;
#pragma unroll
    for (int e = 0; e < HD / 2; e++) o[e] *= corr;
#pragma unroll
    for (int u = 0; u < 8; u++) {
        float p = __expf(s[u] - mnew);
        l += p;
        if (p != 0.f) axpy_half<HD>(o, p, V + u * HD, part);
    }
    m = mnew;
}

/* One step of a flash row over a staged tile: the scores of rows j0 .. j0 + 7 of Ks, q . k made
 * into score(jl, q . k) (the score itself, plus a gate, or -inf for a dropped pair; rows at or
 * past n are -inf), then the online update with the same rows of Vs. */
template <int HD, class Score>
__device__ __forceinline__ void flash_step8(float* o, float& m, float& l, const float* q,
                                            const float* Ks, const float* Vs, int j0, int n,
                                            int part, Score score) {
    float s[8], cmax = -INFINITY;
#pragma unroll
    for (int u = 0; u < 8; u++) {
        const int jl = j0 + u;
        s[u] = jl < n ? score(jl, dot_half<HD>(q, Ks + jl * HD, part)) : -INFINITY;
        cmax = fmaxf(cmax, s[u]);
    }
    online_update8<HD>(o, m, l, s, cmax, Vs + j0 * HD, part);
}

#endif
