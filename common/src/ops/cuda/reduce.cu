// reduce.cu — CUDA twins of the small whole-tensor ops: sum of squares (for the global gradient norm),
// in-place scaling, fp32 <-> bf16 casts; and the token-id range check the dispatch runs on GPU tensors.
// Defines scalelab::cuda::sum_squares / scale / cast_f32_to_bf16 / cast_bf16_to_f32 /
// first_index_out_of_range (contract: scalelab/ops/ops.h; declared in scalelab/ops/twins.h).
// CPU twin: common/src/ops/cpu/reduce.cpp   tests: tests/common/ops/test_ops_cuda.cpp
#include "context.cuh"           // defines: scratch, grid_stride_blocks, float_to_bf16_bits, SL_CUDA_CHECK(_LAST)
#include "scalelab/ops/twins.h"  // defines: the declarations implemented here

namespace scalelab::cuda {

namespace {
constexpr int kThreads = 256;        // threads per block in every kernel of this file (a power of two)
constexpr int kMaxSumBlocks = 1024;  // sum_squares pass 1: at most this many partial sums

// Tree sum of the kThreads values in smem (in place; smem[0] holds the result). The pairing is fixed,
// so the result's bits depend only on the inputs. Every thread of the block must call it.
__device__ void block_tree_sum(double* smem) {
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    __syncthreads();
    if (threadIdx.x < stride) smem[threadIdx.x] += smem[threadIdx.x + stride];
  }
  __syncthreads();
}

// sum_squares pass 1: block b sums x[i]^2 (in double) over i = b*kThreads + tid + k * gridDim.x*kThreads,
// then tree-sums its threads into partial[b]. x (n) fp32; partial (gridDim.x) double.
__global__ void sum_squares_partial_kernel(double* partial, const float* x, int64_t n) {
  __shared__ double smem[kThreads];
  double acc = 0.0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const double xi = x[i];
    acc += xi * xi;
  }
  smem[threadIdx.x] = acc;
  block_tree_sum(smem);
  if (threadIdx.x == 0) partial[blockIdx.x] = smem[0];
}

// sum_squares pass 2: one block adds the num_partials partial sums (strided, then a tree) into *total.
__global__ void sum_squares_final_kernel(double* total, const double* partial, int num_partials) {
  __shared__ double smem[kThreads];
  double acc = 0.0;
  for (int j = threadIdx.x; j < num_partials; j += kThreads) acc += partial[j];
  smem[threadIdx.x] = acc;
  block_tree_sum(smem);
  if (threadIdx.x == 0) *total = smem[0];
}

// x (n) *= s.
__global__ void scale_kernel(float* x, int64_t n, float s) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] *= s;  // a lone multiply: nothing to contract, the same bits as the CPU
  }
}

// dst (n) bf16 bits = src (n) fp32, round to nearest even (the bit arithmetic of scalelab/core/bf16.h).
__global__ void cast_f32_to_bf16_kernel(uint16_t* dst, const float* src, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = float_to_bf16_bits(src[i]);
  }
}

// dst (n) fp32 = src (n) bf16 bits; exact.
__global__ void cast_bf16_to_f32_kernel(float* dst, const uint16_t* src, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = bf16_bits_to_float(src[i]);
  }
}

// *first_bad = min over i with idx[i] outside [0, limit) (left at its initial all-ones value if none).
__global__ void index_range_check_kernel(unsigned long long* first_bad, const int32_t* idx, int64_t n, int64_t limit) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t v = idx[i];
    if (v < 0 || v >= limit) atomicMin(first_bad, static_cast<unsigned long long>(i));
  }
}
}  // namespace

// Synchronous. A deterministic two-pass reduction: pass 1 has min(ceil(n / kThreads), kMaxSumBlocks)
// blocks, a number that depends only on n, each summing a fixed set of elements in a fixed order; pass 2
// sums the partials in one block. So the same n and data give the same bits on every run and every GPU
// (not the CPU twin's bits: its chunks differ; both accumulate in double, so they agree to ~1e-15).
double sum_squares(const float* x, int64_t n) {
  if (n == 0) return 0.0;
  const int num_blocks = static_cast<int>(std::min<int64_t>(ceil_div(n, kThreads), kMaxSumBlocks));
  auto* buf = static_cast<double*>(scratch(Scratch::Reduce, sizeof(double) * (num_blocks + 1)));
  double* partial = buf;             // (num_blocks)
  double* total = buf + num_blocks;  // (1)
  sum_squares_partial_kernel<<<num_blocks, kThreads, 0, kDefaultStream>>>(partial, x, n);
  SL_CUDA_CHECK_LAST();
  sum_squares_final_kernel<<<1, kThreads, 0, kDefaultStream>>>(total, partial, num_blocks);
  SL_CUDA_CHECK_LAST();
  double h_total = 0.0;
  SL_CUDA_CHECK(cudaMemcpy(&h_total, total, sizeof(double), cudaMemcpyDeviceToHost));  // waits for the kernels
  return h_total;
}

void scale(float* x, int64_t n, float s) {
  if (n == 0) return;
  scale_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, kDefaultStream>>>(x, n, s);
  SL_CUDA_CHECK_LAST();
}

// bf16 is a struct holding the 16 bits (scalelab/core/bf16.h); the kernels see them as uint16_t.
static_assert(sizeof(bf16) == sizeof(uint16_t), "scalelab::bf16 must be exactly 16 bits");

void cast_f32_to_bf16(bf16* dst, const float* src, int64_t n) {
  if (n == 0) return;
  cast_f32_to_bf16_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, kDefaultStream>>>(
      reinterpret_cast<uint16_t*>(dst), src, n);
  SL_CUDA_CHECK_LAST();
}

void cast_bf16_to_f32(float* dst, const bf16* src, int64_t n) {
  if (n == 0) return;
  cast_bf16_to_f32_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, kDefaultStream>>>(
      dst, reinterpret_cast<const uint16_t*>(src), n);
  SL_CUDA_CHECK_LAST();
}

// Synchronous (two small copies back). atomicMin makes the answer the FIRST bad index whatever the
// order in which threads run, so the error message is the same as the CPU check's.
int64_t first_index_out_of_range(const int32_t* idx, int64_t n, int64_t limit, int32_t* bad_value) {
  if (n == 0) return -1;
  auto* d_first_bad = static_cast<unsigned long long*>(scratch(Scratch::IndexCheck, sizeof(unsigned long long)));
  SL_CUDA_CHECK(cudaMemset(d_first_bad, 0xff, sizeof(unsigned long long)));  // all ones: "none found"
  index_range_check_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, kDefaultStream>>>(d_first_bad, idx, n,
                                                                                             limit);
  SL_CUDA_CHECK_LAST();
  unsigned long long first_bad = 0;
  SL_CUDA_CHECK(cudaMemcpy(&first_bad, d_first_bad, sizeof first_bad, cudaMemcpyDeviceToHost));
  if (first_bad == ~0ull) return -1;
  const auto i = static_cast<int64_t>(first_bad);
  SL_CUDA_CHECK(cudaMemcpy(bad_value, idx + i, sizeof(int32_t), cudaMemcpyDeviceToHost));
  return i;
}

}  // namespace scalelab::cuda
