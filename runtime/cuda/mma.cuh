/*
 * mma.cuh — the tensor-core layer of the CUDA backend: warp-wide matrix multiply-accumulate
 * (mma.sync m16n8k16 with bf16 inputs, m16n8k8 with tf32 inputs, fp32 accumulators), the
 * conversions their inputs need, and cp.async copies into shared memory.
 *
 * Why a layer of its own: the kernels that use tensor cores (attention.cu) are written once
 * for nvcc and for the CPU emulator (tests/gpu/emu).  On the device each function is one or
 * two PTX instructions; under SBPRT_CUDA_EMU the same call is a warp-collective emulation
 * that follows the PTX ISA's fragment layouts (section "Matrix fragments for mma.m16n8k16"
 * with .bf16 and "mma.m16n8k8" with .tf32), so a kernel that puts an element in the wrong
 * register computes wrong results in the emulator too, and the tests see it.
 *
 * Fragment layouts (lane = 4 * g + t: g = groupID = lane / 4, t = threadID_in_group):
 *   m16n8k16 bf16, A (16 x 16, row): a[0] = (row g,     cols 2t, 2t+1)
 *                                    a[1] = (row g + 8, cols 2t, 2t+1)
 *                                    a[2] = (row g,     cols 2t+8, 2t+9)
 *                                    a[3] = (row g + 8, cols 2t+8, 2t+9)
 *                  B (16 x 8, col):  b[0] = (rows 2t, 2t+1, col g),  b[1] = (rows 2t+8, 2t+9)
 *     each uint32_t holds two bf16, the lower column / row in the low 16 bits;
 *   m16n8k8 tf32,  A (16 x 8):       a[0] = (g, t), a[1] = (g + 8, t), a[2] = (g, t + 4),
 *                                    a[3] = (g + 8, t + 4)
 *                  B (8 x 8):        b[0] = (row t, col g), b[1] = (row t + 4, col g)
 *   both, C and D (16 x 8 fp32):     c[0], c[1] = (row g, cols 2t, 2t+1),
 *                                    c[2], c[3] = (row g + 8, cols 2t, 2t+1).
 *
 * 3xTF32 (cu_tf32_split): x = big + small with both parts TF32, and a·b is taken as
 * big·big + big·small + small·big, which recovers nearly the fp32 product (the dropped
 * small·small term is about 2^-22 relative) at three tensor-core operations per product.
 */
#ifndef SBPRT_CUDA_MMA_CUH
#define SBPRT_CUDA_MMA_CUH

#include "cuda.h"

/* Two bf16 bit patterns in one register, lo in the low half (the fragments' order). */
__device__ __forceinline__ uint32_t cu_pack_bf16(uint16_t lo, uint16_t hi)
{
    return (uint32_t)lo | ((uint32_t)hi << 16);
}

/* x rounded to TF32 as cvt.rna.tf32.f32 does: to nearest, ties away from zero, keeping 10
 * mantissa bits (the low 13 bits of the result are zero); Inf and NaN pass through. */
__device__ __forceinline__ uint32_t cu_tf32(float x)
{
#if defined(__CUDA_ARCH__)
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
#else
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u) /* Inf, NaN */
        return u;
    u += 0x1000u; /* half of the last kept bit: ties go away from zero (sign-magnitude) */
    return u & 0xffffe000u;
#endif
}

