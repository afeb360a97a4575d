// test_train_checkpoint.cpp — resume is exact (docs/style.md 33): training 20 steps equals training 10,
// saving a checkpoint, loading it into a fresh model/optimizer/loader, and training 10 more, bit for
// bit on the CPU; a damaged checkpoint is refused and the previous one stays usable.
// Code under test: common/src/model/train_checkpoint.cpp, common/src/model/checkpoint.cpp; the loader's
// position travels as a data::LoaderState record (lab 02's loader is tested by tests/lab02).
#include <gtest/gtest.h>  // defines: TEST, EXPECT_*

#include <cstring>     // defines: std::memcmp
#include <filesystem>  // defines: temp_directory_path
#include <fstream>
#include <string>
#include <vector>

#include "scalelab/core/error.h"
#include "scalelab/core/rng.h"    // defines: Rng
#include "scalelab/data/batch.h"  // defines: data::Batch, LoaderState
#include "scalelab/data/shard.h"  // defines: data::write_shard, read_shard
#include "scalelab/model/checkpoint.h"
#include "scalelab/model/gpt2.h"
#include "scalelab/model/optim.h"
#include "scalelab/model/train_checkpoint.h"

namespace fs = std::filesystem;
using namespace scalelab;

namespace {

constexpr int kB = 2, kT = 8;

// A small corpus of pseudo-random bytes with some structure, written as one train shard.
std::string make_corpus(const fs::path& dir) {
  fs::create_directories(dir);
  std::vector<int32_t> tokens(4000);
  Rng rng(7);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i % 7) * 3 + rng.next_u64() % 5);
  data::write_shard((dir / "train_000000.bin").string(), tokens, 64);
  return (dir / "train_000000.bin").string();
}

// A loader of this test's own, so that common/'s test links no lab: batch k of the stream is windows
// k*B .. k*B+B-1 of T+1 tokens starting every T tokens, epochs one after the other; its position is a
// data::LoaderState, as lab 02's loader's is. The position must survive the checkpoint exactly.
class StreamLoader {
 public:
  explicit StreamLoader(const std::string& shard) : tokens_(data::read_shard(shard)) {}
  data::Batch next() {
    data::Batch b;
    b.B = kB;
    b.T = kT;
    b.epoch = epoch_;
    b.batch_in_epoch = batch_;
    for (int r = 0; r < kB; ++r) {
      const size_t start = static_cast<size_t>((batch_ * kB + r) * kT);
      b.inputs.insert(b.inputs.end(), tokens_.begin() + start, tokens_.begin() + start + kT);
      b.targets.insert(b.targets.end(), tokens_.begin() + start + 1, tokens_.begin() + start + kT + 1);
    }
    if (++batch_ == batches_per_epoch()) {
      batch_ = 0;
      ++epoch_;
    }
    return b;
  }
  data::LoaderState state() const {
    data::LoaderState s;
    s.seed = 11;
    s.epoch = epoch_;
    s.batch_in_epoch = batch_;
    s.B = kB;
    s.T = kT;
    s.dp_size = 1;
    s.tokens_total = static_cast<int64_t>(tokens_.size());
    return s;
  }
  void restore(const data::LoaderState& s) {
    ASSERT_EQ(s.tokens_total, static_cast<int64_t>(tokens_.size()));
    epoch_ = s.epoch;
    batch_ = s.batch_in_epoch;
  }

 private:
  int64_t batches_per_epoch() const { return (static_cast<int64_t>(tokens_.size()) - 1) / kT / kB; }
  std::vector<int32_t> tokens_;
  int64_t epoch_ = 0, batch_ = 0;
};

