// Probe: the DRAM read rate of the access shapes a decode mat-vec uses, against a plain streaming
// read. On the 7B shape the gate/up and down mat-vecs stay near half the DRAM peak (Nsight Compute:
// 41-50%; docs/perf.md, session 13) both as short blocks (the block kernel) and as a persistent
// shared-memory pipeline with ~150 KB an SM in flight, so this separates the access shape from the
// kernels' arithmetic: the same bytes, no dot products. Two buffers of 38 MB (the 7B's gate and up
// in q4_K: 18,944 rows of 2,016 bytes), each rep reading both once (L2 is 60 MB, so a rep evicts
// most of the one before); every loaded word is XORed into a per-block value that is stored (no
// dead loads). Median of 9 reps, CUDA events.
//   nvcc -O3 -arch=sm_90 -o /tmp/read_probe bench/read_probe.cu && /tmp/read_probe
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>
#include "cuda_check.cuh"


constexpr int ROWS = 18944, ROW_BYTES = 2016; // 7B ffn_gate / ffn_up, q4_K: 14 blocks of 144 bytes
constexpr size_t MAT = (size_t)ROWS * ROW_BYTES;

// Plain streaming read of both matrices: a grid-stride loop, 16 bytes a thread, 4 loads in flight.
__global__ void stream_kernel(const uint4 *a, const uint4 *b, size_t n16, uint32_t *out) {
    uint32_t h = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < 2 * n16; i += 4 * stride) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const size_t k = i + u * stride;
            v[u] = k < 2 * n16 ? (k < n16 ? a[k] : b[k - n16]) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < 4; u++) h ^= fold(v[u]);
    }
    publish(h, out);
}

// Short blocks, one contiguous segment of SEG bytes of each matrix per block (the same offset in
// both, as gate and up), every load issued before any is used, then exit.
template <int SEG>
__global__ void seg_kernel(const uint8_t *a, const uint8_t *b, uint32_t *out) {
    constexpr int PER = SEG / 16 / 128; // 16-byte loads per thread per matrix
    const size_t base = (size_t)blockIdx.x * SEG;
    uint4 v[2 * PER];
#pragma unroll
    for (int u = 0; u < PER; u++) {
        v[u] = *(const uint4 *)(a + base + (u * 128 + threadIdx.x) * 16);
        v[PER + u] = *(const uint4 *)(b + base + (u * 128 + threadIdx.x) * 16);
    }
    uint32_t h = 0;
#pragma unroll
    for (int u = 0; u < 2 * PER; u++) h ^= fold(v[u]);
    publish(h, out);
}

// The block kernel's own pattern for the 7B gate/up (rows of 112 chunks: 2 rows a block, 64
// threads a row, thread j taking chunks j and j + 64): per chunk c of superblock c / 8 the 16-byte
// head and the two 16-byte halves of the 32 quant bytes that chunks 2i, 2i + 1 share.
__global__ void q4k_kernel(const uint8_t *a, const uint8_t *b, uint32_t *out) {
    const int r = blockIdx.x * 2 + threadIdx.x / 64, j = threadIdx.x % 64;
    uint4 v[2][2][3];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int c = j + 64 * u;
            if (c < 112) {
                const uint8_t *blk = (m ? b : a) + (size_t)r * ROW_BYTES + (c / 8) * 144;
                v[m][u][0] = *(const uint4 *)blk;
                v[m][u][1] = *(const uint4 *)(blk + 16 + 32 * ((c % 8) >> 1));
                v[m][u][2] = *(const uint4 *)(blk + 32 + 32 * ((c % 8) >> 1));
            } else {
                v[m][u][0] = v[m][u][1] = v[m][u][2] = make_uint4(0, 0, 0, 0);
            }
        }
    uint32_t h = 0;
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int u = 0; u < 2; u++) h ^= fold(v[m][u][0]) ^ fold(v[m][u][1]) ^ fold(v[m][u][2]);
    publish(h, out);
}

template <typename F>
static float median_ms(F launch) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> t;
    for (int rep = 0; rep < 10; rep++) {
        CK(cudaEventRecord(e0));
        launch();
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (rep) t.push_back(ms); // the first is a warm-up
    }
    CK(cudaGetLastError());
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

int main() {
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    uint8_t *a, *b;
    uint32_t *out;
    CK(cudaMalloc(&a, MAT + 4096));
    CK(cudaMalloc(&b, MAT + 4096));
    CK(cudaMalloc(&out, 1 << 22));
    CK(cudaMemset(a, 1, MAT + 4096));
    CK(cudaMemset(b, 2, MAT + 4096));
    const double bytes = 2.0 * MAT;
    auto report = [&](const char *what, float ms) { printf("%-44s %8.1f us  %6.0f GB/s\n", what, ms * 1e3, bytes / ms / 1e6); };
    const size_t n16 = MAT / 16;
    for (int per_sm : {8, 16}) {
        char name[64];
        snprintf(name, sizeof name, "stream, grid-stride, %d blocks an SM", per_sm);
        report(name, median_ms([&] { stream_kernel<<<sms * per_sm, 128>>>((const uint4 *)a, (const uint4 *)b, n16, out); }));
    }
    report("segments of 2 KB x 2 a block", median_ms([&] { seg_kernel<2048><<<(unsigned)(MAT / 2048), 128>>>(a, b, out); }));
    report("segments of 4 KB x 2 a block", median_ms([&] { seg_kernel<4096><<<(unsigned)(MAT / 4096), 128>>>(a, b, out); }));
    report("segments of 8 KB x 2 a block", median_ms([&] { seg_kernel<8192><<<(unsigned)(MAT / 8192), 128>>>(a, b, out); }));
    report("segments of 16 KB x 2 a block", median_ms([&] { seg_kernel<16384><<<(unsigned)(MAT / 16384), 128>>>(a, b, out); }));
    report("q4_K gate/up pattern (mi_mmvq_kernel<Q4_K,1,1>)", median_ms([&] { q4k_kernel<<<ROWS / 2, 128>>>(a, b, out); }));
    return 0;
}
