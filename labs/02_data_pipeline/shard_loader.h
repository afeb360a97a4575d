// shard_loader.h — lab 02: token shards on disk and the loader that serves (B, T+1) windows from them.
// Declared once for both tracks: labs/02_data_pipeline/shard_loader.cpp (learner, the four TODO functions)
// and solutions/02_data_pipeline/shard_loader.cpp (reference) define them; labs/02_data_pipeline/shard_io.cpp
// (given: everything else below) is compiled into both, in namespaces scalelab::lab02::learner and
// scalelab::lab02::ref. Every other program links the reference.
// File format and window order: docs/formats.md ("Token shards", "Loader order"). Lesson and task:
// labs/02_data_pipeline/README.md. Tests: tests/lab02/test_lab02.cpp (graded, both tracks) and
// tests/lab02/test_shard_loader.cpp (the given code); tool that writes shards: tools/make_shards.cpp
#pragma once

// Which track this translation unit sees. CMake sets it per library (sl_add_lab in cmake/scalelab.cmake);
// code that includes the header without it gets the reference.
#ifndef SL_TRACK_LAB02
#define SL_TRACK_LAB02 ref
#endif

#include <condition_variable>  // defines: std::condition_variable (prefetch queue)
#include <cstdint>             // defines: int32_t, uint64_t
#include <deque>               // defines: std::deque (prefetch queue)
#include <exception>           // defines: std::exception_ptr (errors from the prefetch thread)
#include <functional>          // defines: std::function (LoaderConfig::on_assemble)
#include <mutex>               // defines: std::mutex
#include <string>              // defines: std::string
#include <thread>              // defines: std::thread (prefetch thread)
#include <vector>              // defines: std::vector

#include "scalelab/core/tensor.h"    // defines: scalelab::Tensor (load_batch)

