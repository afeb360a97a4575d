// option_checks.cpp — numeric options checked in words, and ranks that agree on their options
// (scalelab/driver/option_checks.h).
#include "scalelab/driver/option_checks.h"

#include <unistd.h>  // defines: getpid (check_writable_dir's probe file)

#include <algorithm>   // defines: std::sort
#include <cerrno>      // defines: errno, ERANGE
#include <cmath>       // defines: std::isfinite
#include <cstdio>      // defines: std::snprintf
#include <cstdlib>     // defines: std::strtoll, std::strtoull, std::strtod
#include <cstring>     // defines: std::strerror
#include <filesystem>  // defines: std::filesystem::create_directories, status (check_writable_dir)
#include <map>
#include <stdexcept>  // defines: std::logic_error

#include "scalelab/comm/host_values.h"  // defines: all_gather_values, all_gather_strings
#include "scalelab/core/error.h"        // defines: SL_FAIL, SL_CHECK_HINT
#include "scalelab/data/shard.h"        // defines: data::list_shards, read_shard_header, fnv1a64

namespace scalelab::driver {

// ---------------------------------------------------------------------------------------------
// Numbers in words

namespace {

// Validators of this file are named "sl:<kind>": require_checked_options looks for that prefix.
constexpr const char* kPrefix = "sl:";

// "from 1 to 2147483647", "from 0 up" (max: none worth saying), "1 or more".
std::string int_range_words(int64_t min, int64_t max) {
  if (max == INT64_MAX) return "from " + std::to_string(min) + " up";
  return "from " + std::to_string(min) + " to " + std::to_string(max);
}

// "" when `text` is a whole number in [min, max]; else why not, with the range in words.
std::string check_int(const std::string& text, int64_t min, int64_t max) {
  const std::string want = "a whole number " + int_range_words(min, max);
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end == text.c_str() || *end != '\0') return "'" + text + "' is not " + want;
  if (errno == ERANGE || v < min || v > max) return text + " is out of range: " + want;
  return "";
}

// "" when `text` is a finite number with `ok(v)`; else why not, `want` saying what is.
template <typename Ok>
std::string check_real(const std::string& text, const std::string& want, Ok ok) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end == text.c_str() || *end != '\0') return "'" + text + "' is not a number: " + want;
  if (!std::isfinite(v)) return text + " is not a finite number: " + want;
  if (!ok(v)) return text + " is out of range: " + want;
  return "";
}

CLI::Validator named(CLI::Validator v, const std::string& kind) {
  v.name(kPrefix + kind);
  return v;
}

}  // namespace

CLI::Validator int_in_range(int64_t min, int64_t max) {
  return named(CLI::Validator([min, max](std::string& s) { return check_int(s, min, max); }, min == 0   ? "NONNEGATIVE"
                                                                                             : min == 1 ? "POSITIVE"
                                                                                                        : ""),
               "int");
}
CLI::Validator positive_int(int64_t max) { return int_in_range(1, max); }
CLI::Validator non_negative_int(int64_t max) { return int_in_range(0, max); }

CLI::Validator seed_value() {
  return named(CLI::Validator(
                   [](std::string& s) -> std::string {
                     const std::string want = "a whole number from 0 to 18446744073709551615";
                     errno = 0;
                     char* end = nullptr;
                     std::strtoull(s.c_str(), &end, 10);
                     if (s.empty() || end == s.c_str() || *end != '\0' || s[0] == '-')
                       return "'" + s + "' is not " + want;
                     if (errno == ERANGE) return s + " is out of range: " + want;
                     return "";
                   },
                   ""),
               "seed");
}

CLI::Validator finite_in_range(double min, double max, bool min_excluded) {
  char lo[32], hi[32];
  std::snprintf(lo, sizeof(lo), "%g", min);
  std::snprintf(hi, sizeof(hi), "%g", max);
  const std::string above = std::string(min_excluded ? "> " : ">= ") + lo;
  const std::string want = std::isinf(max) ? "a finite number " + above
                           : min_excluded  ? "a number " + above + " and <= " + hi
                                           : "a number from " + std::string(lo) + " to " + hi;
  const char* desc = !std::isinf(max) ? "" : min == 0 ? (min_excluded ? "POSITIVE" : "NONNEGATIVE") : "";
  return named(CLI::Validator(
                   [=](std::string& s) {
                     return check_real(s, want,
                                       [=](double v) { return (min_excluded ? v > min : v >= min) && v <= max; });
                   },
                   desc),
               "real");
}
CLI::Validator finite_positive() { return finite_in_range(0, INFINITY, /*min_excluded=*/true); }
CLI::Validator finite_non_negative() { return finite_in_range(0, INFINITY); }
CLI::Validator probability() { return finite_in_range(0, 1); }

