/* sparse.cu: the hard top-k executor on the GPU (kernels/sparse.c's design) and the bf16
 * tensor-core attention kernels.
 *
 * Plan (hard_plan_build): tokens are sorted stably by group with a counting pass and a
 * block-wide scan per (sequence, group) segment; each segment is padded to a multiple of 64 rows
 * so that every 64-row query tile lies in one segment. A token with k groups sits in k segments.
 * Set A: causal attention inside each segment over the gathered rows, a pair shared by several
 * groups counted only in the lowest one. Set B: the local band (i - j <= w) of keys sharing no
 * group. The merge combines each token's partial results through their log-sum-exps. Work is
 * proportional to the pairs kept; memory is O(T k).
 *
 * Two attention cores run the three tile kinds (dense causal, band, group): fp32 (two threads
 * per query row, as attention.cu; used by the model so that results match the CPU path) and
 * bf16 with mma.sync m16n8k16 tensor-core products and fp32 accumulation (head size 64; used
 * for inference speed and the benchmarks). */
#include <cuda_bf16.h>

#include "common.cuh"
#include "cuda.h"
#include "mma.cuh"
#include "rowhalf.cuh"

enum { MODE_DENSE = 0, MODE_BAND = 1, MODE_GROUP = 2 };

struct HardPlan {
    int* counts;     /* (B*K) tokens per segment */
    int* seg_off;    /* (B*K) first padded row of each segment */
    int* tile_seg;   /* (ntiles) segment of each 64-row tile */
    int* tile_p0;    /* (ntiles) first row of each tile */
    int* idx;        /* (nrows) token index within its sequence, -1 for padding */
    uint32_t* gmask; /* (nrows) group mask of the row's token */
    int* gpos;       /* (B*T*K) padded row of token t in group c, or -1 */
    float *oA, *lA, *oB, *lB;
    size_t cap_seg, cap_tiles, cap_rows, cap_gpos, cap_oA, cap_oB;
    int* h_counts;
    int* h_off;
    int* h_tseg;
    int* h_tp0;
    int ntiles, nrows;
};

extern "C" HardPlan* hard_plan_create(void) { return (HardPlan*)callocCheck(1, sizeof(HardPlan)); }

extern "C" void hard_plan_free(HardPlan* p) {
    if (!p) return;
    cuda_free(p->counts);
    cuda_free(p->seg_off);
    cuda_free(p->tile_seg);
    cuda_free(p->tile_p0);
    cuda_free(p->idx);
    cuda_free(p->gmask);
    cuda_free(p->gpos);
    cuda_free(p->oA);
    cuda_free(p->lA);
    cuda_free(p->oB);
    cuda_free(p->lB);
    free(p->h_counts);
    free(p->h_off);
    free(p->h_tseg);
    free(p->h_tp0);
    free(p);
}

/* Grow a device buffer to hold n elements of size sz. */
static void grow(void** buf, size_t* cap, size_t n, size_t sz) {
    if (*cap >= n && *buf) return;
    cuda_free(*buf);
    *cap = n + n / 4 + 64;
    *buf = cuda_malloc(*cap * sz);
}

__device__ __forceinline__ int block_sum_int(int v, int* sh) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* One block per (sequence, group): how many tokens carry the group. */
__global__ void count_kernel(int* counts, const uint32_t* mask, int T, int K) {
    __shared__ int sh[32];
    int b = blockIdx.x / K, c = blockIdx.x % K, n = 0;
    for (int t = threadIdx.x; t < T; t += blockDim.x) n += (mask[(size_t)b * T + t] >> c) & 1;
    n = block_sum_int(n, sh);
    if (threadIdx.x == 0) counts[blockIdx.x] = n;
}

/* One block per (sequence, group): a stable scatter of the group's tokens (block-wide scan of
 * the membership flags, 1024 tokens at a time). */
