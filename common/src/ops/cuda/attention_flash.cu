// attention_flash.cu — CUDA twin of the memory-efficient ("flash-style") causal self-attention:
// scalelab::cuda::attention_forward_flash / attention_backward_flash (contract: scalelab/ops/ops.h; declared in
// scalelab/ops/twins.h). CPU twin (the oracle, tiled the same way): common/src/ops/cpu/attention_flash.cpp
// tests: tests/common/ops/test_attention_flash_cuda.cpp (CUDA vs CPU twin; skipped without a GPU)
//
// What we chose and why. The materialized op (attention.cu, cuBLAS) stays the default: it is faster and
// simpler. This one exists for when the (B,NH,T,T) scores do not fit: it never stores them. It follows
// FlashAttention (Dao et al. 2022, arXiv:2205.14135): the forward runs an online softmax (Alg. 1; Milakov &
// Gimelshein 2018, arXiv:1805.02867) over key tiles staged in shared memory and saves lse (B,NH,T); the
// backward (Alg. 2) recomputes P = exp(S - lse) per tile. It trades speed for memory and readability:
// fp32 on the CUDA cores (no tensor cores, no cp.async, no warp specialisation), one warp per row, so it
// is several times slower than cuBLAS on the materialized scores. UNVERIFIED: written without a GPU,
// checked by reading and against the CPU twin's algorithm (which the CPU tests run).
//
// Layout of every kernel: a block of kBlockRows warps, one warp per "row" (a query row in the forward and
// in dq, a key row in dk/dv); the 32 lanes of a warp take the 32 entries of the inner tile (keys in the
// forward and dq, queries in dk/dv) for the dot products, then share the results with __shfl_sync and
// take channels d = lane + 32 r (r < 4, so HS <= 128) for the weighted sums, kept in registers.
// Shared memory: two (kBlockRows, HS+1) and two (kTile, HS+1) fp32 arrays, 41 KB at HS = 128 (under the
// 48 KB every GPU grants without opt-in). Rows are padded to HS+1 floats so that the 32 lanes reading 32
// different rows at one channel d hit 32 different banks when HS is a multiple of 32.
//
// Backward: three kernels, no atomics, so the result is deterministic (the same bits on every run):
//   1. D (B,NH,T) = rowsum(dout * out), FlashAttention Sec. 3.1 / App. B.2 (= sum_s P dP);
//   2. dk, dv: one block per (key block, h, b) loops over the query tiles t >= its keys;
//   3. dq:     one block per (query block, h, b) loops over the key tiles s <= its queries.
// Each block writes only its own rows of dqkv (+= once at the end), so blocks never race. The price of
// no atomics: S and P are computed twice (once per pass) instead of once.
#include <cmath>    // defines: std::sqrt (host), INFINITY
#include <cstdint>  // defines: int64_t, INT32_MAX

#include "context.cuh"            // defines: kWarpSize, warp_reduce_*, ceil_div, scratch, SL_CUDA_CHECK_LAST
#include "scalelab/ops/twins.h"   // defines: the declarations implemented here
#include "scalelab/core/error.h"  // defines: SL_CHECK, SL_CHECK_HINT

