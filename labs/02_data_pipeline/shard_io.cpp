// shard_io.cpp — lab 02's given code, one file compiled into both tracks (sl_add_lab's GIVEN in
// labs/CMakeLists.txt): shard files (format, writer, reader), the byte tokenizer, the loader state's 64-byte
// record, and the ShardLoader around your four functions (mapping, batch assembly, next(), the producer
// thread). It calls the TODO functions of its own track: yours in labs/02_data_pipeline/shard_loader.cpp, the
// reference's in solutions/02_data_pipeline/shard_loader.cpp. Format: docs/formats.md
// Tests: tests/lab02/test_shard_loader.cpp (this code), tests/lab02/test_lab02.cpp (graded, both tracks)
#include "shard_loader.h"

#include <fcntl.h>     // defines: open, O_RDONLY
#include <sys/mman.h>  // defines: mmap, munmap (shards are memory-mapped, read-only)
#include <sys/stat.h>  // defines: fstat
#include <unistd.h>    // defines: close, fsync

#include <algorithm>   // defines: std::upper_bound, std::min, std::sort, std::copy
#include <cerrno>      // defines: errno
#include <chrono>      // defines: std::chrono::steady_clock (wait_ms)
#include <cstdio>      // defines: std::fopen, std::fwrite, std::rename
#include <cstring>     // defines: std::memcmp, std::memcpy, std::strerror
#include <filesystem>  // defines: std::filesystem::directory_iterator (list_shards)
#include <utility>     // defines: std::move

#include "scalelab/core/error.h"  // defines: SL_CHECK, SL_CHECK_HINT, SL_FAIL