// Every option of app and of its subcommands that takes a number (CLI11's type name INT, UINT, FLOAT or
// NUMBER) and has no "sl:" validator.
static void unchecked_numbers(CLI::App& app, std::vector<std::string>& out) {
  for (CLI::Option* opt : app.get_options()) {
    if (opt->get_expected_min() == 0) continue;  // a flag
    const std::string type = opt->get_type_name();
    const bool number = type.rfind("INT", 0) == 0 || type.rfind("UINT", 0) == 0 || type.rfind("FLOAT", 0) == 0 ||
                        type.rfind("NUMBER", 0) == 0;
    if (!number) continue;
    bool checked = false;
    for (int i = 0;; ++i) {
      try {
        if (opt->get_validator(i)->get_name().rfind(kPrefix, 0) == 0) checked = true;
      } catch (const CLI::OptionNotFound&) {
        break;
      }
    }
    if (!checked) out.push_back(opt->get_name());
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) unchecked_numbers(*sub, out);
}

void require_checked_options(CLI::App& app) {
  std::vector<std::string> missing;
  unchecked_numbers(app, missing);
  if (missing.empty()) return;
  std::string list;
  for (const std::string& m : missing) list += (list.empty() ? "" : ", ") + m;
  throw std::logic_error(
      "options that take a number without a range check (add ->check(driver::positive_int()) or "
      "another validator of scalelab/driver/option_checks.h): " +
      list);
}

void check_rank_option(const std::string& option, int value, int world_size, bool none_ok) {
  SL_CHECK_HINT((none_ok && value == -1) || (value >= 0 && value < world_size),
                std::string("a rank index from 0 to ") + std::to_string(world_size - 1) +
                    (none_ok ? " (-1: none)" : ""),
                "%s %d: there is no such rank, this run has %d rank%s", option.c_str(), value, world_size,
                world_size == 1 ? "" : "s");
}