namespace scalelab::cuda {

namespace {
// Tile sizes, the same as the CPU twin's (attention_flash.cpp), so its loops run in this shape.
constexpr int kBlockRows = 8;                           // warps (rows) per block
constexpr int kTile = kWarpSize;                        // inner tile: one entry per lane
constexpr int kThreads = kBlockRows * kWarpSize;        // 256 threads per block
constexpr int kMaxHeadSize = 128;                       // HS limit: kDimsPerLane registers per lane
constexpr int kDimsPerLane = kMaxHeadSize / kWarpSize;  // 4: lane owns channels lane + 32 r, r < 4
constexpr unsigned kFullMask = 0xffffffffu;             // all 32 lanes take part in a shuffle
// Shared memory of every kernel: 2 (kBlockRows, HS+1) + 2 (kTile, HS+1) fp32 arrays.
constexpr size_t smem_bytes(int HS) { return sizeof(float) * (2 * kBlockRows + 2 * kTile) * (HS + 1); }
static_assert(smem_bytes(kMaxHeadSize) <= 48 * 1024, "flash attention tiles must fit the default 48 KB of smem");

// dst (rows, stride) in shared memory <- rows [row0, row0 + rows) of a (T, HS) matrix src with leading
// dimension ld (a head of q, k or v inside qkv: ld = 3C; of dout: ld = C). Rows at or past T are filled
// with zeros, so later products with them are 0 (never NaN from uninitialised memory). All threads of
// the block take part; consecutive threads read consecutive channels (coalesced).
__device__ void load_rows(float* dst, int stride, const float* src, int64_t ld, int row0, int rows, int T, int HS) {
  for (int idx = threadIdx.x; idx < rows * HS; idx += blockDim.x) {
    const int r = idx / HS, d = idx % HS;
    const int row = row0 + r;
    dst[r * stride + d] = row < T ? src[row * ld + d] : 0.0f;
  }
}

// Dot product of two shared-memory rows of length HS, summed in order d = 0..HS-1 (as the CPU twin).
__device__ __forceinline__ float smem_dot(const float* a, const float* b, int HS) {
  float s = 0.0f;
  for (int d = 0; d < HS; d++) s += a[d] * b[d];
  return s;
}

// Forward. Grid (ceil(T/kBlockRows), NH, B); block kThreads; dynamic smem smem_bytes(HS).
// Warp w owns query row t = q0 + w of head h of sequence b and runs the online softmax over key tiles
// [k0, k0 + 32) for k0 <= t (FlashAttention Alg. 1, lines 8-12, for one row):
//   m_new = max(m, max_s S[t,s]);  alpha = exp(m - m_new);  p_s = exp(S[t,s] - m_new)
//   l = alpha l + sum_s p_s;       acc = alpha acc + sum_s p_s v_s
// out_t = acc / l, lse_t = m + log l. qkv (B,T,3C), out (B,T,C), lse (B,NH,T).
__global__ void attention_forward_flash_kernel(float* out, float* lse, const float* qkv, int T, int C, int NH, int HS,
                                               float scale) {
  extern __shared__ float smem[];
  const int stride = HS + 1;               // padded row (see the file head)
  float* q_s = smem;                       // (kBlockRows, stride): this block's query rows
  float* k_s = q_s + kBlockRows * stride;  // (kTile, stride): the current key tile
  float* v_s = k_s + kTile * stride;       // (kTile, stride): its values
  // (the fourth array of smem_bytes is unused here; the three kernels share one size for simplicity)
  const int q0 = blockIdx.x * kBlockRows, h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int t = q0 + warp;       // this warp's query row
  const bool row_valid = t < T;  // the same for all lanes of a warp
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const float* q = qkv + static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * HS;  // (T,HS), ld 3C
  const float* k = q + C;
  const float* v = q + 2 * C;
  load_rows(q_s, stride, q, C3, q0, kBlockRows, T, HS);

  float m = -INFINITY;                          // running max of the row's scores
  float l = 0.0f;                               // running sum of exp(S - m)
  float acc[kDimsPerLane] = {};                 // acc[r]: unnormalised output channel lane + 32 r
  const int key_end = min(q0 + kBlockRows, T);  // keys [0, key_end) are visible to some row of the block
  for (int k0 = 0; k0 < key_end; k0 += kTile) {
    __syncthreads();  // every warp is done with the previous tile (and q_s is complete on the first pass)
    load_rows(k_s, stride, k, C3, k0, kTile, T, HS);
    load_rows(v_s, stride, v, C3, k0, kTile, T, HS);
    __syncthreads();
    if (row_valid && k0 <= t) {     // warp-uniform: whole warps enter, as the shuffles below require
      const int s = k0 + lane;      // this lane's key
      const bool visible = s <= t;  // the causal mask (s <= t < T)
      const float score = visible ? scale * smem_dot(q_s + warp * stride, k_s + lane * stride, HS) : -INFINITY;
      const float m_new = fmaxf(m, warp_reduce_max(score));  // finite: lane 0's key k0 <= t is visible
      const float alpha = expf(m - m_new);                   // 0 on the first tile (m = -inf)
      const float p = visible ? expf(score - m_new) : 0.0f;
      l = alpha * l + warp_reduce_sum(p);
      const int keys = min(kTile, t + 1 - k0);  // visible keys of the tile, the same for the whole warp
      float o[kDimsPerLane] = {};               // sum_j p_j v_j for this tile (then rescale-and-add, as the CPU)
      for (int j = 0; j < keys; j++) {
        const float p_j = __shfl_sync(kFullMask, p, j);
#pragma unroll
        for (int r = 0; r < kDimsPerLane; r++) {
          const int d = lane + r * kWarpSize;
          if (d < HS) o[r] += p_j * v_s[j * stride + d];
        }
      }
#pragma unroll
      for (int r = 0; r < kDimsPerLane; r++) acc[r] = alpha * acc[r] + o[r];
      m = m_new;
    }
  }
  if (!row_valid) return;        // after the last __syncthreads: leaving now cannot deadlock the block
  const float inv_l = 1.0f / l;  // l >= 1: the max term contributes exp(0)
  float* out_t = out + (static_cast<int64_t>(b) * T + t) * C + static_cast<int64_t>(h) * HS;
#pragma unroll
  for (int r = 0; r < kDimsPerLane; r++) {
    const int d = lane + r * kWarpSize;
    if (d < HS) out_t[d] = acc[r] * inv_l;
  }
  if (lane == 0) lse[(static_cast<int64_t>(b) * NH + h) * T + t] = m + logf(l);
}

// Backward pass 1: D (B,NH,T), D[b,h,t] = sum_d dout[b,t,h*HS+d] * out[b,t,h*HS+d] (FlashAttention App. B.2:
// sum_s P[t,s] dP[t,s] = dout_t . out_t). One warp per (b, t, h); num_rows = B*T*NH, row = (b*T + t)*NH + h.
__global__ void attention_flash_row_dot_kernel(float* D, const float* dout, const float* out, int64_t num_rows, int T,
                                               int C, int NH, int HS) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kBlockRows + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= num_rows) return;  // whole warps only (row is uniform across a warp)
  const int h = static_cast<int>(row % NH);
  const int64_t bt = row / NH;  // b * T + t
  const int64_t off = bt * C + static_cast<int64_t>(h) * HS;
  float sum = 0.0f;
  for (int d = lane; d < HS; d += kWarpSize) sum += dout[off + d] * out[off + d];
  sum = warp_reduce_sum(sum);
  const int64_t b = bt / T, t = bt % T;
  if (lane == 0) D[(b * NH + h) * T + t] = sum;
}

