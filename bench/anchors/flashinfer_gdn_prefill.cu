// SPDX-License-Identifier: Apache-2.0
// Benchmark anchor (not part of the build): a C ABI around FlashInfer's SM90 (Hopper, CUTLASS C++)
// Gated DeltaNet chunked prefill, FlashInfer 28406af5 with CUTLASS b46b16d0, for bench_gdn_prefill
// (KJIT_PREFILL_ANCHOR_LIB; bench/gdn_prefill.cpp, PrefillAnchor). Only this file is kjit's:
// scripts/build_flashinfer_anchor.sh unpacks FlashInfer's and CUTLASS's sources from local git
// mirrors into the git-ignored .anchors/fi, renders FlashInfer's own instantiation template
// (csrc/gdn_prefill_sm90_kernel_inst.jinja) for bf16 with and without GVA into two translation
// units, and links them with this one into .anchors/fi/libkjit_fi_prefill.so (nvcc for sm_90a,
// ~4 minutes on two cores; carry the library to the GPU machine). This file holds the C ABI,
// argument checks and a bf16 L2-norm kernel (the normalization pass engines run before the
// kernel); it includes no CUTLASS header.
//
// ---------------------------------------------------------------------------------------------
// Findings about FlashInfer's SM90 GDN prefill kernel (include/flashinfer/flat/..., 28406af5):
//
//  * q, k: [T, H, K] token-major packed (token stride H*K, head stride K, dim stride 1), bf16.
//    v, out: [T, HV, V] packed likewise (out has num_o_heads = max(H, HV) = HV heads).
//    TMA loads/stores: base pointers must be 16-byte aligned (checked below).
//  * cu_seqlens: int64 [N+1], device pointer (flashinfer casts to int64 before calling). Used as
//  is.
//  * alpha: f32 [T, num_sab_heads] with num_sab_heads = max(H, HV) = HV, row stride HV, i.e. one
//    value per (token, value head). It is the multiplicative decay alpha = exp(g) (NOT log decay):
//    the kernel computes log2f(alpha + 1e-10f) internally and cumsums it per 64-token chunk.
//    -> our ABI's alpha = exp(g) is passed through unchanged. No conversion.
//  * beta: f32 [T, HV], row stride HV, per (token, value head). Passed through unchanged.
//  * scale: applied inside the kernel (o = scale * q @ S). Passed through (caller gives 1/sqrt(K)).
//  * q/k are NOT L2-normalized by the SM90 kernel (flashinfer's use_qk_l2norm_in_kernel flag is
//    ignored on the SM90 path) -> caller must pass normalized q/k (our ABI says they are).
//  * State layout: the kernel views input/output state as a CuTe LayoutLeft tensor of shape
//    (K, V, num_sab_heads, num_seqs), i.e. K is contiguous: element (n, h, v, k) lives at
//    ((n*HV + h)*V + v)*K + k  ==  row-major [N, HV, V, K] ("k-last"). flashinfer's python doc
//    also says "The final state layout is [N, H, V, K]" and its test transposes the last two dims
//    to compare with a [.., K, V] reference. This MATCHES our ABI layout -> no transpose needed.
//    state_in is read once per (seq, head) CTA at the start and state_out written at the end.
//    HeadSizeQK = HeadSizeV = 128 are compile-time constants in the state indexing (TileShape
//    64x64x128), so only head_dim == 128 is supported (checked below).
//  * GVA head mapping (HV = r*H): value head hv uses q/k head hv / r (repeat_interleave style:
//    consecutive value heads share a q/k head). Grid = N * HV CTAs, one per (seq, value head).
//  * Workspace: sm_count * sizeof(TmaDescriptor)=128 bytes, indexed by %smid (tail-tile TMA
//    descriptors for O). We require sm_count*128 <= 1 MiB (the ABI's workspace size).
//  * Host side per call: builds TMA descriptors (cuTensorMapEncodeTiled via
//    cudaGetDriverEntryPoint, so no -lcuda link), and on the first call per process and
//    instantiation sets cudaFuncAttributeMaxDynamicSharedMemorySize (a process-wide static flag in
//    flat::device::Universal, so only the first CUDA context/device used gets the attribute).
//    Launch is a cluster launch (cudaLaunchKernelEx) on `stream`. No memsets, no extra kernels.
//  * The launcher reports failure by throwing std::runtime_error; caught here and turned into an
//    error code + message.
// ---------------------------------------------------------------------------------------------

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

