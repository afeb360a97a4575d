// test_checkpoint.cpp — the checkpoint file (common/include/scalelab/model/checkpoint.h): what is written
// is read back bit for bit, and every kind of damage is refused with a message that says what, where
// and what to do. A crash while writing never costs the previous checkpoint.
#include <gtest/gtest.h>

#include <signal.h>    // defines: kill, SIGKILL
#include <sys/wait.h>  // defines: waitpid
#include <unistd.h>    // defines: fork, getpid, _exit

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "scalelab/model/checkpoint.h"
#include "scalelab/core/error.h"

namespace fs = std::filesystem;
using scalelab::CheckpointReader;
using scalelab::CheckpointWriter;

namespace {

// The report of the scalelab::Error that f throws, or "" if it throws none.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const scalelab::Error& e) {
    return e.what();
  }
  return std::string();
}

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "expected '" << (part) << "' in:\n" << (text)

// Each test gets an empty directory of its own.
class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = (fs::temp_directory_path() / ("sl_test_ckpt_" + std::to_string(::getpid()) + "_" + info->name())).string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A small checkpoint whose bytes depend on `seed`: 1000 floats, a 3-byte section, an empty one, JSON.
  std::string write_ckpt(int64_t step, float seed = 1.0f) {
    std::vector<float> params(1000);
    for (size_t i = 0; i < params.size(); ++i) params[i] = seed * static_cast<float>(i) * 0.5f;
    const uint8_t rng[3] = {7, 8, 9};
    CheckpointWriter w;
    w.add("params/unit0", params.data(), params.size() * sizeof(float));
    w.add_copy("rng", rng, sizeof(rng));
    w.add("empty", nullptr, 0);
    w.add_json("meta", {{"step", step}, {"seed", seed}});
    const std::string path = scalelab::checkpoint_path(dir_, step);
    w.commit(path);
    return path;
  }

  static std::vector<uint8_t> file_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
  }
  static void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  }

  std::string dir_;
};

}  // namespace

TEST_F(CheckpointTest, RoundTripReturnsEveryByteAndTheJson) {
  // Sizes around the 64-byte section alignment, and one large enough to span several CRC chunks.
  std::vector<std::vector<uint8_t>> sections;
  for (size_t n : {size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{20u << 20}}) {
    std::vector<uint8_t> b(n);
    for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>((i * 131 + n) & 0xff);
    sections.push_back(std::move(b));
  }
  CheckpointWriter w;
  for (size_t s = 0; s < sections.size(); ++s) w.add("sec" + std::to_string(s), sections[s].data(), sections[s].size());
  w.add("empty", nullptr, 0);
  const nlohmann::json meta = {{"step", 42}, {"config", {{"n_layer", 12}, {"lr", 6e-4}}}, {"name", "d12"}};
  w.add_json("meta", meta);
  const std::string path = scalelab::checkpoint_path(dir_, 42);
  w.commit(path);
  EXPECT_FALSE(fs::exists(path + ".tmp." + std::to_string(::getpid()))) << "commit left its temporary file";

  CheckpointReader r(path);
  EXPECT_EQ(r.names(), (std::vector<std::string>{"sec0", "sec1", "sec2", "sec3", "sec4", "empty", "meta"}));
  EXPECT_EQ(r.file_bytes(), fs::file_size(path));
  for (size_t s = 0; s < sections.size(); ++s) {
    const std::string name = "sec" + std::to_string(s);
    ASSERT_TRUE(r.has(name));
    EXPECT_EQ(r.size_bytes(name), sections[s].size());
    EXPECT_EQ(r.bytes(name), sections[s]) << name;
    std::vector<uint8_t> dst(sections[s].size());
    r.read(name, dst.data(), dst.size());
    EXPECT_EQ(dst, sections[s]) << name;
  }
  EXPECT_EQ(r.size_bytes("empty"), 0u);
  EXPECT_EQ(r.json("meta"), meta);
  EXPECT_FALSE(r.has("params/unit0"));
}

TEST_F(CheckpointTest, CommitReplacesAnExistingCheckpoint) {
  const std::string path = write_ckpt(5, 1.0f);
  write_ckpt(5, 2.0f);  // same path, new content
  EXPECT_EQ(CheckpointReader(path).json("meta")["seed"], 2.0);
}

TEST_F(CheckpointTest, MissingFileIsRefusedNamingTheNewestCheckpoint) {
  write_ckpt(100);
  const std::string msg = error_of([&] { CheckpointReader r(dir_ + "/ckpt_999.bin"); });
  EXPECT_CONTAINS(msg, "cannot open checkpoint");
  EXPECT_CONTAINS(msg, "ckpt_999.bin");
  EXPECT_CONTAINS(msg, "hint:");
  EXPECT_CONTAINS(msg, "ckpt_100.bin");
}