// Backward pass 2: dk, dv. Grid (ceil(T/kBlockRows), NH, B). Warp w owns key s = k0 + w and loops over
// query tiles [i0, i0 + 32) from the one holding k0 to T; lane i takes query t = i0 + i >= s:
//   P = exp(scale q_t.k_s - lse_t),  dP = dout_t.v_s,  dS = P (dP - D_t)
//   dv_s += sum_t P dout_t;   dk_s += scale * sum_t dS q_t.
// dqkv (B,T,3C) +=; dout (B,T,C); qkv (B,T,3C); lse, D (B,NH,T).
__global__ void attention_backward_flash_dkdv_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                                                     const float* D, int T, int C, int NH, int HS, float scale) {
  extern __shared__ float smem[];
  const int stride = HS + 1;
  float* k_s = smem;                       // (kBlockRows, stride): this block's keys
  float* v_s = k_s + kBlockRows * stride;  // (kBlockRows, stride): their values
  float* q_s = v_s + kBlockRows * stride;  // (kTile, stride): the current query tile
  float* do_s = q_s + kTile * stride;      // (kTile, stride): its output gradients
  const int k0 = blockIdx.x * kBlockRows, h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int s = k0 + warp;       // this warp's key
  const bool key_valid = s < T;  // warp-uniform
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const int64_t qkv_off = static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * HS;
  const float* q = qkv + qkv_off;  // (T,HS), ld 3C
  const float* k = q + C;
  const float* v = q + 2 * C;
  const float* dout_bh = dout + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * HS;  // (T,HS), ld C
  const float* lse_bh = lse + (static_cast<int64_t>(b) * NH + h) * T;                            // (T)
  const float* D_bh = D + (static_cast<int64_t>(b) * NH + h) * T;                                // (T)
  load_rows(k_s, stride, k, C3, k0, kBlockRows, T, HS);
  load_rows(v_s, stride, v, C3, k0, kBlockRows, T, HS);

  float acc_dk[kDimsPerLane] = {};  // sum_t dS[t,s] q_t, channel lane + 32 r (scale applied at the end)
  float acc_dv[kDimsPerLane] = {};  // sum_t P[t,s] dout_t
  // kBlockRows divides kTile, so the block's keys lie in one query tile: the first tile starts there.
  for (int i0 = (k0 / kTile) * kTile; i0 < T; i0 += kTile) {
    __syncthreads();  // previous tile consumed (k_s, v_s complete on the first pass)
    load_rows(q_s, stride, q, C3, i0, kTile, T, HS);
    load_rows(do_s, stride, dout_bh, C, i0, kTile, T, HS);
    __syncthreads();
    if (key_valid) {                         // warp-uniform
      const int t = i0 + lane;               // this lane's query
      const bool visible = t >= s && t < T;  // the causal mask, and the sequence's end
      float P = 0.0f, dS = 0.0f;
      if (visible) {
        P = expf(scale * smem_dot(q_s + lane * stride, k_s + warp * stride, HS) - lse_bh[t]);
        const float dP = smem_dot(do_s + lane * stride, v_s + warp * stride, HS);
        dS = P * (dP - D_bh[t]);
      }
      for (int i = 0; i < kTile; i++) {  // masked lanes contribute 0 (P = dS = 0, their rows are finite)
        const float P_i = __shfl_sync(kFullMask, P, i);
        const float dS_i = __shfl_sync(kFullMask, dS, i);
#pragma unroll
        for (int r = 0; r < kDimsPerLane; r++) {
          const int d = lane + r * kWarpSize;
          if (d < HS) {
            acc_dv[r] += P_i * do_s[i * stride + d];
            acc_dk[r] += dS_i * q_s[i * stride + d];
          }
        }
      }
    }
  }
  if (!key_valid) return;
  float* dk_s = dqkv + qkv_off + C + static_cast<int64_t>(s) * C3;  // row s of dk, the += rule
  float* dv_s = dk_s + C;
#pragma unroll
  for (int r = 0; r < kDimsPerLane; r++) {
    const int d = lane + r * kWarpSize;
    if (d < HS) {
      dk_s[d] += scale * acc_dk[r];
      dv_s[d] += acc_dv[r];
    }
  }
}

