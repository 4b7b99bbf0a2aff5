// Device copy bandwidth, the denominator of `pyminfer bench`'s roofline share.
#include <cuda_runtime.h>
#include "backend.h"

// Median-free best of 5 device-to-device copies of 1 GiB, timed with events; bytes moved count
// the read and the write (as ../shared/anchors/ANCHORS.md's 4.3 TB/s copy figure does).
extern "C" double mi_cuda_copy_bandwidth(void) {
    const size_t n = (size_t)1 << 30;
    void *a = nullptr, *b = nullptr;
    cudaEvent_t e0, e1;
    double best = -1.0;
    if (cudaMalloc(&a, n) != cudaSuccess || cudaMalloc(&b, n) != cudaSuccess) goto done;
    cudaMemset(a, 1, n);
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    for (int i = 0; i < 6; i++) {
        cudaEventRecord(e0);
        cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms = 0.0f;
        cudaEventElapsedTime(&ms, e0, e1);
        double bw = 2.0 * (double)n / (ms * 1e-3);
        if (i > 0 && bw > best) best = bw;  // first copy is a warm-up
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
done:
    cudaGetLastError();
    if (a) cudaFree(a);
    if (b) cudaFree(b);
    return best;
}
