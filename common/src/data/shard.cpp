// shard.cpp — token shards: format, writer, readers, the list of a split, the read-only mapping
// (scalelab/data/shard.h; docs/formats.md "Token shards").
#include "scalelab/data/shard.h"

#include <fcntl.h>     // defines: open, O_RDONLY
#include <sys/mman.h>  // defines: mmap, munmap (shards are memory-mapped, read-only)
#include <sys/stat.h>  // defines: fstat
#include <unistd.h>    // defines: close, fsync

#include <algorithm>   // defines: std::sort
#include <cerrno>      // defines: errno
#include <cstdio>      // defines: std::fopen, std::fwrite, std::rename
#include <cstring>     // defines: std::memcmp, std::memcpy, std::strerror
#include <filesystem>  // defines: std::filesystem::directory_iterator (list_shards), exists
#include <utility>     // defines: std::move

#include "little_endian.h"        // defines: detail::store_le, load_le
#include "scalelab/core/error.h"  // defines: SL_CHECK, SL_CHECK_HINT, SL_FAIL

namespace scalelab::data {

using detail::load_le;
using detail::store_le;

namespace {

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
                "truncated shard '%s': header needs %zu bytes, found %zu", path.c_str(), kShardHeaderBytes, file_bytes);
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

  // The body must be exactly token_count tokens: shorter is a cut-off copy, longer is not our file. A count
  // whose byte size does not fit in 64 bits would wrap around in `expected` and pass (found by fuzz_shard).
  SL_CHECK_HINT(h.token_count <= (UINT64_MAX - kShardHeaderBytes) / h.bytes_per_token, kRegenerateHint,
                "damaged shard '%s': its header says %llu tokens of %u bytes, more than any file holds", path.c_str(),
                static_cast<unsigned long long>(h.token_count), h.bytes_per_token);
  const uint64_t expected = kShardHeaderBytes + h.token_count * h.bytes_per_token;  // bytes
  SL_CHECK_HINT(file_bytes >= expected,
                "the file was cut short (interrupted write or copy?); " + std::string(kRegenerateHint),
                "truncated shard '%s': expected %llu bytes (64-byte header + %llu tokens x %u bytes) found %zu",
                path.c_str(), static_cast<unsigned long long>(expected), static_cast<unsigned long long>(h.token_count),
                h.bytes_per_token, file_bytes);
  SL_CHECK_HINT(file_bytes == expected, kRegenerateHint,
                "shard '%s' has %zu bytes, expected %llu: %llu bytes after the last token", path.c_str(), file_bytes,
                static_cast<unsigned long long>(expected), static_cast<unsigned long long>(file_bytes - expected));
  // Every token inside the vocabulary, checked when the shard is opened (the embedding would find it only
  // when the loader reaches it, without the shard or the position).
  const uint8_t* body = bytes + kShardHeaderBytes;
  for (uint64_t i = 0; i < h.token_count; ++i) {
    const uint64_t t = load_le(body + i * h.bytes_per_token, static_cast<int>(h.bytes_per_token));
    SL_CHECK_HINT(t < h.vocab_size, kRegenerateHint,
                  "shard '%s': token %llu at position %llu is outside the vocabulary [0, %u)", path.c_str(),
                  static_cast<unsigned long long>(t), static_cast<unsigned long long>(i), h.vocab_size);
  }
  if (verify_checksum) {
    const uint64_t actual = fnv1a64(bytes + kShardHeaderBytes, expected - kShardHeaderBytes);
    SL_CHECK_HINT(actual == h.checksum, "the file is corrupted; " + std::string(kRegenerateHint),
                  "checksum mismatch in '%s': header says 0x%016llx, body hashes to 0x%016llx (FNV-1a 64)",
                  path.c_str(), static_cast<unsigned long long>(h.checksum), static_cast<unsigned long long>(actual));
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
              "token %d at index %zu is outside [0, vocab_size=%d) (writing '%s')", t, i, vocab_size, path.c_str());
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
  return MappedShard(path, verify_checksum).header();
}

std::vector<int32_t> read_shard(const std::string& path) {
  const MappedShard shard(path, /*verify_checksum=*/true);
  std::vector<int32_t> tokens(static_cast<size_t>(shard.token_count()));
  shard.copy_tokens(0, shard.token_count(), tokens.data());
  return tokens;
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
                "FILE... --out " +
                    dir,
                "no '%s_*.bin' shards in '%s'", split.c_str(), dir.c_str());
  return files;
}

// =============================================================================================
// MappedShard
// =============================================================================================
MappedShard::MappedShard(const std::string& path, bool verify_checksum) : path_(path) {
  SL_CHECK_HINT(std::filesystem::exists(path), "make shards with scripts/prepare_corpus.sh (or sl_make_shards)",
                "shard '%s' does not exist", path.c_str());
  base_ = map_file(path, &file_bytes_);
  try {
    header_ = parse_shard(base_, file_bytes_, path, verify_checksum);
  } catch (...) {
    unmap_file(base_, file_bytes_);
    throw;
  }
}

MappedShard::~MappedShard() { unmap_file(base_, file_bytes_); }

MappedShard::MappedShard(MappedShard&& other) noexcept
    : path_(std::move(other.path_)), base_(other.base_), file_bytes_(other.file_bytes_), header_(other.header_) {
  other.base_ = nullptr;  // the mapping is ours now
  other.file_bytes_ = 0;
}

MappedShard& MappedShard::operator=(MappedShard&& other) noexcept {
  if (this != &other) {
    unmap_file(base_, file_bytes_);
    path_ = std::move(other.path_);
    base_ = other.base_;
    file_bytes_ = other.file_bytes_;
    header_ = other.header_;
    other.base_ = nullptr;
    other.file_bytes_ = 0;
  }
  return *this;
}

void MappedShard::copy_tokens(int64_t first, int64_t n, int32_t* out) const {
  SL_CHECK(first >= 0 && n >= 0 && first + n <= token_count(), "tokens [%lld, %lld) outside shard '%s' of %lld",
           static_cast<long long>(first), static_cast<long long>(first + n), path_.c_str(),
           static_cast<long long>(token_count()));
  const int bpt = static_cast<int>(header_.bytes_per_token);
  const uint8_t* p = base_ + kShardHeaderBytes + first * bpt;
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(load_le(p + i * bpt, bpt));
}

}  // namespace scalelab::data