// Backward pass 3: dq. Grid (ceil(T/kBlockRows), NH, B). Warp w owns query t = q0 + w and loops over key
// tiles [k0, k0 + 32) with k0 <= t, as the forward; lane j takes key s = k0 + j <= t:
//   dS = exp(scale q_t.k_s - lse_t) (dout_t.v_s - D_t);   dq_t += scale * sum_s dS k_s.
__global__ void attention_backward_flash_dq_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                                                   const float* D, int T, int C, int NH, int HS, float scale) {
  extern __shared__ float smem[];
  const int stride = HS + 1;
  float* q_s = smem;                        // (kBlockRows, stride): this block's queries
  float* do_s = q_s + kBlockRows * stride;  // (kBlockRows, stride): their output gradients
  float* k_s = do_s + kBlockRows * stride;  // (kTile, stride): the current key tile
  float* v_s = k_s + kTile * stride;        // (kTile, stride): its values
  const int q0 = blockIdx.x * kBlockRows, h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int t = q0 + warp;
  const bool row_valid = t < T;  // warp-uniform
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const int64_t qkv_off = static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * HS;
  const float* q = qkv + qkv_off;
  const float* k = q + C;
  const float* v = q + 2 * C;
  const float* dout_bh = dout + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * HS;
  const int64_t lse_off = (static_cast<int64_t>(b) * NH + h) * T;
  const float lse_t = row_valid ? lse[lse_off + t] : 0.0f;
  const float D_t = row_valid ? D[lse_off + t] : 0.0f;
  load_rows(q_s, stride, q, C3, q0, kBlockRows, T, HS);
  load_rows(do_s, stride, dout_bh, C, q0, kBlockRows, T, HS);

  float acc_dq[kDimsPerLane] = {};  // sum_s dS[t,s] k_s, channel lane + 32 r (scale applied at the end)
  const int key_end = min(q0 + kBlockRows, T);
  for (int k0 = 0; k0 < key_end; k0 += kTile) {
    __syncthreads();
    load_rows(k_s, stride, k, C3, k0, kTile, T, HS);
    load_rows(v_s, stride, v, C3, k0, kTile, T, HS);
    __syncthreads();
    if (row_valid && k0 <= t) {  // warp-uniform
      const int s = k0 + lane;
      float dS = 0.0f;
      if (s <= t) {  // the causal mask (s <= t < T)
        const float P = expf(scale * smem_dot(q_s + warp * stride, k_s + lane * stride, HS) - lse_t);
        const float dP = smem_dot(do_s + warp * stride, v_s + lane * stride, HS);
        dS = P * (dP - D_t);
      }
      const int keys = min(kTile, t + 1 - k0);  // warp-uniform
      for (int j = 0; j < keys; j++) {
        const float dS_j = __shfl_sync(kFullMask, dS, j);
#pragma unroll
        for (int r = 0; r < kDimsPerLane; r++) {
          const int d = lane + r * kWarpSize;
          if (d < HS) acc_dq[r] += dS_j * k_s[j * stride + d];
        }
      }
    }
  }
  if (!row_valid) return;
  float* dq_t = dqkv + qkv_off + static_cast<int64_t>(t) * C3;  // row t of dq, the += rule
#pragma unroll
  for (int r = 0; r < kDimsPerLane; r++) {
    const int d = lane + r * kWarpSize;
    if (d < HS) dq_t[d] += scale * acc_dq[r];
  }
}