__global__ void scatter_kernel(int* idx, uint32_t* gmask, int* gpos, const uint32_t* mask,
                               const int* seg_off, int T, int K) {
    __shared__ int wsum[32];
    __shared__ int running;
    int b = blockIdx.x / K, c = blockIdx.x % K;
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int off = seg_off[blockIdx.x];
    if (threadIdx.x == 0) running = 0;
    __syncthreads();
    for (int t0 = 0; t0 < T; t0 += blockDim.x) {
        int t = t0 + threadIdx.x;
        uint32_t m = t < T ? mask[(size_t)b * T + t] : 0u;
        int flag = (m >> c) & 1;
        unsigned bal = __ballot_sync(0xffffffffu, flag);
        int pre = __popc(bal & ((1u << lane) - 1u));
        if (lane == 0) wsum[wid] = __popc(bal);
        __syncthreads();
        if (wid == 0) {
            int v = lane < nw ? wsum[lane] : 0, x = v;
            for (int o = 1; o < 32; o <<= 1) {
                int y = __shfl_up_sync(0xffffffffu, x, o);
                if (lane >= o) x += y;
            }
            if (lane < nw) wsum[lane] = x - v; /* exclusive prefix of the warp totals */
            if (lane == 31)
                wsum[31] = x; /* nw <= 32; lane 31's prefix is not needed when nw == 32 */
        }
        __syncthreads();
        int total = wsum[31];
        int base = running;
        int wpre = (wid == 31) ? total - __popc(bal) : wsum[wid];
        if (flag) {
            int p = off + base + wpre + pre;
            idx[p] = t;
            gmask[p] = m;
            gpos[((size_t)b * T + t) * K + c] = p;
        }
        __syncthreads();
        if (threadIdx.x == 0) running = base + total;
        __syncthreads();
    }
}

/* Sort the tokens of every sequence by group (see the file comment). */
static void hard_plan_build(HardPlan* p, const uint32_t* mask, int K, int B, int T) {
    size_t nseg = (size_t)B * K;
    if (p->cap_seg < nseg) {
        cuda_free(p->counts);
        cuda_free(p->seg_off);
        free(p->h_counts);
        free(p->h_off);
        p->counts = (int*)cuda_malloc(sizeof(int) * nseg);
        p->seg_off = (int*)cuda_malloc(sizeof(int) * nseg);
        p->h_counts = (int*)mallocCheck(sizeof(int) * nseg);
        p->h_off = (int*)mallocCheck(sizeof(int) * nseg);
        p->cap_seg = nseg;
    }
    count_kernel<<<(unsigned)nseg, 1024>>>(p->counts, mask, T, K);
    LAUNCH_CHECK();
    cuda_download(p->h_counts, p->counts, sizeof(int) * nseg);
    size_t rows = 0, tiles = 0;
    for (size_t s = 0; s < nseg; s++) {
        p->h_off[s] = (int)rows;
        size_t nt = (p->h_counts[s] + 63) / 64;
        rows += nt * 64;
        tiles += nt;
    }
    if (rows > 0x7fffffff) fatal("hard attention: %zu gathered rows exceed the 32-bit index", rows);
    p->h_tseg = (int*)realloc(p->h_tseg, sizeof(int) * (tiles + 1));
    p->h_tp0 = (int*)realloc(p->h_tp0, sizeof(int) * (tiles + 1));
    if (!p->h_tseg || !p->h_tp0) fatal("out of host memory for the hard attention plan");
    /* tiles in order of decreasing work: the last tile of each segment first */
    size_t maxnt = 0, n = 0;
    for (size_t s = 0; s < nseg; s++) {
        size_t nt = (p->h_counts[s] + 63) / 64;
        maxnt = nt > maxnt ? nt : maxnt;
    }
    for (size_t k = maxnt; k-- > 0;) {
        for (size_t s = 0; s < nseg; s++) {
            if ((size_t)(p->h_counts[s] + 63) / 64 <= k) continue;
            p->h_tseg[n] = (int)s;
            p->h_tp0[n] = p->h_off[s] + (int)k * 64;
            n++;
        }
    }
    p->ntiles = (int)tiles;
    p->nrows = (int)rows;
    size_t cap_tiles = p->cap_tiles;
    grow((void**)&p->tile_seg, &p->cap_tiles, tiles, sizeof(int));
    if (cap_tiles != p->cap_tiles) {
        cuda_free(p->tile_p0);
        p->tile_p0 = (int*)cuda_malloc(sizeof(int) * p->cap_tiles);
    }
    size_t cap_rows = p->cap_rows;
    grow((void**)&p->idx, &p->cap_rows, rows, sizeof(int));
    if (cap_rows != p->cap_rows) {
        cuda_free(p->gmask);
        p->gmask = (uint32_t*)cuda_malloc(sizeof(uint32_t) * p->cap_rows);
    }
    grow((void**)&p->gpos, &p->cap_gpos, (size_t)B * T * K, sizeof(int));
    cuda_upload(p->seg_off, p->h_off, sizeof(int) * nseg);
    cuda_upload(p->tile_seg, p->h_tseg, sizeof(int) * tiles);
    cuda_upload(p->tile_p0, p->h_tp0, sizeof(int) * tiles);
    CUDA_CHECK(cudaMemsetAsync(p->idx, 0xff, sizeof(int) * rows));
    CUDA_CHECK(cudaMemsetAsync(p->gmask, 0, sizeof(uint32_t) * rows));
    CUDA_CHECK(cudaMemsetAsync(p->gpos, 0xff, sizeof(int) * (size_t)B * T * K));
    scatter_kernel<<<(unsigned)nseg, 1024>>>(p->idx, p->gmask, p->gpos, mask, p->seg_off, T, K);
    LAUNCH_CHECK();
}