void check_writable_dir(const std::string& option, const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string hint = "give " + option + " a directory this program may write (or make this one writable)";
  // The first part of the path that exists but is not a directory: "runs" a file where "runs/x" is wanted.
  fs::path part;
  for (const fs::path& p : fs::path(dir)) {
    part /= p;
    std::error_code ec;
    const fs::file_status st = fs::status(part, ec);
    if (!fs::exists(st)) break;
    SL_CHECK_HINT(fs::is_directory(st), hint, "%s %s: %s is not a directory", option.c_str(), dir.c_str(),
                  part.c_str());
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  SL_CHECK_HINT(!ec, hint, "%s %s: cannot create the directory: %s", option.c_str(), dir.c_str(), ec.message().c_str());
  const fs::path probe = fs::path(dir) / (".sl_write_probe_" + std::to_string(::getpid()));
  std::FILE* f = std::fopen(probe.c_str(), "w");
  SL_CHECK_HINT(f != nullptr, hint, "%s %s: cannot write in it: %s", option.c_str(), dir.c_str(), std::strerror(errno));
  std::fclose(f);
  fs::remove(probe, ec);
}

// ---------------------------------------------------------------------------------------------
// Ranks agree

const std::vector<std::string>& per_rank_options() {
  static const std::vector<std::string> names = {"--log-dir", "--threads", "--calibration", "--quiet",
                                                 "--heartbeat-dir"};
  return names;
}

// A value as every rank writes it: numbers in one spelling (%.15g, or %.17g where that reads back
// otherwise), other text as it is.
static std::string canonical(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end == text.c_str() || *end != '\0') return text;
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.15g", v);  // the shortest of the two that reads back as v
  if (std::strtod(buf, nullptr) != v) std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

std::vector<std::string> agreed_options(const CLI::App& app, int world_size) {
  std::vector<std::string> lines;
  for (const CLI::Option* opt : app.get_options()) {
    const std::string name = opt->get_name();
    if (name == "--help" || name == "-h" || name.empty()) continue;
    if (std::find(per_rank_options().begin(), per_rank_options().end(), name) != per_rank_options().end()) continue;
    std::string value;
    if (opt->count() > 0) {
      for (const std::string& r : opt->results()) value += (value.empty() ? "" : ",") + canonical(r);
    } else {
      value = opt->get_expected_min() == 0 ? "false" : canonical(opt->get_default_str());  // a flag not given
    }
    lines.push_back(name + "=" + value);
  }
  std::sort(lines.begin(), lines.end());
  lines.insert(lines.begin(), {"program=" + app.get_description(), "ranks=" + std::to_string(world_size)});
  return lines;
}

std::vector<std::string> data_agreement_lines(const std::string& option, const std::string& dir) {
  std::vector<std::string> lines;
  for (const char* split : {"train", "val"}) {
    std::vector<std::string> mine;
    try {
      for (const std::string& path : data::list_shards(dir, split)) {
        const data::ShardHeader h = data::read_shard_header(path, /*verify_checksum=*/false);  // 64 bytes read
        char value[96];
        std::snprintf(value, sizeof(value), "%llu tokens, vocab %u, checksum 0x%016llx",
                      static_cast<unsigned long long>(h.token_count), h.vocab_size,
                      static_cast<unsigned long long>(h.checksum));
        mine.push_back(option + " " + std::filesystem::path(path).filename().string() + "=" + value);
      }
    } catch (const std::exception&) {
      // No shards, a damaged header: one line, the same on every such rank (no rank number, no path); the
      // cause follows when the run opens the data.
      mine.assign(1, option + " " + split + "=(no shards that can be read)");
    }
    lines.insert(lines.end(), mine.begin(), mine.end());
  }
  return lines;
}

void check_ranks_agree(Communicator& comm, const CLI::App& app, const std::vector<std::string>& inputs) {
  if (comm.size() == 1) return;
  std::vector<std::string> mine = agreed_options(app, comm.size());
  mine.insert(mine.end(), inputs.begin(), inputs.end());
  std::string text;  // the lines, each ended by '\n': hashed here, and sent whole if the hashes differ
  for (const std::string& l : mine) text += l + "\n";
  const uint64_t d = data::fnv1a64(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  const std::vector<int32_t> all =
      all_gather_values(comm,
                        std::vector<int32_t>{static_cast<int32_t>(d & 0xffffffffu), static_cast<int32_t>(d >> 32)},
                        "options digest");
  bool same = true;
  for (int r = 1; r < comm.size(); ++r) same = same && all[2 * r] == all[0] && all[2 * r + 1] == all[1];
  if (same) return;
  // They differ: every rank learns every rank's options, and names the same differences.
  const std::vector<std::string> texts = all_gather_strings(comm, text, "options");
  std::map<std::string, std::vector<std::string>> values;  // option -> its value on each rank ("(none)")
  for (int r = 0; r < comm.size(); ++r) {
    size_t at = 0;
    const std::string& t = texts[static_cast<size_t>(r)];
    while (at < t.size()) {
      const size_t nl = t.find('\n', at);
      const std::string line = t.substr(at, nl - at);
      at = nl == std::string::npos ? t.size() : nl + 1;
      const size_t eq = line.find('=');
      std::vector<std::string>& v = values[line.substr(0, eq)];
      v.resize(static_cast<size_t>(comm.size()), "(not an option of this program)");
      v[static_cast<size_t>(r)] = eq == std::string::npos ? "" : line.substr(eq + 1);
    }
  }
  std::string diff;
  for (auto& [name, v] : values) {
    v.resize(static_cast<size_t>(comm.size()), "(not an option of this program)");
    if (std::all_of(v.begin(), v.end(), [&](const std::string& x) { return x == v[0]; })) continue;
    std::map<std::string, std::string> ranks_of;  // value -> "0, 2"
    for (int r = 0; r < comm.size(); ++r) {
      std::string& rs = ranks_of[v[static_cast<size_t>(r)]];
      rs += (rs.empty() ? "" : ", ") + std::to_string(r);
    }
    diff += "\n  " + name + ":";
    for (const auto& [value, ranks] : ranks_of)
      diff += " " + std::string(ranks.find(',') == std::string::npos ? "rank " : "ranks ") + ranks + " '" + value +
              "';";
    diff.pop_back();
  }
  SL_FAIL(
      "start every rank with the same options (one command line: mpirun -np N prog OPTIONS); only " +
          [] {
            std::string s;
            for (const std::string& n : per_rank_options()) s += (s.empty() ? "" : ", ") + n;
            return s;
          }() +
          " may differ; give every node the same files of --data and of the checkpoint resumed (copies, not "
          "files made again)",
      "the ranks were started with different options or read different data (rank %d of %d stops before "
      "training):%s",
      comm.rank(), comm.size(), diff.c_str());
}

}  // namespace scalelab::driver
