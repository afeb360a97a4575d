// attention_flash.cu — CUDA twin of the memory-efficient ("flash-style") causal self-attention:
// scalelab::cuda::attention_forward_flash / attention_backward_flash (contract: scalelab/ops/ops.h; declared in
// scalelab/ops/twins.h). CPU twin (the oracle, tiled the same way): common/src/ops/cpu/attention_flash.cpp
// The block ops of context parallelism (attention_forward_block / attention_backward_block: q (B,Tq,C) against
// kv (B,Tk,2C) at absolute offsets) run the same kernels on other strides; attention_merge is one more kernel.
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

// Where the heads sit (as the CPU twin's FlashLayout): row t of head h of sequence b of q is at
// q + (b*Tq + t)*ldq + h*HS, row s of k and v at k/v + (b*Tk + s)*ldkv + h*HS; dq, dk, dv have the layout of
// q, k, v. Dense op: q, k, v inside qkv (ldq = ldkv = 3C, Tq = Tk = T, delta = 0); block op: q (B,Tq,C), kv
// (B,Tk,2C) (ldq = C, ldkv = 2C). Key s is visible to query t iff s <= t + delta, delta = q_offset - kv_offset.
struct FlashDims {
  int Tq, Tk, C, NH, HS;
  int64_t ldq, ldkv;
  int64_t delta;
  float scale;  // 1/sqrt(HS)
  // The first key past what query row `t_end - 1` sees: key tiles [0, key_end) serve the rows before t_end.
  __device__ int key_end(int t_end) const {
    const int64_t e = min(static_cast<int64_t>(min(t_end, Tq)) + delta, static_cast<int64_t>(Tk));
    return e > 0 ? static_cast<int>(e) : 0;
  }
};

// dst (rows, stride) in shared memory <- rows [row0, row0 + rows) of a (T, HS) matrix src with leading
// dimension ld (a head of q, k or v: ld = 3C inside qkv, C for q, 2C inside kv; of dout: ld = C). Rows at
// or past T are filled with zeros, so later products with them are 0 (never NaN from uninitialised memory).
// All threads of the block take part; consecutive threads read consecutive channels (coalesced).
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

