// tensor_parallel.cpp — the identity of the tensor-parallel points (tensor_parallel.h): what a dense model
// (tp = 1) does at each of them, so the model calls the points unconditionally.
#include "scalelab/model/tensor_parallel.h"

#include "scalelab/ops/ops.h"  // defines: add_bias_, encoder_*, softmax_crossentropy_*

namespace scalelab {

void TensorParallel::g_forward(Tensor& y, const Tensor* bias) {
  if (bias != nullptr) add_bias_(y, *bias);
}

void TensorParallel::sp_scatter_forward(const Tensor& y_full, Tensor& y_shard, const Tensor* bias) {
  y_shard.copy_from(y_full);
  if (bias != nullptr) add_bias_(y_shard, *bias);
}

void TensorParallel::embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte_shard, const Tensor& wpe) {
  encoder_forward(out, tokens, wte_shard, wpe);
}

void TensorParallel::embedding_backward(Tensor& dwte_shard, Tensor& dwpe, const Tensor& dout, const Tensor& tokens) {
  encoder_backward(dwte_shard, dwpe, dout, tokens);
}

void TensorParallel::cross_entropy_forward(Tensor& losses, Tensor& probs, const Tensor& logits, const Tensor& targets) {
  softmax_crossentropy_forward(losses, probs, logits, targets);
}

void TensorParallel::cross_entropy_backward(Tensor& dlogits, const Tensor& probs, const Tensor& targets, float dloss) {
  softmax_crossentropy_backward(dlogits, probs, targets, dloss);
}

}  // namespace scalelab
