// gpu_assignment.h — which GPU a rank of the nccl backend takes, and the check that no two ranks share
// one. Pure functions (no CUDA, no MPI), so they are tested on any machine; common/src/comm/nccl.cpp calls
// them with cudaGetDeviceCount and the device UUIDs of all ranks.
// Tests: tests/common/comm/test_gpu_assignment.cpp
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace scalelab {

// The CUDA device index of the local_rank-th rank of a node that sees visible_gpus GPUs:
// local_rank % visible_gpus. One GPU per rank, each seeing all of them (mpirun -np 8 on 8 GPUs): rank k
// takes GPU k. Each rank seeing only its own (Slurm --gpus-per-task=1, CUDA_VISIBLE_DEVICES per rank):
// every rank takes device 0, which is a different GPU for each. More ranks than GPUs map two ranks to one
// GPU; first_shared_gpu then refuses the run with their names. Throws scalelab::Error when
// visible_gpus < 1 or local_rank < 0.
int gpu_for_local_rank(int local_rank, int visible_gpus);

// The first pair (r, q), r < q, of ranks whose GPUs have the same UUID ("GPU-1a2b..."), or (-1, -1) when
// every rank has a GPU of its own. NCCL refuses two ranks on one GPU ("Duplicate GPU detected").
std::pair<int, int> first_shared_gpu(const std::vector<std::string>& uuid_of_rank);

}  // namespace scalelab