/* Geometry of one query tile: the sequence, the coordinate of its first row (gathered row for
 * groups, token index otherwise), its valid rows and the key range, in the same coordinates. */
struct TileGeom {
    int b, qbase, qn, kstart, kend;
    uint32_t low; /* groups below this segment's (for the lowest-shared-group rule) */
};

struct PlanArgs {
    const int *idx, *seg_off, *counts, *tile_seg, *tile_p0;
    const uint32_t *mask, *gmask;
    int K, w;
};

template <int MODE>
__device__ __forceinline__ TileGeom tile_geom(const PlanArgs& pa, int T, int BQ, int reverse) {
    TileGeom g;
    if (MODE == MODE_GROUP) {
        int t = blockIdx.x, s = pa.tile_seg[t], p0 = pa.tile_p0[t];
        int so = pa.seg_off[s], ns = pa.counts[s];
        g.b = s / pa.K;
        g.low = (1u << (s % pa.K)) - 1u;
        g.qbase = p0;
        g.qn = min(BQ, so + ns - p0);
        g.kstart = so;
        g.kend = min(p0 + BQ, so + ns);
    } else {
        int nblk = (T + BQ - 1) / BQ;
        int blk = (int)(blockIdx.x % nblk);
        if (reverse) blk = nblk - 1 - blk;
        g.b = (int)(blockIdx.x / nblk);
        g.low = 0;
        g.qbase = blk * BQ;
        g.qn = min(BQ, T - g.qbase);
        g.kend = min(g.qbase + BQ, T);
        g.kstart = MODE == MODE_BAND ? max(0, g.qbase - pa.w) : 0;
    }
    return g;
}

/* Whether query q and key k (tile coordinates, masks mq / mk) form a pair of this tile kind. */
template <int MODE>
__device__ __forceinline__ bool pair_ok(int q, int k, uint32_t mq, uint32_t mk, uint32_t low,
                                        int w) {
    if (k > q) return false;
    if (MODE == MODE_BAND) return q - k <= w && !(mq & mk);
    if (MODE == MODE_GROUP) return !(mq & mk & low);
    return true;
}

template <int MODE>
__device__ __forceinline__ uint32_t row_mask(const PlanArgs& pa, int b, int T, int coord) {
    if (MODE == MODE_GROUP) return pa.gmask[coord];
    if (MODE == MODE_BAND) return pa.mask[(size_t)b * T + coord];
    return 0u;
}

__device__ __forceinline__ int row_token(const PlanArgs& pa, int mode, int coord) {
    return mode == MODE_GROUP ? pa.idx[coord] : coord;
}

