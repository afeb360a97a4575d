// shard_loader.h — lab 02: the loader that serves (B, T+1) windows from token shards, and its four decisions.
// Declared once for both tracks: labs/02_data_pipeline/shard_loader.cpp (learner, the four TODO functions)
// and solutions/02_data_pipeline/shard_loader.cpp (reference) define them; labs/02_data_pipeline/shard_io.cpp
// (given: the ShardLoader around them) is compiled into both, in namespaces scalelab::lab02::learner and
// scalelab::lab02::ref. Every other program links the reference. The shard files, the tokenizer, the Batch
// and LoaderState records and the BatchSource interface the training loop reads are common's data layer
// (common/include/scalelab/data/). Window order: docs/formats.md ("Loader order"). Lesson and task:
// labs/02_data_pipeline/README.md. Tests: tests/lab02/test_lab02.cpp (graded, both tracks) and
// tests/lab02/test_shard_loader.cpp (the given code)
#pragma once

// Which track this translation unit sees. CMake sets it per library (sl_add_lab in cmake/scalelab.cmake);
// code that includes the header without it gets the reference.
#ifndef SL_TRACK_LAB02
#define SL_TRACK_LAB02 ref
#endif

#include <condition_variable>  // defines: std::condition_variable (prefetch queue)
#include <cstdint>             // defines: int64_t, uint64_t
#include <deque>               // defines: std::deque (prefetch queue)
#include <exception>           // defines: std::exception_ptr (errors from the prefetch thread)
#include <memory>              // defines: std::unique_ptr (open_shard_loader)
#include <mutex>               // defines: std::mutex
#include <string>              // defines: std::string
#include <thread>              // defines: std::thread (prefetch thread)
#include <vector>              // defines: std::vector

#include "scalelab/data/batch.h"         // defines: data::Batch, LoaderState
#include "scalelab/data/batch_source.h"  // defines: data::BatchSource, LoaderConfig
#include "scalelab/data/shard.h"         // defines: data::MappedShard, list_shards

