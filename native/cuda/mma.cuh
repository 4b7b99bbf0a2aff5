// Tensor-core PTX shared by the GEMM (mmq.cu), the attention (attention.cu) and the verify mat-vec
// (mmvq_mma.cu), sm_80+: the m16n8k16 f16 MMA with f32 accumulators, the m16n8k32 s8 MMA, ldmatrix
// and cp.async (PTX ISA, "Warp-level matrix instructions: mma", "ldmatrix", "cp.async").
#ifndef MI_CUDA_MMA_CUH
#define MI_CUDA_MMA_CUH
#include <stdint.h>
#include <cuda_fp16.h>

// d += A B: A 16 x 16 f16 row-major (a[0..3]: rows g / g + 8, k 2q.. / 8 + 2q.., g = lane / 4,
// q = lane % 4), B 16 x 8 f16 "col" (b0: k 2q, 2q + 1 of column g; b1: k + 8), d 16 x 8 f32
// (d[0], d[1]: row g, columns 2q, 2q + 1; d[2], d[3]: row g + 8).
__device__ __forceinline__ void mi_mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d = A B (int32, exact): A 16 x 32 s8 row-major (a[0]: row g, k 4q..4q+3; a[1]: row g + 8, same k;
// a[2], a[3]: the same rows, k 16 + 4q..), B 32 x 8 s8 "col" (b0: k 4q..4q+3 of column g; b1: k +
// 16), d as mi_mma_f16's (d[0], d[1]: row g, columns 2q, 2q + 1; d[2], d[3]: row g + 8). An integer
// dot product has no order, so callers may permute k freely if A and B agree.
__device__ __forceinline__ void mi_mma_s8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%10,%10,%10,%10};"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}

// Four 8 x 8 f16 matrices from shared memory: lanes 8m .. 8m + 7 give the addresses of matrix m's
// eight 16-byte rows; r[m] then holds, in lane l, row l / 4, halves 2 (l % 4) and 2 (l % 4) + 1.
__device__ __forceinline__ void mi_ldsm_x4(uint32_t (&r)[4], const __half *p) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// 16 bytes global -> shared without registers (L2 only: .cg); both addresses 16-byte aligned.
__device__ __forceinline__ void mi_cp_async16(void *smem, const void *gmem) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void mi_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Wait for every cp.async this thread issued (the block barrier after it publishes them).
__device__ __forceinline__ void mi_cp_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }
#endif
