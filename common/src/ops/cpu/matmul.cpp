// matmul.cpp — CPU twin of the linear layer out = inp @ weight^T + bias (torch.nn.Linear layout).
// Defines scalelab::cpu::matmul_forward / matmul_backward and the cast + sgemm bf16-operand variants
// matmul_forward_bf16_reference / matmul_backward_bf16_reference (contract: scalelab/ops/ops.h). Every product
// is one OpenBLAS sgemm (multithreaded by OpenBLAS itself, OpenMP build); only the bias sums are our loops.
// matmul_forward_bf16 / matmul_backward_bf16 are the reference variants in a build without oneDNN; with it
// (SL_WITH_DNNL) they live in matmul_dnnl.cpp, which may also fall back to the reference variants.
// CUDA twin: common/src/ops/cuda/matmul.cu (cuBLASLt / cuBLAS)
// tests: tests/common/ops/test_ops_cpu.cpp, tests/common/ops/test_bf16_compute.cpp
#include <cblas.h>  // defines: cblas_sgemm (OpenBLAS, OpenMP build)

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "scalelab/ops/ops.h"      // defines: the cpu:: declarations implemented here, cast_bf16_to_f32
#include "scalelab/core/tensor.h"  // defines: Tensor (fp32 scratch of the bf16 variants, category Workspace)

namespace scalelab::cpu {

namespace {
constexpr int kChannelBlock = 64;  // output channels per task in the dbias column reduction
}  // namespace

// out (N,OC) = inp (N,C) @ weight(OC,C)^T + bias(OC); bias may be nullptr.
// Row-major: out[i,o] = sum_c inp[i,c] * weight[o,c], i.e. sgemm(NoTrans, Trans). 2*N*C*OC flops.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N, int C, int OC) {
  float beta = 0.0f;  // 0: sgemm overwrites out
  if (bias != nullptr) {
    // Put the bias in every row first, then let sgemm add the product (beta = 1): one pass over out.
#pragma omp parallel for schedule(static) if (N * OC > 32768)
    for (int64_t i = 0; i < N; i++) std::memcpy(out + i * OC, bias, sizeof(float) * OC);
    beta = 1.0f;
  }
  // The Tensor-level op checks N fits in an int (cblas takes int dimensions in the LP64 build).
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(N), OC, C,
              /*alpha=*/1.0f, inp, /*lda=*/C, weight, /*ldb=*/C, beta, out, /*ldc=*/OC);
}

// Gradients of the forward above; each ADDS into its output (ops.h accumulation rule), which for the
// GEMMs is simply beta = 1:
//   dinp (N,C)     += dout (N,OC) @ weight (OC,C)          sgemm(NoTrans, NoTrans)   2*N*C*OC flops
//   dweight (OC,C) += dout^T (OC,N) @ inp (N,C)            sgemm(Trans, NoTrans)     2*N*C*OC flops
//   dbias (OC)     += sum over rows of dout
// Each output may be nullptr (not computed; ops.h): the three are independent computations from the same
// operands, so computing them in one call or in several gives the same bits.
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int64_t N, int C, int OC) {
  const int n = static_cast<int>(N);  // checked by the Tensor-level op
  if (dinp != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, C, OC,
                /*alpha=*/1.0f, dout, /*lda=*/OC, weight, /*ldb=*/C, /*beta=*/1.0f, dinp, /*ldc=*/C);
  }
  if (dweight != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, n,
                /*alpha=*/1.0f, dout, /*lda=*/OC, inp, /*ldb=*/C, /*beta=*/1.0f, dweight, /*ldc=*/C);
  }
  if (dbias != nullptr) {
    // Column sums: each task owns a block of output channels and walks all rows in order (no races,
    // same bits for any thread count; the inner loop over o is contiguous and vectorises).
    const int num_blocks = (OC + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static) if (N * OC > 32768)
    for (int blk = 0; blk < num_blocks; blk++) {
      const int o0 = blk * kChannelBlock, o1 = std::min(OC, o0 + kChannelBlock);
      for (int64_t i = 0; i < N; i++) {
        const float* dy = dout + i * OC;
        for (int o = o0; o < o1; o++) dbias[o] += dy[o];
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// bf16 operands (PrecisionPolicy::bf16_compute), the CPU twin of cuBLAS on the bf16 tensor cores, without
// bf16 hardware: a bf16 value has 8 significant bits, so the product of two has at most 16 and is exact in
// fp32 (24): converting the operands to fp32 and running the fp32 GEMM computes the same products the tensor
// cores (or AVX512_BF16's vdpbf16ps) do, summed in fp32 in another order. It moves 3x the bytes of a native
// bf16 GEMM (the fp32 copies) and runs at fp32 speed. The fp32 copies are scratch for this call only.

namespace {
// An fp32 copy (n,) of n bf16 values, counted by the CPU allocator as Workspace.
Tensor to_f32_scratch(const bf16* src, int64_t n) {
  Tensor t = Tensor::empty({n}, DType::F32, Device::CPU, MemCategory::Workspace);
  cast_bf16_to_f32(t.data<float>(), src, n);
  return t;
}
}  // namespace

// out (N,OC) fp32 = inp (N,C) bf16 @ weight (OC,C)^T bf16 + bias (OC) fp32; bias may be nullptr.
void matmul_forward_bf16_reference(float* out, const bf16* inp, const bf16* weight, const float* bias, int64_t N, int C,
                                   int OC) {
  const Tensor inp_f32 = to_f32_scratch(inp, N * C);                  // (N,C)
  const Tensor weight_f32 = to_f32_scratch(weight, int64_t{OC} * C);  // (OC,C)
  matmul_forward(out, inp_f32.data<float>(), weight_f32.data<float>(), bias, N, C, OC);
}

// dinp (N,C) += dout @ weight; dweight (OC,C) += dout^T @ inp; dbias (OC) += column sums of dout, all fp32,
// from bf16 dout (N,OC), inp (N,C), weight (OC,C). Each output may be nullptr; only the operands the asked
// outputs read are converted (weight for dinp, inp for dweight).
void matmul_backward_bf16_reference(float* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp,
                                    const bf16* weight, int64_t N, int C, int OC) {
  const Tensor dout_f32 = to_f32_scratch(dout, N * OC);                                            // (N,OC)
  const Tensor inp_f32 = dweight != nullptr ? to_f32_scratch(inp, N * C) : Tensor();               // (N,C)
  const Tensor weight_f32 = dinp != nullptr ? to_f32_scratch(weight, int64_t{OC} * C) : Tensor();  // (OC,C)
  matmul_backward(dinp, dweight, dbias, dout_f32.data<float>(), dweight != nullptr ? inp_f32.data<float>() : nullptr,
                  dinp != nullptr ? weight_f32.data<float>() : nullptr, N, C, OC);
}

#ifndef SL_WITH_DNNL
// No oneDNN in this build (CMake SL_WITH_DNNL=OFF, or AUTO without libdnnl-dev): the cast + sgemm path.
void matmul_forward_bf16(float* out, const bf16* inp, const bf16* weight, const float* bias, int64_t N, int C, int OC) {
  matmul_forward_bf16_reference(out, inp, weight, bias, N, C, OC);
}

void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp,
                          const bf16* weight, int64_t N, int C, int OC) {
  matmul_backward_bf16_reference(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
}

std::string bf16_matmul_backend() { return "fp32 sgemm on bf16-rounded operands (no oneDNN in this build)"; }
#endif

}  // namespace scalelab::cpu
