// matmul_dnnl.cpp — the CPU bf16 matmuls (PrecisionPolicy::bf16_compute) on oneDNN's native bf16 GEMM:
// scalelab::cpu::matmul_forward_bf16 / matmul_backward_bf16 / bf16_matmul_backend (contract: scalelab/ops/ops.h).
// Compiled only with oneDNN (CMake SL_WITH_DNNL, compile definition SL_WITH_DNNL=1; Debian libdnnl-dev, 2.6).
// On a CPU with AVX512_BF16 (vdpbf16ps: bf16 pairs multiplied, summed into fp32) oneDNN reads the bf16
// operands directly: no fp32 copies (the cast + sgemm path of matmul.cpp makes three), and vdpbf16ps does
// two products per fp32 lane where an fp32 FMA does one (measured here: 1.8-2.4x that path, lab 01 README).
// Without AVX512_BF16 oneDNN would emulate bf16 itself; there the cast + sgemm path is used instead.
// The same path PyTorch's CPU autocast takes (aten mkldnn_matmul -> oneDNN matmul).
// Reference (oracle) and non-oneDNN path: matmul.cpp   CUDA twin: common/src/ops/cuda/matmul.cu
// tests: tests/common/ops/test_bf16_compute.cpp
#include <oneapi/dnnl/dnnl.hpp>  // defines: dnnl::engine, stream, matmul, memory, post_ops, get_effective_cpu_isa

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>

#include "scalelab/core/bf16.h"    // defines: bf16, bf16_to_float
#include "scalelab/core/error.h"   // defines: SL_FAIL
#include "scalelab/ops/ops.h"      // defines: the cpu:: declarations implemented here, the _reference fallbacks
#include "scalelab/core/tensor.h"  // defines: Tensor (oneDNN's scratchpad, category Workspace)

namespace scalelab::cpu {

namespace {

using dnnl::memory;
using dt = dnnl::memory::data_type;

// The three GEMMs of a linear layer, each its own primitive (oneDNN compiles a kernel per shape and kind).
enum class GemmKind { Forward, ForwardBias, BackwardData, BackwardWeight };

struct Gemm {
  dnnl::matmul::primitive_desc pd;  // chosen implementation and memory layouts
  dnnl::matmul prim;                // its generated code
};

// oneDNN state shared by every call: one CPU engine, one in-order stream, and the primitives by shape.
// Creating a matmul primitive (choosing and JIT-compiling a kernel) costs far more than one of the small
// GEMMs of the demo model, so each (kind, N, C, OC) is created once and reused; a training run
// sees a handful of shapes (qkv, attn proj, fc, mlp proj, LM head, times forward/backward).
struct DnnlState {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  // The CPU has AVX512_BF16 (or AMX) and oneDNN may use it. cpu_isa values are bit sets, each ISA a
  // superset of the bits of the ones it extends (dnnl_types.h): AMX includes all of avx512_core_bf16's,
  // avx2_vnni does not.
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  const bool native_bf16 = (static_cast<unsigned>(isa) & static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16)) ==
                           static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  std::mutex mutex;  // guards `cache` (ops are called from one thread today; cheap insurance)
  // (kind, N, C, OC) -> the primitive's descriptor (its memory layouts, scratchpad size) and the primitive.
  std::map<std::tuple<GemmKind, int64_t, int, int>, Gemm> cache;
};

const char* isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx512_mic: return "avx512_mic";
    case dnnl::cpu_isa::avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    default: return "no JIT ISA";
  }
}

// Created on first use (thread-safe: a function-local static).
DnnlState& state() {
  static DnnlState s;
  return s;
}

// Row-major (rows, cols) view with a row stride: element (r, c) at ptr[r * ld + c], or with
// transposed = true, the (rows, cols) matrix whose element (r, c) is at ptr[c * ld + r] (the transpose of
// a row-major (cols, rows) array). oneDNN reads either through the strides: no copy of our data.
memory::desc view(int64_t rows, int64_t cols, dt type, int64_t ld, bool transposed = false) {
  return transposed ? memory::desc({rows, cols}, type, {1, ld}) : memory::desc({rows, cols}, type, {ld, 1});
}

