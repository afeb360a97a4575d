// attention_flash.cpp — CPU twin of the memory-efficient ("flash-style") causal self-attention:
// scalelab::cpu::attention_forward_flash / attention_backward_flash (contract: scalelab/ops/ops.h). Same math as
// cpu::attention_forward/backward (attention.cpp) without the (B,NH,T,T) scores: an online softmax over
// key tiles (Dao et al. 2022, "FlashAttention", arXiv:2205.14135, Alg. 1; Milakov & Gimelshein 2018,
// arXiv:1805.02867) saves only lse (B,NH,T), and the backward recomputes P = exp(S - lse) tile by tile (Alg. 2).
// It is the oracle of the CUDA twin and is tiled exactly as that kernel is, so the tiling is tested here.
// CUDA twin: common/src/ops/cuda/attention_flash.cu   tests: tests/common/ops/test_attention_flash.cpp (vs attention.cpp),
// tests/common/ops/test_attention_flash_cuda.cpp (CUDA vs this file)
#include <omp.h>  // defines: omp_get_max_threads, omp_get_thread_num

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "scalelab/core/allocator.h"  // defines: Device, MemCategory
#include "scalelab/ops/ops.h"         // defines: the cpu:: declarations implemented here
#include "scalelab/core/tensor.h"     // defines: Tensor (scratch, counted by the allocator as Workspace)

namespace scalelab::cpu {

namespace {
// The CUDA kernel's tile sizes (attention_flash.cu), so that this file runs its loops in the same shape:
//   kBlockRows: rows one block owns: query rows (forward, dQ) or key rows (dK, dV); one warp per row there.
//   kTile:      the inner tile: keys (forward, dQ) or queries (dK, dV); one lane per entry there.
constexpr int kBlockRows = 8;
constexpr int kTile = 32;

// Dot product of two length-n rows, summed in order d = 0..n-1 (as one CUDA lane sums it).
inline float dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int d = 0; d < n; d++) s += a[d] * b[d];
  return s;
}

// Per-thread scratch as one fp32 Workspace tensor of num_threads slices: it goes through the counting
// allocator, so tests see every byte these ops use (O(threads * kBlockRows * HS), never O(T^2)).
// Allocated before the parallel region, so an OutOfMemory (simulated cap) is thrown on the caller's thread.
struct ThreadScratch {
  int num_threads;
  int64_t floats_per_thread;
  Tensor buf;  // (num_threads * floats_per_thread) fp32
  ThreadScratch(int64_t per_thread)
      : num_threads(omp_get_max_threads()),
        floats_per_thread(per_thread),
        buf(Tensor::empty({int64_t{num_threads} * per_thread}, DType::F32, Device::CPU, MemCategory::Workspace)) {}
  float* slice() { return buf.data<float>() + int64_t{omp_get_thread_num()} * floats_per_thread; }
};
}  // namespace

// qkv (B,T,3C): row (b,t) = q | k | v, head h at channels [h*HS, (h+1)*HS) of each (as attention.cpp).
// out (B,T,C) = softmax(S) @ v per head, S[t,s] = scale * q_t . k_s for s <= t (causal), scale = 1/sqrt(HS).
// lse (B,NH,T) = log sum_{s<=t} exp(S[t,s]), natural log: the softmax is P[t,s] = exp(S[t,s] - lse[t]).
// Online softmax (FlashAttention Alg. 1, lines 8-12), per query row t, over key tiles [k0, k0+kTile):
//   m_new = max(m, max_s S[t,s]);   alpha = exp(m - m_new)    (rescales what was summed against m)
//   p_s = exp(S[t,s] - m_new);      l = alpha * l + sum_s p_s;   acc = alpha * acc + sum_s p_s v_s
// and at the end out_t = acc / l, lse_t = m + log(l). Tile 0 holds key 0 <= t, so m is finite from the first
// tile on and alpha = exp(-inf) = 0 there (acc, l start at 0). Keys s > t get p_s = 0 (the mask, exactly).
void attention_forward_flash(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
  if (B <= 0 || T <= 0) return;
  const int C3 = 3 * C;
  const int HS = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));  // the 1/sqrt(d_k) of Vaswani et al., Eq. 1
  const int num_qblocks = (T + kBlockRows - 1) / kBlockRows;
  // Per thread: acc (kBlockRows, HS), m and l (kBlockRows each), p (kTile).
  ThreadScratch scratch(int64_t{kBlockRows} * HS + 2 * kBlockRows + kTile);