// Forward declaration, as in flashinfer/flat/prefill/prefill_kernel.hpp (avoids CUTLASS here).
namespace cutlass::arch {
struct Sm90;
}  // namespace cutlass::arch

namespace flat {
// Declaration identical to include/flashinfer/flat/prefill/prefill_kernel_delta_rule_sm90.cuh
// (definition + explicit instantiations live in build/inst_gva{0,1}.cu, rendered from
// csrc/gdn_prefill_sm90_kernel_inst.jinja). Mirrors
// csrc/flat_prefill_kernel_delta_rule_sm90_extern.inc.
template <bool IsGVA, bool NeedsBeta, bool NeedsAlpha, bool InitStateFromInput,
          bool EnableCheckpointing, typename ArchTag, typename TO, typename TQKV, typename TState>
void launch_delta_rule_prefill_kernel_gbai(
    cudaStream_t stream, TO* output, TState* output_state, TQKV const* q, TQKV const* k,
    TQKV const* v, TState const* input_state, float const* alpha, float const* beta,
    int64_t const* cu_seqlens, uint8_t* workspace_buffer, int32_t num_seqs, int32_t num_q_heads,
    int32_t num_k_heads, int32_t num_v_heads, int32_t num_o_heads, int32_t head_size,
    int64_t total_seqlen, float scale, int32_t sm_count, float* state_checkpoints,
    int64_t const* checkpoint_cu_starts, int32_t checkpoint_every_n_tokens);

extern template void launch_delta_rule_prefill_kernel_gbai<
    false, true, true, true, false, cutlass::arch::Sm90, nv_bfloat16, nv_bfloat16, float>(
    cudaStream_t, nv_bfloat16*, float*, nv_bfloat16 const*, nv_bfloat16 const*, nv_bfloat16 const*,
    float const*, float const*, float const*, int64_t const*, uint8_t*, int32_t, int32_t, int32_t,
    int32_t, int32_t, int32_t, int64_t, float, int32_t, float*, int64_t const*, int32_t);

extern template void launch_delta_rule_prefill_kernel_gbai<
    true, true, true, true, false, cutlass::arch::Sm90, nv_bfloat16, nv_bfloat16, float>(
    cudaStream_t, nv_bfloat16*, float*, nv_bfloat16 const*, nv_bfloat16 const*, nv_bfloat16 const*,
    float const*, float const*, float const*, int64_t const*, uint8_t*, int32_t, int32_t, int32_t,
    int32_t, int32_t, int32_t, int64_t, float, int32_t, float*, int64_t const*, int32_t);
}  // namespace flat

namespace {

constexpr long long kWorkspaceBytes = 1ll << 20;  // the ABI's workspace is 1 MiB
constexpr int kTmaDescBytes = 128;                // sizeof(cute::TmaDescriptor)

int set_error(char* error, int error_len, int code, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));

int set_error(char* error, int error_len, int code, const char* fmt, ...) {
  if (error != nullptr && error_len > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error, (size_t)error_len, fmt, ap);
    va_end(ap);
    error[error_len - 1] = '\0';
  }
  return code;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// ---------------------------------------------------------------------------------------------
// L2 norm: one warp per row, out = x / sqrt(sum(x^2) + 1e-6), f32 math, bf16 in/out.
// eps = 1e-6 is added INSIDE the sqrt. Compiled without -use_fast_math (IEEE sqrt and division).
// ---------------------------------------------------------------------------------------------
constexpr int kL2WarpsPerBlock = 8;
constexpr float kL2Eps = 1e-6f;

