// lab03_support.cpp — lab 03's shared check helpers (lab03_support.h).
#include "lab03_support.h"

#include <algorithm>  // defines: std::max
#include <cmath>      // defines: std::fabs, std::isfinite
#include <cstdio>     // defines: std::snprintf
#include <cstring>    // defines: std::memcpy

#include <gtest/gtest.h>  // defines: EXPECT_*

#include "grading.h"               // defines: grading::all_ranks, rank_reducer
#include "scalelab/model/optim.h"  // defines: Optimizer

namespace scalelab::lab03_test {

// ---------------------------------------------------------------------------------------------
// Comparisons

namespace {

// max |got - want| over a tensor, the largest |want|, and the first 5 indices where the bound fails.
Comparison compare_tensors(const std::vector<ParamInfo>& table, bool grads, const GPT2& got, const GPT2& want,
                           double rtol, double atol) {
  Comparison c;
  for (const ParamInfo& p : table) {
    const Tensor g = grads ? got.grad(p.name) : got.param(p.name);
    const Tensor w = grads ? want.grad(p.name) : want.param(p.name);
    const float* hg = g.data<float>();
    const float* hw = w.data<float>();
    double max_abs_want = 0.0, max_err = 0.0;
    for (int64_t i = 0; i < p.numel; ++i) max_abs_want = std::max(max_abs_want, std::fabs(double{hw[i]}));
    const double bound = rtol * max_abs_want + atol;
    test::ScaleFit fit;
    fit.add(hg, hw, p.numel);
    c.scale.add(fit);
    std::string bad;
    int n_bad = 0;
    for (int64_t i = 0; i < p.numel; ++i) {
      const double err = std::fabs(double{hg[i]} - double{hw[i]});
      const bool fails = !(err <= bound);  // NaN fails too
      max_err = std::isfinite(err) ? std::max(max_err, err) : INFINITY;
      if (fails && n_bad++ < 5) {
        char buf[128];
        std::snprintf(buf, sizeof(buf), "%s[%lld] = %.8g, expected %.8g", bad.empty() ? "" : "; ",
                      static_cast<long long>(i), hg[i], hw[i]);
        bad += buf;
      }
    }
    const double worst = rtol > 0 ? (max_abs_want > 0 ? max_err / max_abs_want : max_err) : max_err;
    if (worst > c.worst || !std::isfinite(worst)) {
      c.worst = worst;
      c.worst_name = p.name;
    }
    if (n_bad > 0 && c.ok) {
      char buf[256];
      std::snprintf(buf, sizeof(buf),
                    "%s%s: %d of %lld elements off by more than %.3g (max abs error %.3g, "
                    "largest |expected| %.3g): ",
                    grads ? "grad of " : "", p.name.c_str(), n_bad, static_cast<long long>(p.numel), bound, max_err,
                    max_abs_want);
      c.failure = buf + bad;
      const std::string scaled = test::describe_scale(fit, {});
      if (!scaled.empty()) c.failure += "; every element is " + scaled;
      c.ok = false;
    }
  }
  return c;
}

}  // namespace

std::string gradient_failure(const Comparison& c, int world, int micro_steps) {
  const std::string scaled =
      test::describe_scale(c.scale, test::data_parallel_factors(world, micro_steps), "the one-process gradient");
  if (c.ok || scaled.empty()) return c.failure;
  return "every gradient tensor is " + scaled;  // the whole story, and the same on every rank
}

Comparison compare_gradients(const GPT2& got, const GPT2& want, double rtol) {
  return compare_tensors(want.param_table(), /*grads=*/true, got, want, rtol, /*atol=*/0.0);
}

Comparison compare_parameters(const GPT2& got, const GPT2& want, double atol) {
  return compare_tensors(want.param_table(), /*grads=*/false, got, want, /*rtol=*/0.0, atol);
}

std::string fingerprint(const GPT2& model, bool grads) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64
  for (const ParamInfo& p : model.param_table()) {
    const Tensor t = grads ? model.grad(p.name) : model.param(p.name);
    const unsigned char* bytes = static_cast<const unsigned char*>(t.raw());
    for (size_t i = 0; i < t.nbytes(); ++i) {
      h ^= bytes[i];
      h *= 0x100000001b3ull;
    }
  }
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string ranks_differing_from_rank0(const std::string& fp) {
  const grading::RankReducer& rr = grading::rank_reducer();
  if (rr.size <= 1 || !rr.all_gather) return "";
  const std::vector<std::string> all = rr.all_gather(fp);
  std::string differ;
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] != all[0]) differ += (differ.empty() ? "rank " : ", rank ") + std::to_string(r);
  }
  return differ.empty() ? "" : differ + " differ(s) from rank 0 bit for bit";
}

// ---------------------------------------------------------------------------------------------
// Check bodies