// The primitive for one (kind, N, C, OC), created on first use. Shapes (row-major, PyTorch order):
//   Forward(Bias)   dst (N,OC) f32  = src inp (N,C) bf16 @ wei weight^T (C,OC) bf16 [+ bias (1,OC) f32]
//   BackwardData    dst dinp (N,C) f32  += src dout (N,OC) bf16 @ wei weight (OC,C) bf16
//   BackwardWeight  dst dweight (OC,C) f32 += src dout^T (OC,N) bf16 @ wei inp (N,C) bf16
// `+=` is oneDNN's sum post-op: dst = src @ wei + 1.0 * dst (oneDNN developer guide, "Primitive Attributes:
// Post-ops"; matmul supports it since v1.x). The bf16 kernels accumulate in fp32 and dst is fp32.
// The scratchpad is user-managed so that our allocator counts it (run()).
const Gemm& gemm(GemmKind kind, int64_t N, int C, int OC) {
  DnnlState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  const auto key = std::make_tuple(kind, N, C, OC);
  if (auto it = s.cache.find(key); it != s.cache.end()) return it->second;

  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  memory::desc src, wei, bias, dst;
  switch (kind) {
    case GemmKind::Forward:
    case GemmKind::ForwardBias:
      src = view(N, C, dt::bf16, C);
      wei = view(C, OC, dt::bf16, C, /*transposed=*/true);  // weight (OC,C) row-major read as (C,OC)
      dst = view(N, OC, dt::f32, OC);
      if (kind == GemmKind::ForwardBias) bias = view(1, OC, dt::f32, OC);
      break;
    case GemmKind::BackwardData:
      src = view(N, OC, dt::bf16, OC);
      wei = view(OC, C, dt::bf16, C);
      dst = view(N, C, dt::f32, C);
      break;
    case GemmKind::BackwardWeight:
      src = view(OC, N, dt::bf16, OC, /*transposed=*/true);  // dout (N,OC) row-major read as (OC,N)
      wei = view(N, C, dt::bf16, C);
      dst = view(OC, C, dt::f32, C);
      break;
  }
  if (kind == GemmKind::BackwardData || kind == GemmKind::BackwardWeight) {
    dnnl::post_ops accumulate;
    accumulate.append_sum(/*scale=*/1.0f);
    attr.set_post_ops(accumulate);
  }
  const dnnl::matmul::desc desc = kind == GemmKind::ForwardBias ? dnnl::matmul::desc(src, wei, bias, dst)
                                                                : dnnl::matmul::desc(src, wei, dst);
  try {
    dnnl::matmul::primitive_desc pd(desc, attr, s.engine);
    dnnl::matmul prim(pd);
    return s.cache.emplace(key, Gemm{pd, prim}).first->second;
  } catch (const dnnl::error& e) {  // e.g. "could not create a primitive descriptor": no kernel fits
    SL_FAIL("rebuild with -DSL_WITH_DNNL=OFF to use the cast + sgemm path, and report the shape",
            "oneDNN %s: bf16 matmul kind %d, N=%lld C=%d OC=%d: %s (status %d)", bf16_matmul_backend().c_str(),
            static_cast<int>(kind), static_cast<long long>(N), C, OC, e.what(), static_cast<int>(e.status));
  }
}

