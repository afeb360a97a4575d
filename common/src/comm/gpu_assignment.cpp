// gpu_assignment.cpp — a rank's GPU and the no-sharing check of the nccl backend (scalelab/comm/gpu_assignment.h).
#include "scalelab/comm/gpu_assignment.h"

#include "scalelab/core/error.h"  // defines: SL_CHECK_HINT

namespace scalelab {

int gpu_for_local_rank(int local_rank, int visible_gpus) {
  SL_CHECK_HINT(visible_gpus >= 1, "the nccl backend needs a GPU per rank; on a CPU use --backend mpi",
                "no CUDA device visible (local rank %d)", local_rank);
  SL_CHECK_HINT(local_rank >= 0, "the launcher's local rank is never negative", "local rank %d", local_rank);
  return local_rank % visible_gpus;
}

std::pair<int, int> first_shared_gpu(const std::vector<std::string>& uuid_of_rank) {
  for (size_t r = 0; r < uuid_of_rank.size(); ++r) {
    for (size_t q = r + 1; q < uuid_of_rank.size(); ++q) {
      if (uuid_of_rank[r] == uuid_of_rank[q]) return {static_cast<int>(r), static_cast<int>(q)};
    }
  }
  return {-1, -1};
}

}  // namespace scalelab
