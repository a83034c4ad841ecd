// Compile-target macros shared by host and device code.
// Every header that may be reached from a GPU kernel marks its functions with
// CHI_CROSS_FUN; under plain g++ the macros expand to nothing.
#pragma once

// nvcc pre-includes its runtime header and hipcc does not: without this, device-side
// memcpy (used by the archives) and kernel launches fail to compile under hipcc.
#if defined(__HIPCC__)
#include <hip/hip_runtime.h>  // __host__/__device__, device memcpy, threadIdx
#endif

#if defined(__CUDACC__) || defined(__HIPCC__)
#define CHI_CROSS_FUN __host__ __device__
#define CHI_GPU_FUN __device__
#define CHI_HOST_FUN __host__
#define CHI_KERNEL __global__
#else
#define CHI_CROSS_FUN
#define CHI_GPU_FUN
#define CHI_HOST_FUN
#define CHI_KERNEL
#endif

// True while compiling the device side of a CUDA or HIP translation unit.
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define CHI_IS_GPU 1
#else
#define CHI_IS_GPU 0
#endif

// Which GPU toolchain compiles this translation unit (0 when none).
#if defined(__HIPCC__)
#define CHI_GPU_HIP 1
#define CHI_GPU_CUDA 0
#elif defined(__CUDACC__)
#define CHI_GPU_HIP 0
#define CHI_GPU_CUDA 1
#else
#define CHI_GPU_HIP 0
#define CHI_GPU_CUDA 0
#endif

#define CHI_INLINE inline __attribute__((always_inline))
// Forces inlining in host code only: an archive's per-field calls then fold into the
// caller's copies (25 ns of a shm round trip on the CI-like VM); device code keeps the
// compiler's choice, tuned separately.
#if CHI_IS_GPU
#define CHI_HOST_INLINE
#else
#define CHI_HOST_INLINE __attribute__((always_inline))
#endif
// Keeps a cold path (an error answer, a failure message) out of line, so its code is not
// laid into, or hoisted onto, the hot path that calls it (GPU threads run one instruction
// stream: every instruction on the path costs latency).
#define CHI_NOINLINE __attribute__((noinline))

// Fully unrolls the loop that follows (a pragma cannot come from a template). GPU polling
// loops need it: with constant indices their arrays stay in registers, so a batch of loads
// is in flight together instead of each waiting for the previous one's store to the stack.
#if defined(__CUDACC__) || defined(__HIPCC__)
#define CHI_UNROLL _Pragma("unroll")
#else
#define CHI_UNROLL _Pragma("GCC unroll 16")
#endif

// Branch hints for checks that almost never fire on the hot path.
#define CHI_LIKELY(x) __builtin_expect(!!(x), 1)
#define CHI_UNLIKELY(x) __builtin_expect(!!(x), 0)

// Markers for task fields, for readers only: CHI_IN is set by the caller and travels to the
// runtime, CHI_OUT is set by the handler and travels back, CHI_INOUT both, CHI_TEMP stays in
// the process that holds the task. Prefixed, so they never collide with user code or
// platform headers.
#define CHI_IN
#define CHI_OUT
#define CHI_INOUT
#define CHI_TEMP

namespace chi {
/** Cache line size used to keep producer and consumer indices apart. */
inline constexpr unsigned kCacheLine = 64;
}  // namespace chi
