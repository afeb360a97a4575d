// shard_io.cpp — lab 02's given code, one file compiled into both tracks (sl_add_lab's GIVEN in
// labs/CMakeLists.txt): the ShardLoader around your four functions (the shards mapped, batch assembly,
// next(), the producer thread, the position's checks). It calls the TODO functions of its own track: yours in
// labs/02_data_pipeline/shard_loader.cpp, the reference's in solutions/02_data_pipeline/shard_loader.cpp. The
// shard files it maps are common's (common/src/data/shard.cpp). Format: docs/formats.md
// Tests: tests/lab02/test_shard_loader.cpp (this code), tests/lab02/test_lab02.cpp (graded, both tracks)
#include "shard_loader.h"

#include <algorithm>  // defines: std::upper_bound, std::min, std::copy
#include <chrono>     // defines: std::chrono::steady_clock (wait_ms)
#include <utility>    // defines: std::move

#include "scalelab/core/error.h"  // defines: SL_CHECK, SL_CHECK_HINT, SL_FAIL

namespace scalelab::lab02 {
inline namespace SL_TRACK_LAB02 {

// =============================================================================================
// ShardLoader
// =============================================================================================
ShardLoader::ShardLoader(const std::string& dir, const std::string& split, const LoaderConfig& config)
    : ShardLoader(data::list_shards(dir, split), config) {}

ShardLoader::ShardLoader(const std::vector<std::string>& files, const LoaderConfig& config) : cfg_(config) {
  SL_CHECK(cfg_.B >= 1 && cfg_.T >= 1, "B=%d T=%d must be >= 1", cfg_.B, cfg_.T);
  SL_CHECK(cfg_.dp_size >= 1 && cfg_.dp_rank >= 0 && cfg_.dp_rank < cfg_.dp_size,
           "dp_rank=%d dp_size=%d: need 0 <= dp_rank < dp_size", cfg_.dp_rank, cfg_.dp_size);
  SL_CHECK(cfg_.prefetch_depth >= 1, "prefetch_depth=%d must be >= 1 (or set prefetch=false)", cfg_.prefetch_depth);
  open_shards(files);

  n_windows_ = n_tokens_ > 0 ? (n_tokens_ - 1) / cfg_.T : 0;                // W: windows start every T tokens
  n_batches_ = n_windows_ / (static_cast<int64_t>(cfg_.B) * cfg_.dp_size);  // whole global batches
  if (n_batches_ < 1) {
    shards_.clear();  // unmaps them
    SL_FAIL("use a smaller B or T, fewer ranks, or more text (for a val split: a larger --val-fraction)",
            "%lld tokens make %lld windows of T+1=%d tokens, fewer than one global batch of B*dp_size=%d*%d",
            static_cast<long long>(n_tokens_), static_cast<long long>(n_windows_), cfg_.T + 1, cfg_.B, cfg_.dp_size);
  }
  if (cfg_.prefetch) start_prefetch();
}

ShardLoader::~ShardLoader() { stop_prefetch(); }  // then shards_ unmaps the files

void ShardLoader::open_shards(const std::vector<std::string>& files) {
  SL_CHECK_HINT(!files.empty(), "pass at least one shard (list_shards(dir, split) finds them)",
                "ShardLoader got an empty list of shard files");
  for (const std::string& path : files) {
    shards_.emplace_back(path, cfg_.verify_checksums);  // maps it and checks its header (common's data layer)
    first_token_.push_back(n_tokens_);
    n_tokens_ += shards_.back().token_count();
    const uint32_t vocab = shards_.back().header().vocab_size;
    SL_CHECK_HINT(vocab == shards_.front().header().vocab_size, "all shards of one loader come from one tokenizer",
                  "shard '%s' has vocab_size %u but '%s' has %u", path.c_str(), vocab, shards_.front().path().c_str(),
                  shards_.front().header().vocab_size);
  }
  vocab_size_ = static_cast<int>(shards_.front().header().vocab_size);
}

void ShardLoader::copy_tokens(int64_t start, int64_t n, int32_t* out) const {
  SL_CHECK(start >= 0 && n >= 0 && start + n <= n_tokens_, "tokens [%lld, %lld) outside the stream of %lld",
           static_cast<long long>(start), static_cast<long long>(start + n), static_cast<long long>(n_tokens_));
  // The last shard whose first token is <= start holds token `start`.
  size_t s =
      static_cast<size_t>(std::upper_bound(first_token_.begin(), first_token_.end(), start) - first_token_.begin()) - 1;
  while (n > 0) {
    const int64_t local = start - first_token_[s];  // index within this shard
    const int64_t take = std::min(n, shards_[s].token_count() - local);
    shards_[s].copy_tokens(local, take, out);
    out += take;
    start += take;
    n -= take;
    ++s;  // the rest of the window continues in the next shard
  }
}

Batch ShardLoader::make_batch(int64_t epoch, int64_t batch_in_epoch) {
  const int B = cfg_.B, T = cfg_.T;
  if (order_epoch_ != epoch) {  // a new epoch: its order, computed once and cached
    order_ = epoch_window_order(n_windows_, cfg_.seed, epoch, cfg_.shuffle);
    order_epoch_ = epoch;
    SL_CHECK_HINT(static_cast<int64_t>(order_.size()) == n_windows_, "see TODO(lab02-1)",
                  "epoch_window_order returned %zu entries for %lld windows", order_.size(),
                  static_cast<long long>(n_windows_));
  }
  if (cfg_.on_assemble) cfg_.on_assemble(epoch, batch_in_epoch);  // a simulated slow or failing read
  Batch batch;
  batch.B = B;
  batch.T = T;
  batch.epoch = epoch;
  batch.batch_in_epoch = batch_in_epoch;
  batch.window_ids = rank_batch_windows(order_, batch_in_epoch, B, cfg_.dp_rank, cfg_.dp_size);
  SL_CHECK_HINT(static_cast<int>(batch.window_ids.size()) == B, "see TODO(lab02-2)",
                "rank_batch_windows returned %zu windows, expected B=%d", batch.window_ids.size(), B);
  batch.inputs.resize(static_cast<size_t>(B) * T);          // (B, T)
  batch.targets.resize(static_cast<size_t>(B) * T);         // (B, T)
  std::vector<int32_t> window(static_cast<size_t>(T) + 1);  // (T+1,) one window's tokens
  for (int b = 0; b < B; ++b) {
    const int64_t w = batch.window_ids[b];
    SL_CHECK(w >= 0 && w < n_windows_, "window id %lld outside [0, %lld)", static_cast<long long>(w),
             static_cast<long long>(n_windows_));
    copy_tokens(w * T, T + 1, window.data());
    // inputs = window[0, T), targets = window[1, T+1): the model predicts each next token.
    std::copy(window.begin(), window.begin() + T, batch.inputs.begin() + static_cast<size_t>(b) * T);
    std::copy(window.begin() + 1, window.end(), batch.targets.begin() + static_cast<size_t>(b) * T);
  }
  return batch;
}

Batch ShardLoader::next() {
  const auto t0 = std::chrono::steady_clock::now();
  // Without prefetch the caller waits for the whole assembly; with it, only for what is not ready yet.
  Batch batch = cfg_.prefetch ? take_prefetched() : make_batch(epoch_, batch_);
  SL_CHECK_HINT(batch.epoch == epoch_ && batch.batch_in_epoch == batch_,
                "prefetched batches must be taken oldest first (README 'Prefetch'), and after restore() none "
                "prepared for the old position may remain (README 'Resume')",
                "next() got batch (epoch %lld, batch %lld) but the loader's position is (epoch %lld, batch %lld)",
                static_cast<long long>(batch.epoch), static_cast<long long>(batch.batch_in_epoch),
                static_cast<long long>(epoch_), static_cast<long long>(batch_));
  if (++batch_ == n_batches_) {  // epoch done: batch 0 of the next one
    batch_ = 0;
    ++epoch_;
  }
  batch.wait_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return batch;
}

void ShardLoader::start_prefetch() {
  stop_ = false;
  worker_ = std::thread(&ShardLoader::prefetch_loop, this, epoch_, batch_);
}

void ShardLoader::stop_prefetch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  std::lock_guard<std::mutex> lock(mu_);
  queue_.clear();  // prepared for the old position; useless after a restore
  worker_error_ = nullptr;
  stop_ = false;
}

// The producer's half of the hand-off (the consumer's half: take_prefetched). It sleeps on cv_ while
// the queue is full, builds the next batch outside the lock, appends it and wakes the consumer; an error
// ends the thread and is kept in worker_error_ for next() to rethrow.
void ShardLoader::prefetch_loop(int64_t epoch, int64_t batch_in_epoch) {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || static_cast<int>(queue_.size()) < cfg_.prefetch_depth; });
      if (stop_) return;
    }
    try {
      Batch batch = make_batch(epoch, batch_in_epoch);  // outside the lock: next() can pop meanwhile
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(batch));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      worker_error_ = std::current_exception();
      cv_.notify_all();
      return;
    }
    cv_.notify_all();
    if (++batch_in_epoch == n_batches_) {
      batch_in_epoch = 0;
      ++epoch;
    }
  }
}

