// rank_reducer.h — the rank-collective helpers of the grading contract (grading.h, RankReducer) built
// on a communicator, so grading::all_ranks() and grading::run() combine every rank's result.
// Used by tests/grading/graded_main.cpp and tests/support/mpi/mpi_main.cpp. Implementation: rank_reducer.cpp
#pragma once

#include <memory>

#include "grading.h"             // defines: grading::RankReducer
#include "scalelab/comm/comm.h"  // defines: Communicator

namespace scalelab::test {

// A RankReducer whose collectives run on `comm` (which it keeps alive). Give it a communicator of
// its own, so its calls never show up in the event log of the communicator a test inspects.
//   all_and     all_reduce(Sum) of one i32 flag per rank: all passed iff the sum is size()
//   all_gather  all_gather of the string lengths (i32), then of the bytes padded to the longest
//               string and packed into i32 words
grading::RankReducer make_rank_reducer(std::shared_ptr<Communicator> comm);

}  // namespace scalelab::test
