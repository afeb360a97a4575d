// naive_loader.h — lab 02's driver: the loader the kit's ShardLoader is compared with (README "The
// starvation experiment"). Not a TODO: it is what a first data loader often looks like, written here so
// that both run in the same program on the same windows. Used by labs/02_data_pipeline/main.cpp only.
//
//   kit loader (shard_loader.h)                 naive loader (this file)
//   pre-tokenized shards, tokenized once        the raw text, tokenized again for every batch
//   memory-mapped: a batch copies B*(T+1)       one open() + read() of the whole text per batch
//     tokens out of the page cache
//   a prefetch thread builds the next batches   built in the caller's thread, while the model waits
//
// Both serve exactly the same windows (the window order and rank split of shard_loader.h, on the stream
// the train shards hold), so a run trains bit for bit alike with either: only the time differs.
#pragma once

#include <fcntl.h>     // defines: open, O_RDONLY
#include <sys/stat.h>  // defines: fstat
#include <unistd.h>    // defines: read, close

#include <algorithm>  // defines: std::copy
#include <cerrno>     // defines: errno
#include <chrono>     // defines: std::chrono::steady_clock (wait_ms)
#include <cstdint>    // defines: int64_t, uint8_t
#include <cstring>    // defines: std::strerror
#include <string>
#include <vector>

#include "scalelab/core/error.h"      // defines: SL_CHECK_HINT, SL_FAIL
#include "scalelab/data/shard.h"      // defines: data::list_shards, read_shard_header, fnv1a64
#include "scalelab/data/tokenizer.h"  // defines: data::encode_bytes, kByteVocab
#include "shard_loader.h"             // defines: lab02::Batch, LoaderConfig, epoch_window_order, rank_batch_windows
                                      //   (this track's)

namespace scalelab::lab02_driver {

namespace lab02 = scalelab::lab02;

// Reads a whole file with one read() call per attempt (a regular file returns it all at once, up to
// 2 GiB). Throws with the path and the system's message.
inline std::string read_whole_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  SL_CHECK_HINT(fd >= 0, "scripts/prepare_corpus.sh writes the text next to the shards (data/kjv/kjv.txt)",
                "cannot open text '%s': %s", path.c_str(), std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    SL_FAIL("check the file's permissions", "cannot stat text '%s': %s", path.c_str(), std::strerror(err));
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t got = ::read(fd, text.data() + done, text.size() - done);
    if (got <= 0) {
      const int err = errno;
      ::close(fd);
      SL_FAIL("is the file being rewritten? rerun scripts/prepare_corpus.sh",
              "reading text '%s' stopped at byte %zu "
              "of %zu: %s",
              path.c_str(), done, text.size(), got == 0 ? "end of file" : std::strerror(err));
    }
    done += static_cast<size_t>(got);
  }
  ::close(fd);
  return text;
}

