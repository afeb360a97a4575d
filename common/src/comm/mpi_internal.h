// mpi_internal.h — what the two backends that speak MPI share (not a public header): mpi.cpp, which
// moves every byte over MPI, and nccl.cpp, which bootstraps over MPI and keeps an MPI twin of each of
// its communicators for what NCCL cannot say (the world ranks of a group, the headers of sends).
//   SL_MPI_CALL          wraps an MPI call; errors become scalelab::Error with MPI's own message
//   mpi_world_ranks      the MPI_COMM_WORLD ranks of a communicator's members, in its rank order
//   mpi_split_color      Communicator::kNoColor -> MPI_UNDEFINED
// Tests: tests/common/comm/test_comm_mpi.cpp
#pragma once

#include <mpi.h>

#include <numeric>
#include <vector>

#include "comm_internal.h"        // defines: Communicator::kNoColor (comm.h)
#include "scalelab/core/error.h"  // defines: detail::fail, detail::format

// SL_MPI_CALL(call): like SL_MPI_CHECK (error.h), with MPI's own words for the error.
#define SL_MPI_CALL(call)                                                                       \
  do {                                                                                          \
    const int sl_rc_ = (call);                                                                  \
    if (sl_rc_ != MPI_SUCCESS) {                                                                \
      char sl_msg_[MPI_MAX_ERROR_STRING] = {0};                                                 \
      int sl_len_ = 0;                                                                          \
      MPI_Error_string(sl_rc_, sl_msg_, &sl_len_);                                              \
      ::scalelab::detail::fail("MPI", #call, __FILE__, __LINE__, __func__,                      \
                               ::scalelab::detail::format("MPI error %d: %s", sl_rc_, sl_msg_), \
                               "a peer may have failed first: read every rank's output");       \
    }                                                                                           \
  } while (0)

namespace scalelab::comm_detail {

// The world rank of each member of comm, in comm's rank order: a local translation between the two
// groups (MPI_Group_translate_ranks), no message.
inline std::vector<int> mpi_world_ranks(MPI_Comm comm) {
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  SL_MPI_CALL(MPI_Comm_group(comm, &group));
  SL_MPI_CALL(MPI_Comm_group(MPI_COMM_WORLD, &world));
  int n = 0;
  SL_MPI_CALL(MPI_Group_size(group, &n));
  std::vector<int> ranks(static_cast<size_t>(n)), world_ranks(static_cast<size_t>(n));
  std::iota(ranks.begin(), ranks.end(), 0);
  SL_MPI_CALL(MPI_Group_translate_ranks(group, n, ranks.data(), world, world_ranks.data()));
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  return world_ranks;
}

// A split color as MPI_Comm_split takes it.
inline int mpi_split_color(int color) { return color == Communicator::kNoColor ? MPI_UNDEFINED : color; }

}  // namespace scalelab::comm_detail