TEST_F(CheckpointTest, TruncatedFileIsRefusedAndThePreviousOneIsNamed) {
  write_ckpt(100);
  const std::string path = write_ckpt(200);
  const uint64_t full = fs::file_size(path);
  fs::resize_file(path, full / 2);
  const std::string msg = error_of([&] { CheckpointReader r(path); });
  EXPECT_CONTAINS(msg, "is truncated");
  EXPECT_CONTAINS(msg, std::to_string(full));      // expected size ...
  EXPECT_CONTAINS(msg, std::to_string(full / 2));  // ... and found size
  EXPECT_CONTAINS(msg, "the previous one is " + scalelab::checkpoint_path(dir_, 100));
  EXPECT_CONTAINS(msg, "--resume");

  fs::resize_file(path, 10);  // shorter than a header
  EXPECT_CONTAINS(error_of([&] { CheckpointReader r(path); }), "is truncated");
}

TEST_F(CheckpointTest, FlippedByteIsRefusedNamingTheDamagedSection) {
  const std::string path = write_ckpt(7);
  std::vector<uint8_t> b = file_bytes(path);
  // The params section is the first one, at the first 64-byte boundary after the table; flip a byte
  // in the middle of it (the file is ~4 KB, the params 4000 bytes).
  b[b.size() / 2] ^= 0x10;
  write_bytes(path, b);
  const std::string msg = error_of([&] { CheckpointReader r(path); });
  EXPECT_CONTAINS(msg, "checksum mismatch");
  EXPECT_CONTAINS(msg, "stored CRC-32 0x");
  EXPECT_CONTAINS(msg, "damaged section(s): params/unit0");
  EXPECT_CONTAINS(msg, "the checkpoint is damaged");

  // Without the whole-file check the damage is still caught when the section is read.
  CheckpointReader quick(path, /*verify_file_checksum=*/false);
  std::vector<float> dst(1000);
  const std::string read_msg = error_of([&] { quick.read("params/unit0", dst.data(), dst.size() * sizeof(float)); });
  EXPECT_CONTAINS(read_msg, "checksum mismatch in section 'params/unit0'");
  EXPECT_NO_THROW(quick.json("meta"));  // the undamaged sections stay readable
}

TEST_F(CheckpointTest, WrongMagicIsRefused) {
  const std::string path = write_ckpt(3);
  std::vector<uint8_t> b = file_bytes(path);
  b[0] = 0x7f, b[1] = 'E', b[2] = 'L', b[3] = 'F';
  write_bytes(path, b);
  const std::string msg = error_of([&] { CheckpointReader r(path); });
  EXPECT_CONTAINS(msg, "is not a scalelab checkpoint");
  EXPECT_CONTAINS(msg, "magic is '.ELF");
  EXPECT_CONTAINS(msg, "expected 'SLCKPT");
  // Not a checkpoint at all is a wrong path, not damage: no "damaged", and never advice to delete.
  EXPECT_CONTAINS(msg, "check the path");
  EXPECT_EQ(msg.find("damaged"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("delete"), std::string::npos) << msg;
}

TEST_F(CheckpointTest, MissingSectionAndWrongSizeAreRefused) {
  const std::string path = write_ckpt(3);
  CheckpointReader r(path);
  std::vector<float> dst(1000);
  std::string msg = error_of([&] { r.read("params/unit1", dst.data(), 4000); });
  EXPECT_CONTAINS(msg, "has no section 'params/unit1'");
  EXPECT_CONTAINS(msg, "params/unit0, rng, empty, meta");  // what it does have

  msg = error_of([&] { r.read("params/unit0", dst.data(), 3996); });
  EXPECT_CONTAINS(msg, "section 'params/unit0' holds 4000 bytes, the caller expects 3996");
  EXPECT_CONTAINS(msg, "same model config");
}

TEST_F(CheckpointTest, WriterRefusesDuplicateAndEmptyNames) {
  CheckpointWriter w;
  const int x = 1;
  w.add("a", &x, sizeof(x));
  EXPECT_CONTAINS(error_of([&] { w.add("a", &x, sizeof(x)); }), "added twice");
  EXPECT_CONTAINS(error_of([&] { w.add("", &x, sizeof(x)); }), "allowed 1..255");
}

TEST_F(CheckpointTest, PartialTempFileFromACrashLeavesThePreviousCheckpointIntact) {
  // A writer that died half-way through replacing ckpt_100.bin leaves "<path>.tmp.<pid>" and never
  // renames it. Simulate that with half of a valid file under a dead process's pid.
  const std::string path = write_ckpt(100, 1.0f);
  const std::vector<uint8_t> before = file_bytes(path);
  const std::string scratch = dir_ + "/scratch.bin";
  {
    CheckpointWriter w;
    const std::vector<uint8_t> big(1u << 20, 0xab);
    w.add("params/unit0", big.data(), big.size());
    w.commit(scratch);
  }
  std::vector<uint8_t> partial = file_bytes(scratch);
  partial.resize(partial.size() / 2);
  fs::remove(scratch);
  const pid_t dead = fork();  // a pid that surely belongs to no running process: a reaped child
  if (dead == 0) _exit(0);
  waitpid(dead, nullptr, 0);
  const std::string tmp = path + ".tmp." + std::to_string(dead);
  write_bytes(tmp, partial);

  EXPECT_EQ(file_bytes(path), before);
  EXPECT_EQ(CheckpointReader(path).json("meta")["step"], 100);
  EXPECT_EQ(scalelab::latest_checkpoint(dir_), path);       // tmp files are not checkpoints
  EXPECT_EQ(scalelab::remove_old_checkpoints(dir_, 1), 1);  // ... and the dead writer's tmp is cleaned up
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_TRUE(fs::exists(path));
}

TEST_F(CheckpointTest, ProcessKilledDuringCommitLeavesAReadableCheckpoint) {
  // A real crash: a child process rewrites the same checkpoint over and over (32 MiB each) and is
  // SIGKILLed while its temporary file is being written. The checkpoint at the path must be intact.
  const std::string path = scalelab::checkpoint_path(dir_, 1);
  std::vector<uint8_t> payload(32u << 20, 0);
  auto commit_version = [&](uint8_t v) {
    std::fill(payload.begin(), payload.end(), v);
    CheckpointWriter w;
    w.add("params/unit0", payload.data(), payload.size());
    w.add_json("meta", {{"version", v}});
    w.commit(path);
  };
  commit_version(1);

  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    for (uint8_t v = 2;; v = static_cast<uint8_t>(v == 255 ? 2 : v + 1)) commit_version(v);
  }
  // Wait until the child's tmp file exists and has bytes, i.e. a commit is in flight, then kill it.
  const std::string tmp = path + ".tmp." + std::to_string(child);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::error_code ec;
  while (std::chrono::steady_clock::now() < deadline && !(fs::exists(tmp, ec) && fs::file_size(tmp, ec) > 0))
    std::this_thread::yield();
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);

  CheckpointReader r(path);  // old or new version, but whole
  const int version = r.json("meta")["version"];
  const std::vector<uint8_t> got = r.bytes("params/unit0");
  ASSERT_EQ(got.size(), payload.size());
  EXPECT_EQ(got.front(), version);
  EXPECT_EQ(got.back(), version);
  EXPECT_EQ(scalelab::latest_checkpoint(dir_), path);
  fs::remove(tmp, ec);
}

