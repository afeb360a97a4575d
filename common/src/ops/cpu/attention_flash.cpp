// attention_flash.cpp — CPU twin of the memory-efficient ("flash-style") causal self-attention:
// scalelab::cpu::attention_forward_flash / attention_backward_flash (contract: scalelab/ops/ops.h). Same math as
// cpu::attention_forward/backward (attention.cpp) without the (B,NH,T,T) scores: an online softmax over
// key tiles (Dao et al. 2022, "FlashAttention", arXiv:2205.14135, Alg. 1; Milakov & Gimelshein 2018,
// arXiv:1805.02867) saves only lse (B,NH,T), and the backward recomputes P = exp(S - lse) tile by tile (Alg. 2).
// It is the oracle of the CUDA twin and is tiled exactly as that kernel is, so the tiling is tested here.
// The block ops of context parallelism (attention_forward_block / attention_backward_block, a query block
// against a key/value block at absolute offsets) and their merge (attention_merge) run the same loops.
// CUDA twin: common/src/ops/cuda/attention_flash.cu   tests: tests/common/ops/test_attention_flash.cpp (vs attention.cpp),
// tests/common/ops/test_attention_block.cpp (blocks merged vs the dense op), tests/common/ops/test_attention_flash_cuda.cpp
// (CUDA vs this file)
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

namespace {
// Where the heads sit, for the dense op and the block op alike. Row t of head h of sequence b of q is at
// q + (b*Tq + t)*ldq + h*HS, row s of k (and of v) at k + (b*Tk + s)*ldkv + h*HS; the gradients dq, dk, dv
// have the layout of q, k, v. The dense op reads q, k, v inside qkv (B,T,3C): Tq = Tk = T, ldq = ldkv = 3C,
// delta = 0. The block op reads q (B,Tq,C) and kv (B,Tk,2C) = k | v: ldq = C, ldkv = 2C.
// The causal mask by absolute positions: query t sits at q_offset + t, key s at kv_offset + s, and s is
// visible to t iff kv_offset + s <= q_offset + t, i.e. s <= t + delta with delta = q_offset - kv_offset.
struct FlashLayout {
  int B, Tq, Tk, C, NH;
  int64_t ldq, ldkv;  // floats between consecutive rows of q, and of k and v
  int64_t delta;      // q_offset - kv_offset
};

// The forward of both ops: out (B,Tq,C) (ld C), lse (B,NH,Tq). See attention_forward_flash below for the math.
// A row that sees no key of the block (t + delta < 0) gets out 0 and lse -inf: an empty sum (exp(lse) = 0),
// which attention_merge adds as nothing.
void flash_forward(float* out, float* lse, const float* q_all, const float* k_all, const float* v_all,
                   const FlashLayout& L) {
  if (L.B <= 0 || L.Tq <= 0 || L.Tk <= 0) return;
  const int C = L.C, NH = L.NH, Tq = L.Tq, Tk = L.Tk;
  const int HS = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));  // the 1/sqrt(d_k) of Vaswani et al., Eq. 1
  const int num_qblocks = (Tq + kBlockRows - 1) / kBlockRows;
  // Per thread: acc (kBlockRows, HS), m and l (kBlockRows each), p (kTile).
  ThreadScratch scratch(int64_t{kBlockRows} * HS + 2 * kBlockRows + kTile);
