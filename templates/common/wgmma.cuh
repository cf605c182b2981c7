// SPDX-License-Identifier: Apache-2.0
// Warpgroup tensor-core products (wgmma.mma_async, sm_90a only): four warps multiply their
// 16-row A fragments (registers, the layout of mma.cuh's A) by one B tile that the tensor cores
// read from shared memory once for the whole warpgroup, where mma.sync has every warp load its
// own copy through ldmatrix. NVRTC-clean (inline PTX only); compile only under
// __CUDA_ARCH_FEAT_SM90_ALL.
//
// B tiles are bf16 in the no-swizzle canonical layout: 8 x 8 "core matrices" of 128 contiguous
// bytes (row r of a core matrix at byte 16 r). `lbo` is the byte distance between core matrices
// adjacent along K, `sbo` along N, for a K-major B and for an N-major one (kTransB = 1) alike:
// bench/experiments/wgmma_layout_check.cu checked both on the H200 (the other reading of the
// N-major strides gives wrong products).
// The accumulators are written asynchronously: issue after fence(), then commit(), wait<0>() and
// hold_registers() on every accumulator before reading it; the A registers stay untouched until
// the wait.
#pragma once

#include "templates/common/types.h"

namespace kjit {
namespace wgmma {

/// The shared-memory matrix descriptor of a no-swizzle tile starting at `smem_addr` (16-byte
/// aligned, a __cvta_generic_to_shared address).
__device__ __forceinline__ u64 descriptor(u32 smem_addr, u32 lbo, u32 sbo) {
  return u64((smem_addr & 0x3ffffu) >> 4) | (u64((lbo >> 4) & 0x3fffu) << 16) |
         (u64((sbo >> 4) & 0x3fffu) << 32);
}

/// The descriptor of a 128-byte-swizzled tile (layout type 1, templates/common/swizzle.cuh):
/// rows of 128 bytes whose 16-byte chunk j sits at chunk j ^ (row % 8), in atoms of 8 rows (1024
/// bytes, 1024-byte aligned: the swizzle is taken from the address bits). K-major: `sbo` is the
/// distance between 8-row groups along N (lbo unused), and a k-step inside the 128-byte row moves
/// the start by 32 bytes. N-major: `lbo` is the distance between 64-column atoms along N, `sbo`
/// between 8-row groups along K. Both readings checked on the H200 by
/// bench/experiments/wgmma_layout_check.cu. Measured on the H200 (docs/performance.md): copies into
/// this layout move whole 128-byte lines, where the no-swizzle core matrices took every 16 bytes on
/// its own (8x the shared-memory wavefronts and 2x the L2 sectors of the copies).
__device__ __forceinline__ u64 descriptor_sw128(u32 smem_addr, u32 lbo, u32 sbo) {
  return descriptor(smem_addr, lbo, sbo) | (u64(1) << 62);
}
/// The descriptor `desc` moved `bytes` (a multiple of 16) further into shared memory: one add to
/// its address field, where building each k-step's descriptor from its address took ~6 uniform
/// instructions per wgmma (mask, shift, or, moves). Shared addresses stay below 256 KiB, so the
/// 14-bit field (address / 16) cannot carry into the next one (tests/unit/
/// templates_common_emulated_test.cpp checks every tile start and offset the kernels use).
__device__ __forceinline__ u64 advance(u64 desc, u32 bytes) { return desc + u64(bytes >> 4); }

#if !defined(KJIT_EMULATED_PTX)  // tests/common/sm90_emulation.hpp defines these on the CPU
/// Orders this thread's register writes (A fragments, accumulators) before the next wgmma.
__device__ __forceinline__ void fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

/// Makes this thread's generic-proxy writes to shared memory (st.shared, cp.async) visible to
/// the async proxy that wgmma reads its shared-memory operands through; every writer fences
/// before the barrier that precedes the wgmma.
__device__ __forceinline__ void fence_shared_writes() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/// Closes the group of wgmma issued since the previous commit.
__device__ __forceinline__ void commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

/// Waits until at most `kPending` committed groups are still running.
template <int kPending>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

/// Keeps the compiler from moving reads of an accumulator above the wait (or writes of it
/// below the issue).
template <int N>
__device__ __forceinline__ void hold_registers(float (&d)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
  }
}

/// d (64 x 64, f32, d[nt][e] as in mma.cuh's C fragments of n-tile nt) += a (64 x 16,
/// bf16, the warp's 16 rows as an mma.cuh A fragment) * b (16 x 64, bf16, in shared memory
/// behind the descriptor `b`). kTransB 0: b K-major, 1: b N-major.
template <int kTransB>
__device__ __forceinline__ void mma_m64n64k16(float (&d)[8][4], const u32 (&a)[4], u64 b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
      "}, {%32,%33,%34,%35}, %36, p, 1, 1, %37;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(kTransB));
}

/// d (64 x 64) += a (64 x 16, bf16, K-major in shared memory behind the descriptor `a`: warp w's
/// accumulator rows are a's rows 16 w .. 16 w + 15) * b (16 x 64, as in mma_m64n64k16). No
/// registers hold operands, so nothing but the accumulators waits for the product.
template <int kTransB>
__device__ __forceinline__ void mma_m64n64k16_ss(float (&d)[8][4], u64 a, u64 b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
      "}, %32, %33, p, 1, 1, 0, %34;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(a), "l"(b), "n"(kTransB));
}

/// d (64 x 32) += a (64 x 16, K-major in shared memory behind the descriptor `a`) * b (16 x 32,
/// as in mma_m64n64k16): mma_m64n64k16_ss on half the columns, for two warpgroups that split a
/// product's columns between them.
template <int kTransB>
__device__ __forceinline__ void mma_m64n32k16_ss(float (&d)[4][4], u64 a, u64 b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
      "}, %16, %17, p, 1, 1, 0, %18;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "l"(a), "l"(b), "n"(kTransB));
}

/// The operand list of an n = 128 product's 64 accumulator registers (%0 .. %63).
#define KJIT_WGMMA_ACC_N128                                          \
  "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"           \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31," \
  "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47," \
  "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"

/// The 64 accumulator operands of an n = 128 product held as two 64-column halves.
#define KJIT_WGMMA_OUT_N128(lo, hi)                                                               \
  "+f"(lo[0][0]), "+f"(lo[0][1]), "+f"(lo[0][2]), "+f"(lo[0][3]), "+f"(lo[1][0]), "+f"(lo[1][1]), \
      "+f"(lo[1][2]), "+f"(lo[1][3]), "+f"(lo[2][0]), "+f"(lo[2][1]), "+f"(lo[2][2]),             \
      "+f"(lo[2][3]), "+f"(lo[3][0]), "+f"(lo[3][1]), "+f"(lo[3][2]), "+f"(lo[3][3]),             \
      "+f"(lo[4][0]), "+f"(lo[4][1]), "+f"(lo[4][2]), "+f"(lo[4][3]), "+f"(lo[5][0]),             \
      "+f"(lo[5][1]), "+f"(lo[5][2]), "+f"(lo[5][3]), "+f"(lo[6][0]), "+f"(lo[6][1]),             \
      "+f"(lo[6][2]), "+f"(lo[6][3]), "+f"(lo[7][0]), "+f"(lo[7][1]), "+f"(lo[7][2]),             \
      "+f"(lo[7][3]), "+f"(hi[0][0]), "+f"(hi[0][1]), "+f"(hi[0][2]), "+f"(hi[0][3]),             \
      "+f"(hi[1][0]), "+f"(hi[1][1]), "+f"(hi[1][2]), "+f"(hi[1][3]), "+f"(hi[2][0]),             \
      "+f"(hi[2][1]), "+f"(hi[2][2]), "+f"(hi[2][3]), "+f"(hi[3][0]), "+f"(hi[3][1]),             \
      "+f"(hi[3][2]), "+f"(hi[3][3]), "+f"(hi[4][0]), "+f"(hi[4][1]), "+f"(hi[4][2]),             \
      "+f"(hi[4][3]), "+f"(hi[5][0]), "+f"(hi[5][1]), "+f"(hi[5][2]), "+f"(hi[5][3]),             \
      "+f"(hi[6][0]), "+f"(hi[6][1]), "+f"(hi[6][2]), "+f"(hi[6][3]), "+f"(hi[7][0]),             \
      "+f"(hi[7][1]), "+f"(hi[7][2]), "+f"(hi[7][3])

/// d (64 x 128, f32, d[nt][e] as in mma.cuh's C fragments of n-tile nt) += a (64 x 16,
/// bf16, the warp's 16 rows as an mma.cuh A fragment) * b (16 x 128, bf16, in shared memory
/// behind the descriptor `b`). kTransB 0: b K-major, 1: b N-major.
template <int kTransB>
__device__ __forceinline__ void mma_m64n128k16(float (&d)[16][4], const u32 (&a)[4], u64 b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" KJIT_WGMMA_ACC_N128
      "}, {%64,%65,%66,%67}, %68, p, 1, 1, %69;\n}\n"
      : KJIT_WGMMA_OUT_N128(d, (d + 8))
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(kTransB));
}

