// shard_state.cpp — lab 08's given plumbing (shard_state.h): a rank's state as named tensors, its shard file,
// the layout's description, and the file log. One copy for both tracks (library lab08_given).
#include "shard_state.h"

#include <algorithm>   // defines: std::sort
#include <chrono>      // defines: std::chrono::system_clock
#include <cstdio>      // defines: std::snprintf, std::printf
#include <filesystem>  // defines: std::filesystem::directory_iterator
#include <fstream>     // defines: std::ifstream
#include <regex>       // defines: std::regex_match
#include <thread>      // defines: std::this_thread::sleep_for

#include "reshard.h"                    // defines: load_resharded; data::LoaderState
#include "scalelab/comm/host_values.h"  // defines: any_rank, all_gather_values, broadcast_string (any backend)
#include "scalelab/core/error.h"        // defines: SL_CHECK, SL_CHECK_HINT
#include "scalelab/model/checkpoint.h"  // defines: CheckpointWriter, CheckpointReader, write_file_atomic, file_checksum

namespace fs = std::filesystem;

namespace scalelab::lab08 {

// =============================================================================================
// Names and places
// =============================================================================================
std::string step_dir(const std::string& root, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(step));
  return (fs::path(root) / name).string();
}

int64_t step_of_dir(const std::string& dir) {
  static const std::regex form("step_([0-9]{1,18})");
  std::smatch m;
  const std::string name = fs::path(dir).filename().string();
  return std::regex_match(name, m, form) ? std::stoll(m[1].str()) : -1;
}

std::vector<std::string> list_step_dirs(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return {};
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec))
    if (e.is_directory(ec) && step_of_dir(e.path().string()) >= 0)
      found.emplace_back(step_of_dir(e.path().string()), e.path().string());
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> dirs;
  for (auto& [step, dir] : found) dirs.push_back(dir);
  return dirs;
}

std::string shard_file_name(int rank) { return "rank_" + std::to_string(rank) + ".bin"; }

// =============================================================================================
// What a rank holds
// =============================================================================================
std::vector<StateTensor> rank_state(lab07::Rank3D& r) {
  std::vector<StateTensor> out;
  auto add = [&](int c, const char* what, int u, Tensor& t) {
    if (t.defined()) out.push_back({"c" + std::to_string(c) + "/" + what + "/" + std::to_string(u), &t, c, u, what});
  };
  for (int c = 0; c < static_cast<int>(r.models.size()); ++c) {
    GPT2& model = *r.models[c];
    for (int u = 0; u < model.num_units(); ++u) {
      if (!model.owns_unit(u)) continue;
      add(c, "params", u, model.unit_params(u));
      if (!r.zero1.empty()) {  // ZeRO-1: this rank's shard of the optimizer state
        lab04::UnitShard& s = r.zero1[c]->units[u];
        add(c, "adam_m", u, s.m);
        add(c, "adam_v", u, s.v);
        add(c, "master", u, s.master);
      } else {
        Optimizer& opt = *r.optimizers[c];
        add(c, "adam_m", u, opt.m()[u]);
        add(c, "adam_v", u, opt.v()[u]);
        add(c, "master", u, opt.master()[u]);
      }
    }
  }
  return out;
}

static nlohmann::json coords_json(const GridCoords& c) {
  return {{"tp_rank", c.tp_rank}, {"pp_rank", c.pp_rank}, {"dp_rank", c.dp_rank}};
}

nlohmann::json ShardInfo::to_json() const {
  return {{"rank", rank}, {"coords", coords_json(coords)}, {"file", file}, {"bytes", bytes}, {"adler32", checksum}};
}

ShardInfo ShardInfo::from_json(const nlohmann::json& j) {
  ShardInfo s;
  try {
    s.rank = j.at("rank").get<int>();
    s.coords.tp_rank = j.at("coords").at("tp_rank").get<int>();
    s.coords.pp_rank = j.at("coords").at("pp_rank").get<int>();
    s.coords.dp_rank = j.at("coords").at("dp_rank").get<int>();
    s.file = j.at("file").get<std::string>();
    s.bytes = j.at("bytes").get<uint64_t>();
    s.checksum = j.at("adler32").get<uint32_t>();
  } catch (const nlohmann::json::exception& e) {
    SL_FAIL("a manifest's shard entry has rank, coords, file, bytes and adler32 (ShardInfo::to_json)",
            "bad shard entry %s: %s", j.dump().c_str(), e.what());
  }
  return s;
}

static Tensor host_copy(const Tensor& t) {
  Tensor h = Tensor::empty(t.shape(), t.dtype(), Device::CPU, MemCategory::Workspace);
  h.copy_from(t);
  return h;
}

