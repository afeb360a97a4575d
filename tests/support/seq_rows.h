// seq_rows.h — host copies of rows of a (B, T, W) CPU tensor along the sequence, for the tests of the block
// attention ops and of context parallelism (tests/common/ops/test_attention_block.cpp,
// tests/common/model/test_context_parallel.cpp): a block of positions out of every sequence, and back.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "scalelab/core/tensor.h"  // defines: Tensor, Shape, numel_of

namespace scalelab::test {

// Rows [t0, t0 + n) of every sequence of x (B, T, W), channels [c0, c0 + w): a new (B, n, w) tensor.
inline Tensor seq_rows(const Tensor& x, int64_t t0, int64_t n, int64_t c0, int64_t w) {
  const int64_t B = x.size(0), T = x.size(1), W = x.size(2);
  Tensor y = Tensor::empty({B, n, w});
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < n; t++)
      for (int64_t c = 0; c < w; c++)
        y.data<float>()[(b * n + t) * w + c] = x.data<float>()[(b * T + t0 + t) * W + c0 + c];
  return y;
}

// The inverse, adding: x[:, t0:t0+n, c0:c0+w] += y (B, n, w).
inline void add_seq_rows(Tensor& x, const Tensor& y, int64_t t0, int64_t c0) {
  const int64_t B = x.size(0), T = x.size(1), W = x.size(2), n = y.size(1), w = y.size(2);
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < n; t++)
      for (int64_t c = 0; c < w; c++)
        x.data<float>()[(b * T + t0 + t) * W + c0 + c] += y.data<float>()[(b * n + t) * w + c];
}

// lse (B, NH, T) -> positions [t0, t0 + n) of each row: (B, NH, n); and back (overwriting).
inline Tensor lse_rows(const Tensor& lse, int64_t t0, int64_t n) {
  const int64_t BH = lse.size(0) * lse.size(1), T = lse.size(2);
  Tensor y = Tensor::empty({lse.size(0), lse.size(1), n});
  for (int64_t r = 0; r < BH; r++)
    for (int64_t t = 0; t < n; t++) y.data<float>()[r * n + t] = lse.data<float>()[r * T + t0 + t];
  return y;
}
inline void set_lse_rows(Tensor& lse, const Tensor& y, int64_t t0) {
  const int64_t BH = lse.size(0) * lse.size(1), T = lse.size(2), n = y.size(2);
  for (int64_t r = 0; r < BH; r++)
    for (int64_t t = 0; t < n; t++) lse.data<float>()[r * T + t0 + t] = y.data<float>()[r * n + t];
}

// A (shape) tensor of -inf: the log-sum-exp of an accumulator that has summed nothing yet.
inline Tensor minus_inf(const Shape& shape) {
  Tensor t = Tensor::empty(shape);
  for (int64_t i = 0; i < t.numel(); i++) t.data<float>()[i] = -INFINITY;
  return t;
}

}  // namespace scalelab::test
