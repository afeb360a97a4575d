// make_shards.cpp — program sl_make_shards: text files -> byte-level token shards for the loader.
//   sl_make_shards kjv.txt --out-dir data/kjv            writes train_000000.bin ..., val_000000.bin
//   sl_make_shards --check data/kjv                      validates every shard there (checksums too)
// Shard format: docs/formats.md. Writer, reader and tokenizer: common/src/data/ (scalelab/data/).
// scripts/prepare_corpus.sh runs this on the King James Bible.
#include <CLI/CLI.hpp>  // defines: CLI::App (command line)

#include <chrono>      // defines: std::chrono::steady_clock (timing the run)
#include <cstdio>      // defines: std::printf, std::fprintf
#include <filesystem>  // defines: std::filesystem::create_directories, directory_iterator
#include <fstream>     // defines: std::ifstream, std::ofstream
#include <set>         // defines: std::set (stale shard names)
#include <sstream>     // defines: std::ostringstream (reading a whole file)
#include <string>
#include <vector>

#include "scalelab/core/error.h"            // defines: SL_CHECK_HINT, SL_FAIL, scalelab::Error
#include "scalelab/data/shard.h"            // defines: data::write_shard, read_shard_header, list_shards
#include "scalelab/data/tokenizer.h"        // defines: data::encode_bytes, kByteVocab
#include "scalelab/driver/option_checks.h"  // defines: finite_in_range, positive_int, require_checked_options

namespace fs = std::filesystem;
namespace data = scalelab::data;

namespace {

constexpr double kMaxControlFraction = 0.01;  // more control bytes than this (1%) and a file "looks binary"

// Reads a whole input file, refusing what is missing, empty or binary.
std::string read_text_file(const std::string& path) {
  SL_CHECK_HINT(fs::exists(path), "check the path (scripts/prepare_corpus.sh writes data/kjv/kjv.txt)",
                "input '%s' does not exist", path.c_str());
  SL_CHECK_HINT(fs::is_regular_file(path), "pass text files, not directories", "input '%s' is not a regular file",
                path.c_str());
  std::ifstream in(path, std::ios::binary);
  SL_CHECK_HINT(in.good(), "check the file's permissions", "cannot read input '%s'", path.c_str());
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  SL_CHECK_HINT(!text.empty(), "give a file with some text in it", "input '%s' is empty", path.c_str());

  // Text has no NUL bytes and few control bytes other than tab, newline, CR, form feed, vertical tab.
  // Bytes >= 0x80 are allowed: they are UTF-8 (the byte tokenizer keeps them as they are).
  size_t n_control = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == 0)
      SL_FAIL("sl_make_shards takes text files (ASCII or UTF-8); is this a compressed or binary file?",
              "input '%s' looks binary: NUL byte at offset %zu", path.c_str(), i);
    const bool whitespace = c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
    if ((c < 0x20 && !whitespace) || c == 0x7f) ++n_control;
  }
  const double control_fraction = static_cast<double>(n_control) / static_cast<double>(text.size());
  SL_CHECK_HINT(control_fraction <= kMaxControlFraction,
                "sl_make_shards takes text files (ASCII or UTF-8); is this a compressed or binary file?",
                "input '%s' looks binary: %.2f%% control bytes (more than %.0f%%)", path.c_str(),
                100.0 * control_fraction, 100.0 * kMaxControlFraction);
  return text;
}

// Fails unless dir exists (created if needed) and a file can be written in it.
void ensure_writable_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  SL_CHECK_HINT(!ec && fs::is_directory(dir), "choose another --out-dir or fix its permissions",
                "output dir '%s' cannot be created: %s", dir.c_str(), ec.message().c_str());
  const std::string probe = (fs::path(dir) / ".sl_write_probe").string();
  {
    std::ofstream out(probe);
    out << "probe";
    SL_CHECK_HINT(out.good(), "choose another --out-dir or fix its permissions", "output dir '%s' is not writable",
                  dir.c_str());
  }
  fs::remove(probe, ec);
}

// Writes tokens[begin, end) as shards <dir>/<split>_000000.bin, ... of at most shard_tokens each,
// then removes older shards of the split that this run did not write (a previous, longer run).
// Returns the file names written.
std::vector<std::string> write_split(const std::string& dir, const std::string& split,
                                     const std::vector<int32_t>& tokens, size_t begin, size_t end,
                                     size_t shard_tokens) {
  std::vector<std::string> written;
  for (size_t start = begin; start < end; start += shard_tokens) {
    const size_t stop = std::min(end, start + shard_tokens);
    char name[64];
    std::snprintf(name, sizeof(name), "%s_%06zu.bin", split.c_str(), written.size());
    const std::vector<int32_t> piece(tokens.begin() + start, tokens.begin() + stop);
    data::write_shard((fs::path(dir) / name).string(), piece, data::kByteVocab);
    written.push_back(name);
  }
  const std::set<std::string> keep(written.begin(), written.end());
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(split + "_", 0) == 0 && e.path().extension() == ".bin" && !keep.count(name)) {
      std::printf("  removed stale shard %s\n", name.c_str());
      fs::remove(e.path());
    }
  }
  return written;
}

