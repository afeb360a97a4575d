// matmul.cu — CUDA twin of the linear layer out = inp @ weight^T + bias (torch.nn.Linear layout), in fp32
// and with bf16 operands (the mixed precision policy). Defines scalelab::cuda::matmul_forward /
// matmul_backward / matmul_forward_bf16 / matmul_backward_bf16 (contract: scalelab/ops/ops.h; declared in
// scalelab/ops/twins.h). CPU twin: common/src/ops/cpu/matmul.cpp   tests: tests/common/ops/test_ops_cuda.cpp
//
// Row-major to cuBLAS's column-major: a row-major (R, K) matrix with leading dimension K is, read
// column-major, its transpose (K, R) with the same leading dimension. So with Xc = inp read column-major
// (C, N), Wc = weight (C, OC), Yc = out (OC, N) and Gc = dout (OC, N):
//   forward   Yc (OC,N) = Wc^T Xc            m=OC n=N k=C    A=weight op T   B=inp op N
//   dinp      dXc (C,N) += Wc Gc             m=C  n=N k=OC   A=weight op N   B=dout op N   beta=1
//   dweight   dWc (C,OC) += Xc Gc^T          m=C  n=OC k=N   A=inp op N      B=dout op T   beta=1
// The bias is a vector of m = OC entries added to every column of Yc (= every row of out): cuBLASLt's
// CUBLASLT_EPILOGUE_BIAS adds it inside the GEMM, saving a pass over out. That pays most with bf16 on
// the tensor cores: with K = C = 768 a GEMM does 2*768 flops per fp32 output it writes, and a separate
// bias pass (read + write, 8 bytes per output) costs about as long as the GEMM itself on an H100/H200
// (989 TFLOP/s against 3.3-4.8 TB/s). dbias is NOT fused (CUBLASLT_EPILOGUE_BGRADB): the epilogue
// overwrites its output while ops.h asks for +=, so it would need a scratch vector and an add; a
// column-sum kernel reads dout once (N*OC, small next to the 2*N*C*OC of the GEMMs) and is deterministic.
// Fallback: cuBLASLt may have no algorithm for a pointer's alignment (weights and biases are views at
// arbitrary offsets of a unit's buffer; a bias must be 16-byte aligned for the epilogue); then
// cublasGemmEx, which takes any alignment, runs after a kernel has put the bias in every row (beta = 1),
// as the CPU twin does.
// Precision: CUBLAS_COMPUTE_32F everywhere, i.e. fp32 accumulation and, for fp32 operands, no TF32.
#include "context.cuh"           // defines: context, scratch, SL_CUBLAS_CHECK, SL_CUDA_CHECK_LAST
#include "scalelab/ops/twins.h"  // defines: the declarations implemented here

namespace scalelab::cuda {

namespace {
constexpr int kThreads = 256;      // threads per block in the kernels of this file
constexpr int kRowsPerChunk = 64;  // dbias column sums: rows per partial sum

// ---------------------------------------------------------------------------------------------
// Kernels

// out (N,OC): every row = bias (OC). Before a GEMM with beta = 1 (the fallback path).
__global__ void matmul_bias_broadcast_kernel(float* out, const float* bias, int64_t N, int OC) {
  const int64_t n = N * OC;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[idx] = bias[idx % OC];
  }
}

__device__ __forceinline__ float load_f32(const float* p) { return *p; }
__device__ __forceinline__ float load_f32(const uint16_t* p) { return bf16_bits_to_float(*p); }

// dbias pass 1: partials (num_chunks, OC), partials[chunk][o] = sum of dout[i][o] over the chunk's rows.
// Block (x: 256 output channels, y: one chunk); threads read consecutive channels (coalesced).
// T is float (fp32 dout) or uint16_t (bf16 bits).
template <typename T>
__global__ void matmul_backward_bias_partials_kernel(float* partials, const T* dout, int64_t N, int OC,
                                                     int rows_per_chunk) {
  const int o = blockIdx.x * blockDim.x + threadIdx.x;
  const int chunk = blockIdx.y;
  if (o >= OC) return;
  const int64_t i0 = static_cast<int64_t>(chunk) * rows_per_chunk;
  const int64_t i1 = min(N, i0 + rows_per_chunk);
  float acc = 0.0f;
  for (int64_t i = i0; i < i1; i++) acc += load_f32(dout + i * OC + o);
  partials[static_cast<int64_t>(chunk) * OC + o] = acc;
}

// dbias pass 2: dbias[o] += sum of the partials in chunk order (fixed order: same bits every run).
__global__ void matmul_backward_bias_finalize_kernel(float* dbias, const float* partials, int num_chunks, int OC) {
  const int o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= OC) return;
  float acc = 0.0f;
  for (int k = 0; k < num_chunks; k++) acc += partials[static_cast<int64_t>(k) * OC + o];
  dbias[o] += acc;
}

