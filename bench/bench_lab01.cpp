// bench_lab01.cpp — lab 01 reference throughput: tokens/s and MFU of one training step, on the CPU or a
// GPU, in fp32, bf16-mixed or bf16-compute (precision.h), for the demo config and GPT-2 d12/d24 widths. MFU divides by device_peak()
// (calibration.h): the sgemm calibration for the same thread count on the CPU, the datasheet's dense
// figure at the run's precision on a known GPU (none borrowed for an unknown one: MFU "n/a").
// Prints measured numbers only; nothing here is asserted (absolute speed never decides a unit test).
// Also splits the step into forward / backward / optimizer so a missed target says where time goes, and with
// --breakdown each phase into its ops (op_profile.h: every ops.h call timed; "other" is the phase's time
// outside them).
// bench/bench_pytorch.py runs this program beside the same model in PyTorch (reads its --jsonl records).
//
//   build/bin/bench_lab01 [--device cpu|cuda] [--precision fp32|bf16|bf16-compute] [--attention materialized|flash] [--threads N] [--steps 5]
//                         [--configs demo:8x128,d12:4x256] [--jsonl FILE] [--breakdown]
#include <CLI/CLI.hpp>        // defines: CLI::App
#include <nlohmann/json.hpp>  // defines: nlohmann::json (the --jsonl records)

#include <algorithm>  // defines: std::sort
#include <chrono>     // defines: steady_clock
#include <cstdio>     // defines: std::printf
#include <fstream>    // defines: std::ofstream
#include <sstream>
#include <string>
#include <vector>

#include "scalelab/measure/calibration.h"  // defines: device_peak, Peak, memcpy_bytes_per_s
#include "scalelab/core/device.h"  // defines: device_synchronize, cuda_device_count, cuda_unavailable_reason, cuda_device_name
#include "scalelab/core/error.h"
#include "scalelab/model/gpt2.h"
#include "scalelab/ops/op_profile.h"  // defines: op_profile_enable, op_profile_phase, op_profile_table
#include "scalelab/ops/ops.h"         // defines: cpu::bf16_matmul_backend
#include "scalelab/model/optim.h"
#include "scalelab/core/precision.h"  // defines: PrecisionPolicy
#include "scalelab/core/rng.h"
#include "scalelab/core/threads.h"
#include "scalelab/measure/stats.h"  // defines: median (of the timed steps)
#include "train_step.h"              // defines: lab01::flops_per_token, tokens_per_second, mfu (reference track)

using namespace scalelab;
using Clock = std::chrono::steady_clock;

static double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

static double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

// The op profile of `steps` timed steps, per phase: each op's calls and ms per step, then "other" (the phase's
// mean time minus its ops), with its share of the phase and of the step. Printed, and returned for --jsonl.
static nlohmann::json print_breakdown(int steps, const std::vector<std::pair<std::string, double>>& phase_ms) {
  const std::vector<OpTime> table = op_profile_table();
  double step_ms = 0;
  for (const auto& [phase, ms] : phase_ms) step_ms += ms;
  nlohmann::json out = nlohmann::json::array();
  std::printf("  %-10s %-34s %8s %9s %8s %7s\n", "phase", "op", "calls", "ms/step", "% phase", "% step");
  auto row = [&](const std::string& phase, const std::string& op, double calls, double ms, double phase_total) {
    std::printf("  %-10s %-34s %8.0f %9.2f %7.1f%% %6.1f%%\n", phase.c_str(), op.c_str(), calls, ms,
                100.0 * ms / phase_total, 100.0 * ms / step_ms);
    out.push_back({{"phase", phase}, {"op", op}, {"calls_per_step", calls}, {"ms_per_step", ms}});
  };
  for (const auto& [phase, total] : phase_ms) {
    double in_ops = 0;
    for (const OpTime& t : table) {
      if (t.phase != phase) continue;
      row(phase, t.op, static_cast<double>(t.calls) / steps, t.ms / steps, total);
      in_ops += t.ms / steps;
    }
    row(phase, "other (outside the ops)", 0, total - in_ops, total);
  }
  std::printf("\n");
  return out;
}

