// rank_reducer.cpp — grading::RankReducer on a communicator (rank_reducer.h).
#include "rank_reducer.h"

#include <cstdint>
#include <string>

#include "scalelab/comm/host_values.h"  // defines: all_reduce_value, all_gather_strings

namespace scalelab::test {

grading::RankReducer make_rank_reducer(std::shared_ptr<Communicator> comm) {
  grading::RankReducer r;
  r.rank = comm->rank();
  r.size = comm->size();

  // Through the helpers of comm/host_values.h, so any backend's communicator serves (nccl, sim included).
  r.all_and = [comm](bool local_ok) {
    return all_reduce_value(*comm, static_cast<int32_t>(local_ok ? 1 : 0), ReduceOp::Sum, "grading all_and") ==
           comm->size();
  };
  r.all_gather = [comm](const std::string& local) { return all_gather_strings(*comm, local, "grading all_gather"); };
  return r;
}

}  // namespace scalelab::test