/* ---- fp32 core ---- */
template <int HD, int MODE>
__global__ void __launch_bounds__(2 * ROWS)
    seg_fwd_kernel(float* out, float* lse, const float* qkv, PlanArgs pa, int T, int NH, int NKV,
                   float scale) {
    __shared__ __align__(16) float Ks[TILE * HD];
    __shared__ __align__(16) float Vs[TILE * HD];
    __shared__ uint32_t mk[TILE];
    __shared__ int krow[TILE];
    const int QKV = (NH + 2 * NKV) * HD, C = NH * HD, h = blockIdx.y, kvh = h / (NH / NKV);
    TileGeom g = tile_geom<MODE>(pa, T, ROWS, 1);
    const int r = threadIdx.x >> 1, part = threadIdx.x & 1;
    const int valid = r < g.qn, qc = g.qbase + (valid ? r : 0);
    const float* base = qkv + (size_t)g.b * T * QKV;
    float q[HD / 2], o[HD / 2];
    load_half<HD>(q, base + (size_t)row_token(pa, MODE, qc) * QKV + h * HD, part, scale);
#pragma unroll
    for (int e = 0; e < HD / 2; e++) o[e] = 0.f;
    const uint32_t mq = valid ? row_mask<MODE>(pa, g.b, T, qc) : 0u;
    float m = -INFINITY, l = 0.f;
    for (int k0 = g.kstart; k0 < g.kend; k0 += TILE) {
        int n = min(TILE, g.kend - k0);
        __syncthreads();
        if ((int)threadIdx.x < TILE) {
            int kr = (int)threadIdx.x < n ? row_token(pa, MODE, k0 + threadIdx.x) : -1;
            krow[threadIdx.x] = kr;
            mk[threadIdx.x] =
                (int)threadIdx.x < n ? row_mask<MODE>(pa, g.b, T, k0 + threadIdx.x) : 0u;
        }
        __syncthreads();
        load_tile_rows<HD>(Ks, base + C + kvh * HD, QKV, krow, n);
        load_tile_rows<HD>(Vs, base + C + NKV * HD + kvh * HD, QKV, krow, n);
        __syncthreads();
        for (int j0 = 0; j0 < n; j0 += 8)
            flash_step8<HD>(o, m, l, q, Ks, Vs, j0, n, part, [&](int jl, float x) {
                return valid && pair_ok<MODE>(qc, k0 + jl, mq, mk[jl], g.low, pa.w) ? x : -INFINITY;
            });
    }
    if (!valid) return;
    size_t orow = MODE == MODE_GROUP ? (size_t)qc : (size_t)g.b * T + qc;
    store_half<HD>(out + orow * C + h * HD, o, part, l > 0.f ? 1.f / l : 0.f, 0);
    if (part == 0) {
        float L = l > 0.f ? m + logf(l) : -INFINITY;
        if (MODE == MODE_GROUP)
            lse[(size_t)qc * NH + h] = L;
        else
            lse[((size_t)g.b * NH + h) * T + qc] = L;
    }
}

/* ---- bf16 tensor-core core (head size 64) ---- */
/* Global -> registers: rows k0 + (x >> 3) + 16 u (u < 4) of K and V, 16-byte chunk x & 7 of
 * the head; rows past kend are zero. */
template <int MODE>
__device__ __forceinline__ void fetch_kv(uint4 (&pk)[4], uint4 (&pv)[4], const __nv_bfloat16* base,
                                         const PlanArgs& pa, int k0, int kend, int QKV, int koff,
                                         int voff) {
    const int cc = threadIdx.x & 7;
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const int r = (threadIdx.x >> 3) + 16 * u;
        pk[u] = pv[u] = make_uint4(0, 0, 0, 0);
        if (k0 + r < kend) {
            const __nv_bfloat16* row = base + (size_t)row_token(pa, MODE, k0 + r) * QKV;
            pk[u] = *(const uint4*)(row + koff + cc * 8);
            pv[u] = *(const uint4*)(row + voff + cc * 8);
        }
    }
}