// The grid of the three tiled kernels: x = row blocks of kBlockRows, y = heads, z = sequences.
// Throws if B or NH exceed gridDim's y/z limit of 65535 (never in GPT-2: NH <= 25, B in the tens).
dim3 flash_grid(const char* op, int B, int T, int NH) {
  SL_CHECK(NH <= 65535 && B <= 65535, "%s: B=%d and NH=%d must be <= 65535 (CUDA grid y/z limit)", op, B, NH);
  return dim3(static_cast<unsigned int>(ceil_div(T, kBlockRows)), static_cast<unsigned int>(NH),
              static_cast<unsigned int>(B));
}

// The kernels keep a row's HS channels in kDimsPerLane registers per lane: HS <= kMaxHeadSize.
void check_head_size(const char* op, int C, int NH) {
  const int HS = C / NH;
  SL_CHECK_HINT(HS >= 1 && HS <= kMaxHeadSize,
                "use attention_forward / attention_backward (materialized scores, any head size) for this model",
                "%s: head size HS = C/NH = %d/%d = %d, but the flash-style CUDA kernel supports 1 <= HS <= %d "
                "(each lane keeps %d channels of a row in registers)",
                op, C, NH, HS, kMaxHeadSize, kDimsPerLane);
}
}  // namespace

// out (B,T,C), lse (B,NH,T) written; qkv (B,T,3C) read. No scratch.
void attention_forward_flash(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
  if (B == 0 || T == 0) return;
  check_head_size(__func__, C, NH);
  const int HS = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));  // as the CPU twin computes it
  attention_forward_flash_kernel<<<flash_grid(__func__, B, T, NH), kThreads, smem_bytes(HS), kDefaultStream>>>(out, lse,
                                                                                                               qkv, T,
                                                                                                               C, NH,
                                                                                                               HS,
                                                                                                               scale);
  SL_CUDA_CHECK_LAST();
}

// dqkv (B,T,3C) +=; dout, out (B,T,C), qkv (B,T,3C), lse (B,NH,T) read. Scratch: D (B,NH,T) fp32 in the
// context's AttentionRowDot buffer (Workspace, kept for the next call).
void attention_backward_flash(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                              int B, int T, int C, int NH) {
  if (B == 0 || T == 0) return;
  check_head_size(__func__, C, NH);
  const int HS = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int64_t num_rows = static_cast<int64_t>(B) * T * NH;
  float* D = static_cast<float*>(scratch(Scratch::AttentionRowDot, static_cast<size_t>(num_rows) * sizeof(float)));
  const int64_t row_blocks = ceil_div(num_rows, kBlockRows);
  SL_CHECK(row_blocks <= INT32_MAX, "%s: %lld rows need more than 2^31-1 blocks", __func__,
           static_cast<long long>(num_rows));
  attention_flash_row_dot_kernel<<<static_cast<unsigned int>(row_blocks), kThreads, 0, kDefaultStream>>>(D, dout, out,
                                                                                                         num_rows, T, C,
                                                                                                         NH, HS);
  SL_CUDA_CHECK_LAST();
  const dim3 grid = flash_grid(__func__, B, T, NH);
  attention_backward_flash_dkdv_kernel<<<grid, kThreads, smem_bytes(HS), kDefaultStream>>>(dqkv, dout, qkv, lse, D, T,
                                                                                           C, NH, HS, scale);
  SL_CUDA_CHECK_LAST();
  attention_backward_flash_dq_kernel<<<grid, kThreads, smem_bytes(HS), kDefaultStream>>>(dqkv, dout, qkv, lse, D, T, C,
                                                                                         NH, HS, scale);
  SL_CUDA_CHECK_LAST();
}

}  // namespace scalelab::cuda
