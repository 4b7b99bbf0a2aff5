// CK(call): the standalone probes' check of a CUDA runtime call: print file, line, call and the
// error string to stderr and exit(1) when it fails (bench/barrier_probe.cu, bench/read_probe.cu).
#ifndef MI_BENCH_CUDA_CHECK_CUH
#define MI_BENCH_CUDA_CHECK_CUH
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                        \
    do {                                                                             \
        cudaError_t e_ = (x);                                                        \
        if (e_ != cudaSuccess) {                                                     \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)
#endif
