// lab08_support.cpp — checkpoint directories and orderings for lab 08's checks (lab08_support.h).
#include "lab08_support.h"

#include <filesystem>
#include <nlohmann/json.hpp>            // defines: nlohmann::json
#include "resilience.h"                 // defines: lab08::step_dir, shard_file_name, kManifestName, ... (the track)
#include "scalelab/model/checkpoint.h"  // defines: write_file_atomic, file_checksum

namespace scalelab::lab08_test {

namespace fs = std::filesystem;

void make_checkpoint(const std::string& root, int64_t step, bool marker) {
  const std::string dir = lab08::step_dir(root, step);
  fs::create_directories(dir);
  const std::string shard = (fs::path(dir) / lab08::shard_file_name(0)).string();
  std::string bytes(4096, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 131 + step * 7) & 0xff);
  write_file_atomic(shard, bytes.data(), bytes.size());
  lab08::ShardInfo s;
  s.file = lab08::shard_file_name(0);
  s.bytes = bytes.size();
  s.checksum = file_checksum(shard);
  const nlohmann::json manifest = {{"format", 1}, {"world_size", 1}, {"step", step}, {"shards", {s.to_json()}}};
  const std::string text = manifest.dump(1);
  write_file_atomic((fs::path(dir) / lab08::kManifestName).string(), text.data(), text.size());
  if (marker) write_file_atomic((fs::path(dir) / lab08::kMarkerName).string(), "done\n", 5);
}

std::string steps_left(const std::string& root) {
  std::string s;
  for (const std::string& d : lab08::list_step_dirs(root))
    s += (s.empty() ? "" : " ") + std::to_string(lab08::step_of_dir(d));
  return s;
}

std::string Ordering::describe() const {
  std::string done, not_done;
  for (int s = 1; s <= n; ++s) {
    if (is_complete(s)) done += " " + std::to_string(s);
    else not_done += " " + std::to_string(s) + (s % 2 == 1 ? " (no marker)" : " (shard cut short)");
  }
  return "complete" + (done.empty() ? std::string(" none") : done) + ", incomplete" +
         (not_done.empty() ? std::string(" none") : not_done);
}

std::vector<Ordering> all_orderings(int n) {
  std::vector<Ordering> out;
  for (unsigned c = 0; c < (1u << n); ++c) out.push_back(Ordering{n, c});
  return out;
}

void make_ordering(const std::string& root, const Ordering& o) {
  for (int s = 1; s <= o.n; ++s) {
    const bool odd = s % 2 == 1;
    make_checkpoint(root, s, o.is_complete(s) || !odd);
    if (!o.is_complete(s) && !odd)  // the marker is there, a shard is not whole
      fs::resize_file(fs::path(lab08::step_dir(root, s)) / lab08::shard_file_name(0), 100);
  }
}

std::string retained_steps(const Ordering& o, int keep_last) {
  int newest_complete = 0;
  for (int s = 1; s <= o.n; ++s)
    if (o.is_complete(s)) newest_complete = s;
  std::string out;
  for (int s = o.n; s >= 1; --s) {
    int complete_at_or_above = 0;
    for (int t = s; t <= o.n; ++t) complete_at_or_above += o.is_complete(t) ? 1 : 0;
    const bool keep = s > newest_complete || (o.is_complete(s) && complete_at_or_above <= keep_last);
    if (keep) out += (out.empty() ? "" : " ") + std::to_string(s);
  }
  return out;
}

int64_t chosen_step(const Ordering& o) {
  for (int s = o.n; s >= 1; --s)
    if (o.is_complete(s)) return s;
  return -1;
}

std::vector<int64_t> skipped_steps(const Ordering& o) {
  std::vector<int64_t> out;
  for (int s = o.n; s > chosen_step(o) && s >= 1; --s) out.push_back(s);
  return out;
}

}  // namespace scalelab::lab08_test