static std::vector<int64_t> optimizer_steps(const lab07::Rank3D& r) {
  std::vector<int64_t> t;
  if (!r.zero1.empty())
    for (const auto& z : r.zero1) t.push_back(z->optimizer_steps);
  else
    for (const auto& o : r.optimizers) t.push_back(o->step_count());
  return t;
}

static nlohmann::json shard_meta(lab07::Rank3D& r, int world_rank, const ResumeState& st) {
  const GPTConfig& c = r.models.front()->config();
  return {{"world_rank", world_rank},
          {"coords", coords_json(r.layout.coords)},
          {"grid", r.layout.grid.describe()},
          {"chunks", r.models.size()},
          {"zero1", !r.zero1.empty()},
          {"model", {{"n_layer", c.n_layer}, {"n_head", c.n_head}, {"n_embd", c.n_embd}, {"vocab_size", c.vocab_size}}},
          {"step", st.step},
          {"optimizer_steps", optimizer_steps(r)}};
}

double wall_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::system_clock::now().time_since_epoch()).count();
}

static std::vector<FileEvent>& log_storage() {
  static std::vector<FileEvent> log;
  return log;
}

static double g_write_delay_ms = 0;
void set_write_delay_ms(double ms) { g_write_delay_ms = ms; }
static void simulated_disk_delay() {
  if (g_write_delay_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(g_write_delay_ms));
}

ShardInfo write_shard(const std::string& dir, lab07::Rank3D& r, int world_rank, const ResumeState& st) {
  simulated_disk_delay();
  CheckpointWriter w;
  w.add_json("meta", shard_meta(r, world_rank, st));
  std::vector<Tensor> staged;  // host copies (a GPU model is staged through the host); alive until commit
  for (const StateTensor& s : rank_state(r)) {
    staged.push_back(s.tensor->device() == Device::CPU ? *s.tensor : host_copy(*s.tensor));
    w.add(s.name, staged.back().raw(), staged.back().nbytes());
  }
  w.add_copy("loader", st.loader.data(), st.loader.size());
  w.add_copy("rng", st.rng.data(), sizeof(st.rng));
  ShardInfo info;
  info.rank = world_rank;
  info.coords = r.layout.coords;
  info.file = shard_file_name(world_rank);
  const std::string path = (fs::path(dir) / info.file).string();
  w.commit(path);  // durable under its final name on return
  info.bytes = static_cast<uint64_t>(fs::file_size(path));
  info.checksum = file_checksum(path);
  log_storage().push_back({path, wall_ms()});
  return info;
}

ResumeState read_shard(const std::string& dir, const ShardInfo& info, lab07::Rank3D& r) {
  const std::string path = (fs::path(dir) / info.file).string();
  CheckpointReader reader(path);  // every section's CRC is checked before anything is copied
  const nlohmann::json meta = reader.json("meta");
  const nlohmann::json want = shard_meta(r, info.rank, ResumeState{});
  for (const char* key : {"coords", "grid", "chunks", "zero1", "model"})
    SL_CHECK_HINT(meta.at(key) == want.at(key),
                  "load at the layout the checkpoint was written with (its manifest.json says which); loading at "
                  "another layout is resharding (load_checkpoint with reshard, README.md#resharding)",
                  "%s was written by a rank with %s = %s; this rank has %s", path.c_str(), key,
                  meta.at(key).dump().c_str(), want.at(key).dump().c_str());
  const std::vector<StateTensor> state = rank_state(r);
  for (const StateTensor& s : state)  // sizes first: a mismatch must leave r unchanged
    SL_CHECK_HINT(reader.has(s.name) && reader.size_bytes(s.name) == s.tensor->nbytes(),
                  "load with the --model, --precision and --optimizer the checkpoint was written with",
                  "%s: section %s is missing or of another size", path.c_str(), s.name.c_str());
  for (const StateTensor& s : state) {
    if (s.tensor->device() == Device::CPU) {
      reader.read(s.name, s.tensor->raw(), s.tensor->nbytes());
    } else {
      Tensor h = Tensor::empty(s.tensor->shape(), s.tensor->dtype(), Device::CPU, MemCategory::Workspace);
      reader.read(s.name, h.raw(), h.nbytes());
      s.tensor->copy_from(h);
    }
  }
  const ResumeState st = shard_resume_state(reader);
  for (size_t c = 0; c < st.optimizer_steps.size(); ++c) {
    if (!r.zero1.empty()) r.zero1[c]->optimizer_steps = st.optimizer_steps[c];
    else r.optimizers[c]->set_step_count(st.optimizer_steps[c]);
  }
  return st;
}

ResumeState shard_resume_state(const CheckpointReader& shard) {
  const nlohmann::json meta = shard.json("meta");
  ResumeState st;
  st.step = meta.at("step").get<int64_t>();
  st.loader = shard.bytes("loader");
  shard.read("rng", st.rng.data(), sizeof(st.rng));
  st.optimizer_steps = meta.at("optimizer_steps").get<std::vector<int64_t>>();
  return st;
}