namespace scalelab::lab02 {
inline namespace SL_TRACK_LAB02 {

namespace {

// ---- little-endian integers, independent of the host's byte order ----------------------------
void store_le(uint8_t* p, uint64_t v, int n_bytes) {
  for (int i = 0; i < n_bytes; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t load_le(const uint8_t* p, int n_bytes) {
  uint64_t v = 0;
  for (int i = 0; i < n_bytes; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

constexpr const char* kRegenerateHint =
    "regenerate the shards: scripts/prepare_corpus.sh (or build/bin/sl_make_shards --help)";

// ---- read-only memory map of a whole file ------------------------------------------------------
// Returns the mapping and its size in bytes; a file shorter than 8 bytes is "not a shard" and an
// empty file cannot be mapped, so both are rejected here with the shard error messages.
const uint8_t* map_file(const std::string& path, size_t* file_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  SL_CHECK_HINT(fd >= 0, kRegenerateHint, "cannot open shard '%s': %s", path.c_str(), std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    SL_FAIL(kRegenerateHint, "cannot stat shard '%s': %s", path.c_str(), std::strerror(err));
  }
  *file_bytes = static_cast<size_t>(st.st_size);
  if (*file_bytes < 8) {
    ::close(fd);
    SL_FAIL("make one with sl_make_shards (scripts/prepare_corpus.sh runs it)",
            "'%s' is not a scalelab shard (%zu bytes, no \"SLSHARD1\" magic)", path.c_str(), *file_bytes);
  }
  void* p = ::mmap(nullptr, *file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping stays valid after the descriptor is closed
  SL_CHECK_HINT(p != MAP_FAILED, "is the file on a file system that supports mmap?", "cannot mmap shard '%s': %s",
                path.c_str(), std::strerror(err));
  return static_cast<const uint8_t*>(p);
}

void unmap_file(const uint8_t* base, size_t file_bytes) {
  if (base != nullptr) ::munmap(const_cast<uint8_t*>(base), file_bytes);
}

// Parses and checks the 64-byte header at bytes[0, file_bytes) of the shard at path (for messages).
// verify_checksum: also hash the body and compare with the header (reads every byte once).
ShardHeader parse_shard(const uint8_t* bytes, size_t file_bytes, const std::string& path, bool verify_checksum) {
  SL_CHECK_HINT(std::memcmp(bytes, kShardMagic, 8) == 0,
                "make one with sl_make_shards (scripts/prepare_corpus.sh runs it)",
                "'%s' is not a scalelab shard (first 8 bytes are not \"SLSHARD1\")", path.c_str());
  SL_CHECK_HINT(file_bytes >= kShardHeaderBytes, kRegenerateHint,
                "truncated shard '%s': header needs %zu bytes, found %zu", path.c_str(), kShardHeaderBytes,
                file_bytes);
  ShardHeader h;
  h.version = static_cast<uint32_t>(load_le(bytes + 8, 4));
  h.bytes_per_token = static_cast<uint32_t>(load_le(bytes + 12, 4));
  h.vocab_size = static_cast<uint32_t>(load_le(bytes + 16, 4));
  h.token_count = load_le(bytes + 24, 8);
  h.checksum = load_le(bytes + 32, 8);

  SL_CHECK_HINT(h.version == kShardVersion, "rewrite the shards with this build's sl_make_shards",
                "unsupported shard version %u in '%s' (this build reads version %u)", h.version, path.c_str(),
                kShardVersion);
  SL_CHECK_HINT(h.bytes_per_token == 2 || h.bytes_per_token == 4, kRegenerateHint,
                "bad bytes_per_token %u in '%s' (must be 2 or 4)", h.bytes_per_token, path.c_str());
  SL_CHECK_HINT(h.vocab_size >= 1, kRegenerateHint, "vocab_size 0 in '%s'", path.c_str());
  SL_CHECK_HINT(h.bytes_per_token == 4 || h.vocab_size <= 65536u, kRegenerateHint,
                "'%s' stores 2-byte tokens but vocab_size=%u > 65536 does not fit in 2 bytes", path.c_str(),
                h.vocab_size);

  // The body must be exactly token_count tokens: shorter is a cut-off copy, longer is not our file.
  const uint64_t expected = kShardHeaderBytes + h.token_count * h.bytes_per_token;  // bytes
  SL_CHECK_HINT(file_bytes >= expected, "the file was cut short (interrupted write or copy?); " +
                std::string(kRegenerateHint),
                "truncated shard '%s': expected %llu bytes (64-byte header + %llu tokens x %u bytes) found %zu",
                path.c_str(), static_cast<unsigned long long>(expected),
                static_cast<unsigned long long>(h.token_count), h.bytes_per_token, file_bytes);
  SL_CHECK_HINT(file_bytes == expected, kRegenerateHint,
                "shard '%s' has %zu bytes, expected %llu: %llu bytes after the last token", path.c_str(),
                file_bytes, static_cast<unsigned long long>(expected),
                static_cast<unsigned long long>(file_bytes - expected));
  if (verify_checksum) {
    const uint64_t actual = fnv1a64(bytes + kShardHeaderBytes, expected - kShardHeaderBytes);
    SL_CHECK_HINT(actual == h.checksum, "the file is corrupted; " + std::string(kRegenerateHint),
                  "checksum mismatch in '%s': header says 0x%016llx, body hashes to 0x%016llx (FNV-1a 64)",
                  path.c_str(), static_cast<unsigned long long>(h.checksum),
                  static_cast<unsigned long long>(actual));
  }
  return h;
}

}  // namespace

// =============================================================================================
// Shard files
// =============================================================================================
uint64_t fnv1a64(const uint8_t* bytes, size_t n_bytes) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64 offset basis
  for (size_t i = 0; i < n_bytes; ++i) {
    h ^= bytes[i];
    h *= 0x100000001b3ull;  // FNV 64-bit prime
  }
  return h;
}

void write_shard(const std::string& path, const std::vector<int32_t>& tokens, int vocab_size) {
  SL_CHECK(vocab_size >= 1, "vocab_size=%d must be >= 1", vocab_size);
  const int bytes_per_token = vocab_size <= 65536 ? 2 : 4;

  // Body: validate every token, then store it little-endian in bytes_per_token bytes.
  std::vector<uint8_t> body(tokens.size() * bytes_per_token);  // (token_count * bytes_per_token) bytes
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t t = tokens[i];
    if (t < 0 || t >= vocab_size)
      SL_FAIL("every token must be in [0, vocab_size); is vocab_size right for this tokenizer?",
              "token %d at index %zu is outside [0, vocab_size=%d) (writing '%s')", t, i, vocab_size,
              path.c_str());
    store_le(body.data() + i * bytes_per_token, static_cast<uint32_t>(t), bytes_per_token);
  }

  uint8_t header[kShardHeaderBytes] = {};  // zero padding included
  std::memcpy(header, kShardMagic, 8);
  store_le(header + 8, kShardVersion, 4);
  store_le(header + 12, static_cast<uint32_t>(bytes_per_token), 4);
  store_le(header + 16, static_cast<uint32_t>(vocab_size), 4);
  store_le(header + 20, 0, 4);  // reserved
  store_le(header + 24, tokens.size(), 8);
  store_le(header + 32, fnv1a64(body.data(), body.size()), 8);

  // Write <path>.tmp completely, flush it to disk, then rename: readers see the old shard or the
  // new one, never half of one.
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  SL_CHECK_HINT(f != nullptr, "does the directory exist and is it writable?", "cannot open '%s' for writing: %s",
                tmp.c_str(), std::strerror(errno));
  bool ok = std::fwrite(header, 1, sizeof(header), f) == sizeof(header);
  ok = ok && (body.empty() || std::fwrite(body.data(), 1, body.size(), f) == body.size());
  ok = ok && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  const int err = errno;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    SL_FAIL("is the disk full?", "writing '%s' failed: %s", tmp.c_str(), std::strerror(err));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int rename_err = errno;
    std::remove(tmp.c_str());
    SL_FAIL("is the destination writable?", "cannot rename '%s' to '%s': %s", tmp.c_str(), path.c_str(),
            std::strerror(rename_err));
  }
}

ShardHeader read_shard_header(const std::string& path, bool verify_checksum) {
  SL_CHECK_HINT(std::filesystem::exists(path), "make shards with scripts/prepare_corpus.sh (or sl_make_shards)",
                "shard '%s' does not exist", path.c_str());
  size_t file_bytes = 0;
  const uint8_t* base = map_file(path, &file_bytes);
  try {
    const ShardHeader h = parse_shard(base, file_bytes, path, verify_checksum);
    unmap_file(base, file_bytes);
    return h;
  } catch (...) {
    unmap_file(base, file_bytes);
    throw;
  }
}

std::vector<int32_t> read_shard(const std::string& path) {
  SL_CHECK_HINT(std::filesystem::exists(path), "make shards with scripts/prepare_corpus.sh (or sl_make_shards)",
                "shard '%s' does not exist", path.c_str());
  size_t file_bytes = 0;
  const uint8_t* base = map_file(path, &file_bytes);
  try {
    const ShardHeader h = parse_shard(base, file_bytes, path, /*verify_checksum=*/true);
    std::vector<int32_t> tokens(h.token_count);
    const uint8_t* body = base + kShardHeaderBytes;
    for (size_t i = 0; i < tokens.size(); ++i)
      tokens[i] = static_cast<int32_t>(load_le(body + i * h.bytes_per_token, h.bytes_per_token));
    unmap_file(base, file_bytes);
    return tokens;
  } catch (...) {
    unmap_file(base, file_bytes);
    throw;
  }
}

std::vector<std::string> list_shards(const std::string& dir, const std::string& split) {
  namespace fs = std::filesystem;
  SL_CHECK_HINT(fs::is_directory(dir), "run scripts/prepare_corpus.sh (writes data/kjv/train_*.bin, val_*.bin)",
                "data directory '%s' does not exist", dir.c_str());
  // <split>_<digits>.bin, e.g. train_000003.bin; leftovers such as train_000003.bin.tmp do not match.
  const std::string prefix = split + "_";
  std::vector<std::string> files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.size() <= prefix.size() + 4 || name.compare(0, prefix.size(), prefix) != 0 ||
        name.compare(name.size() - 4, 4, ".bin") != 0)
      continue;
    const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - 4);
    if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
    files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());  // zero-padded numbers: name order is shard order
  SL_CHECK_HINT(!files.empty(),
                "make shards: scripts/prepare_corpus.sh (the default corpus) or scripts/prepare_corpus.sh --text "
                "FILE... --out " + dir,
                "no '%s_*.bin' shards in '%s'", split.c_str(), dir.c_str());
  return files;
}

// =============================================================================================
// Byte-level tokenizer
// =============================================================================================
std::vector<int32_t> encode_bytes(const std::string& text) {
  std::vector<int32_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);  // 0..255
  return tokens;
}