__device__ __forceinline__ float cu_u2f(uint32_t u)
{
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* x = big + small (approximately: small is rounded too), both TF32. */
__device__ __forceinline__ void cu_tf32_split(float x, uint32_t *big, uint32_t *small)
{
    *big = cu_tf32(x);
    *small = cu_tf32(x - cu_u2f(*big));
}

#ifdef SBPRT_CUDA_EMU
/* The emulation: every lane deposits its fragments (emu_warp_exchange, a warp barrier), then
 * computes its own four D elements from the documented layout.  Inputs are what the hardware
 * reads: bf16 exactly, TF32 as the top 19 bits of the register (the low 13 are ignored, as
 * the PTX ISA says for .tf32 operands).  Products are exact in fp32 (8 x 8 or 11 x 11
 * significant bits) and summed in fp32 in k order after c; the hardware's internal order
 * and rounding of that sum are not specified, so D agrees with a device to rounding, not
 * bit for bit (see cuda_emu.h). */
struct cu_mma_frag_ {
    uint32_t a[4], b[2];
};

__device__ __forceinline__ void cu_mma_bf16_16816(float d[4], const uint32_t a[4],
                                                  const uint32_t b[2], const float c[4])
{
    cu_mma_frag_ mine, all[32];
    memcpy(mine.a, a, sizeof mine.a);
    memcpy(mine.b, b, sizeof mine.b);
    emu_warp_exchange(&mine, all, sizeof mine);
    const int lane = emu_lane(), g = lane >> 2, t = lane & 3;
    float r[4];
    for (int e = 0; e < 4; e++) {
        const int row = g + (e >> 1) * 8, col = 2 * t + (e & 1);
        float s = c[e];
        for (int k = 0; k < 16; k++) {
            /* A(row, k): lane 4 * (row % 8) + (k % 8) / 2, register (row / 8) + 2 (k / 8) */
            const cu_mma_frag_ &fa = all[4 * (row & 7) + ((k & 7) >> 1)];
            const uint32_t ra = fa.a[(row >> 3) + 2 * (k >> 3)];
            const uint16_t ha = (uint16_t)((k & 1) ? ra >> 16 : ra & 0xffffu);
            /* B(k, col): lane 4 * col + (k % 8) / 2, register k / 8 */
            const cu_mma_frag_ &fb = all[4 * col + ((k & 7) >> 1)];
            const uint32_t rb = fb.b[k >> 3];
            const uint16_t hb = (uint16_t)((k & 1) ? rb >> 16 : rb & 0xffffu);
            s += cu_bf16_bits_to_float(ha) * cu_bf16_bits_to_float(hb);
        }
        r[e] = s;
    }
    memcpy(d, r, sizeof r);
}

__device__ __forceinline__ void cu_mma_tf32_1688(float d[4], const uint32_t a[4],
                                                 const uint32_t b[2], const float c[4])
{
    cu_mma_frag_ mine, all[32];
    memcpy(mine.a, a, sizeof mine.a);
    memcpy(mine.b, b, sizeof mine.b);
    emu_warp_exchange(&mine, all, sizeof mine);
    const int lane = emu_lane(), g = lane >> 2, t = lane & 3;
    float r[4];
    for (int e = 0; e < 4; e++) {
        const int row = g + (e >> 1) * 8, col = 2 * t + (e & 1);
        float s = c[e];
        for (int k = 0; k < 8; k++) {
            /* A(row, k): lane 4 * (row % 8) + k % 4, register (row / 8) + 2 (k / 4) */
            const uint32_t ra = all[4 * (row & 7) + (k & 3)].a[(row >> 3) + 2 * (k >> 2)];
            /* B(k, col): lane 4 * col + k % 4, register k / 4 */
            const uint32_t rb = all[4 * col + (k & 3)].b[k >> 2];
            s += cu_u2f(ra & 0xffffe000u) * cu_u2f(rb & 0xffffe000u);
        }
        r[e] = s;
    }
    memcpy(d, r, sizeof r);
}

/* cp.async: a synchronous copy here (what arrives is the same; only the timing differs),
 * so commit and wait have nothing to do. */
__device__ __forceinline__ void cu_cp_async16(void *smem, const void *gmem, bool valid)
{
    if (valid)
        memcpy(smem, gmem, 16);
    else
        memset(smem, 0, 16);
}
__device__ __forceinline__ void cu_cp_async_commit(void) {}
template <int N> __device__ __forceinline__ void cu_cp_async_wait(void) {}

#else /* the device */

__device__ __forceinline__ void cu_mma_bf16_16816(float d[4], const uint32_t a[4],
                                                  const uint32_t b[2], const float c[4])
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
                   "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

__device__ __forceinline__ void cu_mma_tf32_1688(float d[4], const uint32_t a[4],
                                                 const uint32_t b[2], const float c[4])
{
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
                   "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

/* 16 bytes global -> shared without going through registers; valid = false writes zeros
 * (src-size 0), for rows past a tensor's end or before a window. */
__device__ __forceinline__ void cu_cp_async16(void *smem, const void *gmem, bool valid)
{
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem), "r"(n)
                 : "memory");
}
__device__ __forceinline__ void cu_cp_async_commit(void)
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}
/* Waits until at most N of this thread's committed groups are still in flight. */
template <int N> __device__ __forceinline__ void cu_cp_async_wait(void)
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
#endif