class NaiveTextLoader {
 public:
  // text_path: the raw text the train shards of data_dir were made from (sl_make_shards, docs/formats.md:
  // the train split is the text's first tokens). config: B, T, seed, dp_rank, dp_size, shuffle as the kit
  // loader's (prefetch and on_assemble are ignored: this loader has neither). Checks once that the text
  // is the shards' (each train shard's FNV-1a checksum against the text's bytes stored as 2-byte tokens),
  // so both loaders serve the same windows; throws with a hint otherwise.
  NaiveTextLoader(const std::string& text_path, const std::string& data_dir, const lab02::LoaderConfig& config)
      : path_(text_path), cfg_(config) {
    const std::string text = read_whole_file(path_);
    for (const std::string& shard : data::list_shards(data_dir, "train")) {
      const data::ShardHeader h = data::read_shard_header(shard, /*verify_checksum=*/false);
      SL_CHECK_HINT(h.vocab_size == static_cast<uint32_t>(data::kByteVocab) && h.bytes_per_token == 2,
                    "the naive loader tokenizes bytes; make byte-level shards with scripts/prepare_corpus.sh",
                    "shard '%s' has vocab_size %u and %u-byte tokens, not the byte tokenizer's 256 and 2",
                    shard.c_str(), h.vocab_size, h.bytes_per_token);
      SL_CHECK_HINT(n_tokens_ + static_cast<int64_t>(h.token_count) <= static_cast<int64_t>(text.size()),
                    "pass the text the shards were made from (--text), or rerun scripts/prepare_corpus.sh",
                    "text '%s' has %zu bytes, fewer than the %lld tokens of the train shards up to '%s'", path_.c_str(),
                    text.size(), static_cast<long long>(n_tokens_ + static_cast<int64_t>(h.token_count)),
                    shard.c_str());
      std::vector<uint8_t> body(2 * h.token_count);  // the shard's body as sl_make_shards stored it
      for (uint64_t i = 0; i < h.token_count; ++i) {
        body[2 * i] = static_cast<uint8_t>(text[static_cast<size_t>(n_tokens_) + i]);
        body[2 * i + 1] = 0;
      }
      SL_CHECK_HINT(data::fnv1a64(body.data(), body.size()) == h.checksum,
                    "pass the text the shards were made from (--text), or rerun scripts/prepare_corpus.sh",
                    "text '%s' is not the text shard '%s' was made from (its checksum differs)", path_.c_str(),
                    shard.c_str());
      n_tokens_ += static_cast<int64_t>(h.token_count);
    }
    n_windows_ = (n_tokens_ - 1) / cfg_.T;
    n_batches_ = n_windows_ / (static_cast<int64_t>(cfg_.B) * cfg_.dp_size);
    SL_CHECK_HINT(n_batches_ >= 1, "use a smaller B or T",
                  "%lld tokens make no global batch of B*dp_size=%d*%d "
                  "windows of T+1=%d tokens",
                  static_cast<long long>(n_tokens_), cfg_.B, cfg_.dp_size, cfg_.T + 1);
  }

  // The next batch: (B, T) inputs and targets, the same windows as ShardLoader::next() at this position.
  // wait_ms: the whole call (there is no prefetch). Epochs follow each other as in ShardLoader.
  lab02::Batch next() {
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<int32_t> tokens = data::encode_bytes(read_whole_file(path_));  // the naive part
    if (order_epoch_ != epoch_) {
      order_ = lab02::epoch_window_order(n_windows_, cfg_.seed, epoch_, cfg_.shuffle);
      order_epoch_ = epoch_;
    }
    lab02::Batch b;
    b.B = cfg_.B;
    b.T = cfg_.T;
    b.epoch = epoch_;
    b.batch_in_epoch = batch_;
    b.window_ids = lab02::rank_batch_windows(order_, batch_, cfg_.B, cfg_.dp_rank, cfg_.dp_size);
    b.inputs.resize(static_cast<size_t>(cfg_.B) * cfg_.T);   // (B, T)
    b.targets.resize(static_cast<size_t>(cfg_.B) * cfg_.T);  // (B, T)
    for (int r = 0; r < cfg_.B; ++r) {
      const int32_t* w = tokens.data() + b.window_ids[r] * cfg_.T;  // window: stream tokens [w*T, w*T + T + 1)
      std::copy(w, w + cfg_.T, b.inputs.begin() + static_cast<size_t>(r) * cfg_.T);
      std::copy(w + 1, w + cfg_.T + 1, b.targets.begin() + static_cast<size_t>(r) * cfg_.T);
    }
    if (++batch_ == n_batches_) {
      batch_ = 0;
      ++epoch_;
    }
    b.wait_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return b;
  }

  int64_t tokens_total() const { return n_tokens_; }  // N of the train stream (its shards' token count)

 private:
  std::string path_;
  lab02::LoaderConfig cfg_;
  int64_t n_tokens_ = 0, n_windows_ = 0, n_batches_ = 0;
  int64_t epoch_ = 0, batch_ = 0;  // position of the next batch
  int64_t order_epoch_ = -1;       // the epoch whose order is cached in order_
  std::vector<int64_t> order_;
};

}  // namespace scalelab::lab02_driver