void load_batch(const Batch& b, scalelab::Tensor& x, scalelab::Tensor& y) {
  const scalelab::Shape want{b.B, b.T};
  SL_CHECK(x.shape() == want && y.shape() == want && x.dtype() == scalelab::DType::I32 &&
               y.dtype() == scalelab::DType::I32,
           "batch is (%d, %d) i32; inputs %s and targets %s must be the same", b.B, b.T,
           scalelab::shape_str(x.shape()).c_str(), scalelab::shape_str(y.shape()).c_str());
  scalelab::Tensor h_x = scalelab::Tensor::empty(want, scalelab::DType::I32, scalelab::Device::CPU,
                                                 scalelab::MemCategory::Data);
  scalelab::Tensor h_y = scalelab::Tensor::empty(want, scalelab::DType::I32, scalelab::Device::CPU,
                                                 scalelab::MemCategory::Data);
  std::copy(b.inputs.begin(), b.inputs.end(), h_x.data<int32_t>());
  std::copy(b.targets.begin(), b.targets.end(), h_y.data<int32_t>());
  x.copy_from(h_x);
  y.copy_from(h_y);
}

std::string decode_bytes(const std::vector<int32_t>& tokens) {
  std::string text(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= kByteVocab)
      SL_FAIL("byte-level tokens are 0..255; were these tokens made by another tokenizer?",
              "token %d at index %zu is not a byte", tokens[i], i);
    text[i] = static_cast<char>(static_cast<unsigned char>(tokens[i]));
  }
  return text;
}

