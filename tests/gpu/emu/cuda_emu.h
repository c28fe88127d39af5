/*
 * cuda_emu.h — a CPU emulator for the subset of CUDA that runtime/cuda/ uses, so that the CUDA
 * backend's own kernel code runs (slowly, single-threaded) on machines without a GPU and the
 * GPU kernel test can compare it with the CPU twins in CI.
 *
 * What it emulates: the runtime API calls the backend makes (memory is host memory, a stream
 * is a no-op queue: every call completes before it returns), one cuBLAS entry point (a plain
 * column-major GEMM loop, written from cuBLAS's documented semantics; fp32, or bf16 A and B
 * with a bf16 or fp32 C and fp32 accumulation), and kernel execution:
 * every CUDA thread of a block is a ucontext coroutine with its own stack; __syncthreads() and
 * the warp primitives (__shfl*_sync, __syncwarp) are real barriers over the block or the warp,
 * scheduled round-robin.  A barrier that can never complete (divergent __syncthreads, a
 * shuffle some lanes never reach, a lane that exited before a shuffle) aborts with a message,
 * so the emulator also checks the kernels' barrier discipline.  Shared memory (static and
 * dynamic) is per block and filled with NaN at block start, device memory from cudaMalloc is
 * filled with NaN too: reading something never written shows up in the results.  A launch
 * asking for more than 48 KiB of dynamic shared memory fails unless cudaFuncSetAttribute
 * raised that kernel's limit first, as on a real device.
 *
 * Tensor cores (runtime/cuda/mma.cuh): mma.sync m16n8k16 (bf16) and m16n8k8 (tf32) are
 * warp-collective here too (emu_warp_exchange), and each lane's D elements are computed from
 * the other lanes' registers through the PTX ISA's fragment layouts, so a kernel that loads
 * a fragment wrongly gets wrong numbers here as on a device.  Bit-exact: which elements
 * meet (the layout), the inputs the hardware reads (bf16 exactly; a .tf32 operand as the
 * top 19 bits of its register, the low 13 ignored), cvt.rna.tf32.f32 (nearest, ties away),
 * and the exactness of each product in fp32.  Not bit-exact: the order and internal
 * rounding of the sum c + a0 b0 + ... inside one mma, which the PTX ISA does not specify
 * (here: fp32, in k order after c); results agree with a device to fp32 rounding of that
 * sum.  cp.async is a synchronous 16-byte copy (or zero fill), so commit / wait_group are
 * no-ops and a kernel that reads a cp.async destination before waiting is not caught.
 *
 * The cuBLAS GEMM computes in fp32 in k order; with CUBLAS_COMPUTE_32F_FAST_TF32 it rounds
 * fp32 inputs to TF32 first (as cvt.rna does; cuBLAS's own conversion is undocumented).
 *
 * What it does not: concurrency between threads (a data race runs in a fixed order here),
 * the memory model, timing.
 *
 * Used by compiling runtime/cuda/ *.cu as C++ with -DSBPRT_CUDA_EMU; runtime/cuda/cuda.h then
 * includes this header instead of the CUDA headers.  The host API part is plain C.
 */
#ifndef CUDA_EMU_H
#define CUDA_EMU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- runtime API (the subset the backend and the tests call) -------------------------- */

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorNoDevice = 100,
    cudaErrorLaunchFailure = 719,
} cudaError_t;

typedef struct emu_stream *cudaStream_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

enum cudaDeviceAttr {
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};

enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    int multiProcessorCount;
    int major, minor;
};
typedef struct cudaDeviceProp cudaDeviceProp;

const char *cudaGetErrorString(cudaError_t err);
const char *cudaGetErrorName(cudaError_t err);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaGetDevice(int *dev);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int dev);
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int dev);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t stream);
cudaError_t cudaStreamCreate(cudaStream_t *stream);
/* A stream created non-blocking (the CUDA backend's copy stream) is the one concurrent thing
 * the emulator models: its copies are deferred until an event recorded after them is waited
 * for, or the stream or the device is synchronised, and the destination of a deferred copy
 * is filled with NaN meanwhile.  So a kernel that reads a transfer's destination before the
 * step waits for it reads NaN, and one that overwrites a transfer's source before the wait
 * changes what arrives: both show up in the results, as a race on a real device would. */
