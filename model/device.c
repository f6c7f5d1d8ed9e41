/* device.c: from a device name to its backend (backend.h). The only place that knows whether
 * the CUDA backend was built (FOCUS_CUDA: nvcc was found at configure time). */
#include <string.h>

#include "backend.h"

#ifdef FOCUS_CUDA
#include "../kernels/cuda/cuda.h"
extern const ModelBackend model_cuda_backend;
#endif

const ModelBackend* model_find_backend(const char* device, const char** why) {
    if (!strcmp(device, "cpu")) return &model_cpu_backend;
    if (strcmp(device, "cuda")) {
        *why = "unknown device (expected cpu or cuda)";
        return NULL;
    }
#ifdef FOCUS_CUDA
    if (!cuda_available()) {
        *why = "no usable CUDA device on this machine";
        return NULL;
    }
    return &model_cuda_backend;
#else
    *why = "this focus was built without CUDA (no nvcc found at configure time)";
    return NULL;
#endif
}