// =============================================================================================
// LoaderState: 64 bytes, little-endian
// =============================================================================================
//   0 magic "SLLOADR1" | 8 u32 version=1 | 12 u32 B | 16 u32 T | 20 u32 dp_size | 24 u32 dp_rank
//   28 u32 shuffle | 32 u64 seed | 40 u64 epoch | 48 u64 batch_in_epoch | 56 u64 tokens_total
namespace {
constexpr char kStateMagic[9] = "SLLOADR1";
constexpr uint32_t kStateVersion = 1;
}  // namespace

std::vector<uint8_t> LoaderState::to_bytes() const {
  std::vector<uint8_t> b(kBytes, 0);
  std::memcpy(b.data(), kStateMagic, 8);
  store_le(&b[8], kStateVersion, 4);
  store_le(&b[12], static_cast<uint32_t>(B), 4);
  store_le(&b[16], static_cast<uint32_t>(T), 4);
  store_le(&b[20], static_cast<uint32_t>(dp_size), 4);
  store_le(&b[24], static_cast<uint32_t>(dp_rank), 4);
  store_le(&b[28], shuffle ? 1 : 0, 4);
  store_le(&b[32], seed, 8);
  store_le(&b[40], static_cast<uint64_t>(epoch), 8);
  store_le(&b[48], static_cast<uint64_t>(batch_in_epoch), 8);
  store_le(&b[56], static_cast<uint64_t>(tokens_total), 8);
  return b;
}

LoaderState LoaderState::from_bytes(const std::vector<uint8_t>& b) {
  SL_CHECK_HINT(b.size() == kBytes, "pass exactly the bytes LoaderState::to_bytes() returned",
                "loader state is %zu bytes, expected %zu", b.size(), kBytes);
  SL_CHECK_HINT(std::memcmp(b.data(), kStateMagic, 8) == 0, "was this record written by LoaderState::to_bytes()?",
                "not a loader state (first 8 bytes are not \"SLLOADR1\")");
  const uint32_t version = static_cast<uint32_t>(load_le(&b[8], 4));
  SL_CHECK_HINT(version == kStateVersion, "this checkpoint comes from another scalelab version",
                "unsupported loader state version %u (this build reads %u)", version, kStateVersion);
  LoaderState s;
  s.B = static_cast<int32_t>(load_le(&b[12], 4));
  s.T = static_cast<int32_t>(load_le(&b[16], 4));
  s.dp_size = static_cast<int32_t>(load_le(&b[20], 4));
  s.dp_rank = static_cast<int32_t>(load_le(&b[24], 4));
  s.shuffle = load_le(&b[28], 4) != 0;
  s.seed = load_le(&b[32], 8);
  s.epoch = static_cast<int64_t>(load_le(&b[40], 8));
  s.batch_in_epoch = static_cast<int64_t>(load_le(&b[48], 8));
  s.tokens_total = static_cast<int64_t>(load_le(&b[56], 8));
  return s;
}

// =============================================================================================
// ShardLoader
// =============================================================================================
ShardLoader::ShardLoader(const std::string& dir, const std::string& split, const LoaderConfig& config)
    : ShardLoader(list_shards(dir, split), config) {}

