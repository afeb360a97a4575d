// shard.h — token shards on disk: the 64-byte header, the FNV-1a 64 checksum, the writer, the readers and
// the list of a split's files; a shard mapped read-only for a loader (MappedShard). Format and the rules
// behind it: docs/formats.md "Token shards". Writer of the corpus: tools/make_shards.cpp; reader that
// serves windows: lab 02's ShardLoader (labs/02_data_pipeline/shard_loader.h).
// Implementation: common/src/data/shard.cpp   Tests: tests/common/data/test_shards.cpp
#pragma once

#include <cstddef>  // defines: size_t
#include <cstdint>  // defines: int32_t, int64_t, uint8_t, uint32_t, uint64_t
#include <string>
#include <vector>

namespace scalelab::data {

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
inline constexpr char kShardMagic[9] = "SLSHARD1";  // 8 bytes on disk; [8] is the C string's NUL
inline constexpr uint32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderBytes = 64;  // bytes

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

// One shard file mapped read-only into memory, its header validated as read_shard_header validates it
// (verify_checksum: the body hashed once, about 1 GB/s). A loader holds one per file and copies windows
// out of the page cache. Unmapped when destroyed; movable, not copyable.
class MappedShard {
 public:
  MappedShard(const std::string& path, bool verify_checksum);  // throws scalelab::Error with a hint
  ~MappedShard();
  MappedShard(MappedShard&& other) noexcept;
  MappedShard& operator=(MappedShard&& other) noexcept;
  MappedShard(const MappedShard&) = delete;
  MappedShard& operator=(const MappedShard&) = delete;

  const std::string& path() const { return path_; }
  const ShardHeader& header() const { return header_; }
  int64_t token_count() const { return static_cast<int64_t>(header_.token_count); }
  // Copies tokens [first, first + n) of this shard into out (n int32); 0 <= first, first + n <= token_count.
  void copy_tokens(int64_t first, int64_t n, int32_t* out) const;

 private:
  std::string path_;
  const uint8_t* base_ = nullptr;  // start of the mapping (the header)
  size_t file_bytes_ = 0;          // bytes mapped
  ShardHeader header_;
};

}  // namespace scalelab::data