template <int MODE>
__global__ void __launch_bounds__(128)
    mma_fwd_kernel(float* out, float* lse, const __nv_bfloat16* qkv, PlanArgs pa, int T, int NH,
                   int NKV, float scale_log2) {
    constexpr int HD = 64, BQ = 64, BK = 64, LDS = MMA_LDS;
    __shared__ __align__(16) __nv_bfloat16 Qs[BQ * LDS];
    __shared__ __align__(16) __nv_bfloat16 Ks[BK * LDS];
    __shared__ __align__(16) __nv_bfloat16 Vt[HD * LDS];
    __shared__ uint32_t mks[BK];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
    const int QKV = (NH + 2 * NKV) * HD, C = NH * HD, h = blockIdx.y, kvh = h / (NH / NKV);
    TileGeom g = tile_geom<MODE>(pa, T, BQ, 1);
    const __nv_bfloat16* base = qkv + (size_t)g.b * T * QKV;
    for (int x = threadIdx.x; x < BQ * 8; x += blockDim.x) {
        int r = x >> 3, cc = x & 7;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r < g.qn) {
            int tok = row_token(pa, MODE, g.qbase + r);
            v = *(const uint4*)(base + (size_t)tok * QKV + h * HD + cc * 8);
        }
        *(uint4*)(Qs + r * LDS + cc * 8) = v;
    }
    const int r0 = warp * 16 + gid, r1 = r0 + 8;
    const int qp0 = g.qbase + r0, qp1 = g.qbase + r1;
    const uint32_t mq0 = r0 < g.qn ? row_mask<MODE>(pa, g.b, T, qp0) : 0u;
    const uint32_t mq1 = r1 < g.qn ? row_mask<MODE>(pa, g.b, T, qp1) : 0u;
    __syncthreads();
    uint32_t qa[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        qa[kk][0] = ld32(Qs + r0 * LDS + kk * 16 + tig * 2);
        qa[kk][1] = ld32(Qs + r1 * LDS + kk * 16 + tig * 2);
        qa[kk][2] = ld32(Qs + r0 * LDS + kk * 16 + 8 + tig * 2);
        qa[kk][3] = ld32(Qs + r1 * LDS + kk * 16 + 8 + tig * 2);
    }
    float o[8][4];
#pragma unroll
    for (int dt = 0; dt < 8; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    /* K and V tiles are fetched into registers one tile ahead, so the global loads of tile
     * i + 1 overlap the products of tile i. Thread x holds rows (x >> 3) + 16 u, chunk x & 7. */
    uint4 pk[4], pv[4];
    fetch_kv<MODE>(pk, pv, base, pa, g.kstart, g.kend, QKV, C + kvh * HD, C + NKV * HD + kvh * HD);
    for (int k0 = g.kstart; k0 < g.kend; k0 += BK) {
        const int kn = min(BK, g.kend - k0);
        __syncthreads();
        {
            const int cc = threadIdx.x & 7;
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int r = (threadIdx.x >> 3) + 16 * u;
                *(uint4*)(Ks + r * LDS + cc * 8) = pk[u];
                /* V transposed, with the key index's 8-element chunk XOR-swizzled by the
                 * dimension's chunk so that these stores and the fragment reads below are
                 * free of bank conflicts */
                const __nv_bfloat16* vp = (const __nv_bfloat16*)&pv[u];
#pragma unroll
                for (int e = 0; e < 8; e++) Vt[(cc * 8 + e) * LDS + (r ^ (cc << 3))] = vp[e];
            }
        }
        if ((int)threadIdx.x < BK)
            mks[threadIdx.x] =
                (int)threadIdx.x < kn ? row_mask<MODE>(pa, g.b, T, k0 + threadIdx.x) : 0u;
        __syncthreads();
        if (k0 + BK < g.kend)
            fetch_kv<MODE>(pk, pv, base, pa, k0 + BK, g.kend, QKV, C + kvh * HD,
                           C + NKV * HD + kvh * HD);
        float s[8][4];
        mma_tile_rows(s, qa, Ks, gid, tig);
        /* mask, scale to log2 units, row maxima */
        float mx0 = -INFINITY, mx1 = -INFINITY;
        const bool full = MODE == MODE_DENSE && k0 + BK <= g.qbase && kn == BK;
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = nt * 8 + tig * 2 + (e & 1);
                int row = e < 2 ? r0 : r1;
                bool ok = full || (key < kn && row < g.qn &&
                                   pair_ok<MODE>(g.qbase + row, k0 + key, e < 2 ? mq0 : mq1,
                                                 mks[key], g.low, pa.w));
                s[nt][e] = ok ? s[nt][e] * scale_log2 : -INFINITY;
            }
            mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
            mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
        }
        softmax_tile_pv(s, o, mx0, mx1, m0, m1, l0, l1, Vt, gid, tig);
    }
    quad_sum2(l0, l1);
    const float LN2 = 0.6931471805599453f;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        int row = half ? r1 : r0;
        if (row >= g.qn) continue;
        float l = half ? l1 : l0, m = half ? m1 : m0;
        float inv = l > 0.f ? 1.f / l : 0.f;
        int qc = g.qbase + row;
        size_t orow = MODE == MODE_GROUP ? (size_t)qc : (size_t)g.b * T + qc;
        float* op = out + orow * C + h * HD + tig * 2;
