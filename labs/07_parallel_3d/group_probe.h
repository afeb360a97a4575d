// group_probe.h — what lab 07's driver measures around each step (main.cpp; the same for both tracks; lab
// 08's driver uses it too): per group (tp, pp, dp, embedding) the calls, bytes, waits and busy time of the
// step, the bubble against its formula, and the calls of a `timeline` record. Not part of the lesson's
// algorithm: the lab's concept is in parallel_3d.h / parallel_3d.cpp.
#pragma once

#include <nlohmann/json.hpp>  // defines: nlohmann::json (the step record's keys)

#include <cstdio>  // defines: std::snprintf
#include <string>
#include <vector>

#include "parallel_3d.h"                 // defines: lab07::Rank3D, Groups (this track's)
#include "scalelab/comm/comm.h"          // defines: Communicator, CommEvent
#include "scalelab/driver/driver.h"      // defines: driver::CommStats, comm_stats
#include "scalelab/driver/train_loop.h"  // defines: driver::StepMeasure

namespace scalelab::lab07_driver {

// Every communicator a rank of the 3D layout calls on: tp, pp, the pipeline's gradient channel, dp (with
// --cp > 1 the cp x dp group), the embedding group and the ring's cp group (nullptr where the rank has none).
inline std::vector<Communicator*> communicators(lab07::Rank3D& part) {
  lab07::Groups& g = part.groups;
  return {g.tp.get(), g.pp.get(), &part.exchange->gradient_channel(), g.dp.get(), g.embedding.get(), g.cp.get()};
}

// The time this rank waited for the step's calls on `comms` (the sum of their events' wait_ms), ms.
inline double waited_ms(const std::vector<Communicator*>& comms) {
  double wait = 0;
  for (Communicator* c : comms)
    if (c != nullptr)
      for (const CommEvent& e : c->events()) wait += e.wait_ms;
  return wait;
}

// What one group carried and cost in one step (events of its communicators).
inline nlohmann::json group_measure(const std::vector<Communicator*>& comms, double now) {
  double wait = 0;
  driver::CommStats total;
  for (Communicator* c : comms) {
    if (c == nullptr) continue;
    const std::vector<CommEvent> events = c->events();
    const driver::CommStats s = driver::comm_stats(events, now);
    for (const CommEvent& e : events) wait += e.wait_ms;
    total.payload_bytes += s.payload_bytes;
    total.calls += s.calls;
    total.modeled_ms += s.modeled_ms;
    total.busy_ms += s.busy_ms;
  }
  return {{"wait_ms", wait},
          {"busy_ms", total.busy_ms},
          {"modeled_ms", total.modeled_ms},
          {"payload_bytes", total.payload_bytes},
          {"calls", total.calls}};
}

// Around each step (TrainLoop's before_step and after_step): begin() clears every group's events and the
// stage's timings and starts the step on every rank together (a barrier: the idle time until a rank's first
// action is bubble); end() closes it with another barrier and returns the step's measure: the waits, busy
// and modeled time summed over the groups, and the step record's keys (bubble, bubble_formula, compute_ms,
// pipeline_ms, uniform_overruns, groups; with want_timeline the stage's spans and group_calls).
class GroupProbe {
 public:
  GroupProbe(Communicator& world, lab07::Rank3D& part, double bubble_formula, bool simulated)
      : world_(world), part_(part), formula_(bubble_formula), simulated_(simulated) {}

  void begin() {
    for (Communicator* c : communicators(part_))
      if (c != nullptr) c->clear_events();
    part_.stage->clear();
    world_.barrier();
    start_ms_ = Communicator::now_ms();
  }

  driver::StepMeasure end(bool want_timeline) {
    world_.barrier();
    lab07::Groups& g = part_.groups;
    Communicator* gradients = &part_.exchange->gradient_channel();
    const double now = Communicator::now_ms(), window_ms = now - start_ms_;
    nlohmann::json per_group = {{"tp", group_measure({g.tp.get()}, now)},
                                {"pp", group_measure({g.pp.get(), gradients}, now)},
                                {"dp", group_measure({g.dp.get()}, now)},
                                {"embedding", group_measure({g.embedding.get()}, now)}};
    if (g.cp) per_group["cp"] = group_measure({g.cp.get()}, now);  // the ring (--cp > 1); "dp" is then dp-cp
    driver::StepMeasure m;
    m.comm_ms = 0;
    for (const auto& [name, gm] : per_group.items()) {
      m.comm_ms += gm["wait_ms"].get<double>();
      m.comm_busy_ms += gm["busy_ms"].get<double>();
      m.comm_modeled_ms += gm["modeled_ms"].get<double>();
    }
    m.simulated = simulated_;
    lab06::Stage& stage = *part_.stage;
    m.extra = {{"bubble", 1.0 - stage.compute_ms() / window_ms},
               {"bubble_formula", formula_},
               {"compute_ms", stage.compute_ms()},
               {"pipeline_ms", window_ms},
               {"uniform_overruns", stage.overruns()},
               {"groups", per_group}};
    if (want_timeline) {  // the stage's spans, and every group's calls but tp's (the timeline record has those)
      m.spans = stage.spans();
      m.spans.push_back({"step", start_ms_, now});
      nlohmann::json calls = nlohmann::json::array();
      for (Communicator* c : {g.pp.get(), gradients, g.dp.get(), g.embedding.get(), g.cp.get()})
        if (c != nullptr)
          for (const CommEvent& e : c->events())
            calls.push_back({{"group", e.group},
                             {"op", e.op},
                             {"tag", e.tag},
                             {"start_ms", e.start_ms},
                             {"end_ms", e.end_ms},
                             {"wait_ms", e.wait_ms},
                             {"payload_bytes", e.payload_bytes}});
      m.extra["group_calls"] = calls;
    }
    return m;
  }

  // The progress line's part: each group's wait and the bubble.
  static std::string progress(const driver::StepMeasure& m) {
    const nlohmann::json& gr = m.extra["groups"];
    char s[160];
    std::snprintf(s, sizeof(s), "waits tp %.1f pp %.1f dp %.1f emb %.1f ms | bubble %.3f",
                  gr["tp"]["wait_ms"].get<double>(), gr["pp"]["wait_ms"].get<double>(),
                  gr["dp"]["wait_ms"].get<double>(), gr["embedding"]["wait_ms"].get<double>(),
                  m.extra.value("bubble", 0.0));
    return s;
  }

 private:
  Communicator& world_;
  lab07::Rank3D& part_;
  double formula_;
  bool simulated_;
  double start_ms_ = 0;
};

}  // namespace scalelab::lab07_driver