ShardLoader::ShardLoader(const std::vector<std::string>& files, const LoaderConfig& config) : cfg_(config) {
  SL_CHECK(cfg_.B >= 1 && cfg_.T >= 1, "B=%d T=%d must be >= 1", cfg_.B, cfg_.T);
  SL_CHECK(cfg_.dp_size >= 1 && cfg_.dp_rank >= 0 && cfg_.dp_rank < cfg_.dp_size,
           "dp_rank=%d dp_size=%d: need 0 <= dp_rank < dp_size", cfg_.dp_rank, cfg_.dp_size);
  SL_CHECK(cfg_.prefetch_depth >= 1, "prefetch_depth=%d must be >= 1 (or set prefetch=false)", cfg_.prefetch_depth);
  open_shards(files);

  n_windows_ = n_tokens_ > 0 ? (n_tokens_ - 1) / cfg_.T : 0;             // W: windows start every T tokens
  n_batches_ = n_windows_ / (static_cast<int64_t>(cfg_.B) * cfg_.dp_size);  // whole global batches
  if (n_batches_ < 1) {
    for (const MappedShard& s : shards_) unmap_file(s.base, s.file_bytes);
    shards_.clear();
    SL_FAIL("use a smaller B or T, fewer ranks, or more text (for a val split: a larger --val-fraction)",
            "%lld tokens make %lld windows of T+1=%d tokens, fewer than one global batch of B*dp_size=%d*%d",
            static_cast<long long>(n_tokens_), static_cast<long long>(n_windows_), cfg_.T + 1, cfg_.B,
            cfg_.dp_size);
  }
  if (cfg_.prefetch) start_prefetch();
}

ShardLoader::~ShardLoader() {
  stop_prefetch();
  for (const MappedShard& s : shards_) unmap_file(s.base, s.file_bytes);
}

void ShardLoader::open_shards(const std::vector<std::string>& files) {
  SL_CHECK_HINT(!files.empty(), "pass at least one shard (list_shards(dir, split) finds them)",
                "ShardLoader got an empty list of shard files");
  try {
    for (const std::string& path : files) {
      SL_CHECK_HINT(std::filesystem::exists(path), "make shards with scripts/prepare_corpus.sh (or sl_make_shards)",
                    "shard '%s' does not exist", path.c_str());
      MappedShard s;
      s.path = path;
      s.base = map_file(path, &s.file_bytes);
      shards_.push_back(s);  // from here on the destructor (or the catch below) unmaps it
      shards_.back().header = parse_shard(s.base, s.file_bytes, path, cfg_.verify_checksums);
      shards_.back().first_token = n_tokens_;
      n_tokens_ += static_cast<int64_t>(shards_.back().header.token_count);

      const uint32_t vocab = shards_.back().header.vocab_size;
      SL_CHECK_HINT(vocab == shards_.front().header.vocab_size, "all shards of one loader come from one tokenizer",
                    "shard '%s' has vocab_size %u but '%s' has %u", path.c_str(), vocab,
                    shards_.front().path.c_str(), shards_.front().header.vocab_size);
    }
  } catch (...) {
    for (const MappedShard& s : shards_) unmap_file(s.base, s.file_bytes);
    shards_.clear();
    throw;
  }
  vocab_size_ = static_cast<int>(shards_.front().header.vocab_size);
}

void ShardLoader::copy_tokens(int64_t start, int64_t n, int32_t* out) const {
  SL_CHECK(start >= 0 && n >= 0 && start + n <= n_tokens_, "tokens [%lld, %lld) outside the stream of %lld",
           static_cast<long long>(start), static_cast<long long>(start + n), static_cast<long long>(n_tokens_));
  // The last shard whose first token is <= start holds token `start`.
  auto it = std::upper_bound(shards_.begin(), shards_.end(), start,
                             [](int64_t pos, const MappedShard& s) { return pos < s.first_token; });
  size_t s = static_cast<size_t>(it - shards_.begin()) - 1;
  while (n > 0) {
    const MappedShard& sh = shards_[s];
    const int64_t local = start - sh.first_token;  // index within this shard
    const int64_t take = std::min(n, static_cast<int64_t>(sh.header.token_count) - local);
    const int bpt = static_cast<int>(sh.header.bytes_per_token);
    const uint8_t* p = sh.base + kShardHeaderBytes + local * bpt;
    for (int64_t i = 0; i < take; ++i) out[i] = static_cast<int32_t>(load_le(p + i * bpt, bpt));
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
  batch.inputs.resize(static_cast<size_t>(B) * T);   // (B, T)
  batch.targets.resize(static_cast<size_t>(B) * T);  // (B, T)
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
  SL_CHECK_HINT(s.B == cfg_.B && s.T == cfg_.T, hint, "state was saved with B=%d T=%d, this loader has B=%d T=%d",
                s.B, s.T, cfg_.B, cfg_.T);
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

}  // namespace SL_TRACK_LAB02
}  // namespace scalelab::lab02