// ---------------------------------------------------------------------------------------------
// cuBLAS / cuBLASLt calls (column-major terms, see the file head)

// Largest power of two <= 256 dividing the address: the alignment cuBLASLt may rely on.
uint32_t alignment_bytes(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && address % a != 0) a /= 2;
  return a;
}

// Owners of cuBLASLt descriptors (destroyed on every path, also when a check throws).
struct LtDesc {
  cublasLtMatmulDesc_t d = nullptr;
  ~LtDesc() {
    if (d != nullptr) (void)cublasLtMatmulDescDestroy(d);
  }
};
struct LtLayout {
  cublasLtMatrixLayout_t l = nullptr;
  ~LtLayout() {
    if (l != nullptr) (void)cublasLtMatrixLayoutDestroy(l);
  }
};
struct LtPreference {
  cublasLtMatmulPreference_t p = nullptr;
  ~LtPreference() {
    if (p != nullptr) (void)cublasLtMatmulPreferenceDestroy(p);
  }
};

// D (m,n) = op(A) op(B) [+ bias (m) added to every column]; A, B of ab_type, D fp32 with leading
// dimension m; fp32 accumulation. Returns false, having computed nothing, when cuBLASLt has no algorithm
// (e.g. for these pointers' alignments); the caller then falls back to gemm_ex.
bool lt_matmul(cudaDataType_t ab_type, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
               const void* A, int lda, const void* B, int ldb, float* D, const float* bias) {
  // cuBLASLt's bias epilogue has required a 16-byte aligned bias in some versions (llm.c checks for it);
  // a bias view at an odd offset takes the fallback instead. GPT-2's biases are aligned when C % 4 == 0.
  if (bias != nullptr && alignment_bytes(bias) < 16) return false;
  DeviceContext& ctx = context();
  LtDesc desc;
  SL_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  SL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa)));
  SL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb)));
  const cublasLtEpilogue_t epilogue = bias != nullptr ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  SL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  if (bias != nullptr) {
    // Set before the heuristic query: it reads the pointer's alignment. Bias type = D's type (fp32).
    SL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  // Layouts describe the matrices as stored: op N stores (rows, cols) of op(X); op T stores its transpose.
  LtLayout a, b, d;
  SL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a.l, ab_type, transa == CUBLAS_OP_N ? m : k,
                                             transa == CUBLAS_OP_N ? k : m, lda));
  SL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b.l, ab_type, transb == CUBLAS_OP_N ? k : n,
                                             transb == CUBLAS_OP_N ? n : k, ldb));
  SL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.l, CUDA_R_32F, m, n, m));
  LtPreference pref;
  SL_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.p));
  const uint64_t max_workspace = ctx.workspace_bytes;
  SL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace,
                                                       sizeof(max_workspace)));
  // The default assumes 256-byte aligned matrices; ours are views (e.g. one weight inside a unit's
  // buffer), so state the real alignment and let the heuristic pick an algorithm that allows it.
  const uint32_t align_a = alignment_bytes(A), align_b = alignment_bytes(B), align_d = alignment_bytes(D);
  SL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                       sizeof(align_a)));
  SL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                                       sizeof(align_b)));
  SL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d,
                                                       sizeof(align_d)));
  SL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d,
                                                       sizeof(align_d)));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int returned = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(ctx.cublaslt, desc.d, a.l, b.l, d.l, d.l, pref.p,
                                                               /*requestedAlgoCount=*/1, &heuristic, &returned);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || (status == CUBLAS_STATUS_SUCCESS && returned == 0)) return false;
  SL_CUBLAS_CHECK(status);
  const float alpha = 1.0f, beta = 0.0f;  // D is overwritten (C = D with beta = 0 is never read)
  const cublasStatus_t run = cublasLtMatmul(ctx.cublaslt, desc.d, &alpha, A, a.l, B, b.l, &beta, D, d.l, D, d.l,
                                            &heuristic.algo, ctx.workspace, ctx.workspace_bytes, kDefaultStream);
  if (run == CUBLAS_STATUS_NOT_SUPPORTED) return false;  // refused before launching anything: fall back
  SL_CUBLAS_CHECK(run);
  return true;
}

