// test_gpu_assignment.cpp — the nccl backend's choice of GPU per rank and its no-sharing check
// (scalelab/comm/gpu_assignment.h), on plain numbers: the backend itself needs several GPUs. The old
// choice, device = local_rank, refused a launch that gives each rank one visible GPU (Slurm
// --gpus-per-task=1: 4 ranks on a node, 1 GPU visible to each).
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "expect_error.h"                  // defines: expect_error_containing
#include "scalelab/comm/gpu_assignment.h"  // defines: gpu_for_local_rank, first_shared_gpu

using scalelab::first_shared_gpu;
using scalelab::gpu_for_local_rank;

TEST(GpuAssignment, EachRankSeeingEveryGpuTakesItsLocalIndex) {
  for (int k = 0; k < 8; ++k) EXPECT_EQ(gpu_for_local_rank(k, 8), k);
}

TEST(GpuAssignment, EachRankSeeingOnlyItsOwnGpuTakesDeviceZero) {
  for (int k = 0; k < 4; ++k) EXPECT_EQ(gpu_for_local_rank(k, 1), 0) << "local rank " << k;
  EXPECT_EQ(gpu_for_local_rank(3, 2), 1);  // 2 GPUs visible per rank pair
}

TEST(GpuAssignment, NoGpuIsRefusedWithAHint) {
  scalelab::test::expect_error_containing([] { (void)gpu_for_local_rank(0, 0); },
                                          {"no CUDA device visible", "--backend mpi"});
}

TEST(GpuAssignment, TwoRanksOnOneGpuAreFound) {
  // Slurm --gpus-per-task: every rank's device 0, all different.
  EXPECT_EQ(first_shared_gpu({"GPU-aa", "GPU-bb", "GPU-cc", "GPU-dd"}), std::make_pair(-1, -1));
  // 3 ranks, 2 GPUs, each rank seeing both: ranks 0 and 2 take GPU 0.
  std::vector<std::string> uuid;
  for (int k = 0; k < 3; ++k) uuid.push_back(k % 2 == 0 ? "GPU-aa" : "GPU-bb");
  EXPECT_EQ(first_shared_gpu(uuid), std::make_pair(0, 2));
  EXPECT_EQ(first_shared_gpu({}), std::make_pair(-1, -1));
  EXPECT_EQ(first_shared_gpu({"GPU-aa"}), std::make_pair(-1, -1));
}
