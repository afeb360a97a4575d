// mpi_test.h — what a multi-rank test program (sl_add_mpi_test, cmake/scalelab.cmake) gets from its
// main(), tests/support/mpi/mpi_main.cpp: the world communicator, made by make_communicator("auto") (mpi under
// mpiexec; local, world size 1, when the program is run directly).
//
// Rules for the TEST bodies (docs/design.md "Tests and the grading contract"): every rank runs every
// TEST; never return early before a collective (no ASSERT_ that fails on one rank only, use EXPECT_
// or grading::all_ranks), so one failing rank never leaves the others waiting. mpi_main reduces the
// results: a TEST that fails on any rank is reported by rank 0 with the failing ranks, and every
// rank's exit status says whether all ranks passed.
#pragma once

#include "scalelab/comm/comm.h"  // defines: Communicator

namespace scalelab::test {

Communicator& world();  // the test program's world communicator (its own; the rank reducer has another)

}  // namespace scalelab::test