namespace scalelab::lab02 {
inline namespace SL_TRACK_LAB02 {

// =============================================================================================
// Token shards: a 64-byte little-endian header, then token_count tokens (docs/formats.md)
// =============================================================================================
//   offset  size  field
//        0     8  magic "SLSHARD1" (no terminating NUL)
//        8     4  u32 version = 1
//       12     4  u32 bytes_per_token: 2 (only when vocab_size <= 65536) or 4
//       16     4  u32 vocab_size
//       20     4  u32 reserved = 0
//       24     8  u64 token_count
//       32     8  u64 checksum: FNV-1a 64 of the token bytes exactly as stored after the header
//       40    24  zero padding
//       64     .  tokens: token_count little-endian unsigned integers of bytes_per_token bytes
constexpr char kShardMagic[9] = "SLSHARD1";  // 8 bytes on disk; [8] is the C string's NUL
constexpr uint32_t kShardVersion = 1;
constexpr size_t kShardHeaderBytes = 64;     // bytes
constexpr int kByteVocab = 256;              // vocabulary of the byte-level tokenizer below

struct ShardHeader {
  uint32_t version = 0;
  uint32_t bytes_per_token = 0;  // 2 or 4
  uint32_t vocab_size = 0;       // every token is in [0, vocab_size)
  uint64_t token_count = 0;      // tokens in the body
  uint64_t checksum = 0;         // FNV-1a 64 of the body bytes
};

// FNV-1a 64-bit hash (Fowler, Noll, Vo): h = 0xcbf29ce484222325; for each byte: h ^= byte,
// h *= 0x100000001b3. Not cryptographic: it catches truncation, bit rot and partial copies.
uint64_t fnv1a64(const uint8_t* bytes, size_t n_bytes);

// Writes tokens (each in [0, vocab_size)) as a shard: 2-byte tokens when vocab_size <= 65536, else 4.
// Writes path + ".tmp" first and renames it onto path, so a crash never leaves a partial shard
// under the real name (rename within one directory is atomic on POSIX file systems).
void write_shard(const std::string& path, const std::vector<int32_t>& tokens, int vocab_size);

// Reads and validates the header of the shard at path: magic, version, bytes per token, file size
// (a truncated body says "expected N bytes found M") and, if verify_checksum, the body's FNV-1a 64.
// Throws scalelab::Error with a hint on any problem.
ShardHeader read_shard_header(const std::string& path, bool verify_checksum = true);

// Reads a whole shard (validated as above) into memory: token_count tokens.
std::vector<int32_t> read_shard(const std::string& path);

// The shards of one split in a directory: <dir>/<split>_*.bin sorted by name
// (sl_make_shards writes train_000000.bin, train_000001.bin, ..., val_000000.bin).
// Throws if there are none, with a hint to run scripts/prepare_corpus.sh.
std::vector<std::string> list_shards(const std::string& dir, const std::string& split);

// =============================================================================================
// Byte-level tokenizer: token = byte value (vocab 256). Every text round-trips exactly.
// =============================================================================================
std::vector<int32_t> encode_bytes(const std::string& text);     // one token per byte, in [0, 256)
std::string decode_bytes(const std::vector<int32_t>& tokens);   // throws if a token is outside [0, 256)

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
// of the epoch is the B*dp_size consecutive entries [b*B*dp_size, (b+1)*B*dp_size) of that order;
// rank r takes every dp_size-th of them, starting at r (rank_batch_windows). So ranks are disjoint,
// every rank gets the same number of batches, and a run with dp_size ranks of B windows sees the
// same global batches as one rank with B*dp_size windows. Batches per epoch = W / (B*dp_size); the
// W mod (B*dp_size) windows left at the end of the order (different ones each epoch) are skipped.

// TODO(lab02-1) in the .cpp. The order in which epoch `epoch` visits windows 0..n_windows-1, as
// (n_windows,) window ids. shuffle == false: 0, 1, ..., n_windows-1 (validation). shuffle == true: the
// Fisher-Yates shuffle of docs/formats.md "Loader order" rule 3, driven by
// scalelab::Rng(seed + 0xD1B54A32D192ED03 * epoch) (mod 2^64): a pure function of (seed, epoch), so every
// rank, and a restarted job, computes the same order without being told it. Throws for n_windows < 0 or
// epoch < 0. README "The order of an epoch".
std::vector<int64_t> epoch_window_order(int64_t n_windows, uint64_t seed, int64_t epoch, bool shuffle);

// TODO(lab02-2) in the .cpp. The (B,) window ids that rank dp_rank of dp_size gets for batch
// batch_in_epoch of an epoch whose order is `order` (epoch_window_order): row i is
// order[(batch_in_epoch*B + i)*dp_size + dp_rank], i = 0..B-1 (PyTorch's DistributedSampler takes the
// same strided share, indices[rank::num_replicas]). Throws scalelab::Error when the WHOLE global batch
// [batch_in_epoch*B*dp_size, (batch_in_epoch+1)*B*dp_size) does not fit in the order, on every rank alike
// (not only when this rank's own rows run out: then one rank would step once more than the others), and
// for B < 1, dp_size < 1, dp_rank outside [0, dp_size) or batch_in_epoch < 0. README "Ranks: disjoint
// windows, equal steps".
std::vector<int64_t> rank_batch_windows(const std::vector<int64_t>& order, int64_t batch_in_epoch, int B,
                                        int dp_rank, int dp_size);

// =============================================================================================
// ShardLoader
// =============================================================================================
struct LoaderConfig {
  int B = 8;                      // windows per batch on this rank
  int T = 256;                    // tokens per sequence; a window holds T+1 tokens
  uint64_t seed = 1337;           // with the epoch, fixes the window order
  int dp_rank = 0;                // this rank in the data-parallel group
  int dp_size = 1;                // ranks in the data-parallel group
  bool shuffle = true;            // false: windows in stream order every epoch (validation)
  bool prefetch = true;           // a background thread prepares the next batches
  int prefetch_depth = 2;         // batches the thread may prepare ahead (>= 1)
  bool verify_checksums = true;   // hash every shard body once when opening (about 1 GB/s)
  // Optional: called with (epoch, batch_in_epoch) by whichever thread assembles a batch (the prefetch
  // thread, or next()'s caller without prefetch), just before it reads the batch's tokens. What it
  // throws reaches the caller of next() for that batch. For instrumentation and simulations: a slow
  // disk (sleep in it: lab 02's --read-delay-ms), a failing read (throw: the graded prefetch checks).
  // Copied with the config; the drivers' validation split drops it (labs/common/driver.cpp).
  std::function<void(int64_t epoch, int64_t batch_in_epoch)> on_assemble;
};

// One batch for this rank. inputs and targets are (B, T) int32 token ids, row-major (row b is
// window b): targets[b][t] is the token that follows inputs[b][t], i.e. window tokens t and t+1.
// Plain vectors, not Tensors: the loader is host-only; lab 01 copies them into its token tensors.
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
void load_batch(const Batch& b, scalelab::Tensor& x, scalelab::Tensor& y);

// The loader's exact position: restoring it makes the following batches identical. The position is
// the same on every rank (all ranks step together), so rank 0's state restores any rank.
struct LoaderState {
  uint64_t seed = 0;           // the window order's seed (restore adopts it)
  int64_t epoch = 0;           // epoch of the next batch next() returns
  int64_t batch_in_epoch = 0;  // index of that batch within its epoch
  // What the position refers to; restore checks these so a state is never applied to another stream.
  int32_t B = 0, T = 0, dp_size = 0;
  int32_t dp_rank = 0;         // informational (which rank saved it); not checked
  bool shuffle = true;
  int64_t tokens_total = 0;    // N of the stream the position refers to

  static constexpr size_t kBytes = 64;        // serialised size (bytes)
  std::vector<uint8_t> to_bytes() const;      // 64 bytes little-endian, magic "SLLOADR1" (for checkpoints)
  static LoaderState from_bytes(const std::vector<uint8_t>& bytes);  // throws on a bad record
};

class ShardLoader {
 public:
  // Memory-maps every shard in files (all must share one vocab_size) and starts the prefetch thread.
  ShardLoader(const std::vector<std::string>& files, const LoaderConfig& config);
  // The shards of a split in a directory: list_shards(dir, split), e.g. ("data/kjv", "train").
  ShardLoader(const std::string& dir, const std::string& split, const LoaderConfig& config);
  ~ShardLoader();  // stops the prefetch thread, unmaps the shards
  ShardLoader(const ShardLoader&) = delete;
  ShardLoader& operator=(const ShardLoader&) = delete;

  // The next batch of this rank. After the last batch of an epoch comes batch 0 of the next epoch.
  Batch next();

  // Call these from the thread that calls next() (the loader is not shared between threads).
  LoaderState state() const;              // position of the next batch next() will return
  // TODO(lab02-3): continue from a saved position, so that the following batches are those the saving
  // loader would have returned (same seed, epoch, batch). Throws scalelab::Error for a state of another
  // stream (B, T, dp_size, shuffle or N differ) or a position outside the epoch. README "Resume".
  void restore(const LoaderState& state);
  void skip_batches(int64_t n);            // move n batches ahead without reading them (n >= 0)

  int64_t windows_per_epoch() const { return n_windows_; }  // W = (N - 1) / T
  int64_t batches_per_epoch() const { return n_batches_; }  // W / (B * dp_size)
  int vocab_size() const { return vocab_size_; }
  int64_t tokens_total() const { return n_tokens_; }        // N, all shards
  const LoaderConfig& config() const { return cfg_; }

 private:
  struct MappedShard {
    std::string path;
    const uint8_t* base = nullptr;  // start of the mapping (the header)
    size_t file_bytes = 0;          // bytes mapped
    ShardHeader header;
    int64_t first_token = 0;        // stream index of this shard's token 0
  };

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
  std::vector<MappedShard> shards_;
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
  std::condition_variable cv_;   // signalled on every queue change and on stop
  std::deque<Batch> queue_;      // prepared batches, in order; at most cfg_.prefetch_depth
  std::exception_ptr worker_error_;  // an error in the producer, rethrown by next()
  bool stop_ = false;              // asks the producer to return
};

}  // namespace SL_TRACK_LAB02
}  // namespace scalelab::lab02
