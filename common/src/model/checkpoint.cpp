// checkpoint.cpp — the checkpoint file (checkpoint.h). Tests: tests/common/model/test_checkpoint.cpp
//
// File layout, version 1. All integers little-endian (checked at compile time below).
//
//   offset      bytes  field
//   0           8      magic "SLCKPT\0\0"
//   8           4      u32 format version (1)
//   12          4      u32 number of sections S
//   16          8      u64 table_bytes: size of the section table that follows
//   24          8      u64 file_bytes: size of the whole file, footer included
//   32          ...    section table, S entries of
//                        u32 name_bytes, name (no terminating NUL), u64 offset, u64 size_bytes, u32 crc32
//   ...         ...    section data: each section starts at a multiple of 64 bytes (zero padding between)
//   file-16     4      u32 CRC-32 of bytes [0, file_bytes - 16): header, table, padding and data
//   file-12     4      u32 reserved (0)
//   file-8      8      end magic "SLCKEND\0"
//
// Checksums are CRC-32 (zlib's crc32(), the polynomial of gzip/PNG/zip). Each section has its own so a
// damaged file names the damaged section; the whole-file CRC also covers the header and table. The
// file length in the header catches truncation before any checksum is computed.
#include "scalelab/model/checkpoint.h"

#include <fcntl.h>     // defines: open, O_* flags
#include <signal.h>    // defines: kill (is a process alive?)
#include <sys/stat.h>  // defines: fstat
#include <unistd.h>    // defines: write, pread, fsync, close, getpid
#include <zlib.h>      // defines: crc32, adler32

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "scalelab/core/error.h"  // defines: SL_CHECK_HINT, SL_FAIL

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "scalelab checkpoints are written little-endian; this big-endian host would need byte swaps"
#endif

namespace fs = std::filesystem;

namespace scalelab {

namespace {

constexpr char kMagic[8] = {'S', 'L', 'C', 'K', 'P', 'T', '\0', '\0'};
constexpr char kEndMagic[8] = {'S', 'L', 'C', 'K', 'E', 'N', 'D', '\0'};
constexpr uint32_t kVersion = 1;
constexpr uint64_t kHeaderBytes = 32;
constexpr uint64_t kFooterBytes = 16;
constexpr uint64_t kSectionAlignBytes = 64;
constexpr size_t kMaxNameBytes = 255;
constexpr size_t kIoChunkBytes = 8u << 20;  // bytes (8 MiB) per read/write call and per CRC update

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// CRC-32 continued over [data, data + n). zlib takes a 32-bit length, so feed it in chunks.
uint32_t crc32_update(uint32_t crc, const uint8_t* data, size_t n) {
  while (n > 0) {
    const size_t chunk = std::min(n, kIoChunkBytes);
    crc = static_cast<uint32_t>(::crc32(crc, data, static_cast<uInt>(chunk)));
    data += chunk;
    n -= chunk;
  }
  return crc;
}
uint32_t crc32_of(const uint8_t* data, size_t n) {
  return crc32_update(static_cast<uint32_t>(::crc32(0L, Z_NULL, 0)), data, n);
}

// Little-endian field appenders/readers for the header and table.
template <typename T>
void put(std::vector<uint8_t>& buf, T v) {
  const size_t at = buf.size();
  buf.resize(at + sizeof(T));
  std::memcpy(buf.data() + at, &v, sizeof(T));
}
template <typename T>
T get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

std::string hex32(uint32_t v) {
  char s[16];
  std::snprintf(s, sizeof(s), "0x%08x", v);
  return s;
}

// Printable form of up to 8 magic bytes: "SLCKPT\0\0" -> "SLCKPT..", "\x7fELF" -> ".ELF....".
std::string printable(const uint8_t* p, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += (p[i] >= 32 && p[i] < 127) ? static_cast<char>(p[i]) : '.';
  return s;
}

// Owns a POSIX file descriptor; closes it on every path out (errors are exceptions here).
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

// ---------------------------------------------------------------------------------------------
// Hints: when a checkpoint is unusable, tell the user which one to use instead.

// (step, path) of every ckpt_<step>.bin in dir, highest step first. Missing dir: empty.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return found;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int64_t step = checkpoint_step(e.path().string());
    if (step >= 0 && e.is_regular_file(ec)) found.emplace_back(step, e.path().string());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return found;
}

std::string dir_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

// "the checkpoint is damaged; the previous one is runs/x/ckpt_100.bin; pass --resume with that one".
// It never advises deleting anything: the user decides what happens to their files. The previous one is listed, not verified (that would read it in full).
std::string damaged_hint(const std::string& path) {
  const int64_t step = checkpoint_step(path);
  std::string previous;
  for (const auto& [s, p] : list_checkpoints(dir_of(path))) {
    if (p != path && (step < 0 || s < step)) {
      previous = p;
      break;
    }
  }
  std::string hint = "the checkpoint is damaged (an interrupted write, a full disk or a copy error); ";
  if (!previous.empty()) {
    hint += "the previous one is " + previous + "; pass --resume with that one";
  } else {
    hint += "there is no earlier ckpt_<step>.bin in " + dir_of(path) + "; start without --resume";
  }
  return hint;
}

// Reads exactly n bytes at offset, or throws (a short read means the file shrank under us).
void pread_exact(int fd, const std::string& path, void* dst, size_t n, uint64_t offset) {
  uint8_t* out = static_cast<uint8_t*>(dst);
  while (n > 0) {
    const size_t want = std::min(n, kIoChunkBytes);
    const ssize_t got = ::pread(fd, out, want, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    SL_CHECK_HINT(got > 0, damaged_hint(path), "checkpoint %s: read of %zu bytes at offset %llu failed: %s",
                  path.c_str(), want, static_cast<unsigned long long>(offset),
                  got < 0 ? std::strerror(errno) : "unexpected end of file (truncated?)");
    out += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<size_t>(got);
  }
}

// Streams n bytes of the file starting at offset through a bounded buffer: fn(data, bytes) per chunk.
template <class Fn>
void for_each_file_chunk(int fd, const std::string& path, uint64_t offset, uint64_t n, Fn fn) {
  std::vector<uint8_t> buf(static_cast<size_t>(std::min<uint64_t>(n, kIoChunkBytes)));
  while (n > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, buf.size()));
    pread_exact(fd, path, buf.data(), chunk, offset);
    fn(buf.data(), chunk);
    offset += chunk;
    n -= chunk;
  }
}