// C (m,n) = alpha op(A) op(B) + beta C, A and B of ab_type, C fp32, fp32 accumulation. Any alignment.
void gemm_ex(cudaDataType_t ab_type, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
             float alpha, const void* A, int lda, const void* B, int ldb, float beta, float* C, int ldc) {
  SL_CUBLAS_CHECK(cublasGemmEx(context().cublas, transa, transb, m, n, k, &alpha, A, ab_type, lda, B, ab_type, ldb,
                               &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// ---------------------------------------------------------------------------------------------
// The ops, for fp32 (CUDA_R_32F) or bf16 (CUDA_R_16BF) operands; outputs and gradients are fp32.

// out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC); bias may be nullptr.
void matmul_forward_impl(cudaDataType_t type, float* out, const void* inp, const void* weight, const float* bias,
                         int64_t N, int C, int OC) {
  if (N == 0) return;
  SL_CHECK(N <= INT32_MAX, "matmul: N=%lld rows exceed cuBLAS's int dimensions", static_cast<long long>(N));
  const int n = static_cast<int>(N);
  if (lt_matmul(type, CUBLAS_OP_T, CUBLAS_OP_N, OC, n, C, weight, C, inp, C, out, bias)) return;
  float beta = 0.0f;
  if (bias != nullptr) {
    matmul_bias_broadcast_kernel<<<grid_stride_blocks(N * OC, kThreads), kThreads, 0, kDefaultStream>>>(out, bias, N,
                                                                                                        OC);
    SL_CUDA_CHECK_LAST();
    beta = 1.0f;  // the GEMM adds its product to the bias rows
  }
  gemm_ex(type, CUBLAS_OP_T, CUBLAS_OP_N, OC, n, C, 1.0f, weight, C, inp, C, beta, out, OC);
}

// dinp (N,C) += dout @ weight; dweight (OC,C) += dout^T @ inp; dbias (OC) += column sums of dout.
// Each output may be nullptr (not computed; ops.h): separate launches either way, so one call or several
// run the same kernels on the same operands.
void matmul_backward_impl(cudaDataType_t type, float* dinp, float* dweight, float* dbias, const void* dout,
                          const void* inp, const void* weight, int64_t N, int C, int OC) {
  if (N == 0) return;
  SL_CHECK(N <= INT32_MAX, "matmul: N=%lld rows exceed cuBLAS's int dimensions", static_cast<long long>(N));
  const int n = static_cast<int>(N);
  if (dinp != nullptr) gemm_ex(type, CUBLAS_OP_N, CUBLAS_OP_N, C, n, OC, 1.0f, weight, C, dout, OC, 1.0f, dinp, C);
  if (dweight != nullptr) gemm_ex(type, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, n, 1.0f, inp, C, dout, OC, 1.0f, dweight, C);
  if (dbias != nullptr) {
    const int rows_per_chunk = static_cast<int>(std::max<int64_t>(kRowsPerChunk, ceil_div(N, 65535)));
    const int num_chunks = static_cast<int>(ceil_div(N, rows_per_chunk));  // <= 65535: gridDim.y's limit
    auto* partials = static_cast<float*>(scratch(Scratch::ColumnPartials, sizeof(float) * num_chunks * OC));
    const unsigned int channel_blocks = static_cast<unsigned int>(ceil_div(OC, kThreads));
    if (type == CUDA_R_16BF) {
      matmul_backward_bias_partials_kernel<<<dim3(channel_blocks, num_chunks), kThreads, 0, kDefaultStream>>>(
          partials, static_cast<const uint16_t*>(dout), N, OC, rows_per_chunk);
    } else {
      matmul_backward_bias_partials_kernel<<<dim3(channel_blocks, num_chunks), kThreads, 0, kDefaultStream>>>(
          partials, static_cast<const float*>(dout), N, OC, rows_per_chunk);
    }
    SL_CUDA_CHECK_LAST();
    matmul_backward_bias_finalize_kernel<<<channel_blocks, kThreads, 0, kDefaultStream>>>(dbias, partials, num_chunks,
                                                                                          OC);
    SL_CUDA_CHECK_LAST();
  }
}

static_assert(sizeof(bf16) == 2, "scalelab::bf16 must be the 16 bits cuBLAS reads as CUDA_R_16BF");
}  // namespace

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N, int C, int OC) {
  matmul_forward_impl(CUDA_R_32F, out, inp, weight, bias, N, C, OC);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int64_t N, int C, int OC) {
  matmul_backward_impl(CUDA_R_32F, dinp, dweight, dbias, dout, inp, weight, N, C, OC);
}

void matmul_forward_bf16(float* out, const bf16* inp, const bf16* weight, const float* bias, int64_t N, int C, int OC) {
  require_bf16_support();
  matmul_forward_impl(CUDA_R_16BF, out, inp, weight, bias, N, C, OC);
}

void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp,
                          const bf16* weight, int64_t N, int C, int OC) {
  require_bf16_support();
  matmul_backward_impl(CUDA_R_16BF, dinp, dweight, dbias, dout, inp, weight, N, C, OC);
}

}  // namespace scalelab::cuda
