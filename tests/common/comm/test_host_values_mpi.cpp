// test_host_values_mpi.cpp — the host-value helpers (common/include/scalelab/comm/host_values.h) under mpiexec
// with 2 and 4 ranks (sl_add_mpi_test; main(): tests/support/mpi/mpi_main.cpp), on the mpi backend (host
// tensors, nothing staged) and on the sim backend (staged through SIM tensors, as nccl stages through the
// GPU): the same values on both, and on the mpi backend the same bits as the all_reduce of a CPU tensor they
// replace. Values per rank are exact small numbers where a sum's order must not matter (docs/style.md 27).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>  // defines: std::memcmp
#include <memory>
#include <string>
#include <vector>

#include "mpi_test.h"                   // defines: test::world
#include "scalelab/comm/comm.h"         // defines: Communicator, make_communicator
#include "scalelab/comm/host_values.h"  // defines: all_reduce_value(s), any_rank, broadcast_*, all_gather_*
#include "scalelab/core/clock.h"        // defines: VirtualClock
#include "scalelab/core/tensor.h"       // defines: Tensor, DType

namespace {

using scalelab::Communicator;
using scalelab::ReduceOp;
using scalelab::Tensor;
using scalelab::VirtualClock;
namespace test = scalelab::test;

// Runs check(comm) on the mpi backend (the test program's world), then on a sim world (virtual clock on for
// it, off again after).
template <typename F>
void on_both_backends(F check) {
  SCOPED_TRACE(test::world().backend());
  check(test::world());
  VirtualClock::get().start();
  {
    std::unique_ptr<Communicator> sim = scalelab::make_communicator("sim");
    SCOPED_TRACE("sim");
    check(*sim);
    EXPECT_FALSE(sim->events().empty()) << "the values travelled through the sim backend";
  }
  VirtualClock::get().stop();
}

TEST(HostValues, ScalarsReduce) {
  on_both_backends([](Communicator& comm) {
    const int r = comm.rank(), n = comm.size();
    EXPECT_EQ(all_reduce_value(comm, static_cast<float>(r + 1), ReduceOp::Sum, "f sum"), n * (n + 1) / 2.0f);
    EXPECT_EQ(all_reduce_value(comm, static_cast<float>(2 * r), ReduceOp::Avg, "f avg"), static_cast<float>(n - 1));
    EXPECT_EQ(all_reduce_value(comm, static_cast<float>(-r), ReduceOp::Max, "f max"), 0.0f);
    EXPECT_EQ(all_reduce_value(comm, int32_t{10 + r}, ReduceOp::Sum, "i sum"), 10 * n + n * (n - 1) / 2);
    EXPECT_EQ(all_reduce_value(comm, int32_t{r}, ReduceOp::Max, "i max"), n - 1);
    EXPECT_TRUE(any_rank(comm, r == n - 1, "flag on the last rank"));
    EXPECT_FALSE(any_rank(comm, false, "no flag"));
  });
}

TEST(HostValues, DoublesAreExactAndEqualOnEveryRank) {
  on_both_backends([](Communicator& comm) {
    const int r = comm.rank(), n = comm.size();
    const double x = 0.1 * (r + 1) + 1e-12 * r;  // not representable in f32
    double sum = 0;
    for (int q = 0; q < n; ++q) sum += 0.1 * (q + 1) + 1e-12 * q;  // in rank order, as the helper adds
    EXPECT_EQ(all_reduce_value(comm, x, ReduceOp::Sum, "d sum"), sum);
    EXPECT_EQ(all_reduce_value(comm, x, ReduceOp::Avg, "d avg"), sum / n);
    EXPECT_EQ(all_reduce_value(comm, x, ReduceOp::Max, "d max"), 0.1 * n + 1e-12 * (n - 1));
  });
}

TEST(HostValues, VectorsReduceGatherAndBroadcast) {
  on_both_backends([](Communicator& comm) {
    const int r = comm.rank(), n = comm.size();
    const std::vector<float> sums =
        all_reduce_values(comm, std::vector<float>{1.0f, static_cast<float>(r), 0.5f}, ReduceOp::Sum, "v sum");
    EXPECT_EQ(sums, (std::vector<float>{1.0f * n, n * (n - 1) / 2.0f, 0.5f * n}));
    const std::vector<int32_t> maxes = all_reduce_values(comm, std::vector<int32_t>{r, -r, 7}, ReduceOp::Max, "v max");
    EXPECT_EQ(maxes, (std::vector<int32_t>{n - 1, 0, 7}));
    const std::vector<int32_t> got = scalelab::broadcast_values(comm, {100 * r, 100 * r + 1}, n - 1, "bcast");
    EXPECT_EQ(got, (std::vector<int32_t>{100 * (n - 1), 100 * (n - 1) + 1}));
    const std::vector<float> all = scalelab::all_gather_values(comm, std::vector<float>{1.5f * r, -1.0f * r}, "gather");
    ASSERT_EQ(all.size(), 2u * n);
    for (int q = 0; q < n; ++q) {
      EXPECT_EQ(all[2 * q], 1.5f * q);
      EXPECT_EQ(all[2 * q + 1], -1.0f * q);
    }
    const std::vector<int32_t> ints = scalelab::all_gather_values(comm, std::vector<int32_t>{r + 5}, "gather i");
    for (int q = 0; q < n; ++q) EXPECT_EQ(ints[q], q + 5);
  });
}

TEST(HostValues, StringsBroadcastAndGather) {
  on_both_backends([](Communicator& comm) {
    const int r = comm.rank(), n = comm.size();
    const std::string id = "20261204-230044-9f3e";
    EXPECT_EQ(scalelab::broadcast_string(comm, r == 0 ? id : "not mine", 0, "run id"), id);
    const std::string long_text(3000, 'x');
    EXPECT_EQ(scalelab::broadcast_string(comm, long_text, 0, "cut"), std::string(1023, 'x')) << "cut at max_bytes";
    EXPECT_EQ(scalelab::broadcast_string(comm, "abcdef", 0, "short", /*max_bytes=*/4), "abcd");
    EXPECT_EQ(scalelab::broadcast_string(comm, r == n - 1 ? "" : "x", n - 1, "empty"), "");
    const std::vector<std::string> all = scalelab::all_gather_strings(comm, std::string(r * 3, 'a' + r), "strings");
    ASSERT_EQ(all.size(), static_cast<size_t>(n));
    for (int q = 0; q < n; ++q) EXPECT_EQ(all[q], std::string(q * 3, 'a' + q));
  });
}

// On the mpi backend a helper is the all_reduce of a CPU tensor it replaced: the same bits, even for values
// whose f32 sum depends on the order of the additions. 2^24, 1, -2^24, 1 on ranks 0-3: the exact sum is 2,
// MPI's f32 sum 1 or 2 (2^24 + 1 rounds to 2^24), so a helper that added otherwise (in double, say) would
// show at 4 ranks. (Two f32 values always add to the correctly rounded sum: 2 ranks cannot tell.)
TEST(HostValues, OnTheMpiBackendTheSameBitsAsAHostTensor) {
  Communicator& comm = test::world();
  const int r = comm.rank();
  const float x = r % 4 == 0 ? 16777216.0f : r % 4 == 2 ? -16777216.0f : 1.0f;
  Tensor t = Tensor::empty({1}, scalelab::DType::F32);
  t.data<float>()[0] = x;
  comm.all_reduce(t, ReduceOp::Sum, "host tensor");
  const float helper = all_reduce_value(comm, x, ReduceOp::Sum, "helper");
  EXPECT_EQ(std::memcmp(&helper, t.data<float>(), sizeof(float)), 0) << helper << " vs " << t.data<float>()[0];
}

}  // namespace
