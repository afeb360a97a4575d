// threads.h — one place that sets the CPU thread count for OpenMP loops and OpenBLAS together.
// With several ranks per machine each rank gets cores / ranks_per_node threads (at least 1), so BLAS
// never oversubscribes the cores (docs/design.md "Platform facts"); learners need not set env variables.
#pragma once

namespace scalelab {

// n > 0: use n threads. n == 0: default = hardware cores / local ranks (OMPI_COMM_WORLD_LOCAL_SIZE),
// unless OMP_NUM_THREADS is set, which wins. Returns the number now in use.
int set_num_threads(int n = 0);
int num_threads();
// Number of ranks on this node as the launcher says (OpenMPI, Slurm), 1 when run directly.
int local_ranks_from_env();

}  // namespace scalelab
