// test_train_loop.cpp — the driver library stands alone: the training loop runs on a batch source and
// throughput/MFU functions given as arguments (driver::LabParts), no lab linked; its options are checked
// before anything runs. Code under test: common/src/driver/train_loop.cpp, common/src/driver/driver.cpp.
// The labs' programs run the same loop with lab 02's loader and lab 01's MFU (scripts/compare_runs.py).
#include <gtest/gtest.h>  // defines: TEST, EXPECT_*

#include <unistd.h>  // defines: getpid (a scratch directory name per process)

#include <cmath>       // defines: std::isfinite
#include <filesystem>  // defines: std::filesystem::temp_directory_path, remove_all
#include <memory>
#include <string>
#include <vector>

#include "expect_error.h"                // defines: test::expect_error_containing
#include "scalelab/data/batch_source.h"  // defines: data::BatchSource, LoaderConfig
#include "scalelab/driver/driver.h"      // defines: driver::TrainOptions, optimizer_config, run_config
#include "scalelab/driver/train_loop.h"  // defines: driver::TrainLoop, LabParts, open_data
#include "scalelab/model/gpt2.h"         // defines: GPT2
#include "scalelab/model/optim.h"        // defines: Optimizer, clip_grad_norm

namespace fs = std::filesystem;
using namespace scalelab;
using scalelab::test::expect_error_containing;

namespace {

// A source of this test's own: window w of the stream 0, 1, 2, ... (mod 64) holds tokens w*T .. w*T + T, in
// stream order; its position counts batches. Enough for the loop: next, state, restore.
class StreamSource : public data::BatchSource {
 public:
  explicit StreamSource(const data::LoaderConfig& c) : cfg_(c) {}
  data::Batch next() override {
    data::Batch b;
    b.B = cfg_.B;
    b.T = cfg_.T;
    b.batch_in_epoch = batch_;
    for (int r = 0; r < cfg_.B; ++r) {
      const int64_t start = (batch_ * cfg_.B + r) * cfg_.T;
      for (int t = 0; t < cfg_.T; ++t) {
        b.inputs.push_back(static_cast<int32_t>((start + t) % 64));
        b.targets.push_back(static_cast<int32_t>((start + t + 1) % 64));
      }
    }
    batch_ = (batch_ + 1) % batches_per_epoch();
    return b;
  }
  data::LoaderState state() const override {
    data::LoaderState s;
    s.batch_in_epoch = batch_;
    return s;
  }
  void restore(const data::LoaderState& s) override { batch_ = s.batch_in_epoch; }
  void skip_batches(int64_t n) override { batch_ = (batch_ + n) % batches_per_epoch(); }
  int vocab_size() const override { return 64; }
  int64_t batches_per_epoch() const override { return 100; }
  const data::LoaderConfig& config() const override { return cfg_; }

 private:
  data::LoaderConfig cfg_;
  int64_t batch_ = 0;
};

double tokens_per_second(int64_t tokens, double seconds) { return static_cast<double>(tokens) / seconds; }
double quarter_mfu(double, double, double, int) { return 0.25; }  // a stand-in: the loop must use what it is given

driver::LabParts test_parts() {
  return {[](const std::string&, const std::string&, const data::LoaderConfig& c) {
            return std::unique_ptr<data::BatchSource>(std::make_unique<StreamSource>(c));
          },
          &tokens_per_second, &quarter_mfu};
}

driver::TrainOptions tiny_options(const fs::path& log_dir) {
  driver::TrainOptions o;
  o.model = "tiny";
  o.seq_len = 8;
  o.steps = 3;
  o.warmup = 1;
  o.val_batches = 1;
  o.sample_tokens = 0;
  o.timeline_steps = 0;
  o.quiet = true;
  o.log_dir = log_dir.string();
  o.run_id = "test";
  return o;
}

}  // namespace

TEST(TrainLoop, RunsOnTheSourceAndTheMfuItIsGiven) {
  const fs::path dir = fs::temp_directory_path() / ("sl_train_loop_" + std::to_string(::getpid()));
  const driver::TrainOptions o = tiny_options(dir);
  driver::RunData data = driver::open_data(o, test_parts(), /*micro_batch=*/2, /*micro_steps=*/1, 0, 1);
  EXPECT_EQ(data.cfg.vocab_size, 64) << "V comes from the source's vocabulary";
  GPT2 model(data.cfg);
  Optimizer optimizer(model, driver::optimizer_config(o));
  RunLogger log("test", o.run_id, /*rank=*/0, o.log_dir);
  const Peak peak{1e9, "test peak", ""};
  driver::TrainLoop loop(o, {"test", 2, 1, 2}, /*comm=*/nullptr, model, data, log, peak, /*flops_per_token=*/100.0,
                         Device::CPU);
  int steps = 0;
  loop.step = [&](std::vector<MicroBatch>& micro, float lr) {
    ++steps;
    model.zero_grad();
    StepResult r;
    r.loss = model.forward(micro[0].inputs, &micro[0].targets);
    model.backward();
    r.grad_norm = clip_grad_norm(model, o.grad_clip);
    optimizer.step(lr);
    return r;
  };
  const driver::Summary s = loop.run();
  fs::remove_all(dir);
  EXPECT_EQ(steps, 3);
  EXPECT_EQ(s.steps, 3);
  EXPECT_TRUE(std::isfinite(s.final_loss) && std::isfinite(s.val_loss_end));
  EXPECT_EQ(s.mfu, 0.25) << "the loop's MFU is the function LabParts gave it";
  EXPECT_GT(s.tokens_per_s, 0);
}

