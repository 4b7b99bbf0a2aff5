// Probe: what one dependent step costs on this GPU as (a) a software grid barrier inside one
// persistent kernel and (b) one more kernel in a graph-captured chain, with and without
// programmatic dependent launch (PDL). Decides whether a persistent decode kernel (one launch a
// token, barriers between the phases of a layer) can beat the chain of ~8 launches a layer
// (docs/perf.md, session 10), and, last, whether the cost of a launch is per block or per warp
// (session 16). Each step reads a 1536-float vector the previous step wrote and
// writes the next, so the dependency is real.
//   nvcc -O3 -arch=sm_90 -o /tmp/barrier_probe bench/barrier_probe.cu && /tmp/barrier_probe
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>
#include "cuda_check.cuh"


constexpr int N = 1536;

// Sense-reversal barrier: count arrivals, the last one bumps the generation the others poll.
__device__ __forceinline__ void grid_barrier(unsigned *count, unsigned *gen, unsigned nblocks) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned g;
        asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(g) : "l"(gen) : "memory");
        unsigned arrived;
        asm volatile("atom.acq_rel.gpu.add.u32 %0, [%1], 1;" : "=r"(arrived) : "l"(count) : "memory");
        if (arrived == nblocks - 1) {
            *count = 0;
            asm volatile("st.release.gpu.u32 [%0], %1;" ::"l"(gen), "r"(g + 1) : "memory");
        } else {
            unsigned cur;
            do {
                asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(cur) : "l"(gen) : "memory");
            } while (cur == g);
        }
    }
    __syncthreads();
}

// One step's work: block b adds 1 to its share of the vector (src -> dst).
__device__ __forceinline__ void step(const float *src, float *dst, int b, int nb) {
    for (int i = b * blockDim.x + threadIdx.x; i < N; i += nb * blockDim.x) dst[i] = src[i] + 1.0f;
}

__global__ void persistent(float *a, float *b, int steps, unsigned *count, unsigned *gen, int work) {
    for (int s = 0; s < steps; s++) {
        if (work) step(s & 1 ? b : a, s & 1 ? a : b, blockIdx.x, gridDim.x);
        grid_barrier(count, gen, gridDim.x);
    }
}

__global__ void one_step(float *src, float *dst, int work) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (work) step(src, dst, blockIdx.x, gridDim.x);
}

static float time_graph(cudaGraphExec_t ge, cudaStream_t s, int reps) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> t;
    for (int r = 0; r < reps; r++) {
        CK(cudaEventRecord(e0, s));
        CK(cudaGraphLaunch(ge, s));
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

// Capture enqueue(s) as one graph, warm it, and return the median us per step over reps replays.
template <typename F> static float us_per_step(cudaStream_t s, int steps, int reps, F enqueue) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    enqueue();
    CK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    time_graph(ge, s, 3);
    const float us = time_graph(ge, s, reps) * 1000.0f / steps;
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return us;
}

// Launch kernel(args...) on grid x threads with one launch attribute (or none: n_attr = 0).
template <typename... P, typename... A>
static void launch(void (*kernel)(P...), int grid, int threads, cudaStream_t s, cudaLaunchAttribute attr, int n_attr,
                   A... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = threads;
    cfg.stream = s;
    cfg.attrs = &attr;
    cfg.numAttrs = n_attr;
    CK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

int main() {
    const int steps = 200, reps = 21;
    float *a, *b;
    unsigned *bar;
    CK(cudaMalloc(&a, N * 4));
    CK(cudaMalloc(&b, N * 4));
    CK(cudaMalloc(&bar, 256));
    CK(cudaMemset(a, 0, N * 4));
    CK(cudaMemset(bar, 0, 256));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    printf("us per dependent step (median of %d graphs of %d steps), %d SMs\n", reps, steps, sms);
    printf("%-34s %8s %8s\n", "", "empty", "1536 f32");
    for (int threads : {128, 512}) {
        for (int per_sm : {1, 2, 4}) {
            const int grid = sms * per_sm;
            if (threads * per_sm > 2048) continue;
            cudaLaunchAttribute coop = {};
            coop.id = cudaLaunchAttributeCooperative; // all blocks resident: the barrier cannot deadlock
            coop.val.cooperative = 1;
            float us[2];
            for (int work = 0; work < 2; work++)
                us[work] = us_per_step(s, steps, reps, [&] {
                    launch(persistent, grid, threads, s, coop, 1, a, b, steps, bar, bar + 32, work);
                });
            printf("barrier, %4d blocks x %4d threads %8.2f %8.2f\n", grid, threads, us[0], us[1]);
        }
    }
    // us a step of a chain of one_step launches (grid x threads, PDL or not): empty, then copying
    auto chain = [&](int grid, int threads, int pdl, float (&us)[2]) {
        cudaLaunchAttribute ser = {};
        ser.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        ser.val.programmaticStreamSerializationAllowed = 1;
        for (int work = 0; work < 2; work++)
            us[work] = us_per_step(s, steps, reps, [&] {
                for (int k = 0; k < steps; k++)
                    launch(one_step, grid, threads, s, ser, pdl, k & 1 ? b : a, k & 1 ? a : b, work);
            });
    };
    for (int pdl = 0; pdl < 2; pdl++) {
        for (int grid : {1, sms, sms * 4, sms * 16}) {
            float us[2];
            chain(grid, 128, pdl, us);
            printf("launch chain%s, %5d blocks x 128   %8.2f %8.2f\n", pdl ? " + PDL" : "      ", grid, us[0], us[1]);
        }
    }
    // Same warps, fewer blocks: is the launch floor per block or per warp? (decides whether the
    // mat-vecs' 128-thread blocks should serve more rows each; docs/perf.md, session 16)
    for (int total : {sms * 16 * 128, sms * 8 * 128, sms * 32 * 128}) {
        for (int threads : {64, 128, 256, 512, 1024}) {
            float us[2];
            chain(total / threads, threads, 1, us);
            printf("PDL chain, %7d threads: %5d blocks x %4d %8.2f %8.2f\n", total, total / threads, threads, us[0], us[1]);
        }
    }
    return 0;
}