// CRC-32 of n bytes of the file starting at offset.
uint32_t crc32_of_file_range(int fd, const std::string& path, uint64_t offset, uint64_t n) {
  uint32_t crc = crc32_of(nullptr, 0);
  for_each_file_chunk(fd, path, offset, n, [&](const uint8_t* d, size_t k) { crc = crc32_update(crc, d, k); });
  return crc;
}

// write() all n bytes (write may write fewer; EINTR retried).
void write_all(int fd, const std::string& path, const uint8_t* data, size_t n) {
  while (n > 0) {
    const ssize_t put_n = ::write(fd, data, std::min(n, kIoChunkBytes));
    if (put_n < 0 && errno == EINTR) continue;
    SL_CHECK_HINT(put_n > 0, "check free disk space (df -h) and write permission on the directory",
                  "writing checkpoint %s failed: %s", path.c_str(), std::strerror(errno));
    data += put_n;
    n -= static_cast<size_t>(put_n);
  }
}

// The end of an atomic write: make the bytes of `tmp` durable before a name points at them (without this
// fsync a power loss after the rename can leave a file of the right name full of zeros), close it, then
// rename it over `path` (POSIX rename is atomic on one filesystem).
void publish(Fd& f, const std::string& tmp, const std::string& path) {
  SL_CHECK_HINT(::fsync(f.fd) == 0, "check free disk space (df -h)", "fsync of %s failed: %s", tmp.c_str(),
                std::strerror(errno));
  const int fd = f.fd;
  f.fd = -1;
  SL_CHECK_HINT(::close(fd) == 0, "check free disk space (df -h)", "close of %s failed: %s", tmp.c_str(),
                std::strerror(errno));
  SL_CHECK_HINT(::rename(tmp.c_str(), path.c_str()) == 0, "check write permission on the directory",
                "rename %s -> %s failed: %s", tmp.c_str(), path.c_str(), std::strerror(errno));
}

// Persists a directory entry (a rename inside it). Best effort: some filesystems refuse fsync on directories.
void fsync_dir(const fs::path& dir) {
  Fd d(::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (d.fd >= 0) ::fsync(d.fd);
}

}  // namespace

// =============================================================================================
// CheckpointWriter