#pragma omp parallel for collapse(3) schedule(dynamic) num_threads(scratch.num_threads)
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      for (int qb = 0; qb < num_qblocks; qb++) {
        float* acc = scratch.slice();      // (kBlockRows, HS): unnormalised sum_s p_s v_s per row
        float* m = acc + kBlockRows * HS;  // (kBlockRows): running max of the scores seen
        float* l = m + kBlockRows;         // (kBlockRows): running sum of exp(S - m)
        float* p = l + kBlockRows;         // (kTile): this tile's scores, then their exps
        const float* q = qkv + static_cast<int64_t>(b) * T * C3 + h * HS;  // (T,HS), ld 3C
        const float* k = q + C;                                            // (T,HS), ld 3C
        const float* v = q + 2 * C;                                        // (T,HS), ld 3C
        const int q0 = qb * kBlockRows;
        const int rows = std::min(kBlockRows, T - q0);  // query rows [q0, q0 + rows)
        std::fill(acc, acc + kBlockRows * HS, 0.0f);
        std::fill(m, m + kBlockRows, -std::numeric_limits<float>::infinity());
        std::fill(l, l + kBlockRows, 0.0f);
        // Key tiles up to the block's last row (causality): keys [0, q0 + rows).
        for (int k0 = 0; k0 < q0 + rows; k0 += kTile) {
          for (int r = 0; r < rows; r++) {
            const int t = q0 + r;
            if (k0 > t) continue;  // every key of the tile is in row t's future: nothing changes
            const int keys = std::min(kTile, t + 1 - k0);  // visible keys s = k0 .. k0+keys-1 (s <= t < T)
            float m_tile = -std::numeric_limits<float>::infinity();
            for (int j = 0; j < keys; j++) {
              p[j] = scale * dot(q + int64_t{t} * C3, k + int64_t{k0 + j} * C3, HS);
              m_tile = std::max(m_tile, p[j]);
            }
            const float m_new = std::max(m[r], m_tile);  // finite: keys >= 1
            const float alpha = std::exp(m[r] - m_new);  // 0 on the first tile (m = -inf)
            float tile_sum = 0.0f;
            for (int j = 0; j < keys; j++) {
              p[j] = std::exp(p[j] - m_new);
              tile_sum += p[j];
            }
            l[r] = alpha * l[r] + tile_sum;
            float* acc_r = acc + r * HS;
            for (int d = 0; d < HS; d++) {
              float o = 0.0f;
              for (int j = 0; j < keys; j++) o += p[j] * v[int64_t{k0 + j} * C3 + d];
              acc_r[d] = alpha * acc_r[d] + o;
            }
            m[r] = m_new;
          }
        }
        for (int r = 0; r < rows; r++) {
          const int t = q0 + r;
          const float inv_l = 1.0f / l[r];  // l >= 1: the max term contributes exp(0)
          float* out_t = out + (static_cast<int64_t>(b) * T + t) * C + h * HS;
          for (int d = 0; d < HS; d++) out_t[d] = acc[r * HS + d] * inv_l;
          lse[(static_cast<int64_t>(b) * NH + h) * T + t] = m[r] + std::log(l[r]);
        }
      }
    }
  }
}

// Gradients of the forward above (FlashAttention Alg. 2 and Appendix B.2), recomputing per tile
//   S[t,s] = scale * q_t . k_s,  P[t,s] = exp(S[t,s] - lse_t) (0 for s > t),  dP[t,s] = dout_t . v_s,
//   dS[t,s] = P[t,s] * (dP[t,s] - D_t)  with  D_t = sum_s P[t,s] dP[t,s] = dout_t . out_t   (Sec. 3.1 / B.2),
//   dv_s += sum_{t>=s} P[t,s] dout_t;   dk_s += scale * sum_{t>=s} dS[t,s] q_t;
//   dq_t += scale * sum_{s<=t} dS[t,s] k_s.
// Three passes, as the CUDA twin's three kernels: D; dk and dv per block of kBlockRows keys (looping over
// query tiles); dq per block of kBlockRows queries (looping over key tiles). Each block owns its rows of
// dqkv, so no two threads write one element and the result does not depend on the thread count.
// dqkv (B,T,3C) += (the ops.h rule); dout, out (B,T,C); qkv (B,T,3C); lse (B,NH,T) from the forward.
void attention_backward_flash(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                              int B, int T, int C, int NH) {
  if (B <= 0 || T <= 0) return;
  const int C3 = 3 * C;
  const int HS = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int num_blocks = (T + kBlockRows - 1) / kBlockRows;  // key blocks (pass 2) = query blocks (pass 3)

  // Pass 1: D (B,NH,T) = rowsum(dout * out) per head. O(B NH T) scratch, as the CUDA twin's.
  Tensor D_buf = Tensor::empty({B, NH, T}, DType::F32, Device::CPU, MemCategory::Workspace);
  float* D = D_buf.data<float>();
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      const int64_t row = (static_cast<int64_t>(b) * T + t) * C;
      for (int h = 0; h < NH; h++)
        D[(static_cast<int64_t>(b) * NH + h) * T + t] = dot(dout + row + h * HS, out + row + h * HS, HS);
    }
  }

  // Per thread: two (kBlockRows, HS) accumulators (dk and dv in pass 2; dq uses the first in pass 3).
  ThreadScratch scratch(2 * int64_t{kBlockRows} * HS);

  // Pass 2: dk, dv. Block (b, h, kb) owns keys [k0, k0 + keys); queries t >= s see key s, so the query
  // tiles start at the kTile-aligned tile holding k0 (as the CUDA kernel's loop does).