// The log's memory counters follow the loop's device: lab 01 on the GPU logged the CPU allocator's
// counts because its main.cpp, unlike labs 03-08, never called set_memory_device. The loop sets it now.
TEST(TrainLoop, PointsTheLogsMemoryCountersAtItsDevice) {
  const fs::path dir = fs::temp_directory_path() / ("sl_train_loop_mem_" + std::to_string(::getpid()));
  const driver::TrainOptions o = tiny_options(dir);
  driver::RunData data = driver::open_data(o, test_parts(), /*micro_batch=*/2, /*micro_steps=*/1, 0, 1);
  GPT2 model(data.cfg);
  RunLogger log("test", o.run_id, /*rank=*/0, o.log_dir);
  ASSERT_EQ(log.memory_device(), Device::CPU);
  const Peak peak{1e9, "test peak", ""};
  driver::TrainLoop loop(o, {"test", 2, 1, 2}, /*comm=*/nullptr, model, data, log, peak, /*flops_per_token=*/100.0,
                         Device::SIM);
  fs::remove_all(dir);
  EXPECT_EQ(log.memory_device(), Device::SIM) << "the loop's device, without the lab having to say it";
}

// Ranks sharing a GPU share its peak: 2 ranks on one H200 each get half, so lab 04's MFU (tokens/s over
// world_size x the per-rank peak) is the one GPU's; it used to divide by two GPUs' worth.
TEST(SharedGpuPeak, RanksSharingAGpuDivideItsPeak) {
  const Peak h200{989e12, "datasheet: NVIDIA H200 SXM dense bf16", ""};
  const Peak half = driver::shared_gpu_peak(h200, /*ranks_on_node=*/2, /*gpus=*/1);
  EXPECT_EQ(half.flops_per_s, 989e12 / 2);
  EXPECT_NE(half.source.find("2 ranks share 1 GPU"), std::string::npos) << half.source;
  EXPECT_EQ(driver::shared_gpu_peak(h200, 8, 4).flops_per_s, 989e12 / 2);
  EXPECT_EQ(driver::shared_gpu_peak(h200, 3, 2).flops_per_s, 989e12 * 2 / 3);
  EXPECT_EQ(driver::shared_gpu_peak(h200, 4, 4).flops_per_s, 989e12) << "a GPU per rank: the whole peak";
  EXPECT_EQ(driver::shared_gpu_peak(h200, 1, 8).source, h200.source);
  EXPECT_EQ(driver::shared_gpu_peak(h200, 2, 0).flops_per_s, 989e12) << "no GPU: left as it is";
}

TEST(TrainLoop, OpenDataWithoutPartsIsRefused) {
  const driver::TrainOptions o = tiny_options(fs::temp_directory_path());
  expect_error_containing([&] { driver::open_data(o, driver::LabParts{}, 2, 1, 0, 1); }, {"lab_parts"});
}

TEST(TrainOptions, ImpossibleSchedulesAreRefusedBeforeAnythingRuns) {
  driver::TrainOptions o;
  o.lr = -1;
  expect_error_containing([&] { driver::check_train_options(o); }, {"--lr -1"});
  o.lr = 1e-3f;
  o.optimizer = "adam";
  expect_error_containing([&] { driver::check_train_options(o); }, {"--optimizer 'adam'"});
}

TEST(RunConfig, HoldsTheKeysEveryDriverWrites) {
  driver::TrainOptions o;
  const nlohmann::json c = driver::run_config(o, PrecisionPolicy::fp32(), 123.0);
  for (const char* k : {"model", "T", "steps", "lr", "optimizer", "precision", "recompute", "seed", "flops_per_token",
                        "data", "device"})
    EXPECT_TRUE(c.contains(k)) << k;
  EXPECT_EQ(c["flops_per_token"].get<double>(), 123.0);
  o.optimizer = "sgd";
  o.weight_decay = 0.5f;
  EXPECT_EQ(driver::optimizer_config(o).kind, OptimizerConfig::Kind::SGD);
  EXPECT_EQ(driver::optimizer_config(o).weight_decay, 0.5f);
}