/* ---- fragments from shared memory -------------------------------------------------------
 * cu_mma<T>: one warp-level product step for storage type T, its shared-memory element type
 * E and its k extent KS, with the fragment loads for the layouts the kernels keep:
 *   load_a(A, s, ld):    A(r, k) = s[r * ld + k]   (16 x KS, row-major)
 *   load_b_nk(B, s, ld): B(k, n) = s[n * ld + k]   (the operand transposed: K rows of Q·Kᵀ)
 *   load_b_kn(B, s, ld): B(k, n) = s[k * ld + n]   (row-major: V in P·V)
 *   mma(c, A, B):        c += A·B, c a 16 x 8 fp32 accumulator fragment.
 * bf16 (cu_bf16): E = the bf16 bits, m16n8k16.  fp32 (float): E = float, 3xTF32 on m16n8k8.
 * Strides: bf16 rows of ld = width + 8 elements and fp32 rows of ld = width + 8 floats put
 * the 32 lanes of each load on 32 different banks (the 4 lanes of a group read 4 adjacent
 * words, the 8 groups are 4 or 8 banks apart). */
template <class T> struct cu_mma;

/* Two adjacent bf16 elements (p even-aligned) as one fragment register. */
__device__ __forceinline__ uint32_t cu_ld_bf16x2(const uint16_t *p)
{
#if defined(__CUDA_ARCH__)
    return *reinterpret_cast<const uint32_t *>(p);
#else
    return cu_pack_bf16(p[0], p[1]);
#endif
}

template <> struct cu_mma<cu_bf16> {
    typedef uint16_t E;
    enum { KS = 16 };
    struct A {
        uint32_t r[4];
    };
    struct B {
        uint32_t r[2];
    };
    static __device__ __forceinline__ E from_float(float x) { return cu_float_to_bf16_bits(x); }
    static __device__ __forceinline__ void load_a(A &a, const E *s, int ld)
    {
        const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
        a.r[0] = cu_ld_bf16x2(s + g * ld + 2 * t);
        a.r[1] = cu_ld_bf16x2(s + (g + 8) * ld + 2 * t);
        a.r[2] = cu_ld_bf16x2(s + g * ld + 2 * t + 8);
        a.r[3] = cu_ld_bf16x2(s + (g + 8) * ld + 2 * t + 8);
    }
    static __device__ __forceinline__ void load_b_nk(B &b, const E *s, int ld)
    {
        const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
        b.r[0] = cu_ld_bf16x2(s + g * ld + 2 * t);
        b.r[1] = cu_ld_bf16x2(s + g * ld + 2 * t + 8);
    }
    static __device__ __forceinline__ void load_b_kn(B &b, const E *s, int ld)
    {
        const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
        b.r[0] = cu_pack_bf16(s[2 * t * ld + g], s[(2 * t + 1) * ld + g]);
        b.r[1] = cu_pack_bf16(s[(2 * t + 8) * ld + g], s[(2 * t + 9) * ld + g]);
    }
    static __device__ __forceinline__ void mma(float c[4], const A &a, const B &b)
    {
        cu_mma_bf16_16816(c, a.r, b.r, c);
    }
};

template <> struct cu_mma<float> {
    typedef float E;
    enum { KS = 8 };
    struct A {
        uint32_t big[4], small[4];
    };
    struct B {
        uint32_t big[2], small[2];
    };
    static __device__ __forceinline__ E from_float(float x) { return x; }
    static __device__ __forceinline__ void load_a(A &a, const E *s, int ld)
    {
        const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
        cu_tf32_split(s[g * ld + t], &a.big[0], &a.small[0]);
        cu_tf32_split(s[(g + 8) * ld + t], &a.big[1], &a.small[1]);
        cu_tf32_split(s[g * ld + t + 4], &a.big[2], &a.small[2]);
        cu_tf32_split(s[(g + 8) * ld + t + 4], &a.big[3], &a.small[3]);
    }
    static __device__ __forceinline__ void load_b_nk(B &b, const E *s, int ld)
    {
        const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
        cu_tf32_split(s[g * ld + t], &b.big[0], &b.small[0]);
        cu_tf32_split(s[g * ld + t + 4], &b.big[1], &b.small[1]);
    }
    static __device__ __forceinline__ void load_b_kn(B &b, const E *s, int ld)
    {
        const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
        cu_tf32_split(s[t * ld + g], &b.big[0], &b.small[0]);
        cu_tf32_split(s[(t + 4) * ld + g], &b.big[1], &b.small[1]);
    }
    /* the cross terms, then the main one, into the one accumulator */
    static __device__ __forceinline__ void mma(float c[4], const A &a, const B &b)
    {
        cu_mma_tf32_1688(c, a.small, b.big, c);
        cu_mma_tf32_1688(c, a.big, b.small, c);
        cu_mma_tf32_1688(c, a.big, b.big, c);
    }
};

#endif /* SBPRT_CUDA_MMA_CUH */