// The training loop under test: loss per step, using a loader position, schedule and clipping,
// so every piece of state that a checkpoint must carry is exercised.
struct Trainer {
  GPT2 model;
  Optimizer opt;
  StreamLoader loader;
  LRSchedule schedule{1e-2f, 1e-3f, 3, 20};
  explicit Trainer(const std::string& shard)
      : model(GPTConfig::preset("tiny"), PrecisionPolicy::fp32(), Device::CPU, /*seed=*/3),
        opt(model, OptimizerConfig{}),
        loader(shard) {}
  std::vector<float> train(int from_step, int to_step) {
    std::vector<float> losses;
    Tensor x = Tensor::empty({kB, kT}, DType::I32), y = Tensor::empty({kB, kT}, DType::I32);
    for (int step = from_step; step < to_step; ++step) {
      data::Batch b = loader.next();
      std::copy(b.inputs.begin(), b.inputs.end(), x.data<int32_t>());
      std::copy(b.targets.begin(), b.targets.end(), y.data<int32_t>());
      model.zero_grad();
      losses.push_back(model.forward(x, &y));
      model.backward();
      clip_grad_norm(model, 1.0f);
      opt.step(schedule.at(step));
    }
    return losses;
  }
  void save(const std::string& path, int64_t step) {
    TrainState st;
    st.step = step;
    st.loader_state = loader.state().to_bytes();
    save_train_checkpoint(path, model, opt, st);
  }
  int64_t load(const std::string& path) {
    TrainState st = load_train_checkpoint(path, model, opt);
    loader.restore(data::LoaderState::from_bytes(st.loader_state));
    return st.step;
  }
};

bool same_params(GPT2& a, GPT2& b) {
  for (int u = 0; u < a.num_units(); ++u)
    if (std::memcmp(a.unit_params(u).raw(), b.unit_params(u).raw(), a.unit_params(u).nbytes()) != 0) return false;
  return true;
}

class ResumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("sl_resume_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    data_ = make_corpus(dir_ / "data");
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
  std::string data_;
};

}  // namespace

TEST_F(ResumeTest, Train20EqualsTrain10SaveLoadTrain10BitExact) {
  Trainer straight(data_);
  const std::vector<float> all = straight.train(0, 20);

  const std::string ckpt = (dir_ / "ckpt_10.bin").string();
  {
    Trainer first(data_);
    first.train(0, 10);
    first.save(ckpt, 10);
  }
  Trainer resumed(data_);  // fresh weights (same seed) are overwritten by the checkpoint, the loader moved on
  const int64_t step = resumed.load(ckpt);
  ASSERT_EQ(step, 10);
  const std::vector<float> second = resumed.train(10, 20);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(second[i], all[10 + i]) << "step " << 10 + i << " differs after resume";
  EXPECT_TRUE(same_params(straight.model, resumed.model)) << "parameters differ after 20 steps";
}

TEST_F(ResumeTest, DamagedCheckpointIsRefusedAndPreviousOneStillLoads) {
  Trainer t(data_);
  t.train(0, 3);
  const std::string good = checkpoint_path(dir_.string(), 3);
  t.save(good, 3);
  t.train(3, 5);
  const std::string bad = checkpoint_path(dir_.string(), 5);
  t.save(bad, 5);
  {  // flip one byte in the middle of the newer file
    std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(bad) / 2));
    char c = 0;
    f.read(&c, 1);
    f.seekp(static_cast<std::streamoff>(fs::file_size(bad) / 2));
    c = static_cast<char>(c ^ 0x5a);
    f.write(&c, 1);
  }
  Trainer fresh(data_);
  EXPECT_THROW(fresh.load(bad), Error);
  EXPECT_EQ(latest_checkpoint(dir_.string()), good) << "latest_checkpoint must skip the damaged newer file";
  EXPECT_EQ(fresh.load(good), 3);
}

TEST_F(ResumeTest, CheckpointOfAnotherModelShapeIsRefusedWithHint) {
  Trainer t(data_);
  const std::string path = (dir_ / "ckpt_0.bin").string();
  t.save(path, 0);
  GPTConfig other = GPTConfig::preset("tiny");
  other.n_layer = 3;
  GPT2 model(other);
  Optimizer opt(model, OptimizerConfig{});
  try {
    load_train_checkpoint(path, model, opt);
    FAIL() << "a checkpoint of a 2-layer model loaded into a 3-layer model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("same --model"), std::string::npos) << e.what();
  }
}
