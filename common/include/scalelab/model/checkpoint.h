// checkpoint.h — a model-agnostic checkpoint file: named sections of bytes plus small JSON sections.
// What goes in a checkpoint (parameters, optimizer state, loader position, RNG) is the caller's
// choice; this file only guarantees that what was written is what is read back, or a loud error.
// The byte layout is described at the top of common/src/model/checkpoint.cpp.
// Tests: tests/common/model/test_checkpoint.cpp
//
//   CheckpointWriter w;
//   w.add("params/unit0", d_params, params_bytes);   // borrowed: must stay valid until commit()
//   w.add_json("meta", {{"step", step}, {"config", cfg}});
//   w.commit(checkpoint_path("runs/lab08/run1", step));  // atomic: tmp file, fsync, rename
//
//   CheckpointReader r(latest_checkpoint("runs/lab08/run1"));  // validates the whole file
//   r.read("params/unit0", d_params, params_bytes);            // size and checksum checked
//   int64_t step = r.json("meta")["step"];
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>  // defines: nlohmann::json (metadata sections)

namespace scalelab {

// ---------------------------------------------------------------------------------------------
// Writing

class CheckpointWriter {
 public:
  // Adds a section that BORROWS `data`: no copy is made, so the buffer must stay alive and unchanged
  // until commit() returns (a 1.5B-parameter model with AdamW state is ~24 GB; copying it would double
  // host memory). Names are unique, 1-255 bytes, e.g. "params/unit3" or "optim/m/unit3".
  void add(const std::string& name, const void* data, size_t nbytes);
  // As add(), but copies the bytes now (for small, short-lived values: RNG state, loader position).
  void add_copy(const std::string& name, const void* data, size_t nbytes);
  // A JSON section (stored as UTF-8 text, owned by the writer). Read back with CheckpointReader::json.
  void add_json(const std::string& name, const nlohmann::json& value);

  // Writes every section to `path` atomically: the bytes go to "<path>.tmp.<pid>", which is fsync'ed
  // and then renamed over `path`, and the directory is fsync'ed. A crash at any moment leaves either
  // the old file or the new one at `path`, never a partial one (a stale .tmp.<pid> may remain;
  // remove_old_checkpoints deletes those of dead processes). Creates the parent directory.
  // Throws scalelab::Error (disk full, no permission, ...) after removing the tmp file.
  void commit(const std::string& path) const;

  size_t num_sections() const { return sections_.size(); }

 private:
  struct Section {
    std::string name;
    const uint8_t* data = nullptr;  // borrowed bytes (add); null for owned sections
    size_t nbytes = 0;
    std::vector<uint8_t> owned;  // the bytes of add_copy / add_json sections
    const uint8_t* bytes() const { return data ? data : owned.data(); }
  };
  void check_new_name(const std::string& name) const;
  std::vector<Section> sections_;
};

// ---------------------------------------------------------------------------------------------
// Reading

class CheckpointReader {
 public:
  // Opens and validates `path`: magic, version, length, the section table and (with
  // verify_file_checksum) the CRC-32 of the whole file. Throws scalelab::Error naming the file, what
  // was expected and what was found, and which checkpoint to use instead. Nothing is kept in memory
  // but the section table; read() goes back to the file.
  explicit CheckpointReader(const std::string& path, bool verify_file_checksum = true);

  bool has(const std::string& name) const;
  std::vector<std::string> names() const;            // in the order they were written
  size_t size_bytes(const std::string& name) const;  // throws if the section is missing

  // Copies section `name` into dst. Throws if the section is missing, if nbytes differs from the
  // stored size (a different model config or precision policy, usually), or if its CRC-32 fails.
  void read(const std::string& name, void* dst, size_t nbytes) const;
  std::vector<uint8_t> bytes(const std::string& name) const;  // the section, checked, in a new buffer
  nlohmann::json json(const std::string& name) const;         // a section written by add_json

  const std::string& path() const { return path_; }
  uint64_t file_bytes() const { return file_bytes_; }

 private:
  struct Entry {
    std::string name;
    uint64_t offset = 0;  // bytes from the start of the file
    uint64_t size_bytes = 0;
    uint32_t crc32 = 0;  // CRC-32 (zlib) of the section's bytes
  };
  const Entry& find(const std::string& name) const;
  std::string path_;
  uint64_t file_bytes_ = 0;
  std::vector<Entry> entries_;
};

// ---------------------------------------------------------------------------------------------
// Files around checkpoints (lab 08's manifests and completion markers, its shard checksums)

// Writes nbytes of data to `path` as commit() does: a temporary file, fsync, rename, directory fsync, so
// `path` holds either its old content or all of the new. Creates the parent directory. Throws
// scalelab::Error (no permission, disk full) after removing the temporary file.
void write_file_atomic(const std::string& path, const void* data, size_t nbytes);
// Adler-32 (zlib's adler32) of the whole file at `path`, streamed: a manifest's checksum of a file. Not CRC-32:
// a file that ends with the CRC-32 of what precedes it (as a checkpoint file does, plus a fixed end magic)
// has the same whole-file CRC-32 as every other such file (the CRC's residue), so it could not tell two
// intact shards apart. Throws scalelab::Error if the file cannot be read.
uint32_t file_checksum(const std::string& path);

// ---------------------------------------------------------------------------------------------
// Checkpoint directories: files named ckpt_<step>.bin (step without padding, e.g. ckpt_1200.bin).

std::string checkpoint_path(const std::string& dir, int64_t step);  // "<dir>/ckpt_<step>.bin"
// The step in a file name "…/ckpt_<step>.bin", or -1 if the name does not have that form.
int64_t checkpoint_step(const std::string& path);

// The valid checkpoint with the highest step in `dir`, or "" if there is none (or no such dir).
// Damaged files (truncated, bad checksum, ...) are skipped with a warning on stderr, so a crash
// while a checkpoint was being written never stops a restart. Verifies every file it skips over and
// the one it returns (reads them in full).
std::string latest_checkpoint(const std::string& dir);

// Keeps the `keep_last` checkpoints with the highest steps in `dir` and deletes the older ones, plus
// "ckpt_<step>.bin.tmp.<pid>" files whose process is no longer running (left by a crash).
// keep_last >= 1. Returns the number of files deleted.
int remove_old_checkpoints(const std::string& dir, int keep_last);

}  // namespace scalelab
