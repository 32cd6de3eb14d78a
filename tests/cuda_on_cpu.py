"""Run a plain CUDA kernel that TileLang generated on the CPU, to check its results without a GPU.

For kernels of ordinary loads, stores, arithmetic and `__syncthreads()` only (no tensor cores, TMA, cp.async or
warp shuffles): the few-rows GEMM (its atomic arrival count included) and the split-K reduction. The generated source is compiled by the host C++
compiler with a small prelude standing in for CUDA's types (`half_t` as `_Float16`, `bfloat16_t` as a float's
upper half, the vector structs) and built-ins; bfloat16 arrays travel as their uint16 bits (`to_bfloat16_bits`).
Each thread of a block is a std::thread, `__syncthreads()` a barrier, and the grid's blocks run one after
another, so a block's threads meet at the same barriers as on a GPU. What it checks is the code TileLang wrote
(indices, guards, the barriers between shared-memory phases), not what nvcc or the hardware make of it.
"""

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile

import numpy as np

PRELUDE = r"""
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

typedef unsigned char uchar;
typedef _Float16 half_t;
struct half2 { half_t x, y; };
struct uint1 { unsigned x; };
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
inline uint1 make_uint1(unsigned x) { return {x}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline unsigned __pack_half2(half_t a, half_t b) {
  unsigned short ua, ub;
  std::memcpy(&ua, &a, 2);
  std::memcpy(&ub, &b, 2);
  return unsigned(ua) | (unsigned(ub) << 16);
}
inline float2 __half22float2(half2 h) { return {float(h.x), float(h.y)}; }
inline half2 __float22half2_rn(float2 f) { return {half_t(f.x), half_t(f.y)}; }
struct bfloat16_t {  // the upper half of a float32, rounded to nearest even
  uint16_t bits;
  bfloat16_t() = default;
  bfloat16_t(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    bits = uint16_t((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
  }
  operator float() const {
    uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};
struct __nv_bfloat162 { bfloat16_t x, y; };
inline unsigned __pack_nv_bfloat162(bfloat16_t a, bfloat16_t b) { return unsigned(a.bits) | (unsigned(b.bits) << 16); }
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return {float(h.x), float(h.y)}; }
inline __nv_bfloat162 __float22bfloat162_rn(float2 f) { return {bfloat16_t(f.x), bfloat16_t(f.y)}; }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __expf(float a) { return std::exp(a); }
using std::max;
using std::min;

struct Dim3 { int x = 0, y = 0, z = 0; };
static thread_local Dim3 threadIdx, blockIdx;
static std::barrier<>* block_barrier;
static uchar* shared_memory;
inline void __syncthreads() { block_barrier->arrive_and_wait(); }
inline void __threadfence() {}  // the blocks run one after another
template <typename T> inline T AtomicAddRet(T* address, T value) { return std::atomic_ref<T>(*address).fetch_add(value); }

#define __global__
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n) alignas(n)
"""

LAUNCH = r"""
extern "C" void tour_launch(void** args, int gx, int gy, int gz, int threads, long smem, int reverse) {
  std::vector<uchar> shm(smem + 1024);
  shared_memory = shm.data();
  std::barrier<> barrier(threads);
  block_barrier = &barrier;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      threadIdx.x = t;
      for (int z = 0; z < gz; ++z)
        for (int y = 0; y < gy; ++y)
          for (int x = 0; x < gx; ++x) {
            blockIdx = reverse ? Dim3{gx - 1 - x, gy - 1 - y, gz - 1 - z} : Dim3{x, y, z};
            KERNEL(CALL_ARGS);
            barrier.arrive_and_wait();  // the next block starts with fresh shared memory
          }
    });
  }
  for (auto& thread : pool) thread.join();
}
"""

UNSUPPORTED = ("wgmma", "tma_load", "cp_async", "__shfl", "mbarrier", "ldmatrix", "mma.sync")


def host_compiler() -> str | None:
    return shutil.which("g++") or shutil.which("clang++")


def kernel_signature(source: str) -> tuple[str, list[tuple[str, str]]]:
    """(the kernel's name, [(parameter type, name), ...]) from its definition in the generated CUDA."""
    match = re.search(r"__global__ void __launch_bounds__\([^)]*\) (\w+)\(([^)]*)\) \{", source)
    if match is None:
        raise ValueError("no kernel definition found in the source")
    params = []
    for param in match.group(2).split(","):
        *words, name = param.replace("__restrict__", "").split()
        params.append((" ".join(words), name))
    return match.group(1), params


def host_source(source: str) -> str:
    """The generated CUDA as host C++: CUDA headers dropped, dynamic shared memory the block's buffer."""
    found = [word for word in UNSUPPORTED if word in source]
    if found:
        raise ValueError(f"not a plain kernel: it uses {', '.join(found)}")
    body = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("#include"))
    body = re.sub(r"extern __shared__ __align__\(\d+\) (\w+) (\w+)\[\];", r"\1* \2 = (\1*)shared_memory;", body)
    if "__shared__" in body:
        raise ValueError("static __shared__ arrays are not supported")
    name, params = kernel_signature(source)
    casts = ", ".join(f"({ptype})args[{i}]" for i, (ptype, _) in enumerate(params))
    return PRELUDE + body + LAUNCH.replace("KERNEL", name).replace("CALL_ARGS", casts)


def build(source: str) -> ctypes.CDLL:
    """Compile the kernel's host form into a shared library (cached by the source's hash)."""
    code = host_source(source)
    folder = os.path.join(tempfile.gettempdir(), "tour_cuda_on_cpu")
    os.makedirs(folder, exist_ok=True)
    stem = os.path.join(folder, hashlib.sha1(code.encode()).hexdigest()[:16])
    if not os.path.exists(stem + ".so"):
        with open(stem + ".cpp", "w") as f:
            f.write(code)
        subprocess.run([host_compiler(), "-std=c++20", "-O1", "-w", "-shared", "-fPIC", "-pthread",
                        stem + ".cpp", "-o", stem + ".tmp.so"], check=True, capture_output=True, text=True)
        os.replace(stem + ".tmp.so", stem + ".so")
    return ctypes.CDLL(stem + ".so")


def run(report, arrays: dict[str, np.ndarray], reverse: bool = False) -> None:
    """Run a kernel (a tourkernels.KernelReport: its source and launch shape) on numpy arrays named as its
    parameters; arrays are written in place as the kernel writes them. reverse: the blocks in the opposite
    order (the last block of the grid first)."""
    lib = build(report.source)  # refuses kernels it cannot run first
    _, params = kernel_signature(report.source)
    missing = [name for _, name in params if name not in arrays]
    if missing:
        raise ValueError(f"no array for {', '.join(missing)}")
    for _, name in params:
        if not arrays[name].flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous")
    pointers = (ctypes.c_void_p * len(params))(*[arrays[name].ctypes.data for _, name in params])
    gx, gy, gz = report.grid
    lib.tour_launch(pointers, gx, gy, gz, report.threads, ctypes.c_long(report.dynamic_smem_bytes), int(reverse))


def to_bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (nearest even), as the uint16 bits a bfloat16 kernel reads."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bfloat16_bits(bits: np.ndarray) -> np.ndarray:
    """The float32 values of bfloat16 bits."""
    return (bits.astype(np.uint32) << 16).view(np.float32)