ResumeState load_checkpoint(Communicator& world, const std::string& dir, lab07::Rank3D& r, bool zero1, bool reshard) {
  ResumeState st;
  std::string problem;
  try {
    std::ifstream in(fs::path(dir) / kManifestName);
    SL_CHECK(static_cast<bool>(in), "cannot open %s", (fs::path(dir) / kManifestName).c_str());
    const nlohmann::json manifest = nlohmann::json::parse(in);
    const nlohmann::json want = describe_layout(r, zero1, world.size());
    SL_CHECK_HINT(manifest.at("model") == want.at("model"),
                  "restart with the --model the checkpoint was written with (its manifest.json's \"model\")",
                  "%s: the checkpoint's model is %s, this run's %s", dir.c_str(), manifest.at("model").dump().c_str(),
                  want.at("model").dump().c_str());
    const bool same = manifest.at("world_size") == want.at("world_size") && manifest.at("layout") == want.at("layout");
    if (same) {
      const nlohmann::json& shards = manifest.at("shards");
      SL_CHECK(static_cast<int>(shards.size()) == world.size(), "%s lists %zu shards for %d ranks", dir.c_str(),
               shards.size(), world.size());
      st = read_shard(dir, ShardInfo::from_json(shards.at(world.rank())), r);
    } else {
      SL_CHECK_HINT(reshard,
                    "restart with the layout the checkpoint was written with, or add --reshard to load it at this "
                    "one (README.md#resharding: the same loss to a bound, not the same bits)",
                    "%s: the checkpoint's %d ranks have the layout %s, this run's %d ranks %s", dir.c_str(),
                    manifest.at("world_size").get<int>(), manifest.at("layout").dump().c_str(), world.size(),
                    want.at("layout").dump().c_str());
      st = load_resharded(dir, manifest, r);
    }
  } catch (const std::exception& e) {
    problem = e.what();
  }
  if (!any_rank(world, !problem.empty(), "checkpoint loaded?")) return st;
  SL_FAIL("the message of the rank that failed is above; fix that, or start without --resume",
          "loading %s failed on at least one rank%s%s", dir.c_str(),
          problem.empty() ? "" : "; this rank: ", problem.c_str());
}

std::vector<ShardInfo> gather_shard_infos(Communicator& world, const ShardInfo& mine) {
  constexpr int kInts = 7;  // rank, tp, pp, dp, bytes (low, high 32 bits), checksum
  std::vector<int32_t> p(kInts);
  p[0] = mine.rank;
  p[1] = mine.coords.tp_rank;
  p[2] = mine.coords.pp_rank;
  p[3] = mine.coords.dp_rank;
  p[4] = static_cast<int32_t>(static_cast<uint32_t>(mine.bytes & 0xffffffffu));
  p[5] = static_cast<int32_t>(static_cast<uint32_t>(mine.bytes >> 32));
  p[6] = static_cast<int32_t>(mine.checksum);
  const std::vector<int32_t> out = all_gather_values(world, p, "checkpoint shard entries");
  std::vector<ShardInfo> all(world.size());
  const int32_t* q = out.data();
  for (int i = 0; i < world.size(); ++i, q += kInts) {
    all[i].rank = q[0];
    all[i].coords = {q[1], q[2], q[3]};
    all[i].file = shard_file_name(q[0]);
    all[i].bytes = static_cast<uint64_t>(static_cast<uint32_t>(q[4])) |
                   (static_cast<uint64_t>(static_cast<uint32_t>(q[5])) << 32);
    all[i].checksum = static_cast<uint32_t>(q[6]);
  }
  return all;
}

std::string broadcast_text(Communicator& world, const std::string& text, int root) {
  return broadcast_string(world, text, root, "text", /*max_bytes=*/1023);  // 256 i32 words, the last byte a NUL
}

static nlohmann::json describe_resume(const lab07::Rank3D& r, const ResumeState& st) {
  nlohmann::json loader;
  try {
    const data::LoaderState l = data::LoaderState::from_bytes(st.loader);
    loader = {
        {"epoch", l.epoch}, {"batch_in_epoch", l.batch_in_epoch}, {"B", l.B}, {"dp_size", l.dp_size}, {"seed", l.seed}};
  } catch (const Error&) {  // not a LoaderState record (a test's stand-in): the bytes as they are
    std::string hex;
    for (uint8_t x : st.loader) {
      char b[3];
      std::snprintf(b, sizeof(b), "%02x", x);
      hex += b;
    }
    loader = {{"bytes_hex", hex}};
  }
  return {{"loader", loader}, {"rng", st.rng}, {"optimizer_steps", optimizer_steps(r)}};
}

