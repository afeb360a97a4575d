// crossentropy.cpp — CPU twin of the fused softmax + cross-entropy loss at the top of GPT-2.
// Defines scalelab::cpu::softmax_crossentropy_forward / softmax_crossentropy_backward (contract: scalelab/ops/ops.h).
// CUDA twin: common/src/ops/cuda/crossentropy.cu   tests: tests/common/ops/test_ops_cpu.cpp, tests/common/ops/test_ops_cuda.cpp (CPU vs CUDA)
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "scalelab/ops/ops.h"  // defines: the cpu:: declarations implemented here

namespace scalelab::cpu {

// probs (N,V) = softmax(logits (N,V)) per row; losses (N) = -log probs[i, targets[i]], targets (N) i32 in [0,V).
// The loss is computed as log(sum_v exp(logit_v - max)) - (logit_target - max): the same number as
// -log(probs[target]) (and torch's log_softmax), but it stays finite when probs[target] underflows to 0.
void softmax_crossentropy_forward(float* losses, float* probs, const float* logits, const int32_t* targets, int64_t N,
                                  int V) {
#pragma omp parallel for schedule(static) if (N * V > 32768)
  for (int64_t i = 0; i < N; i++) {
    const float* z = logits + i * V;  // (V)
    float* p = probs + i * V;         // (V)
    float maxval = z[0];
    for (int v = 1; v < V; v++) maxval = std::max(maxval, z[v]);  // max subtraction: exp() <= 1
    float sum = 0.0f;
    for (int v = 0; v < V; v++) {
      p[v] = std::exp(z[v] - maxval);
      sum += p[v];
    }
    const float inv_sum = 1.0f / sum;
    for (int v = 0; v < V; v++) p[v] *= inv_sum;
    losses[i] = std::log(sum) - (z[targets[i]] - maxval);
  }
}

// dlogits (N,V) = dloss * (probs - onehot(targets)): the gradient of dloss * sum_i losses[i] with respect to
// the logits, because d(-log softmax(z)_y)/dz_v = p_v - [v == y]. OVERWRITES dlogits (the one exception
// to the += rule). dlogits may alias probs: each element is read before it is written.
// probs (N,V); targets (N) i32; dloss = d(total loss)/d(losses[i]), e.g. 1/N for a mean.
void softmax_crossentropy_backward(float* dlogits, const float* probs, const int32_t* targets, float dloss, int64_t N,
                                   int V) {
#pragma omp parallel for schedule(static) if (N * V > 32768)
  for (int64_t i = 0; i < N; i++) {
    const float* p = probs + i * V;
    float* d = dlogits + i * V;
    const int y = targets[i];
    const float p_y = p[y];  // read before the loop: with dlogits == probs the loop overwrites it
    for (int v = 0; v < V; v++) d[v] = dloss * p[v];
    d[y] = dloss * (p_y - 1.0f);
  }
}

}  // namespace scalelab::cpu
