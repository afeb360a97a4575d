// bench_lab01.cpp — lab 01 reference throughput: tokens/s and MFU of one training step on the CPU,
// for the demo config and GPT-2 d12 width, against the GEMM calibration for the same thread count.
// Prints measured numbers only; nothing here is asserted (absolute speed never decides a unit test).
// Also splits the step into forward / backward / optimizer so a missed target says where time goes.
//
//   build/bin/bench_lab01 [--threads N] [--steps 5] [--configs demo:8x128,d12:4x256]
#include <CLI/CLI.hpp>  // defines: CLI::App

#include <algorithm>  // defines: std::sort
#include <chrono>     // defines: steady_clock
#include <cstdio>     // defines: std::printf
#include <sstream>
#include <string>
#include <vector>

#include "scalelab/calibration.h"  // defines: load_or_calibrate
#include "scalelab/error.h"
#include "scalelab/gpt2.h"
#include "scalelab/optim.h"
#include "scalelab/rng.h"
#include "scalelab/threads.h"
#include "train_step.h"  // defines: lab01::flops_per_token, tokens_per_second, mfu (reference track)

using namespace scalelab;
using Clock = std::chrono::steady_clock;

static double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct BenchCase {
  std::string model;
  int B, T;
};

// "demo:8x128,d12:4x256" -> cases
static std::vector<BenchCase> parse_cases(const std::string& spec) {
  std::vector<BenchCase> out;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    BenchCase c;
    const auto colon = item.find(':'), x = item.find('x');
    SL_CHECK_HINT(colon != std::string::npos && x != std::string::npos && x > colon,
                  "write cases as model:BxT, comma-separated, e.g. demo:8x128,d12:4x256", "bad case '%s'",
                  item.c_str());
    c.model = item.substr(0, colon);
    c.B = std::stoi(item.substr(colon + 1, x - colon - 1));
    c.T = std::stoi(item.substr(x + 1));
    out.push_back(c);
  }
  return out;
}

int main(int argc, char** argv) {
  CLI::App app{"lab 01 reference throughput and MFU on the CPU"};
  int threads = 0, steps = 5;
  std::string spec = "demo:8x128,demo:16x256,d12:4x256";
  app.add_option("--threads", threads, "CPU threads (0: all cores)")->capture_default_str();
  app.add_option("--steps", steps, "timed steps per case (after 1 warm-up step)")->capture_default_str();
  app.add_option("--configs", spec, "cases model:BxT, comma-separated")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    threads = set_num_threads(threads);
    const Calibration cal = load_or_calibrate(threads);
    std::printf("peak: %.1f GFLOP/s (%s)\n\n", cal.flops_per_s / 1e9, cal.source.c_str());
    std::printf("%-6s %4s %5s %10s | %9s %9s %9s %9s | %10s %7s\n", "model", "B", "T", "params", "fwd ms",
                "bwd ms", "optim ms", "step ms", "tokens/s", "MFU");
    for (const BenchCase& c : parse_cases(spec)) {
      GPTConfig cfg = GPTConfig::preset(c.model);
      GPT2 model(cfg);
      Optimizer opt(model, OptimizerConfig{});
      Tensor x = Tensor::empty({c.B, c.T}, DType::I32), y = Tensor::empty({c.B, c.T}, DType::I32);
      Rng rng(1);
      for (int64_t i = 0; i < x.numel(); ++i) {
        x.data<int32_t>()[i] = static_cast<int32_t>(rng.next_u64() % cfg.vocab_size);
        y.data<int32_t>()[i] = static_cast<int32_t>(rng.next_u64() % cfg.vocab_size);
      }
      std::vector<double> fwd, bwd, upd, total;
      for (int s = 0; s <= steps; ++s) {  // s == 0 is the warm-up step (allocations, caches): not kept
        const auto t0 = Clock::now();
        model.zero_grad();
        model.forward(x, &y);
        const double f = ms_since(t0);
        const auto t1 = Clock::now();
        model.backward();
        const double b = ms_since(t1);
        const auto t2 = Clock::now();
        clip_grad_norm(model, 1.0f);
        opt.step(1e-4f);
        const double u = ms_since(t2);
        if (s == 0) continue;
        fwd.push_back(f);
        bwd.push_back(b);
        upd.push_back(u);
        total.push_back(ms_since(t0));
      }
      const double step_ms = median(total);
      const double tok_s = lab01::tokens_per_second(static_cast<int64_t>(c.B) * c.T, step_ms / 1e3);
      const double m = lab01::mfu(tok_s, lab01::flops_per_token(cfg, c.T), cal.flops_per_s, 1);
      std::printf("%-6s %4d %5d %9.2fM | %9.1f %9.1f %9.1f %9.1f | %10.0f %6.1f%%\n", c.model.c_str(), c.B, c.T,
                  model.num_params() / 1e6, median(fwd), median(bwd), median(upd), step_ms, tok_s, 100.0 * m);
      std::fflush(stdout);
    }
    std::printf("\n(medians of %d steps; MFU = tokens/s x flops_per_token / calibrated sgemm peak, "
                "PaLM App. B convention; see labs/01_single_device/README.md)\n", steps);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
