// test_train_checkpoint.cpp — resume is exact (docs/style.md 33): training 20 steps equals training 10,
// saving a checkpoint, loading it into a fresh model/optimizer/loader, and training 10 more, bit for
// bit on the CPU; a damaged checkpoint is refused and the previous one stays usable.
// Code under test: common/src/model/train_checkpoint.cpp, common/src/model/checkpoint.cpp, the lab 02 loader.
#include <gtest/gtest.h>  // defines: TEST, EXPECT_*

#include <cstring>     // defines: std::memcmp
#include <filesystem>  // defines: temp_directory_path
#include <fstream>
#include <string>
#include <vector>

#include "scalelab/model/checkpoint.h"
#include "scalelab/core/error.h"
#include "scalelab/model/gpt2.h"
#include "scalelab/model/optim.h"
#include "scalelab/model/train_checkpoint.h"
#include "shard_loader.h"  // defines: scalelab::lab02::ShardLoader, write_shard

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
  lab02::write_shard((dir / "train_000000.bin").string(), tokens, 64);
  return dir.string();
}

// The training loop under test: loss per step, using a loader position, schedule and clipping,
// so every piece of state that a checkpoint must carry is exercised.
struct Trainer {
  GPT2 model;
  Optimizer opt;
  lab02::ShardLoader loader;
  LRSchedule schedule{1e-2f, 1e-3f, 3, 20};
  Trainer(const std::string& data_dir, bool prefetch)
      : model(GPTConfig::preset("tiny"), PrecisionPolicy::fp32(), Device::CPU, /*seed=*/3),
        opt(model, OptimizerConfig{}),
        loader(data_dir, "train", config(prefetch)) {}
  static lab02::LoaderConfig config(bool prefetch) {
    lab02::LoaderConfig c;
    c.B = kB;
    c.T = kT;
    c.seed = 11;
    c.prefetch = prefetch;
    return c;
  }
  std::vector<float> train(int from_step, int to_step) {
    std::vector<float> losses;
    Tensor x = Tensor::empty({kB, kT}, DType::I32), y = Tensor::empty({kB, kT}, DType::I32);
    for (int step = from_step; step < to_step; ++step) {
      lab02::Batch b = loader.next();
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
    loader.restore(lab02::LoaderState::from_bytes(st.loader_state));
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
  for (bool prefetch : {false, true}) {
    Trainer straight(data_, prefetch);
    const std::vector<float> all = straight.train(0, 20);

    const std::string ckpt = (dir_ / "ckpt_10.bin").string();
    {
      Trainer first(data_, prefetch);
      first.train(0, 10);
      first.save(ckpt, 10);
    }
    Trainer resumed(data_, prefetch);  // fresh weights (same seed) are overwritten by the checkpoint
    const int64_t step = resumed.load(ckpt);
    ASSERT_EQ(step, 10);
    const std::vector<float> second = resumed.train(10, 20);
    for (int i = 0; i < 10; ++i)
      EXPECT_EQ(second[i], all[10 + i]) << "step " << 10 + i << " differs after resume (prefetch=" << prefetch << ")";
    EXPECT_TRUE(same_params(straight.model, resumed.model)) << "parameters differ after 20 steps";
  }
}

TEST_F(ResumeTest, DamagedCheckpointIsRefusedAndPreviousOneStillLoads) {
  Trainer t(data_, false);
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
  Trainer fresh(data_, false);
  EXPECT_THROW(fresh.load(bad), Error);
  EXPECT_EQ(latest_checkpoint(dir_.string()), good) << "latest_checkpoint must skip the damaged newer file";
  EXPECT_EQ(fresh.load(good), 3);
}

TEST_F(ResumeTest, CheckpointOfAnotherModelShapeIsRefusedWithHint) {
  Trainer t(data_, false);
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
