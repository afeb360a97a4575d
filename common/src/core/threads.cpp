// threads.cpp — CPU thread count for OpenMP and OpenBLAS together (threads.h).
#include "scalelab/core/threads.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

extern "C" void openblas_set_num_threads(int num_threads);  // OpenBLAS extension (cblas.h declares it too)

namespace scalelab {

int local_ranks_from_env() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}) {
    if (const char* v = std::getenv(var)) {
      const int n = std::atoi(v);
      if (n > 0) return n;
    }
  }
  return 1;
}

int set_num_threads(int n) {
  if (n <= 0) {
    if (const char* v = std::getenv("OMP_NUM_THREADS"); v && std::atoi(v) > 0) {
      n = std::atoi(v);
    } else {
      const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      n = std::max(1, cores / local_ranks_from_env());
    }
  }
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
  return n;
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace scalelab
