// failures_only_printer.h — the GoogleTest printer for ranks other than 0 in multi-rank test programs
// (tests/grading/graded_main.cpp, tests/support/mpi/mpi_main.cpp): their passes are noise, their failures are not.
#pragma once

#include <gtest/gtest.h>  // defines: EmptyTestEventListener, TestPartResult

#include <cstdio>  // defines: std::printf, std::fflush

namespace scalelab::test {

class FailuresOnlyPrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailuresOnlyPrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& part) override {
    if (!part.failed()) return;
    std::printf("[rank %d] %s:%d: Failure\n%s\n", rank_, part.file_name() ? part.file_name() : "?", part.line_number(),
                part.message());
    std::fflush(stdout);
  }

 private:
  int rank_;
};

}  // namespace scalelab::test