nlohmann::json describe_layout(const lab07::Rank3D& r, bool zero1, int world_size, const ResumeState* st) {
  const lab07::Grid& g = r.layout.grid;
  const lab06::PipelineLayout& p = r.layout.pipeline;
  const GPTConfig& c = r.models.front()->config();
  nlohmann::json dense = nlohmann::json::object();
  for (const ParamInfo& p : gpt2_param_table(c)) dense[p.name] = p.dense_shape;
  nlohmann::json d = {{"format", 1},
                      {"world_size", world_size},
                      {"layout",
                       {{"tp", g.tp},
                        {"pp", g.pp},
                        {"dp", g.dp},
                        {"order", g.order},
                        {"zero1", zero1},
                        {"schedule", lab06::schedule_name(p.schedule)},
                        {"micro_batches", p.m},
                        {"chunks", p.v}}},
                      {"model",
                       {{"n_layer", c.n_layer},
                        {"n_head", c.n_head},
                        {"n_embd", c.n_embd},
                        {"vocab_size", c.vocab_size},
                        {"max_seq_len", c.max_seq_len}}},
                      {"dense_shapes", dense}};
  if (st != nullptr) d["resume"] = describe_resume(r, *st);
  return d;
}

// =============================================================================================
// The skip list
// =============================================================================================
bool SkipList::contains(int64_t epoch, int64_t batch_in_epoch) const {
  for (const Position& p : positions_)
    if (p.epoch == epoch && p.batch_in_epoch == batch_in_epoch) return true;
  return false;
}

void SkipList::add(const Position& p) {
  if (!contains(p.epoch, p.batch_in_epoch)) positions_.push_back(p);
}

void SkipList::save(const std::string& path) const {
  nlohmann::json j = {{"skip", nlohmann::json::array()}};
  for (const Position& p : positions_) j["skip"].push_back({p.epoch, p.batch_in_epoch});
  const std::string text = j.dump() + "\n";
  write_file_atomic(path, text.data(), text.size());
}

SkipList SkipList::load(const std::string& path) {
  SkipList list;
  std::ifstream in(path);
  if (!in) return list;
  try {
    const nlohmann::json doc = nlohmann::json::parse(in);  // named: a range-for over parse(in).at(...) would dangle
    for (const nlohmann::json& p : doc.at("skip")) list.add({p.at(0).get<int64_t>(), p.at(1).get<int64_t>()});
  } catch (const nlohmann::json::exception& e) {
    SL_FAIL("a skip list is {\"skip\": [[epoch, batch_in_epoch], ...]}; fix or delete the file", "%s: %s", path.c_str(),
            e.what());
  }
  return list;
}

// =============================================================================================
// Per-rank timings
// =============================================================================================
nlohmann::json stragglers_json(const std::vector<Straggler>& slow) {
  nlohmann::json out = nlohmann::json::array();
  for (const Straggler& x : slow)
    out.push_back({{"rank", x.rank},
                   {"compute_ms", x.compute_ms},
                   {"typical_compute_ms", x.typical_compute_ms},
                   {"ratio", x.ratio},
                   {"others_wait_ms", x.others_wait_ms}});
  return out;
}

void print_stragglers(const std::vector<Straggler>& slow) {
  for (const Straggler& x : slow)
    std::printf("  rank %d computes %.1f ms a step, %.2fx the typical %.1f ms; the others wait %.1f ms a step for it\n",
                x.rank, x.compute_ms, x.ratio, x.typical_compute_ms, x.others_wait_ms);
}

std::vector<RankTimes> gather_rank_times(Communicator& world, const RankTimes& mine, int window) {
  const int n = std::min<int>(window, static_cast<int>(mine.compute_ms.size()));
  const size_t first = mine.compute_ms.size() - static_cast<size_t>(n);
  std::vector<float> in(2 * n);
  for (int i = 0; i < n; ++i) {
    in[i] = static_cast<float>(mine.compute_ms[first + i]);
    in[n + i] = static_cast<float>(mine.wait_ms[first + i]);
  }
  const std::vector<float> out = all_gather_values(world, in, "rank times");
  std::vector<RankTimes> all(world.size());
  for (int r = 0; r < world.size(); ++r) {
    all[r].rank = r;
    const float* p = out.data() + 2 * n * r;
    all[r].compute_ms.assign(p, p + n);
    all[r].wait_ms.assign(p + n, p + 2 * n);
  }
  return all;
}

// =============================================================================================
// The file log
// =============================================================================================
void write_checkpoint_file(const std::string& path, const std::string& text) {
  simulated_disk_delay();
  write_file_atomic(path, text.data(), text.size());
  log_storage().push_back({path, wall_ms()});
}

const std::vector<FileEvent>& file_log() { return log_storage(); }
void clear_file_log() { log_storage().clear(); }

}  // namespace scalelab::lab08
