// CUDA backend entry points (placeholder until the kernels land): device query and errors.
#include <cstdio>
#include <cuda_runtime.h>
#include "backend.h"
extern "C" int mi_set_error(int code, const char *fmt, ...);

extern "C" int mi_cuda_available(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n > 0;
}

extern "C" const char *mi_cuda_device_name(void) {
    static char name[256];
    cudaDeviceProp p;
    if (!mi_cuda_available() || cudaGetDeviceProperties(&p, 0) != cudaSuccess) return "";
    snprintf(name, sizeof name, "%s", p.name);
    return name;
}

extern "C" int mi_cuda_ctx_create(const mi_model_desc *, int32_t, int32_t, mi_cuda_ctx **out) {
    *out = nullptr;
    return mi_set_error(MI_ERR_CUDA, "CUDA forward not implemented yet");
}
extern "C" void mi_cuda_ctx_free(mi_cuda_ctx *) {}
extern "C" int mi_cuda_forward(mi_cuda_ctx *, const int32_t *, const int32_t *, int32_t, const int32_t *, int32_t, float *,
                               int32_t *) {
    return mi_set_error(MI_ERR_CUDA, "CUDA forward not implemented yet");
}
extern "C" int mi_cuda_op_matmul(int32_t, const void *, int64_t, int64_t, const float *, int32_t, float *) {
    return mi_set_error(MI_ERR_CUDA, "CUDA matmul not implemented yet");
}
