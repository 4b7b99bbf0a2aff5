// Probe: can a few SMs stream weights at a useful share of DRAM bandwidth, and what does a thread
// block cluster barrier cost? Decides whether a draft step (the 0.5B's ~200 dependent launches, each
// 1.2-5.3 us: docs/perf.md, session 8) could run as ONE persistent kernel on one cluster of <= 16 SMs,
// its phases (norm, q/k/v, attention, o, gate/up, down) separated by hardware cluster barriers instead
// of launches, its weights streamed by the Hopper bulk-copy engine (TMA) into a shared-memory ring
// that keeps streaming across the barriers. Such a kernel pays off only if (a) 16 SMs read at
// >= ~2 TB/s and (b) a cluster barrier costs well under a PDL launch (0.7-1.8 us, session 10).
//
// (a) One block per SM (forced by its shared memory), N blocks each reading a contiguous slice of
//     min(256 MiB / N, 24 MiB), each launch the next region of a 256 MiB buffer (L2 is 60 MB: a
//     region was last read >= 60 MB of reads ago, so the reads come from DRAM), two ways: plain 16-byte loads (1,024
//     threads, 8 loads in flight each: 128 KiB an SM) and cp.async.bulk into a ring of 4 x 48 KiB
//     completed by an mbarrier (PTX ISA "cp.async.bulk", "mbarrier"), the block then reading every
//     word from shared memory. Every word is XORed into a stored value (no dead loads). GB/s over
//     the median of 9 reps (CUDA events).
// (b) barrier.cluster.arrive.release + wait.acquire, 20,000 times in a loop, clusters of 2..16
//     blocks (16 needs the non-portable cluster size attribute), one cluster and 8 at once.
// (c) Both together, as a draft step would use them: one cluster of C blocks streams a decode
//     step's layer weights (the real Qwen2.5 Q4_K_M files' bytes a phase: q/k/v, attention (none),
//     o, gate + up, down; LM head left out: a wide kernel of its own would read it) through the
//     bulk-copy ring, 4 dp4a a 16-byte word standing in for the mat-vec's arithmetic, with a cluster
//     barrier after every phase (5 a layer); the ring keeps its copies in flight across barriers.
//     Against the same stream without barriers. us a step, median of 9.
//   nvcc -O3 -arch=sm_90 -o /tmp/sm_stream_probe bench/sm_stream_probe.cu && /tmp/sm_stream_probe
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <algorithm>
#include <vector>
#include "cuda_check.cuh"

constexpr size_t BUF = (size_t)256 << 20;
constexpr int STAGES = 4, CHUNK = 48 << 10; // bulk ring: 4 x 48 KiB = 192 KiB an SM
constexpr int THREADS = 1024;

// (a1) plain loads: block b reads bytes [b*per, (b+1)*per), 8 uint4 a thread in flight.
__global__ void __launch_bounds__(THREADS) ld_kernel(const uint4 *__restrict__ src, size_t per16, uint32_t *out) {
    extern __shared__ uint8_t pin[]; // only to hold one block per SM
    const uint4 *p = src + blockIdx.x * per16;
    uint32_t h = pin[0] * 0u;
    for (size_t i = threadIdx.x; i < per16; i += 8 * THREADS) {
        uint4 v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) v[u] = i + u * THREADS < per16 ? __ldcs(p + i + u * THREADS) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < 8; u++) h ^= fold(v[u]);
    }
    publish(h, out);
}

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

// The bulk-copy ring: STAGES slots of CHUNK bytes in dynamic shared memory, one mbarrier each
// (arrival count 1: the issuing thread's expect_tx; the copy's bytes complete it).
struct Ring {
    uint8_t *slots;  // [STAGES][CHUNK]
    uint64_t *bar;   // [STAGES]
    __device__ void init() { // thread 0, then a block barrier
        if (threadIdx.x == 0) {
            for (int s = 0; s < STAGES; s++) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&bar[s])));
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        }
        __syncthreads();
    }
    // Chunk number c (of this block's sequence) from global src into slot c % STAGES.
    __device__ void issue(int c, const uint8_t *src) {
        const int s = c % STAGES;
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(&bar[s])), "r"(CHUNK)
                     : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                         smem_u32(slots + (size_t)s * CHUNK)),
                     "l"(src), "r"(CHUNK), "r"(smem_u32(&bar[s]))
                     : "memory");
    }
    // Wait until chunk c has landed; its slot as 16-byte words.
    __device__ const uint4 *wait(int c) {
        const int s = c % STAGES;
        const uint32_t parity = (uint32_t)(c / STAGES) & 1u;
        asm volatile("{\n .reg .pred P;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 P, [%0], %1;\n @!P bra WAIT_%=;\n}" ::"r"(
                         smem_u32(&bar[s])),
                     "r"(parity)
                     : "memory");
        return (const uint4 *)(slots + (size_t)s * CHUNK);
    }
};

