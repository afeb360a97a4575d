// host_values.h — collectives of host values (a norm, a loss, a flag, a run id) through any communicator.
// The nccl and sim backends move device tensors only (NCCL's contract, comm.h device()), so a value the
// host holds travels as a GPU program sends it: copied into a small tensor on comm.device(), reduced or
// broadcast there, copied back. On the local and mpi backends the tensor is a CPU one and nothing is
// copied: the same call, the same bits as an all_reduce of a CPU tensor. Every rank calls with the same
// count (and for the strings' helpers, the same max_bytes); the tag names the call in the event log.
//   float norm_sq = all_reduce_value(comm, local_sq, ReduceOp::Sum, "grad norm");
//   std::string id = broadcast_string(comm, rank == 0 ? make_id() : "", /*root=*/0, "run id");
// Errors: those of the communicator (comm.h). Tests: tests/common/comm/test_host_values_mpi.cpp
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scalelab/comm/comm.h"  // defines: Communicator, ReduceOp

namespace scalelab {

// Element-wise reductions over all ranks of values.size() values (the same count on every rank), as
// f32 or i32 (the communicator's dtypes; Avg of i32 is refused, comm.h).
std::vector<float> all_reduce_values(Communicator& comm, const std::vector<float>& values, ReduceOp op,
                                     const std::string& tag = "");
std::vector<int32_t> all_reduce_values(Communicator& comm, const std::vector<int32_t>& values, ReduceOp op,
                                       const std::string& tag = "");
// One value: the same, for a float (an f32 reduction, as a (1) f32 tensor's) or an int32_t.
float all_reduce_value(Communicator& comm, float x, ReduceOp op, const std::string& tag = "");
int32_t all_reduce_value(Communicator& comm, int32_t x, ReduceOp op, const std::string& tag = "");
// A double, exactly: every rank's 8 bytes are gathered and reduced in rank order in double (Avg: the
// sum / size()), so every rank gets the same bits. For times and counters f32 would round.
double all_reduce_value(Communicator& comm, double x, ReduceOp op, const std::string& tag = "");
// True on every rank when `flag` is true on at least one.
bool any_rank(Communicator& comm, bool flag, const std::string& tag = "");

// Root's values on every rank (the same count on every rank; the others' values are overwritten).
std::vector<int32_t> broadcast_values(Communicator& comm, const std::vector<int32_t>& values, int root,
                                      const std::string& tag = "");
// Root's string on every rank, up to max_bytes bytes (longer ones are cut; a NUL ends it early). It
// travels as ceil((max_bytes + 1) / 4) i32 words, the same on every rank; the others' `s` is ignored.
std::string broadcast_string(Communicator& comm, const std::string& s, int root, const std::string& tag = "",
                             int max_bytes = 1023);

// Every rank's values, rank after rank (values.size() the same on every rank): size() * values.size().
std::vector<float> all_gather_values(Communicator& comm, const std::vector<float>& values, const std::string& tag = "");
std::vector<int32_t> all_gather_values(Communicator& comm, const std::vector<int32_t>& values,
                                       const std::string& tag = "");
// Every rank's string, in rank order; any lengths. Two all_gathers, tagged tag + " lengths" and tag +
// " bytes" (the strings padded to the longest).
std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& s, const std::string& tag = "");

}  // namespace scalelab