void CheckpointWriter::check_new_name(const std::string& name) const {
  SL_CHECK_HINT(!name.empty() && name.size() <= kMaxNameBytes, "use a short path-like name, e.g. params/unit0",
                "checkpoint section name '%s' has %zu bytes; allowed 1..%zu", name.c_str(), name.size(), kMaxNameBytes);
  for (const Section& s : sections_) {
    SL_CHECK_HINT(s.name != name, "give each section a distinct name (params/unit0, params/unit1, ...)",
                  "checkpoint section '%s' added twice", name.c_str());
  }
}

void CheckpointWriter::add(const std::string& name, const void* data, size_t nbytes) {
  check_new_name(name);
  SL_CHECK(data != nullptr || nbytes == 0, "section '%s': data is null but nbytes=%zu", name.c_str(), nbytes);
  Section s;
  s.name = name;
  s.data = static_cast<const uint8_t*>(data);
  s.nbytes = nbytes;
  sections_.push_back(std::move(s));
}

void CheckpointWriter::add_copy(const std::string& name, const void* data, size_t nbytes) {
  check_new_name(name);
  SL_CHECK(data != nullptr || nbytes == 0, "section '%s': data is null but nbytes=%zu", name.c_str(), nbytes);
  Section s;
  s.name = name;
  s.owned.assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + nbytes);
  s.nbytes = nbytes;
  sections_.push_back(std::move(s));
}

void CheckpointWriter::add_json(const std::string& name, const nlohmann::json& value) {
  const std::string text = value.dump();
  add_copy(name, text.data(), text.size());
}

void CheckpointWriter::commit(const std::string& path) const {
  // 1. Lay out the file: table entries need every section's offset and CRC before anything is written.
  uint64_t table_bytes = 0;
  for (const Section& s : sections_) table_bytes += 4 + s.name.size() + 8 + 8 + 4;
  std::vector<uint64_t> offsets(sections_.size());
  uint64_t end = kHeaderBytes + table_bytes;
  for (size_t i = 0; i < sections_.size(); ++i) {
    offsets[i] = align_up(end, kSectionAlignBytes);
    end = offsets[i] + sections_[i].nbytes;
  }
  const uint64_t file_bytes = end + kFooterBytes;

  std::vector<uint8_t> head;  // header + table
  head.insert(head.end(), kMagic, kMagic + sizeof(kMagic));
  put<uint32_t>(head, kVersion);
  put<uint32_t>(head, static_cast<uint32_t>(sections_.size()));
  put<uint64_t>(head, table_bytes);
  put<uint64_t>(head, file_bytes);
  for (size_t i = 0; i < sections_.size(); ++i) {
    const Section& s = sections_[i];
    put<uint32_t>(head, static_cast<uint32_t>(s.name.size()));
    head.insert(head.end(), s.name.begin(), s.name.end());
    put<uint64_t>(head, offsets[i]);
    put<uint64_t>(head, s.nbytes);
    put<uint32_t>(head, crc32_of(s.bytes(), s.nbytes));
  }

  // 2. Write everything to a temporary file next to the target (same filesystem, so rename is atomic).
  std::error_code ec;
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent, ec);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  Fd f(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  SL_CHECK_HINT(f.fd >= 0, "check that the directory exists and is writable",
                "cannot create checkpoint temporary file %s: %s", tmp.c_str(), std::strerror(errno));
  try {
    uint32_t file_crc = crc32_of(head.data(), head.size());
    write_all(f.fd, tmp, head.data(), head.size());
    uint64_t at = head.size();
    const std::vector<uint8_t> zeros(kSectionAlignBytes, 0);
    for (size_t i = 0; i < sections_.size(); ++i) {
      const size_t pad = static_cast<size_t>(offsets[i] - at);
      file_crc = crc32_update(file_crc, zeros.data(), pad);
      write_all(f.fd, tmp, zeros.data(), pad);
      file_crc = crc32_update(file_crc, sections_[i].bytes(), sections_[i].nbytes);
      write_all(f.fd, tmp, sections_[i].bytes(), sections_[i].nbytes);
      at = offsets[i] + sections_[i].nbytes;
    }
    std::vector<uint8_t> footer;
    put<uint32_t>(footer, file_crc);
    put<uint32_t>(footer, 0);  // reserved
    footer.insert(footer.end(), kEndMagic, kEndMagic + sizeof(kEndMagic));
    write_all(f.fd, tmp, footer.data(), footer.size());

    publish(f, tmp, path);  // 3 and 4: fsync, close, rename
  } catch (...) {
    ::unlink(tmp.c_str());  // never leave our own partial file behind when we are still alive
    throw;
  }
  fsync_dir(parent);
}