// AdamW is a streaming loop: per parameter it reads the parameter, its gradient, m and v and writes the
// parameter, m and v back, 28 bytes in fp32. Its rate in GB/s of those reads and writes (from the op profile
// of `steps` steps), beside what memcpy reaches on the same threads (lab 00's figure, measured here once):
// how close the optimizer runs to the machine's memory bandwidth.
static void print_adamw_bandwidth(int steps, int64_t params, int threads) {
  double adamw_ms = 0;
  for (const OpTime& t : op_profile_table())
    if (t.op == "adamw_update") adamw_ms += t.ms / steps;
  if (adamw_ms <= 0) return;
  static const double copy_bytes_per_s = memcpy_bytes_per_s(int64_t{256} << 20, threads);
  const double bytes = 28.0 * static_cast<double>(params);
  std::printf(
      "  adamw_update moves 28 B x %.2fM params = %.2f GB a step in %.1f ms: %.1f GB/s of reads and writes;\n"
      "  memcpy of 256 MiB on %d threads: %.1f GB/s copied = %.1f GB/s of reads and writes (lab 00's figure)\n",
      params / 1e6, bytes / 1e9, adamw_ms, bytes / (adamw_ms / 1e3) / 1e9, threads, copy_bytes_per_s / 1e9,
      2 * copy_bytes_per_s / 1e9);
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
  CLI::App app{"lab 01 reference throughput and MFU on the CPU or a GPU"};
  int threads = 0, steps = 5;
  std::string spec = "demo:8x128,demo:16x256,d12:4x256";
  std::string device_name = "cpu", precision = "fp32", attention = "materialized", jsonl;
  bool breakdown = false;
  app.add_option("--device", device_name, "cpu or cuda (a build with the CUDA backend and a GPU)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--precision", precision,
                 "fp32, bf16 (= bf16-mixed: bf16 params, fp32 compute) or bf16-compute (bf16 matmul operands: "
                 "the GPU's bf16 tensor cores)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16", "bf16-mixed", "bf16-compute"}));
  app.add_option("--attention", attention,
                 "materialized (the (B,NH,T,T) scores, as PyTorch's explicit attention) or flash (saves (B,NH,T) and "
                 "recomputes the scores; PyTorch's counterpart is --sdpa)")
      ->capture_default_str()
      ->check(CLI::IsMember({"materialized", "flash"}));
  app.add_option("--threads", threads, "CPU threads (0: all cores)")->capture_default_str();
  app.add_option("--steps", steps, "timed steps per case (after 1 warm-up step)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--configs", spec, "cases model:BxT, comma-separated")->capture_default_str();
  app.add_option("--jsonl", jsonl, "also append one JSON record per case to this file (bench_pytorch.py reads it)");
  app.add_flag("--breakdown", breakdown,
               "also time every op of the timed steps (on a GPU: each op synchronized) "
               "and print each phase's ops with their share");
  CLI11_PARSE(app, argc, argv);
  try {
    const Device device = device_name == "cuda" ? Device::CUDA : Device::CPU;
    if (device == Device::CUDA)
      SL_CHECK_HINT(cuda_device_count() > 0,
                    built_with_cuda() ? "check nvidia-smi and CUDA_VISIBLE_DEVICES, or use --device cpu"
                                      : "rebuild where nvcc is found (cmake -DSL_WITH_CUDA=ON), or use --device cpu",
                    "--device cuda: no CUDA device is available to this program: %s",
                    cuda_unavailable_reason().c_str());
    threads = set_num_threads(threads);
    const PrecisionPolicy policy = PrecisionPolicy::from_name(precision);
    const Peak peak = device_peak(device, policy, threads);
    const std::string where = device == Device::CUDA ? cuda_device_name() : std::to_string(threads) + " threads";
    // On the CPU, bf16-compute's matmuls run on oneDNN's bf16 GEMM or on fp32 sgemm (ops.h): say which.
    // ... and which kernel set OpenBLAS's fp32 GEMMs run on (blas_kernel.cpp: sgemm on a generic set
    // ran at a quarter of the speed on the development VM).
    const std::string matmuls = device == Device::CUDA               ? ""
                                : policy.matmul_dtype == DType::BF16 ? " | bf16 matmuls: " + cpu::bf16_matmul_backend()
                                                                     : " | sgemm: OpenBLAS " + cpu::blas_kernel();
    std::printf("device: %s (%s) | precision %s | %s attention%s\n", device_name.c_str(), where.c_str(),
                policy.name().c_str(), attention.c_str(), matmuls.c_str());
    // bench_pytorch.py reads this line: "peak: <GFLOP/s> GFLOP/s (<source>)"; 0.0 means unknown.
    std::printf("peak: %.1f GFLOP/s (%s)\n\n", peak.flops_per_s / 1e9, peak.source.c_str());
    std::printf("%-6s %4s %5s %10s | %9s %9s %9s %9s | %10s %7s\n", "model", "B", "T", "params", "fwd ms", "bwd ms",
                "optim ms", "step ms", "tokens/s", "MFU");
    std::ofstream records;
    if (!jsonl.empty()) {
      records.open(jsonl, std::ios::app);
      SL_CHECK_HINT(records.good(), "check the directory exists and is writable", "cannot open --jsonl %s",
                    jsonl.c_str());
    }
    for (const BenchCase& c : parse_cases(spec)) {
      GPTConfig cfg = GPTConfig::preset(c.model);
      SL_CHECK_HINT(c.T <= cfg.max_seq_len, "use T <= the model's max_seq_len", "case %s:%dx%d: T > max_seq_len %d",
                    c.model.c_str(), c.B, c.T, cfg.max_seq_len);
      GPT2 model(cfg, policy, device, /*seed=*/1);
      model.set_attention(attention_impl_from_name(attention));
      Optimizer opt(model, OptimizerConfig{});
      // Random tokens, made on the host and copied to the model's device: (B, T) i32.
      Tensor h_x = Tensor::empty({c.B, c.T}, DType::I32), h_y = Tensor::empty({c.B, c.T}, DType::I32);
      Rng rng(1);
      for (int64_t i = 0; i < h_x.numel(); ++i) {
        h_x.data<int32_t>()[i] = static_cast<int32_t>(rng.next_u64() % cfg.vocab_size);
        h_y.data<int32_t>()[i] = static_cast<int32_t>(rng.next_u64() % cfg.vocab_size);
      }
      Tensor x = Tensor::empty({c.B, c.T}, DType::I32, device), y = Tensor::empty({c.B, c.T}, DType::I32, device);
      x.copy_from(h_x);
      y.copy_from(h_y);
      // GPU work is asynchronous: each clock read below comes after device_synchronize, so a phase's time
      // is the device's, not the launch queue's (the syncs cost microseconds against steps of milliseconds).
      std::vector<double> fwd, bwd, upd, total;
      for (int s = 0; s <= steps; ++s) {  // s == 0 is the warm-up step (allocations, caches): not kept
        if (s == 1 && breakdown) op_profile_enable(true);
        device_synchronize(device);
        op_profile_phase("forward");
        const auto t0 = Clock::now();
        model.zero_grad();
        model.forward(x, &y);
        device_synchronize(device);
        const double f = ms_since(t0);
        op_profile_phase("backward");
        const auto t1 = Clock::now();
        model.backward();
        device_synchronize(device);
        const double b = ms_since(t1);
        op_profile_phase("optimizer");
        const auto t2 = Clock::now();
        clip_grad_norm(model, 1.0f);
        opt.step(1e-4f);
        device_synchronize(device);
        const double u = ms_since(t2);
        if (s == 0) continue;
        fwd.push_back(f);
        bwd.push_back(b);
        upd.push_back(u);
        total.push_back(ms_since(t0));
      }
      const double step_ms = median(total);
      const double flops_tok = lab01::flops_per_token(cfg, c.T);
      const double tok_s = lab01::tokens_per_second(static_cast<int64_t>(c.B) * c.T, step_ms / 1e3);
      const double m = peak.flops_per_s > 0 ? lab01::mfu(tok_s, flops_tok, peak.flops_per_s, 1) : 0.0;
      char mfu_text[16] = "n/a";
      if (peak.flops_per_s > 0) std::snprintf(mfu_text, sizeof(mfu_text), "%.1f%%", 100.0 * m);
      std::printf("%-6s %4d %5d %9.2fM | %9.1f %9.1f %9.1f %9.1f | %10.0f %7s\n", c.model.c_str(), c.B, c.T,
                  model.num_params() / 1e6, median(fwd), median(bwd), median(upd), step_ms, tok_s, mfu_text);
      nlohmann::json ops;
      if (breakdown) {
        op_profile_enable(false);
        ops = print_breakdown(steps, {{"forward", mean(fwd)}, {"backward", mean(bwd)}, {"optimizer", mean(upd)}});
        if (device == Device::CPU && policy.name() == "fp32") print_adamw_bandwidth(steps, model.num_params(), threads);
      }
      std::fflush(stdout);
      if (records.is_open()) {
        nlohmann::json r = {{"impl", "ours"},
                            {"device", device_name},
                            {"precision", precision},
                            {"model", c.model},
                            {"B", c.B},
                            {"T", c.T},
                            {"steps", steps},
                            {"step_ms", step_ms},
                            {"fwd_ms", median(fwd)},
                            {"bwd_ms", median(bwd)},
                            {"optim_ms", median(upd)},
                            {"tokens_per_s", tok_s},
                            {"flops_per_token", flops_tok},
                            {"peak_flops_per_s", peak.flops_per_s},
                            {"peak_source", peak.source},
                            {"threads", threads},
                            {"attention", attention}};
        if (peak.flops_per_s > 0) r["mfu"] = m;  // a fraction in [0, 1]; absent when the peak is unknown
        if (breakdown) r["breakdown"] = ops;     // means of the timed steps (the phases above are medians)
        records << r.dump() << "\n";
        records.flush();
      }
    }
    std::printf(
        "\n(medians of %d steps%s; MFU = tokens/s x flops_per_token / peak, PaLM App. B convention; "
        "see labs/01_single_device/README.md)\n",
        steps, breakdown ? ", the breakdowns their means, with every op timed" : "");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