// Runs one cached matmul on raw pointers (oneDNN does not need them aligned). The scratchpad oneDNN asks
// for (packed operand blocks, per-thread accumulators; 0 bytes for many shapes) is a Workspace tensor of
// this call, counted like the reference path's fp32 copies.
void run(GemmKind kind, int64_t N, int C, int OC, const bf16* src, const bf16* wei, const float* bias, float* dst) {
  DnnlState& s = state();
  const Gemm& g = gemm(kind, N, C, OC);
  const dnnl::matmul::primitive_desc& pd = g.pd;
  // oneDNN takes non-const handles; it only reads src, weights and bias.
  std::unordered_map<int, memory> args = {
      {DNNL_ARG_SRC, memory(pd.src_desc(), s.engine, const_cast<bf16*>(src))},
      {DNNL_ARG_WEIGHTS, memory(pd.weights_desc(), s.engine, const_cast<bf16*>(wei))},
      {DNNL_ARG_DST, memory(pd.dst_desc(), s.engine, dst)}};
  if (kind == GemmKind::ForwardBias)
    args.emplace(DNNL_ARG_BIAS, memory(pd.bias_desc(), s.engine, const_cast<float*>(bias)));
  const memory::desc scratch_md = pd.scratchpad_desc();
  Tensor scratch;  // (bytes,) as fp32 words, Workspace; freed on return
  if (scratch_md.get_size() > 0) {
    const int64_t words = static_cast<int64_t>((scratch_md.get_size() + sizeof(float) - 1) / sizeof(float));
    scratch = Tensor::empty({words}, DType::F32, Device::CPU, MemCategory::Workspace);
    args.emplace(DNNL_ARG_SCRATCHPAD, memory(scratch_md, s.engine, scratch.data<float>()));
  }
  g.prim.execute(s.stream, args);
  s.stream.wait();  // the CPU stream runs in order on this thread's OpenMP team; wait() makes that explicit
}

}  // namespace

// out (N,OC) fp32 = inp (N,C) bf16 @ weight (OC,C)^T bf16 + bias (OC) fp32; bias may be nullptr.
// Threads: the Debian build of oneDNN uses OpenMP, and reads omp_get_max_threads() at each execution, so
// it follows set_num_threads (threads.h) like our own loops.
void matmul_forward_bf16(float* out, const bf16* inp, const bf16* weight, const float* bias, int64_t N, int C, int OC) {
  if (!state().native_bf16) return matmul_forward_bf16_reference(out, inp, weight, bias, N, C, OC);
  run(bias != nullptr ? GemmKind::ForwardBias : GemmKind::Forward, N, C, OC, inp, weight, bias, out);
}

// dinp (N,C) += dout @ weight; dweight (OC,C) += dout^T @ inp; dbias (OC) += column sums of dout, all fp32,
// from bf16 dout (N,OC), inp (N,C), weight (OC,C). Each output may be nullptr (not computed; ops.h): one
// call or several give the same bits.
void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp,
                          const bf16* weight, int64_t N, int C, int OC) {
  if (!state().native_bf16) return matmul_backward_bf16_reference(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
  if (dinp != nullptr) run(GemmKind::BackwardData, N, C, OC, dout, weight, nullptr, dinp);
  if (dweight != nullptr) run(GemmKind::BackwardWeight, N, C, OC, dout, inp, nullptr, dweight);
  if (dbias != nullptr) {
    // Column sums of the bf16 dout in fp32, in the reference path's order (matmul.cpp): each task owns a
    // block of output channels and walks the rows in order, so the bits equal the reference's.
    constexpr int kChannelBlock = 64;  // output channels per task
    const int num_blocks = (OC + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static) if (N * OC > 32768)
    for (int blk = 0; blk < num_blocks; blk++) {
      const int o0 = blk * kChannelBlock, o1 = std::min(OC, o0 + kChannelBlock);
      for (int64_t i = 0; i < N; i++) {
        const bf16* dy = dout + i * OC;
        for (int o = o0; o < o1; o++) dbias[o] += bf16_to_float(dy[o]);
      }
    }
  }
}

std::string bf16_matmul_backend() {
  const DnnlState& s = state();
  const dnnl_version_t* v = dnnl_version();
  const std::string version = std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
                              std::to_string(v->patch);
  if (s.native_bf16) return "oneDNN " + version + " (" + isa_name(s.isa) + ")";
  return "fp32 sgemm on bf16-rounded operands (oneDNN " + version + " found no AVX512_BF16: " + isa_name(s.isa) + ")";
}

}  // namespace scalelab::cpu