#pragma omp parallel for collapse(3) schedule(dynamic) num_threads(scratch.num_threads)
  for (int b = 0; b < L.B; b++) {
    for (int h = 0; h < NH; h++) {
      for (int qb = 0; qb < num_qblocks; qb++) {
        float* acc = scratch.slice();      // (kBlockRows, HS): unnormalised sum_s p_s v_s per row
        float* m = acc + kBlockRows * HS;  // (kBlockRows): running max of the scores seen
        float* l = m + kBlockRows;         // (kBlockRows): running sum of exp(S - m)
        float* p = l + kBlockRows;         // (kTile): this tile's scores, then their exps
        const float* q = q_all + static_cast<int64_t>(b) * Tq * L.ldq + h * HS;   // (Tq,HS), ld ldq
        const float* k = k_all + static_cast<int64_t>(b) * Tk * L.ldkv + h * HS;  // (Tk,HS), ld ldkv
        const float* v = v_all + static_cast<int64_t>(b) * Tk * L.ldkv + h * HS;  // (Tk,HS), ld ldkv
        const int q0 = qb * kBlockRows;
        const int rows = std::min(kBlockRows, Tq - q0);  // query rows [q0, q0 + rows)
        std::fill(acc, acc + kBlockRows * HS, 0.0f);
        std::fill(m, m + kBlockRows, -std::numeric_limits<float>::infinity());
        std::fill(l, l + kBlockRows, 0.0f);
        // Key tiles up to the last key the block's last row sees (causality): keys [0, key_end).
        const int64_t key_end = std::min<int64_t>(Tk, q0 + rows + L.delta);
        for (int k0 = 0; k0 < key_end; k0 += kTile) {
          for (int r = 0; r < rows; r++) {
            const int t = q0 + r;
            const int64_t last = t + L.delta;  // the last key row t sees
            if (k0 > last) continue;           // every key of the tile is in row t's future: nothing changes
            // visible keys s = k0 .. k0+keys-1 (s <= last, s < Tk)
            const int keys = static_cast<int>(std::min<int64_t>(kTile, std::min<int64_t>(last + 1, Tk) - k0));
            float m_tile = -std::numeric_limits<float>::infinity();
            for (int j = 0; j < keys; j++) {
              p[j] = scale * dot(q + int64_t{t} * L.ldq, k + int64_t{k0 + j} * L.ldkv, HS);
              m_tile = std::max(m_tile, p[j]);
            }
            const float m_new = std::max(m[r], m_tile);  // finite: keys >= 1
            const float alpha = std::exp(m[r] - m_new);  // 0 on the row's first tile (m = -inf)
            float tile_sum = 0.0f;
            for (int j = 0; j < keys; j++) {
              p[j] = std::exp(p[j] - m_new);
              tile_sum += p[j];
            }
            l[r] = alpha * l[r] + tile_sum;
            float* acc_r = acc + r * HS;
            for (int d = 0; d < HS; d++) {
              float o = 0.0f;
              for (int j = 0; j < keys; j++) o += p[j] * v[int64_t{k0 + j} * L.ldkv + d];
              acc_r[d] = alpha * acc_r[d] + o;
            }
            m[r] = m_new;
          }
        }
        for (int r = 0; r < rows; r++) {
          const int t = q0 + r;
          float* out_t = out + (static_cast<int64_t>(b) * Tq + t) * C + h * HS;
          float& lse_t = lse[(static_cast<int64_t>(b) * NH + h) * Tq + t];
          if (l[r] == 0.0f) {  // no visible key (only in the block op): the empty sum
            std::fill(out_t, out_t + HS, 0.0f);
            lse_t = -std::numeric_limits<float>::infinity();
            continue;
          }
          const float inv_l = 1.0f / l[r];  // l >= 1: the max term contributes exp(0)
          for (int d = 0; d < HS; d++) out_t[d] = acc[r * HS + d] * inv_l;
          lse_t = m[r] + std::log(l[r]);
        }
      }
    }
  }
}

// The backward of both ops: dq (layout of q), dk, dv (layout of k, v) +=; dout, out (B,Tq,C); lse (B,NH,Tq),
// the row's FINAL lse (over every key it sees, not only this block's). See attention_backward_flash below.
void flash_backward(float* dq_all, float* dk_all, float* dv_all, const float* dout, const float* q_all,
                    const float* k_all, const float* v_all, const float* out, const float* lse, const FlashLayout& L) {
  if (L.B <= 0 || L.Tq <= 0 || L.Tk <= 0) return;
  const int C = L.C, NH = L.NH, Tq = L.Tq, Tk = L.Tk, B = L.B;
  const int HS = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int num_qblocks = (Tq + kBlockRows - 1) / kBlockRows;  // query blocks (pass 3)
  const int num_kblocks = (Tk + kBlockRows - 1) / kBlockRows;  // key blocks (pass 2)

  // Pass 1: D (B,NH,Tq) = rowsum(dout * out) per head. O(B NH Tq) scratch, as the CUDA twin's.
  Tensor D_buf = Tensor::empty({B, NH, Tq}, DType::F32, Device::CPU, MemCategory::Workspace);
  float* D = D_buf.data<float>();
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < Tq; t++) {
      const int64_t row = (static_cast<int64_t>(b) * Tq + t) * C;
      for (int h = 0; h < NH; h++)
        D[(static_cast<int64_t>(b) * NH + h) * Tq + t] = dot(dout + row + h * HS, out + row + h * HS, HS);
    }
  }

  // Per thread: two (kBlockRows, HS) accumulators (dk and dv in pass 2; dq uses the first in pass 3).
  ThreadScratch scratch(2 * int64_t{kBlockRows} * HS);

  // Pass 2: dk, dv. Block (b, h, kb) owns keys [k0, k0 + keys); queries t >= s - delta see key s, so the
  // query tiles start at the kTile-aligned tile holding the first query that sees key k0 (as the CUDA
  // kernel's loop does).