__device__ __forceinline__ float warp_sum(float s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

// dim == 128: each lane owns 4 consecutive bf16 (one 8-byte load/store).
__global__ void __launch_bounds__(kL2WarpsPerBlock * 32)
    l2norm_d128_kernel(const __nv_bfloat16* __restrict__ in, __nv_bfloat16* __restrict__ out,
                       long long rows) {
  const int lane = threadIdx.x & 31;
  const long long warps_total = (long long)gridDim.x * kL2WarpsPerBlock;
  for (long long row = (long long)blockIdx.x * kL2WarpsPerBlock + (threadIdx.x >> 5); row < rows;
       row += warps_total) {
    const uint2 raw = reinterpret_cast<const uint2*>(in + row * 128)[lane];
    __nv_bfloat162 a = *reinterpret_cast<const __nv_bfloat162*>(&raw.x);
    __nv_bfloat162 b = *reinterpret_cast<const __nv_bfloat162*>(&raw.y);
    float x0 = __low2float(a), x1 = __high2float(a), x2 = __low2float(b), x3 = __high2float(b);
    float ss = warp_sum(x0 * x0 + x1 * x1 + x2 * x2 + x3 * x3);
    float n = sqrtf(ss + kL2Eps);
    __nv_bfloat162 ra = __floats2bfloat162_rn(x0 / n, x1 / n);
    __nv_bfloat162 rb = __floats2bfloat162_rn(x2 / n, x3 / n);
    uint2 w;
    w.x = *reinterpret_cast<const uint32_t*>(&ra);
    w.y = *reinterpret_cast<const uint32_t*>(&rb);
    reinterpret_cast<uint2*>(out + row * 128)[lane] = w;
  }
}

// FlashInfer's launcher for HV = H (kGva false) or HV a multiple of H; bf16, beta and alpha given,
// the initial state read, no checkpoints.
template <bool kGva>
void launch(cudaStream_t stream, void* out, float* state_out, const void* q, const void* k,
            const void* v, const float* state_in, const float* alpha, const float* beta,
            const long long* cu_seqlens, void* workspace, int num_seqs, int num_heads,
            int num_value_heads, int head_dim, long long total_tokens, float scale, int sm_count) {
  flat::launch_delta_rule_prefill_kernel_gbai<kGva, true, true, true, false, cutlass::arch::Sm90,
                                              nv_bfloat16, nv_bfloat16, float>(
      stream, static_cast<nv_bfloat16*>(out), state_out, static_cast<nv_bfloat16 const*>(q),
      static_cast<nv_bfloat16 const*>(k), static_cast<nv_bfloat16 const*>(v), state_in, alpha, beta,
      reinterpret_cast<int64_t const*>(cu_seqlens), static_cast<uint8_t*>(workspace), num_seqs,
      num_heads, num_heads, num_value_heads, num_value_heads, head_dim,
      static_cast<int64_t>(total_tokens), scale, sm_count, nullptr, nullptr, 0);
}
}  // namespace

