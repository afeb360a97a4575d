// batch_source.h — what the training loop reads its batches from (scalelab/driver/train_loop.h): a source
// of one rank's batches with a position it can save, restore and skip, and the function that opens one for
// a split of a data directory. The loader that decides the windows is lab 02's ShardLoader
// (labs/02_data_pipeline/shard_loader.h, open_shard_loader); the loop never knows which loader it reads.
#pragma once

#include <cstdint>     // defines: int64_t, uint64_t
#include <functional>  // defines: std::function (OpenBatchSource, LoaderConfig::on_assemble)
#include <memory>      // defines: std::unique_ptr
#include <string>

#include "scalelab/data/batch.h"  // defines: Batch, LoaderState

namespace scalelab::data {

// How a loader cuts one rank's batches out of a split (docs/formats.md "Loader order").
struct LoaderConfig {
  int B = 8;                     // windows per batch on this rank
  int T = 256;                   // tokens per sequence; a window holds T+1 tokens
  uint64_t seed = 1337;          // with the epoch, fixes the window order
  int dp_rank = 0;               // this rank in the data-parallel group
  int dp_size = 1;               // ranks in the data-parallel group
  bool shuffle = true;           // false: windows in stream order every epoch (validation)
  bool prefetch = true;          // a background thread prepares the next batches
  int prefetch_depth = 2;        // batches the thread may prepare ahead (>= 1)
  bool verify_checksums = true;  // hash every shard body once when opening (about 1 GB/s)
  // Optional: called with (epoch, batch_in_epoch) by whichever thread assembles a batch (the prefetch
  // thread, or next()'s caller without prefetch), just before it reads the batch's tokens. What it
  // throws reaches the caller of next() for that batch. For instrumentation and simulations: a slow
  // disk (sleep in it: lab 02's --read-delay-ms), a failing read (throw: the graded prefetch checks).
  // Copied with the config; the drivers' validation split drops it (common/src/driver/driver.cpp).
  std::function<void(int64_t epoch, int64_t batch_in_epoch)> on_assemble;
};

// A source of one rank's batches. Call every member from one thread (a source is not shared).
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // The next batch of this rank. After the last batch of an epoch comes batch 0 of the next epoch.
  virtual Batch next() = 0;
  virtual LoaderState state() const = 0;               // the position of the batch next() returns next
  virtual void restore(const LoaderState& state) = 0;  // continue from a saved position (throws for another stream's)
  virtual void skip_batches(int64_t n) = 0;            // move n >= 0 batches ahead without reading them
  virtual int vocab_size() const = 0;                  // every token is in [0, vocab_size)
  virtual int64_t batches_per_epoch() const = 0;       // of this rank
  virtual const LoaderConfig& config() const = 0;
};

// Opens the source of split `split` ("train", "val") of the data directory `dir` for `config`. A lab
// program passes lab 02's (open_shard_loader); the driver calls it for the training and validation splits.
using OpenBatchSource = std::function<std::unique_ptr<BatchSource>(const std::string& dir, const std::string& split,
                                                                   const LoaderConfig& config)>;

}  // namespace scalelab::data
