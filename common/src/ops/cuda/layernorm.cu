// layernorm.cu — CUDA twin of LayerNorm over the last dimension (Ba, Kiros & Hinton 2016, arXiv:1607.06450).
// Defines scalelab::cuda::layernorm_forward / layernorm_backward (contract: scalelab/ops/ops.h; declared in
// scalelab/ops/twins.h). Same formulas as the CPU twin; sums run in a different order (a warp's butterfly
// instead of a sequential loop), so results differ from the CPU's by fp32 rounding only.
// CPU twin: common/src/ops/cpu/layernorm.cpp   tests: tests/common/ops/test_ops_cuda.cpp
#include "context.cuh"           // defines: kWarpSize, warp_reduce_sum, scratch, SL_CUDA_CHECK(_LAST)
#include "scalelab/ops/twins.h"  // defines: the declarations implemented here

namespace scalelab::cuda {

namespace {
constexpr float kLayerNormEps = 1e-5f;  // GPT-2's (and torch.nn.LayerNorm's default) epsilon
constexpr int kRowsPerBlock = 8;        // warp-per-row kernels: 8 warps = 256 threads per block
constexpr int kThreads = 256;           // column kernels: threads (= channels) per block
constexpr int kRowsPerChunk = 64;       // column sums: rows per partial sum (more if the grid's y limit needs it)

// One warp per row: lane l handles channels l, l+32, ... Two passes (mean, then variance about the
// mean) as the CPU twin does. inp, out (N,C); weight, bias (C); mean, rstd (N).
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                         const float* bias, int64_t N, int C) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (row >= N) return;  // the whole warp leaves together: `row` is the same for its 32 lanes
  const float* x = inp + row * C;
  float sum = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) sum += x[c];
  const float m = warp_reduce_sum(sum) / C;
  float sum_sq = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) {
    const float d = x[c] - m;
    sum_sq += d * d;
  }
  const float s = 1.0f / sqrtf(warp_reduce_sum(sum_sq) / C + kLayerNormEps);  // IEEE sqrt and divide (no fast math)
  float* y = out + row * C;
  for (int c = lane; c < C; c += kWarpSize) y[c] = (x[c] - m) * s * weight[c] + bias[c];
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// dinp (N,C) += rstd * (g - mean_c(g) - xhat * mean_c(g * xhat)), g = weight * dout, xhat = (x - mean) * rstd
// (derivation: llm.c doc/layernorm). One warp per row, as the forward.
__global__ void layernorm_backward_dinp_kernel(float* dinp, const float* dout, const float* inp, const float* weight,
                                               const float* mean, const float* rstd, int64_t N, int C) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (row >= N) return;
  const float* x = inp + row * C;
  const float* dy = dout + row * C;
  const float m = mean[row], s = rstd[row];
  float g_sum = 0.0f, g_xhat_sum = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) {
    const float xhat = (x[c] - m) * s;
    const float g = weight[c] * dy[c];
    g_sum += g;
    g_xhat_sum += g * xhat;
  }
  const float g_mean = warp_reduce_sum(g_sum) / C;
  const float g_xhat_mean = warp_reduce_sum(g_xhat_sum) / C;
  float* dx = dinp + row * C;
  for (int c = lane; c < C; c += kWarpSize) {
    const float xhat = (x[c] - m) * s;
    const float g = weight[c] * dy[c];
    dx[c] += s * (g - g_mean - xhat * g_xhat_mean);
  }
}

// Pass 1 of dweight += sum_rows dout * xhat and dbias += sum_rows dout: block (x: 256 channels, y: one
// chunk of rows) writes the chunk's partial sums. Threads of a block read consecutive channels of a
// row (coalesced). partials (num_chunks, 2, C): [chunk][0][c] for dweight, [chunk][1][c] for dbias.
__global__ void layernorm_backward_partials_kernel(float* partials, const float* dout, const float* inp,
                                                   const float* mean, const float* rstd, int64_t N, int C,
                                                   int rows_per_chunk) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int chunk = blockIdx.y;
  if (c >= C) return;
  const int64_t i0 = static_cast<int64_t>(chunk) * rows_per_chunk;
  const int64_t i1 = min(N, i0 + rows_per_chunk);
  float dw = 0.0f, db = 0.0f;
  for (int64_t i = i0; i < i1; i++) {
    const float dy = dout[i * C + c];
    dw += dy * (inp[i * C + c] - mean[i]) * rstd[i];
    db += dy;
  }
  partials[(static_cast<int64_t>(chunk) * 2 + 0) * C + c] = dw;
  partials[(static_cast<int64_t>(chunk) * 2 + 1) * C + c] = db;
}

// Pass 2: each channel adds its chunks' partials in chunk order, then ADDS the total (ops.h += rule).
// Fixed shapes, fixed order: the same bits on every run.
__global__ void layernorm_backward_finalize_kernel(float* dweight, float* dbias, const float* partials, int num_chunks,
                                                   int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float dw = 0.0f, db = 0.0f;
  for (int k = 0; k < num_chunks; k++) {
    dw += partials[(static_cast<int64_t>(k) * 2 + 0) * C + c];
    db += partials[(static_cast<int64_t>(k) * 2 + 1) * C + c];
  }
  dweight[c] += dw;
  dbias[c] += db;
}

unsigned int warp_per_row_blocks(int64_t N) {
  const int64_t blocks = ceil_div(N, kRowsPerBlock);
  SL_CHECK(blocks <= INT32_MAX, "layernorm: N=%lld rows need more than 2^31-1 blocks", static_cast<long long>(N));
  return static_cast<unsigned int>(blocks);
}
}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int64_t N, int C) {
  if (N == 0 || C == 0) return;
  layernorm_forward_kernel<<<warp_per_row_blocks(N), kRowsPerBlock * kWarpSize, 0, kDefaultStream>>>(out, mean, rstd,
                                                                                                     inp, weight, bias,
                                                                                                     N, C);
  SL_CUDA_CHECK_LAST();
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t N, int C) {
  if (N == 0 || C == 0) return;
  // 1. dinp: rows are independent.
  layernorm_backward_dinp_kernel<<<warp_per_row_blocks(N), kRowsPerBlock * kWarpSize, 0, kDefaultStream>>>(dinp, dout,
                                                                                                           inp, weight,
                                                                                                           mean, rstd,
                                                                                                           N, C);
  SL_CUDA_CHECK_LAST();
  // 2. dweight, dbias: deterministic two-pass column sums (no atomics). gridDim.y <= 65535 chunks.
  const int rows_per_chunk = static_cast<int>(std::max<int64_t>(kRowsPerChunk, ceil_div(N, 65535)));
  const int num_chunks = static_cast<int>(ceil_div(N, rows_per_chunk));
  auto* partials = static_cast<float*>(scratch(Scratch::ColumnPartials, sizeof(float) * 2 * num_chunks * C));
  const unsigned int channel_blocks = static_cast<unsigned int>(ceil_div(C, kThreads));
  layernorm_backward_partials_kernel<<<dim3(channel_blocks, num_chunks), kThreads, 0, kDefaultStream>>>(partials, dout,
                                                                                                        inp, mean, rstd,
                                                                                                        N, C,
                                                                                                        rows_per_chunk);
  SL_CUDA_CHECK_LAST();
  layernorm_backward_finalize_kernel<<<channel_blocks, kThreads, 0, kDefaultStream>>>(dweight, dbias, partials,
                                                                                      num_chunks, C);
  SL_CUDA_CHECK_LAST();
}

}  // namespace scalelab::cuda
