// batch.h — what a loader serves and where it stands: one rank's batch of (B, T+1) windows as inputs and
// targets, the copy of a batch into a model's token tensors, and the loader's exact position as a 64-byte
// record that checkpoints carry. The window order that fills a batch is lab 02's (docs/formats.md "Loader
// order"). Implementation: common/src/data/batch.cpp   Tests: tests/common/data/test_shards.cpp
#pragma once

#include <cstddef>  // defines: size_t
#include <cstdint>  // defines: int32_t, int64_t, uint8_t, uint64_t
#include <vector>

#include "scalelab/core/tensor.h"  // defines: Tensor (load_batch)

namespace scalelab::data {

// One batch for this rank. inputs and targets are (B, T) int32 token ids, row-major (row b is
// window b): targets[b][t] is the token that follows inputs[b][t], i.e. window tokens t and t+1.
// Plain vectors, not Tensors: a loader is host-only; load_batch copies them into a model's tensors.
struct Batch {
  int B = 0, T = 0;
  std::vector<int32_t> inputs;      // (B, T) the first T tokens of each window
  std::vector<int32_t> targets;     // (B, T) the last T tokens of each window
  std::vector<int64_t> window_ids;  // (B,) window w starts at stream token w*T
  int64_t epoch = 0;                // position of this batch: epoch ...
  int64_t batch_in_epoch = 0;       // ... and batch index within it
  double wait_ms = 0.0;             // how long next() blocked the caller to return it (ms)
};

// Copies a batch into a model's input tensors: x = inputs, y = targets, both (B, T) i32 on any device
// (staged through host tensors). Throws if the shapes differ from (b.B, b.T).
void load_batch(const Batch& b, Tensor& x, Tensor& y);

// A loader's exact position: restoring it makes the following batches identical. The position is
// the same on every rank (all ranks step together), so rank 0's state restores any rank.
struct LoaderState {
  uint64_t seed = 0;           // the window order's seed (restore adopts it)
  int64_t epoch = 0;           // epoch of the next batch next() returns
  int64_t batch_in_epoch = 0;  // index of that batch within its epoch
  // What the position refers to; restore checks these so a state is never applied to another stream.
  int32_t B = 0, T = 0, dp_size = 0;
  int32_t dp_rank = 0;  // informational (which rank saved it); not checked
  bool shuffle = true;
  int64_t tokens_total = 0;  // N of the stream the position refers to

  static constexpr size_t kBytes = 64;    // serialised size (bytes)
  std::vector<uint8_t> to_bytes() const;  // 64 bytes little-endian, magic "SLLOADR1" (for checkpoints)
  static LoaderState from_bytes(const std::vector<uint8_t>& bytes);  // throws on a bad record
};

}  // namespace scalelab::data