namespace scalelab::lab02 {

// The records the loader speaks, from common's data layer (the same for both tracks).
using data::Batch;
using data::LoaderConfig;
using data::LoaderState;

inline namespace SL_TRACK_LAB02 {

// =============================================================================================
// Loader order (docs/formats.md "Loader order")
// =============================================================================================
// The shards, in the order given, form one stream of N tokens. Window w is tokens [w*T, w*T + T + 1):
// windows start every T tokens, so consecutive windows share one token (the last target of window w
// is the first input of window w+1) and every token after the first is a target exactly once per
// epoch. Windows per epoch W = (N - 1) / T (integer division; the tail that makes no full window is
// not used). A window may cross a shard boundary: shards are consecutive pieces of one text.
//
// Epoch e visits the windows in the order epoch_window_order(W, seed, e, shuffle). Global batch b
// of the epoch is the B*dp_size consecutive entries [b*B*dp_size, (b+1)*B*dp_size) of that order,
// shared among the ranks as PyTorch's DistributedSampler shares it (rank_batch_windows). So ranks are
// disjoint, every rank gets the same number of batches, and a run with dp_size ranks of B windows sees
// the same global batches as one rank with B*dp_size windows. Batches per epoch = W / (B*dp_size); the
// W mod (B*dp_size) windows left at the end of the order (different ones each epoch) are skipped.

// TODO(lab02-1) in the .cpp. The order in which epoch `epoch` visits windows 0..n_windows-1, as
// (n_windows,) window ids. shuffle == false: 0, 1, ..., n_windows-1 (validation). shuffle == true: the
// permutation of docs/formats.md "Loader order" rule 3 (its generator and seed are part of the rule), entry
// for entry: a pure function of (seed, epoch), so every rank, and a restarted job, computes the same order
// without being told it. Throws for n_windows < 0 or epoch < 0. README "The order of an epoch".
std::vector<int64_t> epoch_window_order(int64_t n_windows, uint64_t seed, int64_t epoch, bool shuffle);

// TODO(lab02-2) in the .cpp. The (B,) window ids that rank dp_rank of dp_size gets for batch
// batch_in_epoch of an epoch whose order is `order` (epoch_window_order): this rank's strided share of that
// global batch, the share PyTorch's DistributedSampler gives a rank (docs/formats.md "Loader order"), so
// the ranks' rows never overlap and together are the whole global batch. Throws scalelab::Error when the
// global batch does not fit in the order, on every rank alike (every rank must refuse the same batch
// indices, or one rank would step once more than the others), and for B < 1, dp_size < 1, dp_rank outside
// [0, dp_size) or batch_in_epoch < 0. README "Ranks: disjoint windows, equal steps".
std::vector<int64_t> rank_batch_windows(const std::vector<int64_t>& order, int64_t batch_in_epoch, int B, int dp_rank,
                                        int dp_size);

// =============================================================================================
// ShardLoader
// =============================================================================================
// The kit's loader (docs/formats.md "Loader order"): memory-maps the shards of a split, serves this rank's
// windows in the order of epoch_window_order and rank_batch_windows, a prefetch thread preparing the next
// batches. What the training loop reads (data::BatchSource); open_shard_loader below opens one.
class ShardLoader : public data::BatchSource {
 public:
  // Memory-maps every shard in files (all must share one vocab_size) and starts the prefetch thread.
  ShardLoader(const std::vector<std::string>& files, const LoaderConfig& config);
  // The shards of a split in a directory: list_shards(dir, split), e.g. ("data/kjv", "train").
  ShardLoader(const std::string& dir, const std::string& split, const LoaderConfig& config);
  ~ShardLoader() override;  // stops the prefetch thread, unmaps the shards
  ShardLoader(const ShardLoader&) = delete;
  ShardLoader& operator=(const ShardLoader&) = delete;

  // The next batch of this rank. After the last batch of an epoch comes batch 0 of the next epoch.
  Batch next() override;

  // Call these from the thread that calls next() (the loader is not shared between threads).
  LoaderState state() const override;  // position of the next batch next() will return
  // TODO(lab02-3): continue from a saved position, so that the following batches are those the saving
  // loader would have returned (same seed, epoch, batch). Throws scalelab::Error for a state of another
  // stream (B, T, dp_size, shuffle or N differ) or a position outside the epoch. README "Resume".
  void restore(const LoaderState& state) override;
  void skip_batches(int64_t n) override;  // move n batches ahead without reading them (n >= 0)

  int64_t windows_per_epoch() const { return n_windows_; }           // W = (N - 1) / T
  int64_t batches_per_epoch() const override { return n_batches_; }  // W / (B * dp_size)
  int vocab_size() const override { return vocab_size_; }
  int64_t tokens_total() const { return n_tokens_; }  // N, all shards
  const LoaderConfig& config() const override { return cfg_; }

 private:
  void open_shards(const std::vector<std::string>& files);
  // Copies stream tokens [start, start + n) into out (n int32), crossing shard boundaries as needed.
  void copy_tokens(int64_t start, int64_t n, int32_t* out) const;
  // The batch at (epoch, batch_in_epoch); a pure function of the position (wait_ms is left 0).
  Batch make_batch(int64_t epoch, int64_t batch_in_epoch);
  void start_prefetch();  // starts the producer thread at the consumer's position (epoch_, batch_)
  void stop_prefetch();   // joins the producer and drops every batch it prepared
  void prefetch_loop(int64_t epoch, int64_t batch_in_epoch);  // the producer's body, from that position
  // Throws scalelab::Error unless s is a position of this loader's stream (same B, T, dp_size, shuffle and N)
  // inside an epoch: restore checks its argument with it before your code runs.
  void check_restorable(const LoaderState& s) const;
  // TODO(lab02-4): the consumer's half of the prefetch hand-off: the oldest batch the producer prepared,
  // removed from queue_ (blocks until there is one); rethrows the producer's error once the queue holds
  // no batch before it. README "Prefetch: a producer and a consumer".
  Batch take_prefetched();

  LoaderConfig cfg_;
  std::vector<data::MappedShard> shards_;  // the files, in stream order, mapped
  std::vector<int64_t> first_token_;       // stream index of each shard's token 0
  int vocab_size_ = 0;
  int64_t n_tokens_ = 0;   // N
  int64_t n_windows_ = 0;  // W
  int64_t n_batches_ = 0;  // batches per epoch

  // Consumer position: the next batch next() returns (what state() reports).
  int64_t epoch_ = 0, batch_ = 0;

  // The window order of one epoch, cached by whichever thread builds batches (only one at a time).
  int64_t order_epoch_ = -1;
  std::vector<int64_t> order_;

  // Prefetch: the producer thread builds the batches that follow the consumer's position into queue_.
  std::thread worker_;
  mutable std::mutex mu_;
  std::condition_variable cv_;       // signalled on every queue change and on stop
  std::deque<Batch> queue_;          // prepared batches, in order; at most cfg_.prefetch_depth
  std::exception_ptr worker_error_;  // an error in the producer, rethrown by next()
  bool stop_ = false;                // asks the producer to return
};

// A ShardLoader of split `split` of `dir`, as the driver opens its sources (data::OpenBatchSource): every lab
// program hands this to the driver (labs/common/lab_parts.h), so the training loop reads this track's loader.
std::unique_ptr<data::BatchSource> open_shard_loader(const std::string& dir, const std::string& split,
                                                     const LoaderConfig& config);

}  // namespace SL_TRACK_LAB02
}  // namespace scalelab::lab02