void write_file_atomic(const std::string& path, const void* data, size_t nbytes) {
  std::error_code ec;
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent, ec);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  Fd f(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  SL_CHECK_HINT(f.fd >= 0, "check that the directory is writable", "cannot create temporary file %s: %s", tmp.c_str(),
                std::strerror(errno));
  try {
    write_all(f.fd, tmp, static_cast<const uint8_t*>(data), nbytes);
    publish(f, tmp, path);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_dir(parent);
}

uint32_t file_checksum(const std::string& path) {
  Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  SL_CHECK_HINT(f.fd >= 0, "check the path", "cannot open %s: %s", path.c_str(), std::strerror(errno));
  struct stat st {};
  SL_CHECK(::fstat(f.fd, &st) == 0, "fstat of %s failed: %s", path.c_str(), std::strerror(errno));
  uLong sum = ::adler32(0L, Z_NULL, 0);
  for_each_file_chunk(f.fd, path, 0, static_cast<uint64_t>(st.st_size),
                      [&](const uint8_t* d, size_t k) { sum = ::adler32(sum, d, static_cast<uInt>(k)); });
  return static_cast<uint32_t>(sum);
}

// =============================================================================================
// CheckpointReader

CheckpointReader::CheckpointReader(const std::string& path, bool verify_file_checksum) : path_(path) {
  const char* p = path.c_str();
  Fd f(::open(p, O_RDONLY | O_CLOEXEC));
  if (f.fd < 0) {
    const int err = errno;
    const auto others = list_checkpoints(dir_of(path));
    const std::string hint =
        others.empty()
            ? "there is no ckpt_<step>.bin in " + dir_of(path) + "; check the path, or start without --resume"
            : "check the path; the newest checkpoint in " + dir_of(path) + " is " + others.front().second;
    SL_FAIL(hint, "cannot open checkpoint %s: %s", p, std::strerror(err));
  }
  struct stat st {};
  SL_CHECK(::fstat(f.fd, &st) == 0, "fstat of checkpoint %s failed: %s", p, std::strerror(errno));
  const uint64_t actual_bytes = static_cast<uint64_t>(st.st_size);

  // Header: magic, version, length.
  SL_CHECK_HINT(actual_bytes >= kHeaderBytes + kFooterBytes, damaged_hint(path),
                "checkpoint %s is truncated: %llu bytes, a checkpoint has at least %llu", p,
                static_cast<unsigned long long>(actual_bytes),
                static_cast<unsigned long long>(kHeaderBytes + kFooterBytes));
  uint8_t header[kHeaderBytes];
  pread_exact(f.fd, path, header, kHeaderBytes, 0);
  SL_CHECK_HINT(std::memcmp(header, kMagic, sizeof(kMagic)) == 0,
                "check the path: --resume takes a ckpt_<step>.bin written by a scalelab run (or 'latest' with "
                "--checkpoint-dir)",
                "%s is not a scalelab checkpoint: magic is '%s', expected 'SLCKPT..'", p,
                printable(header, sizeof(kMagic)).c_str());
  const uint32_t version = get<uint32_t>(header + 8);
  const uint32_t num_sections = get<uint32_t>(header + 12);
  const uint64_t table_bytes = get<uint64_t>(header + 16);
  file_bytes_ = get<uint64_t>(header + 24);
  SL_CHECK_HINT(version == kVersion, "rebuild with the scalelab version that wrote it, or start without --resume",
                "checkpoint %s has format version %u, this build reads version %u", p, version, kVersion);
  SL_CHECK_HINT(actual_bytes >= file_bytes_, damaged_hint(path),
                "checkpoint %s is truncated: its header says %llu bytes, the file has %llu", p,
                static_cast<unsigned long long>(file_bytes_), static_cast<unsigned long long>(actual_bytes));
  SL_CHECK_HINT(actual_bytes == file_bytes_, damaged_hint(path),
                "checkpoint %s has trailing bytes: its header says %llu bytes, the file has %llu", p,
                static_cast<unsigned long long>(file_bytes_), static_cast<unsigned long long>(actual_bytes));
  SL_CHECK_HINT(table_bytes <= file_bytes_ - kHeaderBytes - kFooterBytes, damaged_hint(path),
                "checkpoint %s: section table of %llu bytes does not fit in a %llu-byte file", p,
                static_cast<unsigned long long>(table_bytes), static_cast<unsigned long long>(file_bytes_));

  // Footer: end magic, then the CRC of everything before it.
  uint8_t footer[kFooterBytes];
  pread_exact(f.fd, path, footer, kFooterBytes, file_bytes_ - kFooterBytes);
  SL_CHECK_HINT(std::memcmp(footer + 8, kEndMagic, sizeof(kEndMagic)) == 0, damaged_hint(path),
                "checkpoint %s: end marker is '%s', expected 'SLCKEND.' (truncated or overwritten)", p,
                printable(footer + 8, sizeof(kEndMagic)).c_str());

  // Section table, every field bounds-checked (a damaged table must not make us read wild offsets).
  std::vector<uint8_t> table(static_cast<size_t>(table_bytes));
  pread_exact(f.fd, path, table.data(), table.size(), kHeaderBytes);
  std::string table_error;  // set when the table is malformed; reported after the CRC check below
  size_t at = 0;
  for (uint32_t i = 0; i < num_sections && table_error.empty(); ++i) {
    Entry e;
    if (at + 4 > table.size()) {
      table_error = "section table ends inside entry " + std::to_string(i);
      break;
    }
    const uint32_t name_bytes = get<uint32_t>(table.data() + at);
    at += 4;
    if (name_bytes == 0 || name_bytes > kMaxNameBytes || at + name_bytes + 20 > table.size()) {
      table_error = "section table entry " + std::to_string(i) + " is malformed";
      break;
    }
    e.name.assign(reinterpret_cast<const char*>(table.data() + at), name_bytes);
    at += name_bytes;
    e.offset = get<uint64_t>(table.data() + at);
    e.size_bytes = get<uint64_t>(table.data() + at + 8);
    e.crc32 = get<uint32_t>(table.data() + at + 16);
    at += 20;
    if (e.offset < kHeaderBytes + table_bytes || e.size_bytes > file_bytes_ - kFooterBytes ||
        e.offset > file_bytes_ - kFooterBytes - e.size_bytes) {
      table_error = "section '" + e.name + "' lies outside the file";
      break;
    }
    entries_.push_back(std::move(e));
  }
  if (table_error.empty() && at != table.size()) table_error = "section table has trailing bytes";

  if (verify_file_checksum) {
    const uint32_t stored = get<uint32_t>(footer);
    const uint32_t computed = crc32_of_file_range(f.fd, path, 0, file_bytes_ - kFooterBytes);
    if (stored != computed) {
      // Say where the damage is: re-check each section's own CRC.
      std::string where;
      if (!table_error.empty()) {
        where = "; the section table itself is damaged (" + table_error + ")";
      } else {
        std::string damaged;
        for (const Entry& e : entries_) {
          if (crc32_of_file_range(f.fd, path, e.offset, e.size_bytes) != e.crc32)
            damaged += (damaged.empty() ? "" : ", ") + e.name;
        }
        where = damaged.empty() ? "; every section's own CRC matches, so the header, table or padding is damaged"
                                : "; damaged section(s): " + damaged;
      }
      SL_FAIL(damaged_hint(path), "checkpoint %s: checksum mismatch: stored CRC-32 %s, computed %s over %llu bytes%s",
              p, hex32(stored).c_str(), hex32(computed).c_str(),
              static_cast<unsigned long long>(file_bytes_ - kFooterBytes), where.c_str());
    }
  }
  SL_CHECK_HINT(table_error.empty(), damaged_hint(path), "checkpoint %s: %s", p, table_error.c_str());
}

const CheckpointReader::Entry& CheckpointReader::find(const std::string& name) const {
  for (const Entry& e : entries_)
    if (e.name == name) return e;
  std::string have;
  for (const Entry& e : entries_) have += (have.empty() ? "" : ", ") + e.name;
  SL_FAIL("the checkpoint was written by a different program or configuration; its sections are listed above",
          "checkpoint %s has no section '%s'; it has: %s", path_.c_str(), name.c_str(),
          have.empty() ? "(none)" : have.c_str());
}

bool CheckpointReader::has(const std::string& name) const {
  return std::any_of(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.name == name; });
}

