// lab05_support.cpp — what lab 05's graded checks share (lab05_support.h).
#include "lab05_support.h"

#include <algorithm>  // defines: std::max
#include <cmath>      // defines: std::fabs
#include <cstdio>     // defines: std::snprintf
#include <map>
#include <random>
#include <string>  // defines: std::to_string

#include "grading.h"                  // defines: grading::all_ranks
#include "scalelab/core/allocator.h"  // defines: Allocator, MemCategory
#include "scalelab/core/error.h"      // defines: scalelab::Error
#include "scalelab/model/optim.h"     // defines: Optimizer, OptimizerConfig
#include "scalelab/ops/ops.h"         // defines: encoder_*, softmax_crossentropy_*

namespace scalelab::lab05_test {

GPTConfig tp_config() { return GPTConfig{16, 64, 2, 4, 32}; }

TpSetup make_tp_model(const GPTConfig& cfg, bool sequence_parallel) {
  TpSetup s;
  s.tp_group = fresh_comm();
  ModelShard shard;
  shard.tp_rank = s.tp_group->rank();
  shard.tp_size = s.tp_group->size();
  shard.sequence_parallel = sequence_parallel;
  shard.tp_split = &lab05::block_split;  // the track's split of a block's tensors (TODO lab05-9)
  s.points = std::make_unique<lab05::MegatronPoints>(*s.tp_group, sequence_parallel);
  s.model = std::make_unique<GPT2>(cfg, shard, PrecisionPolicy::fp32(), Device::CPU, kModelSeed);
  s.model->set_tensor_parallel(s.points.get());
  return s;
}

namespace {

// A (rows, cols) fp32 tensor of values uniform in [-scale, scale), the same on every rank (seeded).
Tensor random_tensor(const Shape& shape, uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  Tensor t = Tensor::empty(shape, DType::F32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(gen);
  return t;
}

// Columns [c0, c0 + n) of a (rows, cols) tensor, copied.
Tensor columns(const Tensor& t, int64_t c0, int64_t n) {
  const int64_t rows = t.size(0), cols = t.size(1);
  Tensor out = Tensor::empty({rows, n}, DType::F32);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < n; ++j) out.data<float>()[i * n + j] = t.data<float>()[i * cols + c0 + j];
  return out;
}

// Rows [r0, r0 + n) of a tensor with `row` elements per row, copied into a (n * row,) tensor.
Tensor rows_of(const Tensor& t, int64_t r0, int64_t n, int64_t row) {
  Tensor out = Tensor::empty({n * row}, DType::F32);
  out.copy_from(t.view(r0 * row, {n * row}));
  return out;
}

std::string on_rank_if(const std::string& s) { return s.empty() ? s : on_rank(s); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Check bodies

std::string expect_f_and_g_exact() {
  std::unique_ptr<Communicator> comm = fresh_comm();
  lab05::MegatronPoints points(*comm, /*sequence_parallel=*/false);
  const int r = comm->rank(), n = comm->size();
  auto per_rank = [&] {  // (1, 2, 4) fp32: 100 * rank + i, exact small integers
    Tensor t = Tensor::empty({1, 2, 4}, DType::F32);
    for (int i = 0; i < 8; ++i) t.data<float>()[i] = static_cast<float>(100 * r + i);
    return t;
  };
  auto summed = [&](int i) { return static_cast<float>(100 * n * (n - 1) / 2 + n * i); };  // sum over ranks
  Tensor bias = Tensor::empty({4}, DType::F32);
  for (int j = 0; j < 4; ++j) bias.data<float>()[j] = static_cast<float>(1000 * (j + 1));
  std::string bad;
  auto expect = [&](const char* what, const Tensor& t, auto want) {
    for (int i = 0; i < 8 && bad.empty(); ++i)
      if (t.data<float>()[i] != want(i))
        bad = std::string(what) + "[" + std::to_string(i) + "] = " + std::to_string(t.data<float>()[i]) +
              ", expected " + std::to_string(want(i));
  };
  Tensor x = per_rank();
  points.f_forward(x);
  expect("f_forward (identity)", x, [&](int i) { return static_cast<float>(100 * r + i); });
  Tensor dx = per_rank();
  points.f_backward(dx);
  expect("f_backward (sum over the group)", dx, summed);
  Tensor y = per_rank();
  points.g_forward(y, &bias);
  expect("g_forward with a bias (sum, then the bias once)", y,
         [&](int i) { return summed(i) + 1000.0f * (i % 4 + 1); });
  Tensor y2 = per_rank();
  points.g_forward(y2, nullptr);
  expect("g_forward without a bias (sum)", y2, summed);
  Tensor dy = per_rank();
  points.g_backward(dy);
  expect("g_backward (identity)", dy, [&](int i) { return static_cast<float>(100 * r + i); });
  EXPECT_TRUE(grading::all_ranks(bad.empty(), on_rank_if(bad)));
  return bad.empty() ? "f and g, forward and backward, exact on every rank" : bad;
}

std::string expect_embedding_matches_dense(bool sp) {
  const GPTConfig cfg = tp_config();
  std::unique_ptr<Communicator> comm = fresh_comm();
  lab05::MegatronPoints points(*comm, sp);
  const int r = comm->rank(), n = comm->size();
  const int B = 2, T = 16, C = cfg.n_embd, V = cfg.vocab_size, Vl = V / n;
  const GlobalBatch g = random_global_batch(kDataSeed, B, T, V);
  const Tensor wte = random_tensor({V, C}, 1, 1.0f), wpe = random_tensor({cfg.max_seq_len, C}, 2, 1.0f);
  const Tensor dout = random_tensor({B, T, C}, 3, 1.0f);
  Tensor want = Tensor::empty({B, T, C}, DType::F32);
  encoder_forward(want, g.inputs, wte, wpe);
  Tensor dwte = Tensor::zeros({V, C}, DType::F32), dwpe = Tensor::zeros({cfg.max_seq_len, C}, DType::F32);
  encoder_backward(dwte, dwpe, dout, g.inputs);

  Tensor wte_shard = Tensor::empty({Vl, C}, DType::F32);
  wte_shard.copy_from(wte.view(static_cast<int64_t>(r) * Vl * C, {Vl * C}));
  const int64_t rows = sp ? static_cast<int64_t>(B) * T / n : static_cast<int64_t>(B) * T;
  Tensor out = sp ? Tensor::empty({rows, C}, DType::F32) : Tensor::empty({B, T, C}, DType::F32);
  points.embedding_forward(out, g.inputs, wte_shard, wpe);
  const int64_t first = sp ? r * rows : 0;
  std::string bad = compare_tensors("out", out, rows_of(want, first, rows, C), 0, 0);
  Tensor dwte_shard = Tensor::zeros({Vl, C}, DType::F32), dwpe_got = Tensor::zeros({cfg.max_seq_len, C}, DType::F32);
  const Tensor my_dout = sp ? rows_of(dout, first, rows, C).view(0, {rows, C}) : dout;
  points.embedding_backward(dwte_shard, dwpe_got, my_dout, g.inputs);
  if (bad.empty())
    bad = compare_tensors("dwte (this rank's rows)", dwte_shard, rows_of(dwte, static_cast<int64_t>(r) * Vl, Vl, C), 0,
                          0);
  if (bad.empty()) bad = compare_tensors("dwpe", dwpe_got, dwpe, 0, 0);
  EXPECT_TRUE(grading::all_ranks(bad.empty(), on_rank_if(bad)));
  return bad.empty() ? std::string("out, dwte and dwpe equal the dense embedding's bit for bit") +
                           (sp ? " (each rank's token rows)" : "")
                     : bad;
}

std::string expect_cross_entropy_matches_dense() {
  const GPTConfig cfg = tp_config();
  std::unique_ptr<Communicator> comm = fresh_comm();
  lab05::MegatronPoints points(*comm, false);
  const int r = comm->rank(), n = comm->size();
  const int N = 32, V = cfg.vocab_size, Vl = V / n;
  const Tensor logits = random_tensor({N, V}, 4, 4.0f);
  Tensor targets = Tensor::empty({N}, DType::I32);
  for (int i = 0; i < N; ++i) targets.data<int32_t>()[i] = (7 * i + 3) % V;
  Tensor losses = Tensor::empty({N}, DType::F32), probs = Tensor::empty({N, V}, DType::F32);
  softmax_crossentropy_forward(losses, probs, logits, targets);
  Tensor dlogits = Tensor::empty({N, V}, DType::F32);
  softmax_crossentropy_backward(dlogits, probs, targets, 1.0f / N);

  const Tensor my_logits = columns(logits, static_cast<int64_t>(r) * Vl, Vl);
  Tensor my_losses = Tensor::empty({N}, DType::F32), my_probs = Tensor::empty({N, Vl}, DType::F32);
  points.cross_entropy_forward(my_losses, my_probs, my_logits, targets);
  Tensor my_dlogits = Tensor::empty({N, Vl}, DType::F32);
  points.cross_entropy_backward(my_dlogits, my_probs, targets, 1.0f / N);
  double worst = 0;
  constexpr double kRtol = 1e-6;  // an exp-sum over V in tp parts instead of one: fp32 rounding
  std::string bad = compare_tensors("losses", my_losses, losses, kRtol, 0, &worst);
  if (bad.empty())
    bad = compare_tensors("probs (this rank's columns)", my_probs, columns(probs, static_cast<int64_t>(r) * Vl, Vl),
                          kRtol, 1e-9, &worst);
  if (bad.empty())
    bad = compare_tensors("dlogits (this rank's columns)", my_dlogits,
                          columns(dlogits, static_cast<int64_t>(r) * Vl, Vl), kRtol, 1e-9, &worst);
  EXPECT_TRUE(grading::all_ranks(bad.empty(), on_rank_if(bad)));
  char buf[128];
  std::snprintf(buf, sizeof(buf), "losses, probs and dlogits within %.2g of the dense cross-entropy's (relative)",
                worst);
  return bad.empty() ? buf : bad;
}

// The TODO a wrong gradient points to, from the tensor the comparison named ("dln_f.weight[3] = ...").
// A tensor every rank of the group keeps whole (the layernorms, the row-parallel c_proj biases) whose
// gradient differs was left partial: lab05-7. Anything else: the point around it (lab05-2..6).
static std::string with_suspect(const std::string& bad) {
  if (bad.empty() || bad.rfind("d", 0) != 0) return bad;
  const std::string name = bad.substr(1, bad.find('[') - 1);
  const bool replicated = name.find("ln_") != std::string::npos || name.find("c_proj.bias") != std::string::npos;
  return replicated ? bad +
                          " (a tensor every rank keeps whole, its gradient still partial: lab05-7 "
                          "sync_replicated_grads)"
                    : bad;
}

std::string expect_gradients_match_dense(bool sp) {
  const GPTConfig cfg = tp_config();
  const GlobalBatch g = random_global_batch(kDataSeed, 2, 16, cfg.vocab_size);
  std::unique_ptr<GPT2> dense = make_model(cfg);
  const float want = one_process_gradients(*dense, g);
  TpSetup s = make_tp_model(cfg, sp);
  s.model->zero_grad();
  const float loss = s.model->forward(g.inputs, &g.targets);
  s.model->backward();
  lab05::sync_replicated_grads(*s.model, *s.points);
  double worst = 0;
  std::string bad;
  if (std::fabs(loss - want) > kLossRtol * std::fabs(want)) {
    char buf[128];
    std::snprintf(buf, sizeof(buf), "loss %.7f, expected the dense %.7f", loss, want);
    bad = buf;
  }
  if (bad.empty())
    bad = with_suspect(compare_with_dense_slices(*s.model, *dense, /*grads=*/true, kGradRtol, 0, &worst));
  EXPECT_TRUE(grading::all_ranks(bad.empty(), on_rank_if(bad)));
  char buf[160];
  std::snprintf(buf, sizeof(buf),
                "loss %.6f as dense; every gradient within %.2g (relative) of its dense slice, "
                "tp = %d%s",
                loss, worst, s.points->size(), sp ? ", sequence parallel" : "");
  return bad.empty() ? buf : bad;
}

std::string expect_block_split_matches_dense() {
  // The rule on its own: a cut for every block tensor (recorded for the measured line), a refusal otherwise.
  static const char* const kBlockTensors[] = {
      "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
      "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
  std::string cuts;
  for (const char* t : kBlockTensors) {
    const TpSplit c = lab05::block_split(t);
    cuts +=
        std::string(cuts.empty() ? "" : ", ") + t + " " +
        (c.dim < 0 ? "whole" : "dim " + std::to_string(c.dim) + (c.blocks > 1 ? " x" + std::to_string(c.blocks) : ""));
  }
  bool refused = false;
  try {
    lab05::block_split("attn.c_attn");  // not a tensor: a prefix of two
  } catch (const scalelab::Error&) {
    refused = true;
  }
  EXPECT_TRUE(grading::all_ranks(refused, refused ? "" : on_rank("block_split(\"attn.c_attn\") returned a cut")));
  // The rule in the model: its slices, with the points at their places, compute the dense block.
  const std::string model = expect_gradients_match_dense(false);
  return refused ? model + " (" + cuts + ")" : "block_split accepted \"attn.c_attn\"";
}

std::string expect_sgd_steps_match_dense(bool sp) {
  const GPTConfig cfg = tp_config();
  constexpr float kLr = 0.1f, kClip = 1.0f;
  constexpr int kB = 4;                   // rows of the global batch, split into m micro-batches
  const int micro_batches[] = {1, 2, 4};  // one step each: m = 1, then accumulation over 2 and 4
  OptimizerConfig sgd;
  sgd.kind = OptimizerConfig::Kind::SGD;
  sgd.weight_decay = 0.0f;
  std::unique_ptr<GPT2> dense = make_model(cfg);
  Optimizer dense_opt(*dense, sgd);
  TpSetup s = make_tp_model(cfg, sp);
  Optimizer opt(*s.model, sgd);
  std::string bad;
  double worst = 0;
  for (int step = 0; step < 3 && bad.empty(); ++step) {
    const int m = micro_batches[step];
    const GlobalBatch g = random_global_batch(kDataSeed + step, kB, 16, cfg.vocab_size);
    const OneProcessStep d = one_process_train_step(*dense, dense_opt, g, kLr, kClip);
    std::vector<MicroBatch> micro;
    for (int i = 0; i < m; ++i) {  // equal slices: the mean of their means is the global batch's mean
      const GlobalBatch rows = batch_rows(g, static_cast<int64_t>(i) * (kB / m), kB / m);
      micro.push_back(MicroBatch{rows.inputs, rows.targets});
    }
    const StepResult r = lab05::train_step(*s.model, opt, *s.points, nullptr, micro, kLr, kClip);
    // The loss (a mean over the micro-batches) and the gradient's scale (the norm before clipping) are
    // separate decisions: each is asserted on its own, with the ratio that names a factor of m.
    char buf[200];
    if (std::fabs(r.loss - d.loss) > kLossRtol * std::fabs(d.loss)) {
      std::snprintf(buf, sizeof(buf), "the step's loss %.7f, the dense mean %.7f (%.3fx; lab05-8 train_step)", r.loss,
                    d.loss, r.loss / d.loss);
      bad = buf;
    } else if (std::fabs(r.grad_norm - d.grad_norm) > 1e-5 * d.grad_norm) {
      // A factor (1/m, m, 1/sqrt(tp)) is the step's own arithmetic; a ratio near 1 is a few tensors off: a
      // replicated gradient left partial (lab05-7), which the step's norm only carries.
      const double ratio = r.grad_norm / d.grad_norm;
      std::snprintf(buf, sizeof(buf), "the gradient norm %.6f, the dense model's %.6f (%.3fx) before clipping (%s)",
                    r.grad_norm, d.grad_norm, ratio,
                    std::fabs(ratio - 1) < 0.02 ? "near 1: some gradient still partial, lab05-7 sync_replicated_grads; "
                                                  "else lab05-8 train_step"
                                                : "lab05-8 train_step");
      bad = buf;
    }
    // SGD: p -= lr * g, so a parameter differs by lr x the gradient's rounding (kGradRtol of its scale)
    if (bad.empty()) bad = compare_with_dense_slices(*s.model, *dense, /*grads=*/false, 0, 1e-6, &worst);
    if (!bad.empty()) bad = "step " + std::to_string(step) + " (m = " + std::to_string(m) + " micro-batches): " + bad;
  }
  EXPECT_TRUE(grading::all_ranks(bad.empty(), on_rank_if(bad)));
  char buf[200];
  std::snprintf(buf, sizeof(buf),
                "3 SGD steps with m = 1, 2, 4 micro-batches (clip %.1f on the whole model's norm): losses, norms "
                "and every parameter as the dense model's (parameters within 1e-6)",
                kClip);
  return bad.empty() ? buf : bad;
}

std::string expect_collectives_per_layer(bool sp) {
  const GPTConfig cfg = tp_config();
  const int B = 2, T = 16, L = cfg.n_layer;
  const GlobalBatch g = random_global_batch(kDataSeed, B, T, cfg.vocab_size);
  TpSetup s = make_tp_model(cfg, sp);
  const int64_t btc_bytes = static_cast<int64_t>(B) * T * cfg.n_embd * 4;  // one (B,T,C) fp32 tensor
  // op -> how many calls moved a whole (B,T,C) tensor (all_reduce, all_gather's output, reduce_scatter's input)
  auto count = [&](const std::vector<CommEvent>& events) {
    std::map<std::string, int> c;
    const int n = s.tp_group->size();
    for (const CommEvent& e : events) {
      const int64_t whole = e.op == "all_reduce"       ? e.payload_bytes
                            : e.op == "all_gather"     ? e.payload_bytes * n
                            : e.op == "reduce_scatter" ? e.payload_bytes
                                                       : 0;
      if (whole == btc_bytes) ++c[e.op];
    }
    return c;
  };
  s.tp_group->clear_events();
  s.model->zero_grad();
  s.model->forward(g.inputs, &g.targets);
  std::map<std::string, int> fwd = count(s.tp_group->events());
  s.tp_group->clear_events();
  s.model->backward();
  std::map<std::string, int> bwd = count(s.tp_group->events());
  // Without sequence parallelism: g (2 per layer) and the embedding all-reduce forward, f (2 per layer and
  // the head) backward. With it: the all-gathers before the column-parallel regions (2 per layer and the
  // head), the reduce-scatters after the row-parallel ones and the embedding's; backward the reverse.
  const std::map<std::string, int> want_fwd =
      sp ? std::map<std::string, int>{{"all_gather", 2 * L + 1}, {"reduce_scatter", 2 * L + 1}}
         : std::map<std::string, int>{{"all_reduce", 2 * L + 1}};
  const std::map<std::string, int> want_bwd =
      sp ? std::map<std::string, int>{{"all_gather", 2 * L + 1}, {"reduce_scatter", 2 * L + 1}}
         : std::map<std::string, int>{{"all_reduce", 2 * L + 1}};
  auto str = [](const std::map<std::string, int>& m) {
    std::string out;
    for (const auto& [op, k] : m) out += (out.empty() ? "" : ", ") + std::to_string(k) + " " + op;
    return out.empty() ? std::string("none") : out;
  };
  const bool ok = fwd == want_fwd && bwd == want_bwd;
  const std::string got = "forward " + str(fwd) + "; backward " + str(bwd) + " of (B,T,C) tensors";
  EXPECT_TRUE(grading::all_ranks(ok,
                                 on_rank(got + ", expected forward " + str(want_fwd) + "; backward " + str(want_bwd))));
  return got + " (L = " + std::to_string(L) + ")";
}

int64_t activation_set_bytes(const GPTConfig& cfg, int B, int T, int tp, bool sp) {
  const int64_t C = cfg.n_embd, V = cfg.vocab_size, NH = cfg.n_head, BT = static_cast<int64_t>(B) * T;
  const int64_t S = sp ? BT * C / tp : BT * C;  // the residual stream: (B,T,C), or a rank's rows of it
  const int64_t R = sp ? BT / tp : BT;          // one value per token row (layernorm mean, rstd)
  const int64_t gathered = sp ? BT * C : 0;     // a layernorm's output gathered for the column-parallel matmul
  const int64_t layer = 6 * S + 4 * R + 2 * gathered + (3 + 1 + 8) * BT * C / tp + B * (NH / tp) * T * T;
  const int64_t embedding = S + BT;                                       // encoded; tokens (i32)
  const int64_t head = S + 2 * R + gathered + 2 * BT * V / tp + BT + BT;  // lnf, stats, logits, probs, losses, targets
  return 4 * (embedding + cfg.n_layer * layer + head);
}

std::string expect_activation_memory_matches_formula(bool sp) {
  const GPTConfig cfg = tp_config();
  const int B = 2, T = 16;
  TpSetup s = make_tp_model(cfg, sp);
  Allocator& alloc = Allocator::get(Device::CPU);
  auto acts = [&] { return alloc.stats().current_bytes[static_cast<int>(MemCategory::Activations)]; };
  GPT2Activations first = s.model->make_activations(B, T);  // also allocates the backward scratch
  const int64_t before = acts();
  GPT2Activations set = s.model->make_activations(B, T);
  const int64_t measured = acts() - before;
  // A forward through the set (the track's points): a set is what one micro-batch in flight keeps.
  const GlobalBatch g = random_global_batch(kDataSeed, B, T, cfg.vocab_size);
  s.model->forward(set, g.inputs, &g.targets);
  const int64_t after = acts() - before;
  EXPECT_TRUE(grading::all_ranks(after == measured,
                                 on_rank("the forward allocated " + std::to_string(after - measured) + " more bytes")));
  const int tp = s.points->size();
  const int64_t want = activation_set_bytes(cfg, B, T, tp, sp), dense = activation_set_bytes(cfg, B, T, 1, false);
  const double rel = std::fabs(static_cast<double>(measured - want)) / want;
  constexpr double kWithin = 0.05;  // the bound; the kit's count is exact
  EXPECT_TRUE(grading::all_ranks(rel <= kWithin, on_rank("measured " + std::to_string(measured) + " bytes, formula " +
                                                         std::to_string(want))));
  char buf[200];
  std::snprintf(buf, sizeof(buf),
                "one (B=%d, T=%d) set: %lld bytes measured, %lld by the formula (%.1f %% off); "
                "the dense model's set: %lld bytes (%.2fx)",
                B, T, static_cast<long long>(measured), static_cast<long long>(want), 100 * rel,
                static_cast<long long>(dense), static_cast<double>(dense) / measured);
  return buf;
}

}  // namespace scalelab::lab05_test