// --check DIR: validates every train_*/val_* shard (header, size, checksum). Returns the exit code.
int check_dir(const std::string& dir) {
  int64_t total = 0;
  for (const char* split : {"train", "val"}) {
    std::vector<std::string> files;
    try {
      files = data::list_shards(dir, split);
    } catch (const scalelab::Error&) {
      if (std::string(split) == "val") continue;  // a corpus may have no validation split
      throw;
    }
    for (const std::string& f : files) {
      const data::ShardHeader h = data::read_shard_header(f, /*verify_checksum=*/true);
      std::printf("  ok %-40s %10llu tokens x %u bytes, vocab %u\n", f.c_str(),
                  static_cast<unsigned long long>(h.token_count), h.bytes_per_token, h.vocab_size);
      total += static_cast<int64_t>(h.token_count);
    }
  }
  std::printf("sl_make_shards --check: all shards in %s are valid (%lld tokens)\n", dir.c_str(),
              static_cast<long long>(total));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"sl_make_shards: text files -> byte-level token shards (vocab 256) for the lab 02 loader"};
  std::vector<std::string> inputs;
  std::string out_dir;
  std::string check;
  double val_fraction = 0.05;     // of the tokens, taken from the END of the text
  size_t shard_tokens = 1000000;  // tokens per shard (2 MB of 2-byte tokens)
  app.add_option("inputs", inputs, "text files, concatenated in this order");
  app.add_option("--out-dir", out_dir, "directory for train_NNNNNN.bin and val_NNNNNN.bin (created if missing)");
  app.add_option("--val-fraction", val_fraction,
                 "fraction of tokens held out as the validation split, from the end of the text "
                 "(cut moved to the next line start); 0 = no val split")
      ->capture_default_str()
      ->check(scalelab::driver::finite_in_range(0.0, 0.5));
  app.add_option("--shard-tokens", shard_tokens,
                 "max tokens per shard; small enough that the KJV spans several shards, which exercises "
                 "windows that cross shards (llm.c uses 1e8 for large corpora)")
      ->capture_default_str()
      ->check(scalelab::driver::positive_int(int64_t{1} << 40));
  app.add_option("--check", check, "validate every shard in this directory instead (header, size, checksum)");
  scalelab::driver::require_checked_options(app);  // a numeric option without a range check: a programming error
  CLI11_PARSE(app, argc, argv);

  try {
    if (!check.empty()) return check_dir(check);
    SL_CHECK_HINT(!inputs.empty() && !out_dir.empty(), "usage: sl_make_shards FILE... --out-dir DIR",
                  "need at least one input file and --out-dir (got %zu inputs, out-dir '%s')", inputs.size(),
                  out_dir.c_str());
    const auto t0 = std::chrono::steady_clock::now();

    // 1. The text: all inputs in order; a newline joins a file that does not end with one.
    std::string text;
    for (const std::string& path : inputs) {
      const std::string piece = read_text_file(path);
      text += piece;
      if (piece.back() != '\n') text += '\n';
    }
    const std::vector<int32_t> tokens = data::encode_bytes(text);  // one token per byte
    const size_t n = tokens.size();
    size_t distinct = 0;
    {
      std::vector<bool> seen(data::kByteVocab, false);
      for (int32_t t : tokens) seen[t] = true;
      for (bool s : seen) distinct += s ? 1 : 0;
    }

    // 2. The split: validation is the last val_fraction of the text, starting at a line start.
    size_t cut = n;  // tokens [0, cut) train, [cut, n) val
    if (val_fraction > 0.0) {
      cut = n - static_cast<size_t>(val_fraction * static_cast<double>(n));
      const size_t nl = text.find('\n', cut == 0 ? 0 : cut - 1);  // cut just after this newline
      if (nl != std::string::npos && nl + 1 < n) cut = nl + 1;
      SL_CHECK_HINT(cut > 0 && cut < n, "give more text or another --val-fraction",
                    "--val-fraction %.3f of %zu tokens leaves an empty train or val split", val_fraction, n);
    }

    // 3. The shards.
    ensure_writable_dir(out_dir);
    const std::vector<std::string> train = write_split(out_dir, "train", tokens, 0, cut, shard_tokens);
    const std::vector<std::string> val = write_split(out_dir, "val", tokens, cut, n, shard_tokens);

    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf(
        "sl_make_shards: %zu input file(s), %zu bytes -> %zu tokens (byte-level, vocab %d), "
        "%zu distinct byte values\n",
        inputs.size(), text.size(), n, data::kByteVocab, distinct);
    std::printf("  train: %10zu tokens in %zu shard(s) %s .. %s\n", cut, train.size(), train.front().c_str(),
                train.back().c_str());
    if (!val.empty())
      std::printf("  val:   %10zu tokens in %zu shard(s) %s .. %s\n", n - cut, val.size(), val.front().c_str(),
                  val.back().c_str());
    std::printf("  wrote %s in %.2f s\n", out_dir.c_str(), secs);
    return 0;
  } catch (const scalelab::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  } catch (const std::exception& e) {  // std::filesystem errors and the like
    std::fprintf(stderr, "[scalelab] sl_make_shards failed: %s\n", e.what());
    return 1;
  }
}