/// d (64 x 128: columns 0..63 in d_lo, 64..127 in d_hi, each as mma_m64n64k16's d) += a (64 x
/// 16, K-major in shared memory behind the descriptor `a`) * b (16 x 128, behind `b`; K-major: 128
/// rows, e.g. a pair tile of sw128::kPairSlice). One instruction for two 64-column products of the
/// same A: the tensor cores read A once instead of twice. No registers hold operands.
template <int kTransB>
__device__ __forceinline__ void mma_m64n128k16_ss(float (&d_lo)[8][4], float (&d_hi)[8][4], u64 a,
                                                  u64 b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" KJIT_WGMMA_ACC_N128
      "}, %64, %65, p, 1, 1, 0, %66;\n}\n"
      : KJIT_WGMMA_OUT_N128(d_lo, d_hi)
      : "l"(a), "l"(b), "n"(kTransB));
}

/// d (64 x 128: columns 0..63 in d_lo, 64..127 in d_hi, as mma_m64n128k16_ss's) += a (64 x 16,
/// bf16, the warp's 16 rows as an mma.cuh A fragment) * b (16 x 128, behind `b`, as in
/// mma_m64n128k16_ss): the register-A form of the two-accumulator product.
template <int kTransB>
__device__ __forceinline__ void mma_m64n128k16(float (&d_lo)[8][4], float (&d_hi)[8][4],
                                               const u32 (&a)[4], u64 b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" KJIT_WGMMA_ACC_N128
      "}, {%64,%65,%66,%67}, %68, p, 1, 1, %69;\n}\n"
      : KJIT_WGMMA_OUT_N128(d_lo, d_hi)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(kTransB));
}

/// setmaxnreg (sm_90a, warpgroup-aligned): this warpgroup gives registers back to the block's
/// pool down to `kRegisters` per thread (release), or takes them up to `kRegisters` (claim).
template <int kRegisters>
__device__ __forceinline__ void release_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters) : "memory");
}
template <int kRegisters>
__device__ __forceinline__ void claim_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters) : "memory");
}

#endif
}  // namespace wgmma
}  // namespace kjit