#pragma unroll
        for (int dt = 0; dt < 8; dt++)
            *(float2*)(op + dt * 8) = make_float2(o[dt][2 * half] * inv, o[dt][2 * half + 1] * inv);
        if (tig == 0) {
            float L = l > 0.f ? (m + log2f(l)) * LN2 : -INFINITY;
            if (MODE == MODE_GROUP)
                lse[(size_t)qc * NH + h] = L;
            else
                lse[((size_t)g.b * NH + h) * T + qc] = L;
        }
    }
}

/* A warp per (token, head): log-sum-exp merge of the band result and the token's group results. */
__global__ void merge_kernel(float* out, float* lse, const float* oA, const float* lA,
                             const float* oB, const float* lB, const int* gpos,
                             const uint32_t* mask, int B, int T, int K, int NH, int HD) {
    size_t wg = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (wg >= (size_t)B * T * NH) return;
    int h = (int)(wg % NH);
    size_t bt = wg / NH;
    int b = (int)(bt / T), i = (int)(bt % T);
    const int C = NH * HD;
    uint32_t mi = mask[bt];
    float lb = lB[((size_t)b * NH + h) * T + i];
    float L = lb;
    for (int c = 0; c < K; c++) {
        if (!((mi >> c) & 1)) continue;
        float la = lA[(size_t)gpos[bt * K + c] * NH + h];
        float hi = fmaxf(L, la);
        if (hi != -INFINITY) L = hi + logf(expf(L - hi) + expf(la - hi));
    }
    for (int e = lane; e < HD; e += 32) {
        float acc = lb != -INFINITY ? expf(lb - L) * oB[bt * C + h * HD + e] : 0.f;
        for (int c = 0; c < K; c++) {
            if (!((mi >> c) & 1)) continue;
            int p = gpos[bt * K + c];
            float la = lA[(size_t)p * NH + h];
            if (la != -INFINITY) acc += expf(la - L) * oA[(size_t)p * C + h * HD + e];
        }
        out[bt * C + h * HD + e] = acc;
    }
    if (lane == 0) lse[((size_t)b * NH + h) * T + i] = L;
}

static PlanArgs plan_args(const HardPlan* p, const uint32_t* mask, int K, int w) {
    PlanArgs a = {p ? p->idx : NULL,
                  p ? p->seg_off : NULL,
                  p ? p->counts : NULL,
                  p ? p->tile_seg : NULL,
                  p ? p->tile_p0 : NULL,
                  mask,
                  p ? p->gmask : NULL,
                  K,
                  w};
    return a;
}

static void ensure_outputs(HardPlan* p, int B, int T, int NH, int C) {
    size_t needA = (size_t)p->nrows * C + 1, needB = (size_t)B * T * C;
    if (p->cap_oA < needA) {
        cuda_free(p->oA);
        cuda_free(p->lA);
        p->cap_oA = needA + needA / 4;
        p->oA = (float*)cuda_malloc(sizeof(float) * p->cap_oA);
        p->lA = (float*)cuda_malloc(sizeof(float) * p->cap_oA); /* rows * NH <= rows * C */
    }
    if (p->cap_oB < needB) {
        cuda_free(p->oB);
        cuda_free(p->lB);
        p->oB = (float*)cuda_malloc(sizeof(float) * needB);
        p->lB = (float*)cuda_malloc(sizeof(float) * (size_t)B * T * NH);
        p->cap_oB = needB;
    }
}

static void run_merge(HardPlan* p, float* out, float* lse, const uint32_t* mask, int K, int B,
                      int T, int NH, int hs) {
    size_t warps = (size_t)B * T * NH;
    merge_kernel<<<cdiv(warps * 32, 256), 256>>>(out, lse, p->oA, p->lA, p->oB, p->lB, p->gpos,
                                                 mask, B, T, K, NH, hs);
    LAUNCH_CHECK();
}

static void check_heads(int hs, int K, int NH, int NKV) {
    if (K < 1 || K > 32) fatal("hard attention: K=%d groups (1..32 supported)", K);
    if (NKV < 1 || NH % NKV) fatal("hard attention: %d heads are not a multiple of %d", NH, NKV);
}