// Forward. Grid (ceil(Tq/kBlockRows), NH, B); block kThreads; dynamic smem smem_bytes(HS).
// Warp w owns query row t = q0 + w of head h of sequence b and runs the online softmax over key tiles
// [k0, k0 + 32) for k0 <= t + delta (FlashAttention Alg. 1, lines 8-12, for one row):
//   m_new = max(m, max_s S[t,s]);  alpha = exp(m - m_new);  p_s = exp(S[t,s] - m_new)
//   l = alpha l + sum_s p_s;       acc = alpha acc + sum_s p_s v_s
// out_t = acc / l, lse_t = m + log l; a row that sees no key (l = 0) gets out 0, lse -inf. out (B,Tq,C),
// lse (B,NH,Tq).
__global__ void attention_forward_flash_kernel(float* out, float* lse, const float* q_all, const float* k_all,
                                               const float* v_all, FlashDims dims) {
  extern __shared__ float smem[];
  const int HS = dims.HS;
  const int stride = HS + 1;               // padded row (see the file head)
  float* q_s = smem;                       // (kBlockRows, stride): this block's query rows
  float* k_s = q_s + kBlockRows * stride;  // (kTile, stride): the current key tile
  float* v_s = k_s + kTile * stride;       // (kTile, stride): its values
  // (the fourth array of smem_bytes is unused here; the three kernels share one size for simplicity)
  const int q0 = blockIdx.x * kBlockRows, h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int t = q0 + warp;              // this warp's query row
  const bool row_valid = t < dims.Tq;   // the same for all lanes of a warp
  const int64_t last = t + dims.delta;  // the last key row t sees
  const float* q = q_all + static_cast<int64_t>(b) * dims.Tq * dims.ldq + static_cast<int64_t>(h) * HS;
  const float* k = k_all + static_cast<int64_t>(b) * dims.Tk * dims.ldkv + static_cast<int64_t>(h) * HS;
  const float* v = v_all + static_cast<int64_t>(b) * dims.Tk * dims.ldkv + static_cast<int64_t>(h) * HS;
  load_rows(q_s, stride, q, dims.ldq, q0, kBlockRows, dims.Tq, HS);

  float m = -INFINITY;                                // running max of the row's scores
  float l = 0.0f;                                     // running sum of exp(S - m)
  float acc[kDimsPerLane] = {};                       // acc[r]: unnormalised output channel lane + 32 r
  const int key_end = dims.key_end(q0 + kBlockRows);  // keys [0, key_end) are visible to some row of the block
  for (int k0 = 0; k0 < key_end; k0 += kTile) {
    __syncthreads();  // every warp is done with the previous tile (and q_s is complete on the first pass)
    load_rows(k_s, stride, k, dims.ldkv, k0, kTile, dims.Tk, HS);
    load_rows(v_s, stride, v, dims.ldkv, k0, kTile, dims.Tk, HS);
    __syncthreads();
    if (row_valid && k0 <= last) {                    // warp-uniform: whole warps enter, as the shuffles require
      const int s = k0 + lane;                        // this lane's key
      const bool visible = s <= last && s < dims.Tk;  // the causal mask, and the block's end
      const float score = visible ? dims.scale * smem_dot(q_s + warp * stride, k_s + lane * stride, HS) : -INFINITY;
      const float m_new = fmaxf(m, warp_reduce_max(score));  // finite: lane 0's key k0 <= last is visible
      const float alpha = expf(m - m_new);                   // 0 on the first tile (m = -inf)
      const float p = visible ? expf(score - m_new) : 0.0f;
      l = alpha * l + warp_reduce_sum(p);
      // visible keys of the tile, the same for the whole warp
      const int keys =
          static_cast<int>(min(static_cast<int64_t>(kTile), min(last + 1, static_cast<int64_t>(dims.Tk)) - k0));
      float o[kDimsPerLane] = {};  // sum_j p_j v_j for this tile (then rescale-and-add, as the CPU)
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
  if (!row_valid) return;                       // after the last __syncthreads: leaving now cannot deadlock the block
  const bool empty = l == 0.0f;                 // no visible key (only in the block op): the empty sum
  const float inv_l = empty ? 0.0f : 1.0f / l;  // l >= 1 otherwise: the max term contributes exp(0)
  float* out_t = out + (static_cast<int64_t>(b) * dims.Tq + t) * dims.C + static_cast<int64_t>(h) * HS;
#pragma unroll
  for (int r = 0; r < kDimsPerLane; r++) {
    const int d = lane + r * kWarpSize;
    if (d < HS) out_t[d] = acc[r] * inv_l;
  }
  if (lane == 0) lse[(static_cast<int64_t>(b) * dims.NH + h) * dims.Tq + t] = empty ? -INFINITY : m + logf(l);
}

// Backward pass 1: D (B,NH,T), D[b,h,t] = sum_d dout[b,t,h*HS+d] * out[b,t,h*HS+d] (FlashAttention App. B.2:
// sum_s P[t,s] dP[t,s] = dout_t . out_t). One warp per (b, t, h); num_rows = B*T*NH, row = (b*T + t)*NH + h.
// T is the number of query rows (Tq of the block op).
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

// Backward pass 2: dk, dv. Grid (ceil(Tk/kBlockRows), NH, B). Warp w owns key s = k0 + w and loops over
// query tiles [i0, i0 + 32) from the one holding the first query that sees key k0 (t = k0 - delta) to Tq;
// lane i takes query t = i0 + i with t + delta >= s:
//   P = exp(scale q_t.k_s - lse_t),  dP = dout_t.v_s,  dS = P (dP - D_t)
//   dv_s += sum_t P dout_t;   dk_s += scale * sum_t dS q_t.
// dk, dv += (layout of k, v); dout (B,Tq,C); lse, D (B,NH,Tq).
__global__ void attention_backward_flash_dkdv_kernel(float* dk_all, float* dv_all, const float* dout,
                                                     const float* q_all, const float* k_all, const float* v_all,
                                                     const float* lse, const float* D, FlashDims dims) {
  extern __shared__ float smem[];
  const int HS = dims.HS;
  const int stride = HS + 1;
  float* k_s = smem;                       // (kBlockRows, stride): this block's keys
  float* v_s = k_s + kBlockRows * stride;  // (kBlockRows, stride): their values
  float* q_s = v_s + kBlockRows * stride;  // (kTile, stride): the current query tile
  float* do_s = q_s + kTile * stride;      // (kTile, stride): its output gradients
  const int k0 = blockIdx.x * kBlockRows, h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int s = k0 + warp;             // this warp's key
  const bool key_valid = s < dims.Tk;  // warp-uniform
  const int64_t q_off = static_cast<int64_t>(b) * dims.Tq * dims.ldq + static_cast<int64_t>(h) * HS;
  const int64_t kv_off = static_cast<int64_t>(b) * dims.Tk * dims.ldkv + static_cast<int64_t>(h) * HS;
  const float* q = q_all + q_off;   // (Tq,HS), ld ldq
  const float* k = k_all + kv_off;  // (Tk,HS), ld ldkv
  const float* v = v_all + kv_off;
  const float* dout_bh = dout + static_cast<int64_t>(b) * dims.Tq * dims.C + static_cast<int64_t>(h) * HS;  // ld C
  const float* lse_bh = lse + (static_cast<int64_t>(b) * dims.NH + h) * dims.Tq;                            // (Tq)
  const float* D_bh = D + (static_cast<int64_t>(b) * dims.NH + h) * dims.Tq;                                // (Tq)
  load_rows(k_s, stride, k, dims.ldkv, k0, kBlockRows, dims.Tk, HS);
  load_rows(v_s, stride, v, dims.ldkv, k0, kBlockRows, dims.Tk, HS);

  float acc_dk[kDimsPerLane] = {};  // sum_t dS[t,s] q_t, channel lane + 32 r (scale applied at the end)
  float acc_dv[kDimsPerLane] = {};  // sum_t P[t,s] dout_t
  // The first query tile: the one holding the first query that sees key k0 (the block's first key).
  const int64_t first_query = max(static_cast<int64_t>(0), k0 - dims.delta);
  for (int64_t i0 = (first_query / kTile) * kTile; i0 < dims.Tq; i0 += kTile) {
    __syncthreads();  // previous tile consumed (k_s, v_s complete on the first pass)
    load_rows(q_s, stride, q, dims.ldq, static_cast<int>(i0), kTile, dims.Tq, HS);
    load_rows(do_s, stride, dout_bh, dims.C, static_cast<int>(i0), kTile, dims.Tq, HS);
    __syncthreads();
    if (key_valid) {                                            // warp-uniform
      const int64_t t = i0 + lane;                              // this lane's query
      const bool visible = t + dims.delta >= s && t < dims.Tq;  // the causal mask, and the block's end
      float P = 0.0f, dS = 0.0f;
      if (visible) {
        P = expf(dims.scale * smem_dot(q_s + lane * stride, k_s + warp * stride, HS) - lse_bh[t]);
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
  float* dk_s = dk_all + kv_off + static_cast<int64_t>(s) * dims.ldkv;  // row s of dk, the += rule
  float* dv_s = dv_all + kv_off + static_cast<int64_t>(s) * dims.ldkv;
#pragma unroll
  for (int r = 0; r < kDimsPerLane; r++) {
    const int d = lane + r * kWarpSize;
    if (d < HS) {
      dk_s[d] += dims.scale * acc_dk[r];
      dv_s[d] += acc_dv[r];
    }
  }
}

// Backward pass 3: dq. Grid (ceil(Tq/kBlockRows), NH, B). Warp w owns query t = q0 + w and loops over key
// tiles [k0, k0 + 32) with k0 <= t + delta, as the forward; lane j takes key s = k0 + j <= t + delta:
//   dS = exp(scale q_t.k_s - lse_t) (dout_t.v_s - D_t);   dq_t += scale * sum_s dS k_s.
__global__ void attention_backward_flash_dq_kernel(float* dq_all, const float* dout, const float* q_all,
                                                   const float* k_all, const float* v_all, const float* lse,
                                                   const float* D, FlashDims dims) {
  extern __shared__ float smem[];
  const int HS = dims.HS;
  const int stride = HS + 1;
  float* q_s = smem;                        // (kBlockRows, stride): this block's queries
  float* do_s = q_s + kBlockRows * stride;  // (kBlockRows, stride): their output gradients
  float* k_s = do_s + kBlockRows * stride;  // (kTile, stride): the current key tile
  float* v_s = k_s + kTile * stride;        // (kTile, stride): its values
  const int q0 = blockIdx.x * kBlockRows, h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int t = q0 + warp;
  const bool row_valid = t < dims.Tq;  // warp-uniform
  const int64_t last = t + dims.delta;
  const int64_t q_off = static_cast<int64_t>(b) * dims.Tq * dims.ldq + static_cast<int64_t>(h) * HS;
  const int64_t kv_off = static_cast<int64_t>(b) * dims.Tk * dims.ldkv + static_cast<int64_t>(h) * HS;
  const float* q = q_all + q_off;
  const float* k = k_all + kv_off;
  const float* v = v_all + kv_off;
  const float* dout_bh = dout + static_cast<int64_t>(b) * dims.Tq * dims.C + static_cast<int64_t>(h) * HS;
  const int64_t lse_off = (static_cast<int64_t>(b) * dims.NH + h) * dims.Tq;
  const float lse_t = row_valid ? lse[lse_off + t] : 0.0f;
  const float D_t = row_valid ? D[lse_off + t] : 0.0f;
  load_rows(q_s, stride, q, dims.ldq, q0, kBlockRows, dims.Tq, HS);
  load_rows(do_s, stride, dout_bh, dims.C, q0, kBlockRows, dims.Tq, HS);

  float acc_dq[kDimsPerLane] = {};  // sum_s dS[t,s] k_s, channel lane + 32 r (scale applied at the end)
  const int key_end = dims.key_end(q0 + kBlockRows);
  for (int k0 = 0; k0 < key_end; k0 += kTile) {
    __syncthreads();
    load_rows(k_s, stride, k, dims.ldkv, k0, kTile, dims.Tk, HS);
    load_rows(v_s, stride, v, dims.ldkv, k0, kTile, dims.Tk, HS);
    __syncthreads();
    if (row_valid && k0 <= last) {  // warp-uniform
      const int s = k0 + lane;
      float dS = 0.0f;
      if (s <= last && s < dims.Tk) {  // the causal mask, and the block's end
        const float P = expf(dims.scale * smem_dot(q_s + warp * stride, k_s + lane * stride, HS) - lse_t);
        const float dP = smem_dot(do_s + warp * stride, v_s + lane * stride, HS);
        dS = P * (dP - D_t);
      }
      const int keys =
          static_cast<int>(min(static_cast<int64_t>(kTile), min(last + 1, static_cast<int64_t>(dims.Tk)) - k0));
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
  float* dq_t = dq_all + q_off + static_cast<int64_t>(t) * dims.ldq;  // row t of dq, the += rule
#pragma unroll
  for (int r = 0; r < kDimsPerLane; r++) {
    const int d = lane + r * kWarpSize;
    if (d < HS) dq_t[d] += dims.scale * acc_dq[r];
  }
}

// The merge (attention_merge): one warp per (b, t, h) row, num_rows = B*T*NH, row = (b*T + t)*NH + h.
// lse_new = max + log1p(exp(-|lse_a - lse_b|)); out = exp(lse_a - lse_new) out + exp(lse_b - lse_new) out_part.
__global__ void attention_merge_kernel(float* out, float* lse, const float* out_part, const float* lse_part,
                                       int64_t num_rows, int T, int C, int NH, int HS) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kBlockRows + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= num_rows) return;  // whole warps only
  const int h = static_cast<int>(row % NH);
  const int64_t bt = row / NH;  // b * T + t
  const int64_t b = bt / T, t = bt % T;
  const int64_t li = (b * NH + h) * T + t;
  const float lse_a = lse[li], lse_b = lse_part[li];
  if (lse_b == -INFINITY) return;  // an empty part: nothing to add (warp-uniform)
  const float lse_new = fmaxf(lse_a, lse_b) + log1pf(expf(-fabsf(lse_a - lse_b)));
  const float w_a = expf(lse_a - lse_new), w_b = expf(lse_b - lse_new);
  const int64_t off = bt * C + static_cast<int64_t>(h) * HS;
  for (int d = lane; d < HS; d += kWarpSize) out[off + d] = w_a * out[off + d] + w_b * out_part[off + d];
  __syncwarp();  // every lane has read lse[li] before lane 0 overwrites it
  if (lane == 0) lse[li] = lse_new;
}

// The grid of the three tiled kernels: x = row blocks of kBlockRows (rows: query or key rows), y = heads,
// z = sequences. Throws if B or NH exceed gridDim's y/z limit of 65535 (never in GPT-2: NH <= 25, B in the tens).
dim3 flash_grid(const char* op, int B, int rows, int NH) {
  SL_CHECK(NH <= 65535 && B <= 65535, "%s: B=%d and NH=%d must be <= 65535 (CUDA grid y/z limit)", op, B, NH);
  return dim3(static_cast<unsigned int>(ceil_div(rows, kBlockRows)), static_cast<unsigned int>(NH),
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

FlashDims flash_dims(int Tq, int Tk, int C, int NH, int64_t ldq, int64_t ldkv, int64_t delta) {
  const int HS = C / NH;
  return {Tq, Tk, C, NH, HS, ldq, ldkv, delta, 1.0f / std::sqrt(static_cast<float>(HS))};  // as the CPU twin
}

// The forward of both ops: out (B,Tq,C), lse (B,NH,Tq) written. No scratch.
void flash_forward(const char* op, float* out, float* lse, const float* q, const float* k, const float* v, int B,
                   const FlashDims& dims) {
  if (B == 0 || dims.Tq == 0 || dims.Tk == 0) return;
  check_head_size(op, dims.C, dims.NH);
  attention_forward_flash_kernel<<<flash_grid(op, B, dims.Tq, dims.NH), kThreads, smem_bytes(dims.HS),
                                   kDefaultStream>>>(out, lse, q, k, v, dims);
  SL_CUDA_CHECK_LAST();
}

// The backward of both ops: dq, dk, dv +=; dout, out (B,Tq,C), lse (B,NH,Tq) read. Scratch: D (B,NH,Tq) fp32 in
// the context's AttentionRowDot buffer (Workspace, kept for the next call).
void flash_backward(const char* op, float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                    const float* v, const float* out, const float* lse, int B, const FlashDims& dims) {
  if (B == 0 || dims.Tq == 0 || dims.Tk == 0) return;
  check_head_size(op, dims.C, dims.NH);
  const int64_t num_rows = static_cast<int64_t>(B) * dims.Tq * dims.NH;
  float* D = static_cast<float*>(scratch(Scratch::AttentionRowDot, static_cast<size_t>(num_rows) * sizeof(float)));
  const int64_t row_blocks = ceil_div(num_rows, kBlockRows);
  SL_CHECK(row_blocks <= INT32_MAX, "%s: %lld rows need more than 2^31-1 blocks", op, static_cast<long long>(num_rows));
  attention_flash_row_dot_kernel<<<static_cast<unsigned int>(row_blocks), kThreads, 0, kDefaultStream>>>(D, dout, out,
                                                                                                         num_rows,
                                                                                                         dims.Tq,
                                                                                                         dims.C,
                                                                                                         dims.NH,
                                                                                                         dims.HS);
  SL_CUDA_CHECK_LAST();
  attention_backward_flash_dkdv_kernel<<<flash_grid(op, B, dims.Tk, dims.NH), kThreads, smem_bytes(dims.HS),
                                         kDefaultStream>>>(dk, dv, dout, q, k, v, lse, D, dims);
  SL_CUDA_CHECK_LAST();
  attention_backward_flash_dq_kernel<<<flash_grid(op, B, dims.Tq, dims.NH), kThreads, smem_bytes(dims.HS),
                                       kDefaultStream>>>(dq, dout, q, k, v, lse, D, dims);
  SL_CUDA_CHECK_LAST();
}
}  // namespace

// out (B,T,C), lse (B,NH,T) written; qkv (B,T,3C) read. No scratch.
void attention_forward_flash(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  flash_forward(__func__, out, lse, qkv, qkv + C, qkv + 2 * C, B, flash_dims(T, T, C, NH, C3, C3, 0));
}

// dqkv (B,T,3C) +=; dout, out (B,T,C), qkv (B,T,3C), lse (B,NH,T) read.
void attention_backward_flash(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                              int B, int T, int C, int NH) {
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  flash_backward(__func__, dqkv, dqkv + C, dqkv + 2 * C, dout, qkv, qkv + C, qkv + 2 * C, out, lse, B,
                 flash_dims(T, T, C, NH, C3, C3, 0));
}

// out (B,Tq,C), lse (B,NH,Tq) written; q (B,Tq,C), kv (B,Tk,2C) read.
void attention_forward_block(float* out, float* lse, const float* q, const float* kv, int B, int Tq, int Tk, int C,
                             int NH, int q_offset, int kv_offset) {
  flash_forward(__func__, out, lse, q, kv, kv + C, B,
                flash_dims(Tq, Tk, C, NH, C, 2 * static_cast<int64_t>(C), static_cast<int64_t>(q_offset) - kv_offset));
}

// dq (B,Tq,C), dkv (B,Tk,2C) +=; the rest read.
void attention_backward_block(float* dq, float* dkv, const float* dout, const float* q, const float* kv,
                              const float* out, const float* lse, int B, int Tq, int Tk, int C, int NH, int q_offset,
                              int kv_offset) {
  flash_backward(__func__, dq, dkv, dkv + C, dout, q, kv, kv + C, out, lse, B,
                 flash_dims(Tq, Tk, C, NH, C, 2 * static_cast<int64_t>(C), static_cast<int64_t>(q_offset) - kv_offset));
}

// out (B,T,C), lse (B,NH,T) updated in place; out_part, lse_part read.
void attention_merge(float* out, float* lse, const float* out_part, const float* lse_part, int B, int T, int C,
                     int NH) {
  if (B == 0 || T == 0) return;
  const int64_t num_rows = static_cast<int64_t>(B) * T * NH;
  const int64_t row_blocks = ceil_div(num_rows, kBlockRows);
  SL_CHECK(row_blocks <= INT32_MAX, "%s: %lld rows need more than 2^31-1 blocks", __func__,
           static_cast<long long>(num_rows));
  attention_merge_kernel<<<static_cast<unsigned int>(row_blocks), kThreads, 0, kDefaultStream>>>(out, lse, out_part,
                                                                                                 lse_part, num_rows, T,
                                                                                                 C, NH, C / NH);
  SL_CUDA_CHECK_LAST();
}

}  // namespace scalelab::cuda