// (a2) bulk copies: thread 0 keeps STAGES chunks in flight; all threads fold each landed chunk.
__global__ void __launch_bounds__(THREADS) bulk_kernel(const uint8_t *__restrict__ src, size_t per, uint32_t *out) {
    extern __shared__ __align__(128) uint8_t ring_smem[]; // [STAGES][CHUNK]
    __shared__ __align__(8) uint64_t bar[STAGES];
    Ring ring{ring_smem, bar};
    const uint8_t *p = src + blockIdx.x * per;
    const int n = (int)(per / CHUNK);
    ring.init();
    if (threadIdx.x == 0)
        for (int c = 0; c < STAGES && c < n; c++) ring.issue(c, p + (size_t)c * CHUNK);
    uint32_t h = 0;
    for (int c = 0; c < n; c++) {
        const uint4 *q = ring.wait(c);
        for (int i = threadIdx.x; i < CHUNK / 16; i += THREADS) h ^= fold(q[i]);
        __syncthreads(); // everyone is done with the slot before it is refilled
        if (threadIdx.x == 0 && c + STAGES < n) ring.issue(c + STAGES, p + (size_t)(c + STAGES) * CHUNK);
    }
    publish(h, out);
}

// (b) cluster barrier loop.
__global__ void cluster_kernel(int iters, uint32_t *out) {
    for (int i = 0; i < iters; i++)
        asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    if (threadIdx.x == 0) out[blockIdx.x] = iters;
}

// (c) The weights of a step as phases of bytes (each a multiple of CHUNK x C after rounding up),
// block b of the cluster taking every C-th chunk of a phase; a cluster barrier ends each phase.
__global__ void __launch_bounds__(THREADS) phase_kernel(const uint8_t *__restrict__ src, const int *__restrict__ phase_chunks,
                                                         int n_phases, int barriers, uint32_t *out) {
    const size_t n_buf_chunks = BUF / CHUNK; // the stream wraps around the buffer (> L2: still DRAM)
    extern __shared__ __align__(128) uint8_t ring_smem[]; // [STAGES][CHUNK]
    __shared__ __align__(8) uint64_t bar[STAGES];
    Ring ring{ring_smem, bar};
    uint32_t rank, csize;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(csize));
    int total = 0; // this block's chunks over all phases
    for (int p = 0; p < n_phases; p++) total += phase_chunks[p] / (int)csize;
    ring.init();
    // chunk c of this block is global chunk rank + C * c of the concatenated phases
    auto at = [&](int c) { return src + (((size_t)rank + (size_t)csize * c) % n_buf_chunks) * CHUNK; };
    if (threadIdx.x == 0)
        for (int c = 0; c < STAGES && c < total; c++) ring.issue(c, at(c));
    uint32_t h = 0;
    const int a = 0x01020304 + threadIdx.x;
    int c = 0;
    for (int p = 0; p < n_phases; p++) {
        const int n = phase_chunks[p] / (int)csize;
        for (int i = 0; i < n; i++, c++) {
            const uint4 *q = ring.wait(c);
            for (int j = threadIdx.x; j < CHUNK / 16; j += THREADS) {
                const uint4 v = q[j];
                h = __dp4a((int)v.x, a, __dp4a((int)v.y, a, __dp4a((int)v.z, a, __dp4a((int)v.w, a, (int)h))));
            }
            __syncthreads();
            if (threadIdx.x == 0 && c + STAGES < total) ring.issue(c + STAGES, at(c + STAGES));
        }
        if (barriers)
            asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    }
    publish(h, out);
}

// A launch of `grid` blocks in clusters of `csize` (at[0] must outlive the launch).
cudaLaunchConfig_t cluster_config(int grid, int block, size_t smem, int csize, cudaLaunchAttribute (&at)[1]) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(block);
    cfg.dynamicSmemBytes = smem;
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = csize;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cfg;
}