extern "C" {

__attribute__((visibility("default"))) const char* kjit_anchor_name() {
  return "flashinfer-sm90 28406af5";
}

__attribute__((visibility("default"))) int kjit_anchor_gdn_prefill(
    void* stream, void* out, float* state_out, const void* q, const void* k, const void* v,
    const float* state_in, const float* alpha, const float* beta, const long long* cu_seqlens,
    void* workspace, int num_seqs, int num_heads, int num_value_heads, int head_dim,
    long long total_tokens, float scale, int sm_count, char* error, int error_len) {
  if (error != nullptr && error_len > 0) error[0] = '\0';

  // ---- argument validation -------------------------------------------------------------------
  if (head_dim != 128)
    return set_error(error, error_len, 1,
                     "flashinfer sm90 gdn prefill: head_dim=%d unsupported (only 128; state "
                     "layout is compiled for 128x128)",
                     head_dim);
  if (num_seqs <= 0 || num_heads <= 0 || num_value_heads <= 0)
    return set_error(error, error_len, 2,
                     "invalid sizes: num_seqs=%d num_heads=%d num_value_heads=%d", num_seqs,
                     num_heads, num_value_heads);
  if (num_value_heads < num_heads || num_value_heads % num_heads != 0)
    return set_error(error, error_len, 3,
                     "unsupported head ratio: HV=%d must be an integer multiple (>=1) of H=%d "
                     "(q and k share H heads; the kernel's GQA mode would need k heads == v heads)",
                     num_value_heads, num_heads);
  if (total_tokens <= 0 || total_tokens > (long long)INT32_MAX)
    return set_error(error, error_len, 4, "invalid total_tokens=%lld", total_tokens);
  if ((long long)num_seqs * num_value_heads > (long long)INT32_MAX)
    return set_error(error, error_len, 4, "num_seqs*num_value_heads too large for grid");
  if (sm_count <= 0 || (long long)sm_count * kTmaDescBytes > kWorkspaceBytes)
    return set_error(error, error_len, 5,
                     "invalid sm_count=%d (workspace needs sm_count*128 bytes <= 1 MiB)", sm_count);
  if (!out || !state_out || !q || !k || !v || !state_in || !alpha || !beta || !cu_seqlens ||
      !workspace)
    return set_error(error, error_len, 6,
                     "null pointer argument (out, state_out, q, k, v, state_in, alpha, beta, "
                     "cu_seqlens, workspace are all required)");
  if (!aligned16(out) || !aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(state_out) ||
      !aligned16(state_in))
    return set_error(error, error_len, 7,
                     "q/k/v/out/state pointers must be 16-byte aligned (TMA / vector access)");
  if (!(scale > 0.f)) return set_error(error, error_len, 8, "invalid scale=%g", (double)scale);

  // Do not blame the kernel for an error raised by earlier work on this thread.
  cudaError_t prior = cudaGetLastError();
  if (prior != cudaSuccess)
    return set_error(error, error_len, 9, "pending CUDA error before call: %s (%s)",
                     cudaGetErrorName(prior), cudaGetErrorString(prior));

  // ---- call FlashInfer -----------------------------------------------------------------------
  // Mapping (FlashInfer param <- ABI arg):
  //   stream <- (cudaStream_t)stream        output <- out (bf16 [T,HV,V])
  //   output_state <- state_out ([N,HV,V,K]) q,k <- q,k (bf16 [T,H,K])   v <- v (bf16 [T,HV,V])
  //   input_state <- state_in ([N,HV,V,K])   alpha <- alpha (exp(g), [T,HV]) beta <- beta ([T,HV])
  //   cu_seqlens <- (int64_t const*)cu_seqlens  workspace_buffer <- (uint8_t*)workspace
  //   num_seqs <- num_seqs  num_q_heads <- H  num_k_heads <- H  num_v_heads <- HV
  //   num_o_heads <- HV (= max(H, HV), as flashinfer's gdn_prefill requires)
  //   head_size <- head_dim (128)  total_seqlen <- total_tokens  scale <- scale
  //   sm_count <- sm_count  state_checkpoints <- nullptr  checkpoint_cu_starts <- nullptr
  //   checkpoint_every_n_tokens <- 0 (checkpointing disabled, matches EnableCheckpointing=false)
  static_assert(sizeof(long long) == sizeof(int64_t), "int64 cu_seqlens");
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  const bool is_gva = num_value_heads > num_heads;
  try {
    (is_gva ? launch<true> : launch<false>)(s, out, state_out, q, k, v, state_in, alpha, beta,
                                            cu_seqlens, workspace, num_seqs, num_heads,
                                            num_value_heads, head_dim, total_tokens, scale,
                                            sm_count);
  } catch (const std::exception& e) {
    // "run failed" = launch error (CUTLASS consumed the cudaError with cudaGetLastError).
    cudaError_t last = cudaGetLastError();
    return set_error(error, error_len, 10,
                     "flashinfer launch_delta_rule_prefill_kernel_gbai<gva=%d> failed: %s%s%s",
                     (int)is_gva, e.what(), last != cudaSuccess ? "; cuda: " : "",
                     last != cudaSuccess ? cudaGetErrorString(last) : "");
  } catch (...) {
    return set_error(error, error_len, 11, "flashinfer launcher threw a non-std exception");
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return set_error(error, error_len, 12,
                     "CUDA error after flashinfer gdn prefill launch: %s (%s)",
                     cudaGetErrorName(err), cudaGetErrorString(err));
  return 0;
}

__attribute__((visibility("default"))) int kjit_anchor_l2norm(void* stream, const void* in,
                                                              void* out, long long rows, int dim) {
  // (The anchor's kernel takes head_dim 128 only, so its norm pass does too.)
  if (rows < 0 || dim != 128) return 1;
  if (rows == 0) return 0;
  if (in == nullptr || out == nullptr) return 2;
  cudaError_t prior = cudaGetLastError();
  if (prior != cudaSuccess) return 3;
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  long long blocks = (rows + kL2WarpsPerBlock - 1) / kL2WarpsPerBlock;
  if (blocks > 1048576) blocks = 1048576;  // grid-stride loop covers the rest
  const auto* x = static_cast<const __nv_bfloat16*>(in);
  auto* y = static_cast<__nv_bfloat16*>(out);
  if ((reinterpret_cast<uintptr_t>(in) & 7u) != 0 || (reinterpret_cast<uintptr_t>(out) & 7u) != 0) {
    return 5;  // rows of 128 bf16 are loaded 8 bytes a lane
  }
  l2norm_d128_kernel<<<(unsigned)blocks, kL2WarpsPerBlock * 32, 0, s>>>(x, y, rows);
  cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? 0 : 4;
}

}  // extern "C"
