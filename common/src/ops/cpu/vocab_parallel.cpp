// vocab_parallel.cpp — CPU twins of the vocabulary-parallel embedding and cross-entropy pieces (contract:
// scalelab/ops/ops.h, "The vocabulary split across a tensor-parallel group"). A rank holds rows
// [vocab_begin, vocab_begin + Vl) of wte; the collectives between these pieces are the caller's (lab 05).
// CUDA twin: common/src/ops/cuda/vocab_parallel.cu   tests: through lab 05's graded checks against the dense
// model (tests/lab05/test_lab05_np2.cpp, test_lab05_np4.cpp); the CUDA twin against these in
// tests/common/ops/test_ops_cuda.cpp (CudaOps.VocabShard*).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "scalelab/ops/ops.h"  // defines: the cpu:: declarations implemented here (twins.h)

namespace scalelab::cpu {

// out (B,T,C) = (tokens[i] in the rank's rows ? wte_shard[tokens[i] - begin] : 0) + (wpe ? wpe[t] : 0).
void encoder_forward_vocab_shard(float* out, const int32_t* tokens, const float* wte_shard, const float* wpe,
                                 int64_t vocab_begin, int Vl, int B, int T, int C) {
  const int64_t N = static_cast<int64_t>(B) * T;
#pragma omp parallel for schedule(static) if (N * C > 32768)
  for (int64_t i = 0; i < N; i++) {
    const int64_t row = tokens[i] - vocab_begin;
    const float* w = row >= 0 && row < Vl ? wte_shard + row * C : nullptr;  // nullptr: another rank's row
    const float* p = wpe != nullptr ? wpe + static_cast<int64_t>(i % T) * C : nullptr;
    float* o = out + i * C;
    for (int c = 0; c < C; c++) o[c] = (w != nullptr ? w[c] : 0.0f) + (p != nullptr ? p[c] : 0.0f);
  }
}

// dwte_shard (Vl,C) += the rows of dout whose token is in the rank's rows (serial: fixed order, no races,
// as encoder_backward); dwpe (maxT,C) += sum over b of dout[b,t] when given.
void encoder_backward_vocab_shard(float* dwte_shard, float* dwpe, const float* dout, const int32_t* tokens,
                                  int64_t vocab_begin, int Vl, int B, int T, int C) {
  if (dwpe != nullptr) {
#pragma omp parallel for schedule(static) if (static_cast <int64_t>(B) * T * C > 32768)
    for (int t = 0; t < T; t++) {
      float* d = dwpe + static_cast<int64_t>(t) * C;
      for (int b = 0; b < B; b++) {
        const float* g = dout + (static_cast<int64_t>(b) * T + t) * C;
        for (int c = 0; c < C; c++) d[c] += g[c];
      }
    }
  }
  const int64_t N = static_cast<int64_t>(B) * T;
  for (int64_t i = 0; i < N; i++) {
    const int64_t row = tokens[i] - vocab_begin;
    if (row < 0 || row >= Vl) continue;
    float* d = dwte_shard + row * C;
    const float* g = dout + i * C;
    for (int c = 0; c < C; c++) d[c] += g[c];
  }
}

// maxes (N) = max_j logits[i, j] over the rank's Vl columns.
void logits_row_max(float* maxes, const float* logits, int64_t N, int Vl) {
#pragma omp parallel for schedule(static) if (N * Vl > 32768)
  for (int64_t i = 0; i < N; i++) {
    const float* z = logits + i * Vl;
    float m = z[0];
    for (int j = 1; j < Vl; j++) m = std::max(m, z[j]);
    maxes[i] = m;
  }
}

// sumexp (N) = sum_j exp(logits[i,j] - maxes[i]) over the rank's columns; target_logit (N) = logits[i, t - begin]
// when the target t is one of the rank's columns, else 0 (the group's sum then holds it exactly once).
void crossentropy_vocab_shard_partials(float* sumexp, float* target_logit, const float* logits, const float* maxes,
                                       const int32_t* targets, int64_t vocab_begin, int64_t N, int Vl) {
#pragma omp parallel for schedule(static) if (N * Vl > 32768)
  for (int64_t i = 0; i < N; i++) {
    const float* z = logits + i * Vl;
    float s = 0.0f;
    for (int j = 0; j < Vl; j++) s += std::exp(z[j] - maxes[i]);
    sumexp[i] = s;
    const int64_t col = targets[i] - vocab_begin;
    target_logit[i] = col >= 0 && col < Vl ? z[col] : 0.0f;
  }
}

// losses (N) = log(sumexp) + maxes - target_logit, probs (N,Vl) = exp(logits - maxes) / sumexp: maxes,
// sumexp and target_logit are the group's (over all V columns), so every rank's losses are the same.
void crossentropy_vocab_shard_finish(float* losses, float* probs, const float* logits, const float* maxes,
                                     const float* sumexp, const float* target_logit, int64_t N, int Vl) {
#pragma omp parallel for schedule(static) if (N * Vl > 32768)
  for (int64_t i = 0; i < N; i++) {
    const float* z = logits + i * Vl;
    float* p = probs + i * Vl;
    const float inv = 1.0f / sumexp[i];
    for (int j = 0; j < Vl; j++) p[j] = std::exp(z[j] - maxes[i]) * inv;
    losses[i] = std::log(sumexp[i]) + maxes[i] - target_logit[i];
  }
}

// dlogits (N,Vl) = dloss * (probs - onehot(targets - begin)) over the rank's columns; OVERWRITES (may alias probs).
void crossentropy_vocab_shard_backward(float* dlogits, const float* probs, const int32_t* targets, int64_t vocab_begin,
                                       float dloss, int64_t N, int Vl) {
#pragma omp parallel for schedule(static) if (N * Vl > 32768)
  for (int64_t i = 0; i < N; i++) {
    const int64_t col = targets[i] - vocab_begin;
    for (int j = 0; j < Vl; j++) {
      const float onehot = j == col ? 1.0f : 0.0f;
      dlogits[i * Vl + j] = dloss * (probs[i * Vl + j] - onehot);
    }
  }
}

}  // namespace scalelab::cpu