#define cudaStreamNonBlocking 0x01
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags);
typedef struct emu_event *cudaEvent_t;
#define cudaEventDisableTiming 0x02
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value);

/* Device memory the emulator pretends to have (cudaMemGetInfo; cudaMalloc fails beyond it);
 * the environment variable SBP_CUDA_EMU_DEVICE_BYTES overrides it. */
#define EMU_DEVICE_BYTES ((size_t)8 << 30)
/* The opt-in dynamic shared memory limit of an sm_90 device (227 KiB). */
#define EMU_SMEM_OPTIN (227 * 1024)

/* ---- cuBLAS (one GEMM entry point; fp32, or bf16 A and B with a bf16 or fp32 C) -------- */

typedef struct emu_cublas *cublasHandle_t;
typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16BF = 14 } cudaDataType; /* CUDA's values */
typedef enum {
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
} cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;

cublasStatus_t cublasCreate(cublasHandle_t *handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
const char *cublasGetStatusString(cublasStatus_t status);
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void *alpha, const void *A, cudaDataType Atype,
                                          int lda, long long strideA, const void *B,
                                          cudaDataType Btype, int ldb, long long strideB,
                                          const void *beta, void *C, cudaDataType Ctype, int ldc,
                                          long long strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo);

/* Number of kernel launches and emulated thread switches so far (for the test's report). */
unsigned long long emu_launch_count(void);

#ifdef __cplusplus
}

/* ---- device side (C++ only: the .cu files) -------------------------------------------- */

#include <functional>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

/* The indices of the emulated thread that is running. */
struct emu_thread_ids {
    dim3 tid, bid, bdim, gdim;
};
extern emu_thread_ids *emu_ids;
#define threadIdx (emu_ids->tid)
#define blockIdx (emu_ids->bid)
#define blockDim (emu_ids->bdim)
#define gridDim (emu_ids->gdim)

void __syncthreads(void);
void __syncwarp(unsigned mask = 0xffffffffu);
/* Writes `bytes` of *val into this lane's slot, waits for the warp, reads lane src's slot. */
void emu_shfl(const void *val, void *out, size_t bytes, int src_lane);
int emu_lane(void);
/* The tensor-core emulation's exchange (runtime/cuda/mma.cuh): every lane of the warp writes
 * `bytes` (at most EMU_XCHG_BYTES) of *mine, waits for the warp, and reads all 32 lanes'
 * deposits into all[0..31] (lane order).  One warp barrier per call: deposits alternate
 * between two buffers, and a lane can only come back to a buffer after every lane has
 * passed the next exchange's barrier, so after every lane read this one. */
#define EMU_XCHG_BYTES 64
void emu_warp_exchange(const void *mine, void *all, size_t bytes);

template <class T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
    (void)mask;
    (void)width;
    T r;
    emu_shfl(&v, &r, sizeof v, src & 31);
    return r;
}
template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32)
{
    (void)width;
    return __shfl_sync(mask, v, emu_lane() ^ lane_mask);
}

inline int atomicOr(int *addr, int v)
{
    int old = *addr;
    *addr = old | v;
    return old;
}
/* The round-to-nearest arithmetic intrinsics: on the CPU (ISO C++, no contraction) each
 * operator already rounds once. */
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }

/* Per-block shared memory: the dynamic allocation of the launch, and a static array keyed by
 * its declaration site. */
void *emu_dynamic_shared(void);
void *emu_static_shared(const void *key, size_t bytes);

/* Runs body once per thread of every block of the grid; returns after the grid completes.
 * Sets the error cudaGetLastError() reports on a bad configuration. */
void emu_launch(const void *fn, dim3 grid, dim3 block, size_t smem,
                const std::function<void()> &body);

#endif /* __cplusplus */

#endif /* CUDA_EMU_H */