template <class F> float median_ms(F &&launch, int reps = 9) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    launch(); // warm-up
    CK(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int r = 0; r < reps; r++) {
        CK(cudaEventRecord(a));
        launch();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

int main() {
    uint8_t *buf;
    uint32_t *out;
    CK(cudaMalloc(&buf, BUF));
    CK(cudaMalloc(&out, 4096 * 4));
    CK(cudaMemset(buf, 0x5a, BUF));
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int ring = STAGES * CHUNK;
    CK(cudaFuncSetAttribute(bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, ring));
    CK(cudaFuncSetAttribute(ld_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, ring));
    printf("(a) streaming a 256 MiB buffer with N blocks (one an SM), GB/s\n");
    printf("%6s %12s %12s\n", "N", "plain loads", "bulk copies");
    for (int nb : {1, 2, 4, 8, 16, 32, 66, sms}) {
        const size_t per = std::min(BUF / nb, (size_t)24 << 20) / CHUNK * CHUNK; // whole chunks a block
        const size_t region = per * nb, n_regions = BUF / region;
        size_t k = 0; // launch counter: the region each launch reads
        auto at = [&] { return buf + (k++ % n_regions) * region; };
        const float t_ld = median_ms([&] { ld_kernel<<<nb, THREADS, ring>>>((const uint4 *)at(), per / 16, out); });
        CK(cudaGetLastError());
        const float t_bk = median_ms([&] { bulk_kernel<<<nb, THREADS, ring>>>(at(), per, out); });
        CK(cudaGetLastError());
        const double bytes = (double)per * nb;
        printf("%6d %12.0f %12.0f\n", nb, bytes / t_ld / 1e6, bytes / t_bk / 1e6);
    }
    printf("(b) cluster barrier (arrive.release + wait.acquire), us each, 20,000 in a loop\n");
    printf("%8s %14s %14s\n", "cluster", "1 cluster", "8 clusters");
    CK(cudaFuncSetAttribute(cluster_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    const int iters = 20000;
    for (int c : {2, 4, 8, 16}) {
        float us[2];
        for (int k = 0; k < 2; k++) {
            const int nclusters = k ? 8 : 1;
            cudaLaunchAttribute at[1];
            cudaLaunchConfig_t cfg = cluster_config(c * nclusters, 256, 0, c, at);
            const float ms = median_ms([&] { CK(cudaLaunchKernelEx(&cfg, cluster_kernel, iters, out)); }, 5);
            us[k] = ms * 1e3f / iters;
        }
        printf("%8d %14.3f %14.3f\n", c, us[0], us[1]);
    }
    printf("(c) a step's layer weights streamed by one cluster, 5 cluster barriers a layer, us a step\n");
    printf("%-28s %8s %10s %12s %14s\n", "shape", "cluster", "MB", "no barriers", "with barriers");
    CK(cudaFuncSetAttribute(phase_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, ring));
    CK(cudaFuncSetAttribute(phase_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    struct Shape { const char *name; int layers; double kb[5]; };
    // KB a phase: q/k/v, attention, o, gate + up, down (real Q4_K_M files: 0.5B q5_0 / q8_0 v /
    // q4_K-q6_K down, 1.5B q4_K / q6_K v and down in half the layers: the mean bytes a weight)
    const Shape shapes[] = {{"qwen2.5-0.5B (draft)", 24, {752, 0, 552, 5990, 3000}},
                            {"qwen2.5-1.5B", 28, {1820, 0, 1330, 15500, 9500}}};
    int *d_phases;
    CK(cudaMalloc(&d_phases, 4 * 5 * 64));
    for (const Shape &sh : shapes) {
        for (int c : {8, 16}) {
            std::vector<int> ph;
            double mb = 0;
            for (int l = 0; l < sh.layers; l++)
                for (int p = 0; p < 5; p++) {
                    int n = (int)((sh.kb[p] * 1024 + CHUNK - 1) / CHUNK);
                    n = (n + c - 1) / c * c; // whole rounds of the cluster's blocks
                    ph.push_back(n);
                    mb += (double)n * CHUNK / 1e6;
                }
            CK(cudaMemcpy(d_phases, ph.data(), ph.size() * 4, cudaMemcpyHostToDevice));
            cudaLaunchAttribute at[1];
            cudaLaunchConfig_t cfg = cluster_config(c, THREADS, ring, c, at);
            float ms[2];
            for (int b = 0; b < 2; b++)
                ms[b] = median_ms([&] { CK(cudaLaunchKernelEx(&cfg, phase_kernel, (const uint8_t *)buf, (const int *)d_phases,
                                                              (int)ph.size(), b, out)); });
            printf("%-28s %8d %10.1f %12.1f %14.1f\n", sh.name, c, mb, ms[0] * 1e3, ms[1] * 1e3);
        }
    }
    CK(cudaFree(d_phases));
    CK(cudaFree(buf));
    CK(cudaFree(out));
    return 0;
}