#pragma omp parallel for collapse(3) schedule(dynamic) num_threads(scratch.num_threads)
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      for (int kb = 0; kb < num_kblocks; kb++) {
        float* acc_dk = scratch.slice();           // (kBlockRows, HS): sum_t dS[t,s] q_t (scale applied at the end)
        float* acc_dv = acc_dk + kBlockRows * HS;  // (kBlockRows, HS): sum_t P[t,s] dout_t
        const int64_t q_off = static_cast<int64_t>(b) * Tq * L.ldq + h * HS;
        const int64_t kv_off = static_cast<int64_t>(b) * Tk * L.ldkv + h * HS;
        const float* q = q_all + q_off;   // (Tq,HS), ld ldq
        const float* k = k_all + kv_off;  // (Tk,HS), ld ldkv
        const float* v = v_all + kv_off;
        const float* dout_bh = dout + static_cast<int64_t>(b) * Tq * C + h * HS;  // (Tq,HS), ld C
        const float* lse_bh = lse + (static_cast<int64_t>(b) * NH + h) * Tq;      // (Tq)
        const float* D_bh = D + (static_cast<int64_t>(b) * NH + h) * Tq;          // (Tq)
        const int k0 = kb * kBlockRows;
        const int keys = std::min(kBlockRows, Tk - k0);
        std::fill(acc_dk, acc_dk + 2 * kBlockRows * HS, 0.0f);
        const int64_t first_query = std::max<int64_t>(0, k0 - L.delta);  // the first query that sees key k0
        for (int64_t i0 = (first_query / kTile) * kTile; i0 < Tq; i0 += kTile) {
          for (int jj = 0; jj < keys; jj++) {
            const int s = k0 + jj;
            float* dk_s = acc_dk + jj * HS;
            float* dv_s = acc_dv + jj * HS;
            for (int ii = 0; ii < kTile; ii++) {
              const int64_t t = i0 + ii;
              if (t + L.delta < s || t >= Tq) continue;  // masked or past the block's queries: P = dS = 0
              const float P = std::exp(scale * dot(q + t * L.ldq, k + int64_t{s} * L.ldkv, HS) - lse_bh[t]);
              const float dP = dot(dout_bh + t * C, v + int64_t{s} * L.ldkv, HS);
              const float dS = P * (dP - D_bh[t]);
              for (int d = 0; d < HS; d++) {
                dv_s[d] += P * dout_bh[t * C + d];
                dk_s[d] += dS * q[t * L.ldq + d];
              }
            }
          }
        }
        float* dk = dk_all + kv_off;  // (Tk,HS), ld ldkv
        float* dv = dv_all + kv_off;
        for (int jj = 0; jj < keys; jj++) {
          const int64_t s = k0 + jj;
          for (int d = 0; d < HS; d++) {
            dk[s * L.ldkv + d] += scale * acc_dk[jj * HS + d];
            dv[s * L.ldkv + d] += acc_dv[jj * HS + d];
          }
        }
      }
    }
  }

  // Pass 3: dq. Block (b, h, qb) owns queries [q0, q0 + rows); key tiles [0, key_end) as in the forward.
#pragma omp parallel for collapse(3) schedule(dynamic) num_threads(scratch.num_threads)
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      for (int qb = 0; qb < num_qblocks; qb++) {
        float* acc_dq = scratch.slice();  // (kBlockRows, HS): sum_s dS[t,s] k_s (scale applied at the end)
        const int64_t q_off = static_cast<int64_t>(b) * Tq * L.ldq + h * HS;
        const int64_t kv_off = static_cast<int64_t>(b) * Tk * L.ldkv + h * HS;
        const float* q = q_all + q_off;
        const float* k = k_all + kv_off;
        const float* v = v_all + kv_off;
        const float* dout_bh = dout + static_cast<int64_t>(b) * Tq * C + h * HS;
        const float* lse_bh = lse + (static_cast<int64_t>(b) * NH + h) * Tq;
        const float* D_bh = D + (static_cast<int64_t>(b) * NH + h) * Tq;
        const int q0 = qb * kBlockRows;
        const int rows = std::min(kBlockRows, Tq - q0);
        std::fill(acc_dq, acc_dq + kBlockRows * HS, 0.0f);
        const int64_t key_end = std::min<int64_t>(Tk, q0 + rows + L.delta);
        for (int k0 = 0; k0 < key_end; k0 += kTile) {
          for (int r = 0; r < rows; r++) {
            const int t = q0 + r;
            float* dq_t = acc_dq + r * HS;
            for (int j = 0; j < kTile; j++) {
              const int s = k0 + j;
              if (s > t + L.delta || s >= Tk) break;  // the mask, and the block's end
              const float P = std::exp(scale * dot(q + int64_t{t} * L.ldq, k + int64_t{s} * L.ldkv, HS) - lse_bh[t]);
              const float dP = dot(dout_bh + int64_t{t} * C, v + int64_t{s} * L.ldkv, HS);
              const float dS = P * (dP - D_bh[t]);
              for (int d = 0; d < HS; d++) dq_t[d] += dS * k[int64_t{s} * L.ldkv + d];
            }
          }
        }
        float* dq = dq_all + q_off;
        for (int r = 0; r < rows; r++)
          for (int d = 0; d < HS; d++) dq[int64_t{q0 + r} * L.ldq + d] += scale * acc_dq[r * HS + d];
      }
    }
  }
}
}  // namespace