LoaderState ShardLoader::state() const {
  LoaderState s;
  s.seed = cfg_.seed;
  s.epoch = epoch_;
  s.batch_in_epoch = batch_;
  s.B = cfg_.B;
  s.T = cfg_.T;
  s.dp_size = cfg_.dp_size;
  s.dp_rank = cfg_.dp_rank;
  s.shuffle = cfg_.shuffle;
  s.tokens_total = n_tokens_;
  return s;
}

void ShardLoader::check_restorable(const LoaderState& s) const {
  const char* hint = "restore a state into a loader built like the one that saved it (same shards, B, T, dp_size)";
  SL_CHECK_HINT(s.B == cfg_.B && s.T == cfg_.T, hint, "state was saved with B=%d T=%d, this loader has B=%d T=%d", s.B,
                s.T, cfg_.B, cfg_.T);
  SL_CHECK_HINT(s.dp_size == cfg_.dp_size, hint, "state was saved with dp_size=%d, this loader has dp_size=%d",
                s.dp_size, cfg_.dp_size);
  SL_CHECK_HINT(s.tokens_total == n_tokens_, hint, "state refers to a stream of %lld tokens, this loader has %lld",
                static_cast<long long>(s.tokens_total), static_cast<long long>(n_tokens_));
  SL_CHECK_HINT(s.shuffle == cfg_.shuffle, hint, "state was saved with shuffle=%d, this loader has shuffle=%d",
                s.shuffle ? 1 : 0, cfg_.shuffle ? 1 : 0);
  SL_CHECK(s.epoch >= 0 && s.batch_in_epoch >= 0 && s.batch_in_epoch < n_batches_,
           "position epoch=%lld batch=%lld outside [0, %lld batches per epoch)", static_cast<long long>(s.epoch),
           static_cast<long long>(s.batch_in_epoch), static_cast<long long>(n_batches_));
}

void ShardLoader::skip_batches(int64_t n) {
  SL_CHECK(n >= 0, "skip_batches(%lld): n must be >= 0", static_cast<long long>(n));
  LoaderState s = state();
  const int64_t pos = s.batch_in_epoch + n;  // batches from the start of this epoch
  s.epoch += pos / n_batches_;
  s.batch_in_epoch = pos % n_batches_;
  restore(s);
}

std::unique_ptr<data::BatchSource> open_shard_loader(const std::string& dir, const std::string& split,
                                                     const LoaderConfig& config) {
  return std::make_unique<ShardLoader>(dir, split, config);
}

}  // namespace SL_TRACK_LAB02
}  // namespace scalelab::lab02