std::string expect_reduced_gradients_match(lab03::SyncMode mode) {
  const GPTConfig cfg = tiny_config();
  std::unique_ptr<Communicator> comm = fresh_comm();
  const int rank = comm->rank(), n = comm->size();
  const GlobalBatch g = random_global_batch(kDataSeed, kMicroBatch * n, cfg.max_seq_len, cfg.vocab_size);

  std::unique_ptr<GPT2> model = make_model(cfg);
  lab03::GradSync sync(*model, *comm, mode, kTinyBucketMb);
  const lab03::MicroBatch mb = rank_micro_batches(g, rank, n, /*micro_steps=*/1, kMicroBatch)[0];
  model->zero_grad();  // one backward, then the track's synchronisation: what the optimizer would get
  sync.set_require_sync(true);
  model->forward(mb.inputs, &mb.targets);
  model->backward();
  sync.finish();

  std::unique_ptr<GPT2> expected = make_model(cfg);
  one_process_gradients(*expected, g);
  const Comparison c = compare_gradients(*model, *expected, kGradRtol);
  const std::string differ = ranks_differing_from_rank0(fingerprint(*model, /*grads=*/true));
  const std::string mode_name = lab03::sync_mode_name(mode);
  EXPECT_TRUE(grading::all_ranks(c.ok, mode_name + " mode: " + gradient_failure(c, n, 1)))
      << "reduced gradients differ from the one-process gradients";
  EXPECT_TRUE(grading::all_ranks(differ.empty(), mode_name + " mode: " + differ))
      << "ranks must hold identical reduced gradients";
  const std::string scaled =
      test::describe_scale(c.scale, test::data_parallel_factors(n, 1), "the one-process gradient");
  char buf[320];
  if (!scaled.empty()) {
    std::snprintf(buf, sizeof(buf), "%s, %d ranks: every reduced gradient is %s; %s", mode_name.c_str(), n,
                  scaled.c_str(), differ.empty() ? "identical on every rank" : differ.c_str());
  } else {
    std::snprintf(buf, sizeof(buf), "%s, %d ranks: max |reduced - one-process| / max |one-process| = %.2e (%s); %s",
                  mode_name.c_str(), n, c.worst, c.worst_name.c_str(),
                  differ.empty() ? "identical on every rank" : differ.c_str());
  }
  return buf;
}

std::string expect_steps_match(lab03::SyncMode mode, const OptimizerConfig& opt_cfg, float lr, float grad_clip,
                               int steps, int micro_steps, double param_atol) {
  const GPTConfig cfg = tiny_config();
  std::unique_ptr<Communicator> comm = fresh_comm();
  const int rank = comm->rank(), n = comm->size();
  std::unique_ptr<GPT2> model = make_model(cfg), expected = make_model(cfg);
  Optimizer optimizer(*model, opt_cfg), expected_optimizer(*expected, opt_cfg);
  lab03::GradSync sync(*model, *comm, mode, kTinyBucketMb);
  double worst_param = 0.0, worst_grad = 0.0;
  std::string worst_name;
  bool ok = true, identical = true;
  int clipped = 0;
  std::string failure, differ_all;
  for (int step = 0; step < steps; ++step) {
    const GlobalBatch g =
        random_global_batch(kDataSeed + step, kMicroBatch * n * micro_steps, cfg.max_seq_len, cfg.vocab_size);
    lab03::train_step(*model, optimizer, sync, rank_micro_batches(g, rank, n, micro_steps, kMicroBatch), lr, grad_clip);
    const float norm = one_process_step(*expected, expected_optimizer, g, lr, grad_clip);
    if (grad_clip > 0 && norm > grad_clip) ++clipped;
    // The gradients stay in the buffers after the step: without clipping they are what the optimizer got.
    const Comparison cg = grad_clip > 0 ? Comparison{} : compare_gradients(*model, *expected, kGradRtol);
    const Comparison cp = compare_parameters(*model, *expected, param_atol);
    worst_grad = std::max(worst_grad, cg.worst);
    if (cp.worst > worst_param) {
      worst_param = cp.worst;
      worst_name = cp.worst_name;
    }
    if (ok && !(cg.ok && cp.ok)) {
      failure = std::string(lab03::sync_mode_name(mode)) + " mode, step " + std::to_string(step + 1) + ": " +
                (cg.ok ? cp.failure : gradient_failure(cg, n, micro_steps));
    }
    ok = ok && cg.ok && cp.ok;
    const std::string differ = ranks_differing_from_rank0(fingerprint(*model, /*grads=*/false));
    if (identical && !differ.empty()) {
      differ_all = std::string(lab03::sync_mode_name(mode)) + " mode, after step " + std::to_string(step + 1) + ": " +
                   differ;
    }
    identical = identical && differ.empty();
  }
  if (grad_clip > 0) {
    // A precondition of the check itself (true on both tracks): clipping must have acted.
    EXPECT_GT(clipped, 0) << "the check's grad_clip never clipped; lower it";
  }
  EXPECT_TRUE(grading::all_ranks(ok, failure)) << sync_mode_name(mode) << ": steps against the one-process reference";
  EXPECT_TRUE(grading::all_ranks(identical, differ_all)) << "parameters must be identical on every rank";
  char grads[64] = "";
  if (grad_clip <= 0) std::snprintf(grads, sizeof(grads), ", gradients %.2e relative", worst_grad);
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%s: max parameter error %.2e (%s)%s; %s", lab03::sync_mode_name(mode), worst_param,
                worst_name.c_str(), grads, identical ? "identical on every rank" : differ_all.c_str());
  return buf;
}

}  // namespace scalelab::lab03_test
