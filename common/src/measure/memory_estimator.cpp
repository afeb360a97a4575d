// memory_estimator.cpp — ZeRO model-state bytes (paper level and exact for lab 04's layout), GPT-2
// activation bytes, the FAQ "how many devices", and the printed tables.
// Declarations and the formulas: common/include/scalelab/measure/memory_estimator.h, docs/memory.md.
// Tests: tests/common/measure/test_memory_estimator.cpp   CLI: tools/sl_memory.cpp
#include "scalelab/measure/memory_estimator.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <utility>

#include "scalelab/core/error.h"   // defines: SL_CHECK, SL_CHECK_HINT
#include "scalelab/core/tensor.h"  // defines: dtype_size, dtype_name

namespace scalelab {

namespace {

constexpr double kGB = 1e9;                    // bytes: the paper's GB
constexpr double kGiB = 1024.0 * 1024 * 1024;  // bytes

void check_stage_world(int world_size, int stage) {
  SL_CHECK_HINT(stage >= 0 && stage <= 3, "ZeRO stages are 0 (DDP), 1 (P_os), 2 (P_os+g), 3 (P_os+g+p)",
                "ZeRO stage %d is not in 0..3", stage);
  SL_CHECK_HINT(world_size > 0, "the world size (number of data-parallel ranks) is 1 or more", "world size %d <= 0",
                world_size);
}

const char* stage_label(int stage) {
  switch (stage) {
    case 0: return "0 DDP";
    case 1: return "1 P_os";
    case 2: return "2 P_os+g";
    default: return "3 P_os+g+p";
  }
}

std::string optimizer_name(OptimizerConfig::Kind opt) { return opt == OptimizerConfig::Kind::AdamW ? "AdamW" : "SGD"; }

// "bf16-mixed: params bf16 2 B, grads f32 4 B, optimizer K = 12 B/param (AdamW m,v + fp32 master)"
std::string policy_line(const PrecisionPolicy& policy, OptimizerConfig::Kind opt) {
  const int K = optimizer_bytes_per_param(policy, opt);
  std::ostringstream os;
  os << policy.name() << " + " << optimizer_name(opt) << ": params " << dtype_name(policy.param_dtype) << " "
     << dtype_size(policy.param_dtype) << " B, grads " << dtype_name(policy.grad_dtype) << " "
     << dtype_size(policy.grad_dtype) << " B, optimizer K = " << K << " B";
  if (K > 0) {
    os << " (";
    if (opt == OptimizerConfig::Kind::AdamW) os << "AdamW m,v 8";
    if (policy.has_master_copy()) os << (opt == OptimizerConfig::Kind::AdamW ? " + " : "") << "fp32 master 4";
    os << ")";
  }
  os << " per parameter";
  return os.str();
}

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

}  // namespace

int optimizer_bytes_per_param(const PrecisionPolicy& policy, OptimizerConfig::Kind opt) {
  return (opt == OptimizerConfig::Kind::AdamW ? 8 : 0) + (policy.has_master_copy() ? 4 : 0);
}

PrecisionPolicy zero_paper_policy() { return {DType::BF16, DType::F32, DType::BF16, DType::F32}; }

ModelStateBytes zero_model_state_bytes(double psi, int world_size, int stage, const PrecisionPolicy& policy,
                                       OptimizerConfig::Kind opt) {
  check_stage_world(world_size, stage);
  SL_CHECK(psi >= 0.0, "psi = %g parameters < 0", psi);
  const double N = world_size;
  const double Bp = static_cast<double>(dtype_size(policy.param_dtype));
  const double Bg = static_cast<double>(dtype_size(policy.grad_dtype));
  const double K = optimizer_bytes_per_param(policy, opt);
  // ZeRO Sec. 5.1 / Fig. 1: stage s divides the first s of (optimizer, grads, params) by N.
  ModelStateBytes m;
  m.optimizer_state = std::llround(K * psi / (stage >= 1 ? N : 1.0));
  m.grads = std::llround(Bg * psi / (stage >= 2 ? N : 1.0));
  m.params = std::llround(Bp * psi / (stage >= 3 ? N : 1.0));
  return m;
}

int64_t gpt2_activation_bytes(const GPTConfig& cfg, int micro_batch, int seq_len, Recompute recompute,
                              DType activation_dtype) {
  SL_CHECK(micro_batch >= 0 && seq_len >= 0, "micro_batch=%d and seq_len=%d must be >= 0", micro_batch, seq_len);
  if (micro_batch == 0 || seq_len == 0) return 0;  // no activations
  // the dense model, its own one set (GPT2::forward(tokens, &targets)), materialized attention
  return gpt2_activation_bytes(cfg, ModelShard::dense(), micro_batch, seq_len, /*sets=*/1, recompute,
                               AttentionImpl::Materialized, activation_dtype);
}

int64_t gpt2_activation_bytes(const GPTConfig& cfg, const ModelShard& shard, int micro_batch, int seq_len, int sets,
                              Recompute recompute, AttentionImpl attention, DType activation_dtype) {
  cfg.validate();
  shard.validate(cfg);
  SL_CHECK_HINT(sets >= 1, "a pipeline stage holds one activation set per micro-batch in flight: 1 or more",
                "sets=%d < 1", sets);
  SL_CHECK(micro_batch > 0 && seq_len > 0, "micro_batch=%d and seq_len=%d must be > 0", micro_batch, seq_len);
  // Counted from allocate_activations, allocate_block_activations and allocate_backward_scratch
  // (common/src/model/gpt2_activations.cpp), elements.
  const int64_t B = micro_batch, T = seq_len, C = cfg.n_embd, tp = shard.tp_size, NHl = cfg.n_head / tp;
  const int64_t Vl = cfg.vocab_size / tp, BT = B * T, BTC = B * T * C, F = BTC / tp;
  const bool sp = shard.sequence_parallel, materialized = attention == AttentionImpl::Materialized;
  SL_CHECK_HINT(!sp || BT % tp == 0, "with sequence parallelism the B*T token rows are split into tp equal blocks",
                "B*T=%lld not divisible by tp=%lld", static_cast<long long>(BT), static_cast<long long>(tp));
  const int64_t S = sp ? BTC / tp : BTC, R = sp ? BT / tp : BT, K = B * NHl * T * T, gathered = sp ? BTC : 0;
  SL_CHECK_HINT(activation_dtype == DType::F32 || activation_dtype == DType::BF16, "use fp32 or bf16 activations",
                "unsupported activation dtype %s", dtype_name(activation_dtype));
  // One block's bytes as `mode` keeps it, fp32 (4 bytes an element) or 16-bit (gpt2_activations.h): 16-bit
  // keeps ln1, qkv, att, atty, residual2, ln2, fch, fch_gelu (and the gathered ln1/ln2) at 2 bytes, the
  // stream residual3, the 4 layernorm statistics and lse at 4, and no attproj or fcproj.
  auto block = [&](Recompute mode, DType dtype) -> int64_t {
    if (mode == Recompute::Full) return 4 * S;  // residual3 only
    const int64_t scores = materialized && mode == Recompute::None ? K : 0, lse = materialized ? 0 : B * NHl * T;
    if (dtype == DType::F32) return 4 * (6 * S + 12 * F + 4 * R + 2 * gathered + scores + lse);
    return 2 * (3 * S + 12 * F + 2 * gathered + scores) + 4 * (S + 4 * R + lse);
  };
  int64_t set = shard.num_blocks(cfg) * block(recompute, activation_dtype);
  set += 4 * (shard.has_embedding ? S + BT : S);                                 // encoded + tokens, or input
  if (shard.has_head) set += 4 * (S + 2 * R + gathered + 2 * BT * Vl + 2 * BT);  // lnf, logits, probs, losses, targets
  int64_t once = 4 * (2 * S + 12 * F + (materialized ? K : 0) + 2 * gathered);   // the backward scratch
  if (recompute == Recompute::Full || activation_dtype != DType::F32)
    once += block(Recompute::None, DType::F32);                          // the fp32 working block
  if (recompute == Recompute::Selective && materialized) once += 4 * K;  // the recomputed scores
  return sets * set + once;
}

int64_t korthikanti_activation_bytes(const GPTConfig& cfg, int micro_batch, int seq_len, Recompute recompute) {
  const int64_t s = seq_len, b = micro_batch, h = cfg.n_embd, a = cfg.n_head, L = cfg.n_layer;
  if (recompute == Recompute::Full) return L * 2 * s * b * h;        // the layer's 16-bit input
  if (recompute == Recompute::Selective) return L * 34 * s * b * h;  // without the 5*a*s/h term
  // s*b*h*(34 + 5*a*s/h) = 34*s*b*h + 5*a*s^2*b, exact in integers
  return L * (34 * s * b * h + 5 * a * s * s * b);
}

ModelStateEstimate estimate_model_state(const GPTConfig& cfg, const ModelShard& shard, int world_size, int stage,
                                        const PrecisionPolicy& policy, OptimizerConfig::Kind opt, int prefetch) {
  cfg.validate();
  shard.validate(cfg);
  check_stage_world(world_size, stage);
  SL_CHECK_HINT(prefetch >= 0, "prefetch counts all-gathers in flight beyond the unit in use: 0, 1, 2, ...",
                "prefetch %d < 0", prefetch);
  const std::vector<int64_t> n = gpt2_unit_numel(cfg, shard);  // 0 for units the shard does not hold
  const int L = cfg.n_layer, U = L + 2;
  const int64_t N = stage == 0 ? 1 : world_size;  // stage 0: every rank holds everything, unsharded
  const int64_t Bp = static_cast<int64_t>(dtype_size(policy.param_dtype));
  const int64_t Bg = static_cast<int64_t>(dtype_size(policy.grad_dtype));
  const int64_t K = optimizer_bytes_per_param(policy, opt);

  std::vector<int64_t> s(U), P(U);  // shard and padded full size per unit, elements
  for (int u = 0; u < U; ++u) {
    s[u] = (n[u] + N - 1) / N;
    P[u] = N * s[u];
  }
  auto kept = [&](int u) { return stage < 3 || u == 0 || u == L + 1; };  // params gathered all step

  ModelStateEstimate e;
  ModelStateBytes& ps = e.persistent;
  for (int u = 0; u < U; ++u) {
    ps.params += (kept(u) ? P[u] : s[u]) * Bp;
    ps.grads += (stage <= 1 ? P[u] : s[u]) * Bg;
    ps.optimizer_state += s[u] * K;
  }
  e.peak = ps;
  int64_t max_block = 0;  // elements, the largest padded block unit
  for (int u = 1; u <= L; ++u) max_block = std::max(max_block, P[u]);
  if (stage == 3) {
    // the unit in use plus `prefetch` gathers in flight, never more blocks than the shard holds
    e.peak.params += std::min<int64_t>(1 + prefetch, shard.num_blocks(cfg)) * max_block * Bp;
  }
  if (stage >= 2) {
    // backward order L+1, L, ..., 1: the unit computing plus the previous one still reduce-scattering
    int64_t W = P[L + 1];
    for (int u = 1; u <= L; ++u) W = std::max(W, P[u] + P[u + 1]);
    e.peak.grads += Bg * (P[0] + W);  // unit 0's full gradient lives through the whole backward
  }
  return e;
}

ModelStateBytes offload_host_bytes(const GPTConfig& cfg, int world_size, int stage, const PrecisionPolicy& policy,
                                   OptimizerConfig::Kind opt) {
  cfg.validate();
  check_stage_world(world_size, stage);
  const int64_t N = stage == 0 ? 1 : world_size;
  const int64_t Bp = static_cast<int64_t>(dtype_size(policy.param_dtype));
  const int64_t K_host = 4 + (opt == OptimizerConfig::Kind::AdamW ? 8 : 0);  // master always, m and v
  ModelStateBytes h;
  for (const int64_t n : gpt2_unit_numel(cfg)) {
    const int64_t s = (n + N - 1) / N;
    h.optimizer_state += s * K_host;
    h.grads += s * 4;
    if (Bp != 4) h.params += s * Bp;
  }
  return h;
}

MemoryEstimate estimate_memory(const GPTConfig& cfg, int world_size, int stage, const PrecisionPolicy& policy,
                               OptimizerConfig::Kind opt, int prefetch, int micro_batch, int seq_len,
                               Recompute recompute, bool offload_optimizer) {
  // bf16-compute keeps the same model states as bf16-mixed but different scratch (bf16 matmul operands
  // per B*T, no per-pass fp32 unit copy: gpt2.h), which the workspace terms below do not model.
  SL_CHECK_HINT(policy.matmul_dtype == DType::F32,
                "the estimator models --precision fp32 and bf16 (bf16-mixed); use one of those (lab 04 runs both)",
                "estimate_memory: precision %s is not modelled (its matmul scratch differs from bf16-mixed's)",
                policy.name().c_str());
  const ModelStateEstimate state =
      estimate_model_state(cfg, ModelShard::dense(), world_size, stage, policy, opt, prefetch);
  MemoryEstimate e;
  e.persistent = state.persistent;
  e.peak = state.peak;
  if (offload_optimizer) {  // the optimizer state lives on the host (lab 04 part 3)
    e.persistent.optimizer_state = e.peak.optimizer_state = 0;
    e.host = offload_host_bytes(cfg, world_size, stage, policy, opt);
  }
  e.activations_bytes = gpt2_activation_bytes(cfg, micro_batch, seq_len, recompute, policy.activation_dtype);
  e.activations_korthikanti_bytes = korthikanti_activation_bytes(cfg, micro_batch, seq_len, recompute);
  return e;
}

int min_devices_to_fit(double psi, int stage, const PrecisionPolicy& policy, OptimizerConfig::Kind opt,
                       double device_bytes, int64_t extra_bytes, int max_world) {
  for (int N = 1; N <= max_world; N *= 2) {
    const ModelStateBytes m = zero_model_state_bytes(psi, N, stage, policy, opt);
    if (static_cast<double>(m.total() + extra_bytes) <= device_bytes) return N;
    if (stage == 0) break;  // nothing is sharded: N does not help
  }
  return -1;
}

int min_devices_to_fit(const GPTConfig& cfg, int stage, const PrecisionPolicy& policy, OptimizerConfig::Kind opt,
                       int prefetch, int micro_batch, int seq_len, double device_bytes, int max_world) {
  for (int N = 1; N <= max_world; N *= 2) {
    const MemoryEstimate e = estimate_memory(cfg, N, stage, policy, opt, prefetch, micro_batch, seq_len);
    if (static_cast<double>(e.total_peak_bytes()) <= device_bytes) return N;
    if (stage == 0) break;
  }
  return -1;
}

std::string format_memory_table(const GPTConfig& cfg, const std::vector<int>& world_sizes,
                                const std::vector<int>& stages, const PrecisionPolicy& policy,
                                OptimizerConfig::Kind opt, int prefetch, int micro_batch, int seq_len,
                                bool exact_bytes) {
  std::vector<std::pair<std::pair<int, int>, MemoryEstimate>> rows;
  int64_t largest = 0;  // bytes, picks the unit
  for (int stage : stages) {
    for (int N : world_sizes) {
      rows.push_back({{stage, N}, estimate_memory(cfg, N, stage, policy, opt, prefetch, micro_batch, seq_len)});
      largest = std::max(largest, rows.back().second.total_peak_bytes());
    }
  }
  // decimal unit (the paper's) and its binary twin; bytes when asked, MB for the small CPU models
  const bool giga = largest >= 1000000000;
  const char* unit = exact_bytes ? "B" : giga ? "GB" : "MB";
  const char* bunit = exact_bytes ? "B" : giga ? "GiB" : "MiB";
  const double scale = exact_bytes ? 1.0 : giga ? kGB : 1e6;
  const double bscale = exact_bytes ? 1.0 : giga ? kGiB : 1024.0 * 1024;
  const char* num = exact_bytes ? " %11.0f" : " %8.3f";
  const char* col = exact_bytes ? " %11s" : " %8s";

  std::ostringstream os;
  char buf[128];
  os << "model " << cfg.str() << ", " << gpt2_num_params(cfg) << " parameters\n";
  os << policy_line(policy, opt) << "\n";
  os << "activations: micro-batch " << micro_batch << " x seq " << seq_len << "; ZeRO-3 prefetch " << prefetch
     << " (all-gathers in flight beyond the unit in use)\n";
  if (exact_bytes) {
    os << "per rank, in bytes";
  } else {
    os << "per rank, in " << unit << (giga ? " (1e9 bytes)" : " (1e6 bytes)") << "; total also in " << bunit
       << (giga ? " (2^30 bytes)" : " (2^20 bytes)");
  }
  os << "; pers = held between steps, peak = largest during a step\n\n";
  auto cell = [&](const char* f, const char* s) {
    std::snprintf(buf, sizeof buf, f, s);
    return std::string(buf);
  };
  const std::string h1 = cell("%-11s", "stage") + cell(" %5s", "ranks") + " |" + cell(col, "params") + cell(col, "") +
                         " |" + cell(col, "grads") + cell(col, "") + " |" + cell(col, "optim") + " |" +
                         cell(col, "state") + " |" + cell(col, "activ") + " |" + cell(col, "total") +
                         cell(col, "total");
  const std::string u = unit, bu = bunit;
  const std::string h2 = cell("%-11s", "") + cell(" %5s", "") + " |" + cell(col, ("pers " + u).c_str()) +
                         cell(col, ("peak " + u).c_str()) + " |" + cell(col, ("pers " + u).c_str()) +
                         cell(col, ("peak " + u).c_str()) + " |" + cell(col, u.c_str()) + " |" +
                         cell(col, ("pers " + u).c_str()) + " |" + cell(col, u.c_str()) + " |" +
                         cell(col, ("peak " + u).c_str()) + cell(col, ("peak " + bu).c_str());
  os << h1 << "\n" << h2 << "\n";
  auto v = [&](double x) {
    std::snprintf(buf, sizeof buf, num, x);
    return std::string(buf);
  };
  for (const auto& r : rows) {
    const MemoryEstimate& e = r.second;
    const double t = static_cast<double>(e.total_peak_bytes());
    std::snprintf(buf, sizeof buf, "%-11s %5d", stage_label(r.first.first), r.first.second);
    os << buf << " |" << v(e.persistent.params / scale) << v(e.peak.params / scale) << " |"
       << v(e.persistent.grads / scale) << v(e.peak.grads / scale) << " |" << v(e.persistent.optimizer_state / scale)
       << " |" << v(e.persistent.total() / scale) << " |" << v(e.activations_bytes / scale) << " |" << v(t / scale)
       << v(t / bscale) << "\n";
  }
  const int64_t act = gpt2_activation_bytes(cfg, micro_batch, seq_len);
  const int64_t kor = korthikanti_activation_bytes(cfg, micro_batch, seq_len);
  os << "\nactivations: " << act << " bytes (this kit: fp32, llm.c tensor set, logits+probs, backward scratch); "
     << "Korthikanti et al. 2022 sbh(34+5as/h) x L layers: " << kor
     << " bytes (16-bit, 1-byte dropout masks, layers only)\n";
  return os.str();
}

std::string format_zero_table(double psi, const std::vector<int>& world_sizes, const std::vector<int>& stages,
                              const PrecisionPolicy& policy, OptimizerConfig::Kind opt) {
  const int Bp = static_cast<int>(dtype_size(policy.param_dtype));
  const int Bg = static_cast<int>(dtype_size(policy.grad_dtype));
  const int K = optimizer_bytes_per_param(policy, opt);
  std::ostringstream os;
  char line[256];
  os << "ZeRO model state per device (Rajbhandari et al. 2019, arXiv 1910.02054, Sec. 5, Fig. 1), Psi = "
     << fmt("%g", psi) << " parameters\n";
  os << policy_line(policy, opt) << "\n";
  os << "GB = 1e9 bytes (as the paper prints), GiB = 2^30 bytes\n\n";
  std::snprintf(line, sizeof line, "%-11s %-22s", "stage", "bytes per device");
  os << line;
  for (int N : world_sizes) {
    std::snprintf(line, sizeof line, " %16s", ("N=" + std::to_string(N) + " GB (GiB)").c_str());
    os << line;
  }
  os << "\n";
  for (int stage : stages) {
    // bytes per parameter held whole, and divided by N
    const int whole = (stage < 3 ? Bp : 0) + (stage < 2 ? Bg : 0) + (stage < 1 ? K : 0);
    const int split = Bp + Bg + K - whole;
    std::string formula = whole > 0 ? std::to_string(whole) + " Psi" : "";
    if (split > 0) formula += (whole > 0 ? " + " : "") + std::to_string(split) + " Psi/N";
    if (formula.empty()) formula = "0";
    std::snprintf(line, sizeof line, "%-11s %-22s", stage_label(stage), formula.c_str());
    os << line;
    for (int N : world_sizes) {
      const double b = static_cast<double>(zero_model_state_bytes(psi, N, stage, policy, opt).total());
      std::snprintf(line, sizeof line, " %7.1f (%6.1f)", b / kGB, b / kGiB);
      os << line;
    }
    os << "\n";
  }
  return os.str();
}

std::string format_fit_table(double psi, const std::vector<int>& stages, const PrecisionPolicy& policy,
                             OptimizerConfig::Kind opt, double device_bytes, int64_t extra_bytes, int max_world) {
  std::ostringstream os;
  char line[256];
  os << "devices of " << fmt("%g", device_bytes / kGB) << " GB needed for the model state of Psi = " << fmt("%g", psi)
     << " parameters (N a power of two <= " << max_world << ")";
  if (extra_bytes > 0) os << ", plus " << fmt("%.3f", extra_bytes / kGB) << " GB per rank (activations)";
  os << "\n" << policy_line(policy, opt) << "\n";
  std::snprintf(line, sizeof line, "%-11s %8s %14s %14s\n", "stage", "min N", "GB per device", "GiB per device");
  os << line;
  for (int stage : stages) {
    const int N = min_devices_to_fit(psi, stage, policy, opt, device_bytes, extra_bytes, max_world);
    const int shown = N > 0 ? N : (stage == 0 ? 1 : max_world);
    const double b = static_cast<double>(zero_model_state_bytes(psi, shown, stage, policy, opt).total() + extra_bytes);
    if (N > 0) {
      std::snprintf(line, sizeof line, "%-11s %8d %14.1f %14.1f\n", stage_label(stage), N, b / kGB, b / kGiB);
    } else {
      std::snprintf(line, sizeof line, "%-11s %8s %14.1f %14.1f  (at N=%d: does not fit)\n", stage_label(stage),
                    "never", b / kGB, b / kGiB, shown);
    }
    os << line;
  }
  return os.str();
}

}  // namespace scalelab