// qkv (B,T,3C): row (b,t) = q | k | v, head h at channels [h*HS, (h+1)*HS) of each (as attention.cpp).
// out (B,T,C) = softmax(S) @ v per head, S[t,s] = scale * q_t . k_s for s <= t (causal), scale = 1/sqrt(HS).
// lse (B,NH,T) = log sum_{s<=t} exp(S[t,s]), natural log: the softmax is P[t,s] = exp(S[t,s] - lse[t]).
// Online softmax (FlashAttention Alg. 1, lines 8-12), per query row t, over key tiles [k0, k0+kTile):
//   m_new = max(m, max_s S[t,s]);   alpha = exp(m - m_new)    (rescales what was summed against m)
//   p_s = exp(S[t,s] - m_new);      l = alpha * l + sum_s p_s;   acc = alpha * acc + sum_s p_s v_s
// and at the end out_t = acc / l, lse_t = m + log(l). A row's first tile holds a key it sees, so m is finite
// from then on and alpha = exp(-inf) = 0 there (acc, l start at 0). Keys s > t get p_s = 0 (the mask, exactly).
void attention_forward_flash(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
  flash_forward(out, lse, qkv, qkv + C, qkv + 2 * C, {B, T, T, C, NH, 3 * int64_t{C}, 3 * int64_t{C}, 0});
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
  flash_backward(dqkv, dqkv + C, dqkv + 2 * C, dout, qkv, qkv + C, qkv + 2 * C, out, lse,
                 {B, T, T, C, NH, 3 * int64_t{C}, 3 * int64_t{C}, 0});
}

// The block ops (context parallelism): the same loops on q (B,Tq,C) and kv (B,Tk,2C) = k | v, the mask by
// absolute positions (FlashLayout::delta). Every P uses the lse given: the block's own in the forward, the
// row's final one in the backward, which makes the backward this block's exact share of the full gradients
// (Liu et al. 2023, "Ring Attention", arXiv:2310.01889, Sec. 3; FlashAttention Alg. 2 run on one key block).
void attention_forward_block(float* out, float* lse, const float* q, const float* kv, int B, int Tq, int Tk, int C,
                             int NH, int q_offset, int kv_offset) {
  flash_forward(out, lse, q, kv, kv + C, {B, Tq, Tk, C, NH, C, 2 * int64_t{C}, int64_t{q_offset} - kv_offset});
}

void attention_backward_block(float* dq, float* dkv, const float* dout, const float* q, const float* kv,
                              const float* out, const float* lse, int B, int Tq, int Tk, int C, int NH, int q_offset,
                              int kv_offset) {
  flash_backward(dq, dkv, dkv + C, dout, q, kv, kv + C, out, lse,
                 {B, Tq, Tk, C, NH, C, 2 * int64_t{C}, int64_t{q_offset} - kv_offset});
}

// The online-softmax merge (FlashAttention Alg. 1, lines 10-12, on two finished partials), per (b, h, t) row:
//   lse_new = log(exp(lse_a) + exp(lse_b)) = max + log1p(exp(-|lse_a - lse_b|))
//   out_new = exp(lse_a - lse_new) * out_a + exp(lse_b - lse_new) * out_b
// A part with lse_b = -inf (it saw no key) changes nothing; an accumulator with lse_a = -inf takes the part
// (weight exp(-inf) = 0 on out_a, which must be finite: start from zeros).
void attention_merge(float* out, float* lse, const float* out_part, const float* lse_part, int B, int T, int C,
                     int NH) {
  const int HS = C / NH;
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      for (int h = 0; h < NH; h++) {
        const int64_t li = (static_cast<int64_t>(b) * NH + h) * T + t;
        const float lse_a = lse[li], lse_b = lse_part[li];
        if (lse_b == -std::numeric_limits<float>::infinity()) continue;  // an empty part: nothing to add
        const float lse_new = std::max(lse_a, lse_b) + std::log1p(std::exp(-std::fabs(lse_a - lse_b)));
        const float w_a = std::exp(lse_a - lse_new), w_b = std::exp(lse_b - lse_new);
        const int64_t row = (static_cast<int64_t>(b) * T + t) * C + h * HS;
        for (int d = 0; d < HS; d++) out[row + d] = w_a * out[row + d] + w_b * out_part[row + d];
        lse[li] = lse_new;
      }
    }
  }
}

}  // namespace scalelab::cpu