#pragma omp parallel for collapse(3) schedule(dynamic) num_threads(scratch.num_threads)
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      for (int kb = 0; kb < num_blocks; kb++) {
        float* acc_dk = scratch.slice();           // (kBlockRows, HS): sum_t dS[t,s] q_t (scale applied at the end)
        float* acc_dv = acc_dk + kBlockRows * HS;  // (kBlockRows, HS): sum_t P[t,s] dout_t
        const int64_t qkv_off = static_cast<int64_t>(b) * T * C3 + h * HS;
        const float* q = qkv + qkv_off;  // (T,HS), ld 3C
        const float* k = q + C;
        const float* v = q + 2 * C;
        const float* dout_bh = dout + static_cast<int64_t>(b) * T * C + h * HS;  // (T,HS), ld C
        const float* lse_bh = lse + (static_cast<int64_t>(b) * NH + h) * T;      // (T)
        const float* D_bh = D + (static_cast<int64_t>(b) * NH + h) * T;          // (T)
        const int k0 = kb * kBlockRows;
        const int keys = std::min(kBlockRows, T - k0);
        std::fill(acc_dk, acc_dk + 2 * kBlockRows * HS, 0.0f);
        for (int i0 = (k0 / kTile) * kTile; i0 < T; i0 += kTile) {
          for (int jj = 0; jj < keys; jj++) {
            const int s = k0 + jj;
            float* dk_s = acc_dk + jj * HS;
            float* dv_s = acc_dv + jj * HS;
            for (int ii = 0; ii < kTile; ii++) {
              const int t = i0 + ii;
              if (t < s || t >= T) continue;  // masked (t < s) or past the sequence: P = dS = 0
              const float P = std::exp(scale * dot(q + int64_t{t} * C3, k + int64_t{s} * C3, HS) - lse_bh[t]);
              const float dP = dot(dout_bh + int64_t{t} * C, v + int64_t{s} * C3, HS);
              const float dS = P * (dP - D_bh[t]);
              for (int d = 0; d < HS; d++) {
                dv_s[d] += P * dout_bh[int64_t{t} * C + d];
                dk_s[d] += dS * q[int64_t{t} * C3 + d];
              }
            }
          }
        }
        float* dk = dqkv + qkv_off + C;  // (T,HS), ld 3C
        float* dv = dqkv + qkv_off + 2 * C;
        for (int jj = 0; jj < keys; jj++) {
          const int64_t s = k0 + jj;
          for (int d = 0; d < HS; d++) {
            dk[s * C3 + d] += scale * acc_dk[jj * HS + d];
            dv[s * C3 + d] += acc_dv[jj * HS + d];
          }
        }
      }
    }
  }

  // Pass 3: dq. Block (b, h, qb) owns queries [q0, q0 + rows); key tiles [0, q0 + rows) as in the forward.
#pragma omp parallel for collapse(3) schedule(dynamic) num_threads(scratch.num_threads)
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      for (int qb = 0; qb < num_blocks; qb++) {
        float* acc_dq = scratch.slice();  // (kBlockRows, HS): sum_s dS[t,s] k_s (scale applied at the end)
        const int64_t qkv_off = static_cast<int64_t>(b) * T * C3 + h * HS;
        const float* q = qkv + qkv_off;
        const float* k = q + C;
        const float* v = q + 2 * C;
        const float* dout_bh = dout + static_cast<int64_t>(b) * T * C + h * HS;
        const float* lse_bh = lse + (static_cast<int64_t>(b) * NH + h) * T;
        const float* D_bh = D + (static_cast<int64_t>(b) * NH + h) * T;
        const int q0 = qb * kBlockRows;
        const int rows = std::min(kBlockRows, T - q0);
        std::fill(acc_dq, acc_dq + kBlockRows * HS, 0.0f);
        for (int k0 = 0; k0 < q0 + rows; k0 += kTile) {
          for (int r = 0; r < rows; r++) {
            const int t = q0 + r;
            float* dq_t = acc_dq + r * HS;
            for (int j = 0; j < kTile; j++) {
              const int s = k0 + j;
              if (s > t) break;  // the mask; also keeps s < T
              const float P = std::exp(scale * dot(q + int64_t{t} * C3, k + int64_t{s} * C3, HS) - lse_bh[t]);
              const float dP = dot(dout_bh + int64_t{t} * C, v + int64_t{s} * C3, HS);
              const float dS = P * (dP - D_bh[t]);
              for (int d = 0; d < HS; d++) dq_t[d] += dS * k[int64_t{s} * C3 + d];
            }
          }
        }
        float* dq = dqkv + qkv_off;
        for (int r = 0; r < rows; r++)
          for (int d = 0; d < HS; d++) dq[int64_t{q0 + r} * C3 + d] += scale * acc_dq[r * HS + d];
      }
    }
  }
}

}  // namespace scalelab::cpu