TEST_F(CheckpointTest, LatestCheckpointSkipsADamagedNewestOne) {
  write_ckpt(100);
  const std::string good = write_ckpt(200);
  const std::string bad = write_ckpt(300);
  std::vector<uint8_t> b = file_bytes(bad);
  b[b.size() / 2] ^= 0x01;
  write_bytes(bad, b);
  write_bytes(dir_ + "/notes.txt", {'h', 'i'});  // other files are ignored

  ::testing::internal::CaptureStderr();
  const std::string latest = scalelab::latest_checkpoint(dir_);
  const std::string warning = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(latest, good);
  EXPECT_CONTAINS(warning, "skipping damaged checkpoint " + bad);
  EXPECT_CONTAINS(warning, "checksum mismatch");
}

TEST_F(CheckpointTest, LatestCheckpointOfAnEmptyOrMissingDirIsEmpty) {
  EXPECT_EQ(scalelab::latest_checkpoint(dir_), "");
  EXPECT_EQ(scalelab::latest_checkpoint(dir_ + "/does_not_exist"), "");
}

TEST_F(CheckpointTest, RemoveOldCheckpointsKeepsTheLastK) {
  for (int64_t step : {10, 20, 30, 40, 50}) write_ckpt(step);
  EXPECT_EQ(scalelab::remove_old_checkpoints(dir_, 2), 3);
  EXPECT_FALSE(fs::exists(scalelab::checkpoint_path(dir_, 30)));
  EXPECT_TRUE(fs::exists(scalelab::checkpoint_path(dir_, 40)));
  EXPECT_TRUE(fs::exists(scalelab::checkpoint_path(dir_, 50)));
  EXPECT_EQ(scalelab::remove_old_checkpoints(dir_, 2), 0);
  EXPECT_CONTAINS(error_of([&] { scalelab::remove_old_checkpoints(dir_, 0); }), "keep_last=0");
}

TEST(CheckpointNames, StepIsParsedFromTheFileNameOnly) {
  EXPECT_EQ(scalelab::checkpoint_path("runs/x", 1200), "runs/x/ckpt_1200.bin");
  EXPECT_EQ(scalelab::checkpoint_step("runs/x/ckpt_1200.bin"), 1200);
  EXPECT_EQ(scalelab::checkpoint_step("ckpt_0.bin"), 0);
  EXPECT_EQ(scalelab::checkpoint_step("runs/x/ckpt_1200.bin.tmp.77"), -1);
  EXPECT_EQ(scalelab::checkpoint_step("runs/x/ckpt_.bin"), -1);
  EXPECT_EQ(scalelab::checkpoint_step("runs/x/ckpt_12a.bin"), -1);
  EXPECT_EQ(scalelab::checkpoint_step("runs/x/model_12.bin"), -1);
}
