// Tensor-core building blocks shared by the attention kernels (decode_attention_mma.cu, prefill_attention.cu):
// mma.sync m16n8k16 with f32 accumulation on f16 or bf16 operands, ldmatrix from shared memory, the operand
// rounding, the base-2 exponential, cp.async copies, int2 codes as f16 subnormals, and the (scale, zero) word of an
// int row. Fragment layouts (PTX ISA, per lane gid = lane / 4, tid = lane % 4):
//   A (16 x 16, row-major)  a0: row gid, cols 2tid, 2tid+1   a1: row gid+8, same cols   a2 / a3: cols + 8
//   B (16 x 8,  "col")      b0: rows (k) 2tid, 2tid+1, col gid   b1: rows 2tid+8, 2tid+9
//   C (16 x 8,  f32)        c0, c1: row gid, cols 2tid, 2tid+1   c2, c3: row gid+8
// and mma.sync m16n8k32 on 8-bit operands (u8 A, s8 B, four to a register, byte i first), with s32 accumulation:
//   A (16 x 32, row-major)  a0: row gid, cols 4tid .. 4tid+3   a1: row gid+8, same cols   a2 / a3: cols + 16
//   B (32 x 8,  "col")      b0: rows (k) 4tid .. 4tid+3, col gid   b1: rows + 16
//   C (16 x 8,  s32)        as above
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace kvq::cuda::tc {

// GPUs whose blocks may opt into at most 99 KB of shared memory (sm_86, sm_89: A10, RTX 30xx, L40S, RTX 40xx), against
// 163 KB on sm_80 and 227 KB on sm_90: the tensor-core kernels keep fewer tiles in flight there. A property of the code
// being compiled (__CUDA_ARCH__; false in the host pass): each kernel file exports the value of the code the GPU
// loaded (its SASS, or the PTX it was JIT-compiled from) in a __device__ variable, from which the host sizes launches.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 860 || __CUDA_ARCH__ == 890)
constexpr bool kSmemSmall = true;
#else
constexpr bool kSmemSmall = false;
#endif

__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// c = A · B on u8 x s8 operands (exact integer products and sums), from zero.
__device__ __forceinline__ void mma_u8s8(int (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(0));
}
// The mma of the operand type: f16 (F16) or bf16.
template <bool F16>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (F16) mma_f16(c, a, b); else mma_bf16(c, a, b);
}

// Four 8x8 matrices of 16-bit elements from shared memory: lane l gives the address of row l % 8 of matrix l / 8;
// r[i] is this lane's part of matrix i: elements (row gid, cols 2tid, 2tid + 1) as stored, an A fragment or the B
// fragment of a matrix stored [n][k]. trans: elements (rows 2tid, 2tid + 1, col gid), the B fragment of a matrix
// stored [k][n]. Row addresses must be 16-byte aligned.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}

// 16 bytes from global to shared memory without passing through registers (cp.async.cg: cached in L2 only); with
// valid false nothing is read and the 16 bytes are zero-filled (src must still be a mapped address). Both 16-byte
// aligned. A group of copies ends with cp_async_commit; cp_async_wait<N> waits until at most N groups are pending.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
// 4 or 8 bytes from global to shared memory (cp.async.ca; the only sizes below 16 bytes go through L1), zero-filled
// when valid is false; both aligned to the size. For rows whose stride is not a multiple of 16 bytes (int2 rows: 36),
// and words gathered from a key block (codec_kitty.cuh).
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, bool valid) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 4 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_8(void* dst, const void* src, bool valid) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 8 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Two 16-bit elements (lo = first) of the operand type.
template <bool F16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (F16) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}
// x rounded to the operand type, as a float.
template <bool F16>
__device__ __forceinline__ float round16(float x) {
  if constexpr (F16) return __half2float(__float2half_rn(x)); else return __bfloat162float(__float2bfloat16_rn(x));
}

constexpr float kLog2e = 1.4426950409f;  // scores are kept in base 2: s·log2(e), so p = 2^(s - m)
constexpr float kLn2 = 0.6931471806f;    // m back to base e for the merge

// 2^x in one MUFU.EX2; results below 2^-126 flush to zero, which p = 2^(s - m) <= 1 never needs; 2^-inf = 0.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The 2-bit codes at bits [2k, 2k + 2) of bytes 0 and 2 of w as an f16 pair (byte 0 low): masked in place, each
// half holds c·4^k in its mantissa with a zero exponent, the subnormal c·4^k·2^-24 (exact; tensor cores take f16
// subnormals at full precision). k is a compile-time constant after unrolling: one LOP3.
__device__ __forceinline__ uint32_t codes_sub2(uint32_t w, int k) { return w & (0x00030003u << (2 * k)); }
constexpr float kTwo24 = 16777216.f;  // 2^24: undoes the subnormal exponent of codes_sub2

// The (scale, zero) word of an int row of one group (layout::IntRow: fp16 scale, then fp16 zero).
__device__ __forceinline__ float params_scale(uint32_t p) { return __half2float(__ushort_as_half(uint16_t(p))); }
__device__ __forceinline__ float params_zero(uint32_t p) { return __half2float(__ushort_as_half(uint16_t(p >> 16))); }

}  // namespace kvq::cuda::tc
