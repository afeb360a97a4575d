// lab09_support.h — what lab 09's two test programs share (test_lab09.cpp, test_planner_model.cpp).
#pragma once

#include "planner.h"  // defines: lab09::Layout

namespace scalelab::lab09_test {

// A layout in one line: tp x pp x dp, B sequences x m micro-batches, and the options.
inline lab09::Layout layout(int tp, int pp, int dp, int B, int m, int zero = 0, bool sp = false,
                            Recompute r = Recompute::None, lab06::ScheduleKind schedule = lab06::ScheduleKind::OneFOneB,
                            int chunks = 1) {
  lab09::Layout x;
  x.tp = tp;
  x.pp = pp;
  x.dp = dp;
  x.micro_batch = B;
  x.micro_batches = m;
  x.zero_stage = zero;
  x.sequence_parallel = sp;
  x.recompute = r;
  x.schedule = schedule;
  x.chunks = chunks;
  return x;
}

}  // namespace scalelab::lab09_test
