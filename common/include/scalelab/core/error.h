// error.h — scalelab's error type and CHECK macros (docs/style.md 17-21).
// Every failure prints one block: what failed, file:line, function, the values, and a hint.
// Library code throws scalelab::Error; each main() catches it, prints it and exits non-zero.
// Tests: tests/common/core/test_error.cpp
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>

namespace scalelab {

// Base error for everything the kit raises. what() is the full multi-line report.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& report) : std::runtime_error(report) {}
};

// An allocation beyond the allocator's capacity cap (or a real allocation failure): "out of memory".
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

// A learner TODO that has not been written yet. The grader reports it as "not implemented".
class NotImplemented : public Error {
 public:
  // file/line default to the place of the `throw` (GCC/Clang builtins), so the message names the
  // learner's file: "labs/01_single_device/train_step.cpp:37".
  explicit NotImplemented(const std::string& todo_id, const char* file = __builtin_FILE(), int line = __builtin_LINE())
      : Error("[scalelab] not implemented: " + todo_id + " (" + repo_relative(file) + ":" + std::to_string(line) +
              ")\n[scalelab]   hint: fill in the TODO(" + todo_id.substr(0, todo_id.find(' ')) + ") block in " +
              repo_relative(file) + "; the lab README explains what it must compute"),
        todo(todo_id) {}
  std::string todo;  // e.g. "lab01-2 flops_per_token"

 private:
  // "/home/me/scalelab/labs/01_single_device/train_step.cpp" -> "labs/01_single_device/train_step.cpp"
  static std::string repo_relative(const std::string& path) {
    size_t first = std::string::npos;  // the earliest of the top-level folders' last occurrences
    for (const char* top : {"/labs/", "/solutions/", "/common/", "/tests/"}) {
      const size_t at = path.rfind(top);
      if (at != std::string::npos && (first == std::string::npos || at < first)) first = at;
    }
    return first == std::string::npos ? path : path.substr(first + 1);
  }
};

namespace detail {
// printf-style formatting into a std::string (used by the macros below).
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline std::string format() { return std::string(); }
// Builds the report block and throws ErrorT. kind: "check", "CUDA", "MPI", ...
[[noreturn]] void fail(const char* kind, const char* stmt, const char* file, int line, const char* func,
                       const std::string& message, const std::string& hint);
[[noreturn]] void fail_oom(const char* file, int line, const char* func, const std::string& message,
                           const std::string& hint);
}  // namespace detail

}  // namespace scalelab

// SL_CHECK(cond, fmt, ...): validate input; on failure throw Error with the formatted values.
//   SL_CHECK(C % NH == 0, "C=%d not divisible by NH=%d", C, NH);
#define SL_CHECK(cond, ...)                                                                                           \
  do {                                                                                                                \
    if (!(cond))                                                                                                      \
      ::scalelab::detail::fail("check", #cond, __FILE__, __LINE__, __func__, ::scalelab::detail::format(__VA_ARGS__), \
                               std::string());                                                                        \
  } while (0)

// SL_CHECK_HINT(cond, hint, fmt, ...): as SL_CHECK, with a line telling the user what to do.
#define SL_CHECK_HINT(cond, hint, ...)                                                                                \
  do {                                                                                                                \
    if (!(cond))                                                                                                      \
      ::scalelab::detail::fail("check", #cond, __FILE__, __LINE__, __func__, ::scalelab::detail::format(__VA_ARGS__), \
                               (hint));                                                                               \
  } while (0)

// SL_FAIL(hint, fmt, ...): unconditional error (bad input found by a loop, an unreachable case).
#define SL_FAIL(hint, ...) \
  ::scalelab::detail::fail("error", "", __FILE__, __LINE__, __func__, ::scalelab::detail::format(__VA_ARGS__), (hint))

// SL_MPI_CHECK(call): wrap every MPI call; the MPI error string is part of the report.
#define SL_MPI_CHECK(call)                                                                       \
  do {                                                                                           \
    int sl_mpi_rc_ = (call);                                                                     \
    if (sl_mpi_rc_ != 0 /* MPI_SUCCESS */)                                                       \
      ::scalelab::detail::fail("MPI", #call, __FILE__, __LINE__, __func__,                       \
                               ::scalelab::detail::format("MPI error code %d", sl_mpi_rc_),      \
                               "run under mpirun; see the lab README's 'If it hangs or fails'"); \
  } while (0)
