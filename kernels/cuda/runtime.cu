/* runtime.cu: the CUDA runtime set-up (device, cuBLAS handle), memory, and the phase profiler
 * (FOCUS_PROFILE=1). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"
#include "cuda.h"

static cublasHandle_t g_cublas;
static int g_ready, g_tf32 = 1;
static char g_name[400];

cublasHandle_t focus_cublas(void) {
    if (!g_ready) cuda_init(1);
    return g_cublas;
}

extern "C" int cuda_available(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n > 0;
}

extern "C" void cuda_init(int quiet) {
    if (g_ready) return;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        fatal("--device cuda: no usable CUDA device (%s)",
              e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    CUDA_CHECK(cudaSetDevice(0));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    snprintf(g_name, sizeof g_name, "%.256s (sm_%d%d, %d SMs, %.0f GiB)", prop.name, prop.major,
             prop.minor, prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0);
    CUBLAS_CHECK(cublasCreate(&g_cublas));
    CUBLAS_CHECK(
        cublasSetMathMode(g_cublas, g_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH));
    g_ready = 1;
    if (!quiet) printf("device: %s\n", g_name);
}

extern "C" const char* cuda_device_name(void) { return g_name; }

extern "C" void cuda_set_tf32(int on) {
    g_tf32 = on;
    if (g_ready)
        CUBLAS_CHECK(
            cublasSetMathMode(g_cublas, on ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH));
}

extern "C" void* cuda_malloc(size_t bytes) {
    void* p = NULL;
    if (bytes == 0) bytes = 16;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess)
        fatal("GPU memory: cannot allocate %.1f MiB (%s)", bytes / 1048576.0,
              cudaGetErrorString(e));
    return p;
}

extern "C" void cuda_free(void* p) {
    if (p) CUDA_CHECK(cudaFree(p));
}
extern "C" void cuda_upload(void* dst, const void* src, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}
extern "C" void cuda_download(void* dst, const void* src, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}
extern "C" void cuda_memset0(void* p, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemsetAsync(p, 0, bytes));
}
/* ---- phase timing ---- */
enum { PROF_MAX = 1 << 15 };
static cudaEvent_t g_prof_ev[PROF_MAX];
static const char* g_prof_name[PROF_MAX];
static int g_prof_n, g_prof_created, g_prof_on = -1;

extern "C" int cuda_prof_enabled(void) {
    if (g_prof_on < 0) {
        const char* e = getenv("FOCUS_PROFILE");
        g_prof_on = e && !strcmp(e, "1");
    }
    return g_prof_on;
}

extern "C" void cuda_prof_mark(const char* name) {
    if (!cuda_prof_enabled() || g_prof_n >= PROF_MAX) return;
    if (g_prof_n == g_prof_created) CUDA_CHECK(cudaEventCreate(&g_prof_ev[g_prof_created++]));
    CUDA_CHECK(cudaEventRecord(g_prof_ev[g_prof_n], 0));
    g_prof_name[g_prof_n++] = name;
}

extern "C" void cuda_prof_report(const char* title) {
    if (!cuda_prof_enabled() || g_prof_n == 0) return;
    if (!title) { /* start over without printing */
        g_prof_n = 0;
        return;
    }
    cuda_prof_mark(NULL);
    CUDA_CHECK(cudaDeviceSynchronize());
    enum { MAXN = 64 };
    const char* names[MAXN];
    double ms[MAXN], total = 0;
    int calls[MAXN], n = 0;
    for (int i = 0; i + 1 < g_prof_n; i++) {
        if (!g_prof_name[i]) continue;
        float t = 0;
        CUDA_CHECK(cudaEventElapsedTime(&t, g_prof_ev[i], g_prof_ev[i + 1]));
        int j = 0;
        while (j < n && strcmp(names[j], g_prof_name[i])) j++;
        if (j == n) {
            if (n == MAXN) continue;
            names[n] = g_prof_name[i], ms[n] = 0, calls[n] = 0, n++;
        }
        ms[j] += t, calls[j]++, total += t;
    }
    printf("profile: %s (%.2f ms in all)\n", title, total);
    for (int k = 0; k < n; k++) { /* largest first */
        int best = k;
        for (int j = k + 1; j < n; j++)
            if (ms[j] > ms[best]) best = j;
        const char* tn = names[k];
        double tm = ms[k];
        int tc = calls[k];
        names[k] = names[best], ms[k] = ms[best], calls[k] = calls[best];
        names[best] = tn, ms[best] = tm, calls[best] = tc;
        printf("  %-28s %9.3f ms %5.1f %% %6d marks\n", names[k], ms[k],
               total > 0 ? 100 * ms[k] / total : 0, calls[k]);
    }
    g_prof_n = 0;
}

extern "C" void cuda_sync(void) {
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());
}

/* Row-major C = alpha op(A) op(B) + beta C is column-major C^T = op(B)^T op(A)^T. */