#define SEG_LAUNCH(MODE, grid)                                                              \
    switch (hs) {                                                                           \
        case 8:                                                                             \
            seg_fwd_kernel<8, MODE><<<grid, 2 * ROWS>>>(o, l, qkv, pa, T, NH, NKV, scale);  \
            break;                                                                          \
        case 16:                                                                            \
            seg_fwd_kernel<16, MODE><<<grid, 2 * ROWS>>>(o, l, qkv, pa, T, NH, NKV, scale); \
            break;                                                                          \
        case 32:                                                                            \
            seg_fwd_kernel<32, MODE><<<grid, 2 * ROWS>>>(o, l, qkv, pa, T, NH, NKV, scale); \
            break;                                                                          \
        default:                                                                            \
            seg_fwd_kernel<64, MODE><<<grid, 2 * ROWS>>>(o, l, qkv, pa, T, NH, NKV, scale); \
            break;                                                                          \
    }

extern "C" void attention_hard_forward_cuda(HardPlan* plan, float* out, float* lse,
                                            const float* qkv, const uint32_t* mask, int K, int w,
                                            int B, int T, int NH, int NKV, int hs) {
    check_heads(hs, K, NH, NKV);
    if (hs != 8 && hs != 16 && hs != 32 && hs != 64)
        fatal("CUDA hard attention: head size %d is not supported (8, 16, 32 or 64)", hs);
    hard_plan_build(plan, mask, K, B, T);
    ensure_outputs(plan, B, T, NH, NH * hs);
    PlanArgs pa = plan_args(plan, mask, K, w);
    float scale = 1.f / sqrtf((float)hs);
    {
        float *o = plan->oA, *l = plan->lA;
        dim3 grid((unsigned)plan->ntiles, (unsigned)NH);
        if (plan->ntiles) SEG_LAUNCH(MODE_GROUP, grid);
        LAUNCH_CHECK();
    }
    {
        float *o = plan->oB, *l = plan->lB;
        dim3 grid((unsigned)(B * ((T + ROWS - 1) / ROWS)), (unsigned)NH);
        SEG_LAUNCH(MODE_BAND, grid);
        LAUNCH_CHECK();
    }
    run_merge(plan, out, lse, mask, K, B, T, NH, hs);
}

static const float LOG2E = 1.4426950408889634f;

extern "C" void attention_flash_forward_bf16_cuda(float* out, float* lse, const uint16_t* qkv,
                                                  int B, int T, int NH, int NKV, int hs) {
    if (hs != 64) fatal("bf16 attention: head size %d is not supported (64)", hs);
    check_heads(hs, 1, NH, NKV);
    PlanArgs pa = plan_args(NULL, NULL, 1, 0);
    dim3 grid((unsigned)(B * ((T + 63) / 64)), (unsigned)NH);
    mma_fwd_kernel<MODE_DENSE>
        <<<grid, 128>>>(out, lse, (const __nv_bfloat16*)qkv, pa, T, NH, NKV, 0.125f * LOG2E);
    LAUNCH_CHECK();
}

extern "C" void attention_hard_forward_bf16_cuda(HardPlan* plan, float* out, float* lse,
                                                 const uint16_t* qkv, const uint32_t* mask, int K,
                                                 int w, int B, int T, int NH, int NKV, int hs) {
    if (hs != 64) fatal("bf16 attention: head size %d is not supported (64)", hs);
    check_heads(hs, K, NH, NKV);
    hard_plan_build(plan, mask, K, B, T);
    ensure_outputs(plan, B, T, NH, NH * hs);
    PlanArgs pa = plan_args(plan, mask, K, w);
    const __nv_bfloat16* q = (const __nv_bfloat16*)qkv;
    if (plan->ntiles) {
        dim3 grid((unsigned)plan->ntiles, (unsigned)NH);
        mma_fwd_kernel<MODE_GROUP>
            <<<grid, 128>>>(plan->oA, plan->lA, q, pa, T, NH, NKV, 0.125f * LOG2E);
        LAUNCH_CHECK();
    }
    dim3 grid((unsigned)(B * ((T + 63) / 64)), (unsigned)NH);
    mma_fwd_kernel<MODE_BAND><<<grid, 128>>>(plan->oB, plan->lB, q, pa, T, NH, NKV, 0.125f * LOG2E);
    LAUNCH_CHECK();
    run_merge(plan, out, lse, mask, K, B, T, NH, hs);
}