std::vector<std::string> CheckpointReader::names() const {
  std::vector<std::string> out;
  for (const Entry& e : entries_) out.push_back(e.name);
  return out;
}

size_t CheckpointReader::size_bytes(const std::string& name) const { return find(name).size_bytes; }

void CheckpointReader::read(const std::string& name, void* dst, size_t nbytes) const {
  const Entry& e = find(name);
  SL_CHECK_HINT(e.size_bytes == nbytes,
                "resume with the same model config, precision policy and rank layout that wrote the checkpoint",
                "checkpoint %s: section '%s' holds %llu bytes, the caller expects %zu", path_.c_str(), name.c_str(),
                static_cast<unsigned long long>(e.size_bytes), nbytes);
  Fd f(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
  SL_CHECK_HINT(f.fd >= 0, damaged_hint(path_), "cannot reopen checkpoint %s: %s", path_.c_str(), std::strerror(errno));
  pread_exact(f.fd, path_, dst, nbytes, e.offset);
  // Checked again here: the file may have been damaged (or replaced) since the constructor ran.
  const uint32_t crc = crc32_of(static_cast<const uint8_t*>(dst), nbytes);
  SL_CHECK_HINT(crc == e.crc32, damaged_hint(path_),
                "checkpoint %s: checksum mismatch in section '%s': stored CRC-32 %s, computed %s", path_.c_str(),
                name.c_str(), hex32(e.crc32).c_str(), hex32(crc).c_str());
}

std::vector<uint8_t> CheckpointReader::bytes(const std::string& name) const {
  std::vector<uint8_t> out(size_bytes(name));
  read(name, out.data(), out.size());
  return out;
}

nlohmann::json CheckpointReader::json(const std::string& name) const {
  const std::vector<uint8_t> b = bytes(name);
  try {
    return nlohmann::json::parse(b.begin(), b.end());
  } catch (const nlohmann::json::exception& ex) {
    SL_FAIL("write JSON sections with CheckpointWriter::add_json", "checkpoint %s: section '%s' is not JSON: %s",
            path_.c_str(), name.c_str(), ex.what());
  }
}

// =============================================================================================
// Checkpoint directories

std::string checkpoint_path(const std::string& dir, int64_t step) {
  SL_CHECK(step >= 0, "checkpoint step must be >= 0, got %lld", static_cast<long long>(step));
  return (fs::path(dir) / ("ckpt_" + std::to_string(step) + ".bin")).string();
}

int64_t checkpoint_step(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  const std::string prefix = "ckpt_", suffix = ".bin";
  if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return -1;
  const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return -1;
  return std::stoll(digits);
}

std::string latest_checkpoint(const std::string& dir) {
  for (const auto& [step, path] : list_checkpoints(dir)) {
    try {
      CheckpointReader check(path);  // full validation, CRC included
      return path;
    } catch (const Error& e) {
      std::fprintf(stderr, "[scalelab] warning: skipping damaged checkpoint %s; the error was:\n%s\n", path.c_str(),
                   e.what());
    }
  }
  return std::string();
}

int remove_old_checkpoints(const std::string& dir, int keep_last) {
  SL_CHECK(keep_last >= 1, "keep_last=%d must be >= 1 (keep at least the newest checkpoint)", keep_last);
  int removed = 0;
  std::error_code ec;
  int kept = 0;
  for (const auto& [step, path] : list_checkpoints(dir)) {
    bool keep = false;
    if (kept < keep_last) {
      try {
        CheckpointReader quick(path, /*verify_file_checksum=*/false);  // header, length, table: cheap
        keep = true;
      } catch (const Error&) {
        std::fprintf(stderr, "[scalelab] warning: removing damaged checkpoint %s\n", path.c_str());
      }
    }
    if (keep) {
      ++kept;
    } else if (fs::remove(path, ec)) {
      ++removed;
    }
  }
  // Temporary files of processes that died while writing: "ckpt_<step>.bin.tmp.<pid>".
  if (fs::is_directory(dir, ec)) {
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      const size_t tmp_at = name.rfind(".tmp.");
      if (tmp_at == std::string::npos || checkpoint_step(name.substr(0, tmp_at)) < 0) continue;
      const std::string pid_str = name.substr(tmp_at + 5);
      if (pid_str.empty() || !std::all_of(pid_str.begin(), pid_str.end(), [](char c) { return c >= '0' && c <= '9'; }))
        continue;
      const long pid = std::stol(pid_str);
      const bool alive = ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;  // on this host
      if (!alive && fs::remove(e.path(), ec)) ++removed;
    }
  }
  return removed;
}

}  // namespace scalelab
