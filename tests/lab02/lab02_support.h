// lab02_support.h — what lab 02's tests share: a scratch directory per test, a "counting" token stream
// (token i is i, so a window's tokens say where they came from), batch comparison, and a deadline for
// calls that a broken prefetch hand-off could block forever. Header-only: it is compiled into the graded
// program of each track (tests/lab02/test_lab02.cpp, shard_loader.h's lab02:: is that track's) and into
// the reference's unit test (test_shard_loader.cpp).
#pragma once

#include <gtest/gtest.h>  // defines: ::testing::UnitTest (the test's name)

#include <unistd.h>  // defines: getpid (a scratch directory name per process)

#include <chrono>              // defines: std::chrono::duration
#include <condition_variable>  // defines: std::condition_variable (finishes_within)
#include <cstdio>              // defines: std::snprintf
#include <exception>           // defines: std::exception_ptr
#include <filesystem>          // defines: std::filesystem (the scratch directory)
#include <functional>          // defines: std::function
#include <memory>              // defines: std::shared_ptr
#include <mutex>               // defines: std::mutex
#include <sstream>             // defines: std::ostringstream (describe)
#include <string>
#include <thread>  // defines: std::thread (finishes_within)
#include <vector>

#include "scalelab/data/shard.h"  // defines: data::write_shard
#include "shard_loader.h"         // defines: lab02::Batch, LoaderConfig, ShardLoader (the track under test)

namespace scalelab::lab02_test {

namespace fs = std::filesystem;
namespace lab02 = scalelab::lab02;

// A fresh directory under the system's temp dir for the running test, removed when this goes away.
class Scratch {
 public:
  Scratch() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("sl_lab02_" + std::string(info ? info->name() : "test") + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~Scratch() {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);  // mapped shards stay readable after their files are gone
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string dir() const { return dir_.string(); }

 private:
  fs::path dir_;
};

constexpr int kCountingVocab = 1 << 20;  // > 65536: 4-byte tokens, so every position up to 2^20 fits

// Shards train_000000.bin, ... of the given sizes holding the stream 0, 1, 2, ...: token i is i, so
// window w must hold w*T, ..., w*T + T.
inline std::vector<std::string> counting_stream(const Scratch& scratch, const std::vector<int>& shard_sizes) {
  std::vector<std::string> files;
  int32_t next = 0;
  for (size_t s = 0; s < shard_sizes.size(); ++s) {
    std::vector<int32_t> tokens(static_cast<size_t>(shard_sizes[s]));
    for (int32_t& t : tokens) t = next++;
    char name[32];
    std::snprintf(name, sizeof(name), "train_%06zu.bin", s);
    data::write_shard(scratch.path(name), tokens, kCountingVocab);
    files.push_back(scratch.path(name));
  }
  return files;
}

inline lab02::LoaderConfig loader_config(int B, int T, bool prefetch, uint64_t seed = 42) {
  lab02::LoaderConfig c;
  c.B = B;
  c.T = T;
  c.seed = seed;
  c.prefetch = prefetch;
  return c;
}

// "" when a and b are the same batch (position, windows, tokens), else what differs first.
inline std::string batch_difference(const lab02::Batch& a, const lab02::Batch& b) {
  std::ostringstream os;
  if (a.epoch != b.epoch || a.batch_in_epoch != b.batch_in_epoch)
    os << "position (" << a.epoch << ", " << a.batch_in_epoch << ") vs (" << b.epoch << ", " << b.batch_in_epoch << ")";
  else if (a.window_ids != b.window_ids)
    os << "windows differ at batch (" << a.epoch << ", " << a.batch_in_epoch << "): first window " << a.window_ids[0]
       << " vs " << (b.window_ids.empty() ? -1 : b.window_ids[0]);
  else if (a.inputs != b.inputs || a.targets != b.targets)
    os << "same windows, different tokens at batch (" << a.epoch << ", " << a.batch_in_epoch << ")";
  return os.str();
}

// "" when every row of a batch of a counting stream holds its window's tokens (row r of window w: inputs
// w*T .. w*T + T-1, targets one further), else the first row that does not.
inline std::string window_tokens_problem(const lab02::Batch& batch) {
  for (int r = 0; r < batch.B; ++r) {
    const int64_t w = batch.window_ids[r];
    for (int t = 0; t < batch.T; ++t) {
      if (batch.inputs[r * batch.T + t] != w * batch.T + t || batch.targets[r * batch.T + t] != w * batch.T + t + 1)
        return "row " + std::to_string(r) + " (window " + std::to_string(w) + ") does not hold stream tokens [" +
               std::to_string(w * batch.T) + ", " + std::to_string(w * batch.T + batch.T + 1) + ")";
    }
  }
  return "";
}

// Runs fn on a thread of its own and waits at most `seconds` for it; true when it finished (its
// exception, if any, is rethrown here: a NotImplemented still reports "not implemented"). When it does
// not finish, the thread stays blocked, detached, with everything fn owns: so fn must own (or capture by
// value) all it touches. A prefetch hand-off that never wakes its partner then fails a check with a
// message instead of hanging until ctest's timeout.
inline bool finishes_within(double seconds, std::function<void()> fn) {
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr error;
  };
  auto state = std::make_shared<State>();
  std::thread([state, fn = std::move(fn)] {
    std::exception_ptr error;
    try {
      fn();
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(state->mu);
    state->error = error;
    state->done = true;
    state->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(state->mu);
  if (!state->cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return state->done; })) return false;
  if (state->error) std::rethrow_exception(state->error);
  return true;
}

}  // namespace scalelab::lab02_test
