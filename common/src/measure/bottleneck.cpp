// bottleneck.cpp — the four-cause scaling verdict (bottleneck.h). Definitions: docs/bottleneck.md.
// Pure functions of the evidence: no I/O, no clock, nothing throws. Tests: tests/common/measure/test_bottleneck.cpp
#include "scalelab/measure/bottleneck.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>

#include "scalelab/measure/stats.h"  // defines: median

namespace scalelab {

const char* const kCauseNames[4] = {"data-loader saturation", "exposed gradient communication",
                                    "per-device batch too small", "straggling device"};

namespace {

std::string strf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string strf(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  return buf;
}

bool is_set(double x) { return std::isfinite(x); }
bool is_rate(double x) { return std::isfinite(x) && x > 0; }

// 2.1M tok/s, 40k tok/s, 3.1k tok/s, 950 tok/s
std::string rate_str(double tok_s) {
  if (tok_s >= 1e6) return strf("%.1fM tok/s", tok_s / 1e6);
  if (tok_s >= 1e4) return strf("%.0fk tok/s", tok_s / 1e3);
  if (tok_s >= 1e3) return strf("%.1fk tok/s", tok_s / 1e3);
  return strf("%.0f tok/s", tok_s);
}
// 0.3 %, 22.0 %
std::string pct_str(double fraction) { return strf("%.1f %%", 100.0 * fraction); }
// 52x, 1.61x
std::string ratio_str(double r) { return r >= 10 ? strf("%.0fx", r) : strf("%.2fx", r); }
std::string ms_str(double ms) { return ms >= 100 ? strf("%.0f ms", ms) : strf("%.1f ms", ms); }

// Mean over ranks of part_ms / step_ms, over the ranks that logged both; kNotMeasured if none did.
double mean_share(const std::vector<RankTiming>& ranks, double RankTiming::*part) {
  double sum = 0;
  int n = 0;
  for (const RankTiming& r : ranks) {
    if (is_set(r.*part) && is_rate(r.step_ms)) {
      sum += (r.*part) / r.step_ms;
      ++n;
    }
  }
  return n ? sum / n : kNotMeasured;
}

CauseFinding start(int order) {
  CauseFinding f;
  f.order = order;
  f.cause = kCauseNames[order - 1];
  return f;
}

CauseFinding not_measured(CauseFinding f, const std::string& what) {
  f.culprit = false;
  f.has_evidence = false;
  f.evidence = "not measured: " + what;
  f.measured = kNotMeasured;
  return f;
}

// ---------------------------------------------------------------------------------------------
// (1) data-loader saturation: loader-alone headroom over the model's appetite, and the data wait

CauseFinding check_loader(const ScalingEvidence& ev, const VerdictThresholds& th) {
  CauseFinding f = start(1);
  f.fix =
      "more loader threads or a deeper prefetch queue (lab 02), pre-tokenized memory-mapped shards; "
      "then time the loader alone again";
  double consume = ev.consumption_tokens_per_s;
  bool consume_derived = false;
  if (!is_rate(consume) && is_rate(ev.multi_tokens_per_s) && ev.world_size > 0) {
    consume = ev.multi_tokens_per_s / ev.world_size;  // a lower bound of the appetite: it includes the waits
    consume_derived = true;
  }
  const double headroom =
      is_rate(ev.loader_alone_tokens_per_s) && is_rate(consume) ? ev.loader_alone_tokens_per_s / consume : kNotMeasured;
  const double wait = is_set(ev.data_wait_share) ? ev.data_wait_share : mean_share(ev.ranks, &RankTiming::data_wait_ms);
  if (!is_set(headroom) && !is_set(wait))
    return not_measured(f, "neither the loader alone (no model) nor the data wait of the run was timed");

  const bool short_headroom = is_set(headroom) && headroom < th.loader_headroom_min;
  const bool long_wait = is_set(wait) && wait > th.data_wait_share_max;
  f.has_evidence = true;
  f.culprit = short_headroom || long_wait;
  if (short_headroom || (!long_wait && is_set(headroom))) {
    f.measured = headroom;
    f.threshold = th.loader_headroom_min;
  } else {
    f.measured = wait;
    f.threshold = th.data_wait_share_max;
  }

  std::string e;
  if (is_set(headroom)) {
    e = "loader alone " + rate_str(ev.loader_alone_tokens_per_s) + " vs model " + rate_str(consume) + " per rank" +
        (consume_derived ? " (run rate / N)" : "") + ": " + ratio_str(headroom) +
        " headroom (needs >= " + ratio_str(th.loader_headroom_min) + ")";
  } else {
    e = "loader alone not timed";
  }
  e += is_set(wait) ? "; data wait " + pct_str(wait) + " of the step (limit " + pct_str(th.data_wait_share_max) + ")"
                    : "; data wait not logged";
  if (short_headroom) e += ": the loader cannot feed the model";
  else if (long_wait) e += ": the model waits for data";
  f.evidence = e;
  return f;
}

// ---------------------------------------------------------------------------------------------
// (2) exposed gradient communication. Decided on the rank that reaches the collective LAST (largest
// compute_ms): it waits for no peer, so its exposed time is the communication alone. The others'
// exposed time also holds their wait for that rank, which is cause (4)'s evidence, not this one's.

CauseFinding check_comm(const ScalingEvidence& ev, const VerdictThresholds& th) {
  CauseFinding f = start(2);
  f.fix = ev.overlap_enabled
              ? "fewer, bigger messages (lab 03 --bucket-mb; lab 04 --prefetch 1 or 2) or a faster link; overlap is "
                "already on and cannot hide more than the compute lasts"
              : "turn overlap on (lab 03 --mode overlap; lab 04 --overlap on) so communication runs during "
                "compute; then bigger buckets or more prefetch, or a faster link";
  if (ev.link_simulated)
    f.fix += "; the link is simulated (" + (ev.link_name.empty() ? std::string("?") : ev.link_name) +
             "): measure again on the real one";
  if (ev.world_size < 2)
    return not_measured(f, strf("world_size %d: no gradient communication below 2 ranks", ev.world_size));

  const double mean = is_set(ev.exposed_comm_share) ? ev.exposed_comm_share
                                                    : mean_share(ev.ranks, &RankTiming::exposed_comm_ms);
  const RankTiming* last = nullptr;
  for (const RankTiming& r : ev.ranks) {
    if (!is_rate(r.compute_ms) || !is_set(r.exposed_comm_ms) || !is_rate(r.step_ms)) continue;
    if (!last || r.compute_ms > last->compute_ms) last = &r;
  }
  const bool use_last = last && ev.ranks.size() >= 2;
  const double share = use_last ? last->exposed_comm_ms / last->step_ms : mean;
  if (!is_set(share)) return not_measured(f, "no exposed communication time (comm_ms) was logged");

  f.has_evidence = true;
  f.measured = share;
  f.threshold = th.exposed_comm_share_max;
  f.culprit = share > th.exposed_comm_share_max;

  std::string e = "exposed comm " + pct_str(share) + " of the step (limit " + pct_str(th.exposed_comm_share_max) + ")";
  if (use_last && is_set(mean) && mean - share > 0.05) {
    e += strf(
        " on rank %d, the last to reach the collectives; the mean over ranks, %s, also holds peers waiting "
        "for it (see cause 4)",
        last->rank, pct_str(mean).c_str());
  } else if (!use_last) {
    e += ", mean over ranks";
  }
  if (is_set(ev.comm_busy_share)) e += "; collectives in flight " + pct_str(ev.comm_busy_share) + " of the step";
  e += ev.overlap_enabled ? "; overlap on" : "; overlap off";
  if (!ev.link_name.empty()) e += "; link " + ev.link_name + (ev.link_simulated ? " (simulated)" : "");
  f.evidence = e;
  return f;
}

// ---------------------------------------------------------------------------------------------
// (3) per-device batch too small: does one device still speed up a lot with a bigger batch?

CauseFinding check_batch(const ScalingEvidence& ev, const VerdictThresholds& th) {
  CauseFinding f = start(3);
  if (ev.batch_sweep.empty()) {
    f.fix = "a larger micro-batch (gradient accumulation keeps the global batch), or fewer, bigger kernels (fusion)";
    return not_measured(f, "no per-device batch sweep");
  }
  const BatchPoint* used = nullptr;
  const BatchPoint* best = nullptr;  // best rate among batches larger than the used one
  for (const BatchPoint& p : ev.batch_sweep)
    if (p.micro_batch == ev.micro_batch && is_rate(p.tokens_per_s_per_device)) used = &p;
  for (const BatchPoint& p : ev.batch_sweep) {
    if (p.micro_batch <= ev.micro_batch || !is_rate(p.tokens_per_s_per_device)) continue;
    if (!best || p.tokens_per_s_per_device > best->tokens_per_s_per_device) best = &p;
  }
  f.fix = strf(
      "a larger micro-batch (B=%d if memory allows; gradient accumulation keeps the global batch), or "
      "fewer, bigger kernels (fusion)",
      best ? best->micro_batch : 2 * std::max(ev.micro_batch, 1));
  if (!used) return not_measured(f, strf("the batch sweep has no point at the used B=%d", ev.micro_batch));
  if (!best) return not_measured(f, strf("the batch sweep has no batch above the used B=%d", ev.micro_batch));

  const double gain = best->tokens_per_s_per_device / used->tokens_per_s_per_device;
  f.has_evidence = true;
  f.measured = gain;
  f.threshold = th.batch_gain_min;
  f.culprit = gain >= th.batch_gain_min;
  f.evidence = strf("B=%d: %s per device; B=%d: %s, %s (limit %s)", used->micro_batch,
                    rate_str(used->tokens_per_s_per_device).c_str(), best->micro_batch,
                    rate_str(best->tokens_per_s_per_device).c_str(), ratio_str(gain).c_str(),
                    ratio_str(th.batch_gain_min).c_str()) +
               (f.culprit ? ": still rising steeply, the step is overhead-bound"
                          : strf(": the step is compute-bound at B=%d", used->micro_batch));
  return f;
}

// ---------------------------------------------------------------------------------------------
// (4) straggler: per-rank COMPUTE time, since step times equalize at every collective.

CauseFinding check_straggler(const ScalingEvidence& ev, const VerdictThresholds& th) {
  CauseFinding f = start(4);
  std::vector<const RankTiming*> valid;
  for (const RankTiming& r : ev.ranks)
    if (is_rate(r.compute_ms)) valid.push_back(&r);
  const RankTiming* slow = nullptr;
  for (const RankTiming* r : valid)
    if (!slow || r->compute_ms > slow->compute_ms) slow = r;
  f.fix = strf(
      "find why rank %d is slow: throttling (clocks, temperature: nvidia-smi -q -d PERFORMANCE), placement "
      "(two ranks on one core or socket: taskset, numactl), another process on its device (top, nvidia-smi)",
      slow ? slow->rank : -1);
  if (valid.size() < 2)
    return not_measured(f, strf("per-rank compute time of %zu rank(s); needs 2 or more", valid.size()));

  std::vector<double> other_compute, other_exposed, other_step;
  for (const RankTiming* r : valid) {
    if (r == slow) continue;
    other_compute.push_back(r->compute_ms);
    if (is_set(r->exposed_comm_ms)) other_exposed.push_back(r->exposed_comm_ms);
    if (is_rate(r->step_ms)) other_step.push_back(r->step_ms);
  }
  const double med = median(other_compute);
  const double ratio = slow->compute_ms / med;
  f.has_evidence = true;
  f.measured = ratio;
  f.threshold = th.straggler_ratio_max;
  f.culprit = ratio > th.straggler_ratio_max;

  std::string e = strf("slowest rank %d: compute %s vs %s median of the other ranks, %s (limit %s)", slow->rank,
                       ms_str(slow->compute_ms).c_str(), ms_str(med).c_str(), ratio_str(ratio).c_str(),
                       ratio_str(th.straggler_ratio_max).c_str());
  if (is_rate(slow->step_ms) && !other_step.empty())
    e += "; step " + ms_str(slow->step_ms) + " vs " + ms_str(median(other_step));
  if (f.culprit && is_set(slow->exposed_comm_ms) && !other_exposed.empty()) {
    const double others_wait = median(other_exposed);
    const double gap = slow->compute_ms - med;
    if (others_wait - slow->exposed_comm_ms >= th.hidden_wait_fraction * gap) {
      e += strf(
          ": hidden in the others' communication wait (their exposed comm %s vs rank %d's %s), so step times "
          "alone do not show it",
          ms_str(others_wait).c_str(), slow->rank, ms_str(slow->exposed_comm_ms).c_str());
    }
  }
  f.evidence = e;
  return f;
}

std::string conclude(const Verdict& v, const ScalingEvidence& ev, const VerdictThresholds& th) {
  std::string eff = "scaling efficiency not measured";
  if (is_set(v.scaling_efficiency))
    eff = strf("scaling efficiency %.0f %% (%.2fx on %d devices)", 100.0 * v.scaling_efficiency,
               v.scaling_efficiency * ev.world_size, ev.world_size);
  const std::vector<std::string> c = v.culprits();
  int unmeasured = 0;
  for (const CauseFinding& f : v.findings) unmeasured += f.has_evidence ? 0 : 1;
  if (unmeasured == static_cast<int>(v.findings.size())) return "Verdict: " + eff + "; no cause measured, no verdict.";
  if (!c.empty()) {
    std::string s = "Verdict: " + eff + "; fix first: " + c[0];
    for (size_t i = 1; i < c.size(); ++i) s += (i == 1 ? ", then " : ", ") + c[i];
    return s + "; then measure again.";
  }
  if (is_set(v.scaling_efficiency) && v.scaling_efficiency < th.healthy_efficiency_min)
    return "Verdict: " + eff + ": none of the four causes fired, yet efficiency is below " +
           pct_str(th.healthy_efficiency_min) + ": measure what is marked not measured, and check the timing itself.";
  if (unmeasured > 0)
    return "Verdict: " + eff + strf("; no culprit among the causes measured (%d of 4 unchecked).", unmeasured);
  return "Verdict: " + eff + "; no culprit among the four causes.";
}

}  // namespace

std::vector<std::string> Verdict::culprits() const {
  std::vector<std::string> out;
  for (const CauseFinding& f : findings)
    if (f.culprit) out.push_back(f.cause);
  return out;
}

double scaling_efficiency(const ScalingEvidence& ev) {
  if (ev.world_size < 1 || !is_rate(ev.single_tokens_per_s) || !is_rate(ev.multi_tokens_per_s)) return kNotMeasured;
  return ev.multi_tokens_per_s / (ev.world_size * ev.single_tokens_per_s);
}

Verdict diagnose_scaling(const ScalingEvidence& ev, const VerdictThresholds& th) {
  Verdict v;
  v.scaling_efficiency = scaling_efficiency(ev);
  v.findings = {check_loader(ev, th), check_comm(ev, th), check_batch(ev, th), check_straggler(ev, th)};
  v.conclusion = conclude(v, ev, th);
  return v;
}

std::string format_verdict(const Verdict& v) {
  std::string s = "Why not Nx? The four causes, in the order to check them:\n";
  for (const CauseFinding& f : v.findings) {
    const char* mark = !f.has_evidence ? "not measured" : f.culprit ? "CULPRIT" : "ok";
    s += strf("  %d. %-31s %s\n", f.order, f.cause.c_str(), mark);
    // "not measured: ..." already says so; print the rest of the sentence.
    const std::string ev = !f.has_evidence && f.evidence.rfind("not measured: ", 0) == 0 ? f.evidence.substr(14)
                                                                                         : f.evidence;
    s += "     " + ev + "\n";
    if (f.culprit) s += "     fix: " + f.fix + "\n";
  }
  s += v.conclusion.empty() ? std::string("Verdict: (no conclusion)") : v.conclusion;
  s += "\n";
  return s;
}

}  // namespace scalelab
