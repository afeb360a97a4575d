// error.cpp — formatting of scalelab's error reports (error.h).
#include "scalelab/core/error.h"

#include <cstdarg>
#include <cstdlib>
#include <string>

namespace scalelab::detail {

std::string format(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string s(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(s.data(), s.size() + 1, fmt, ap2);
  va_end(ap2);
  return s;
}

// The rank, when launched by mpirun or srun (the communicator is not needed to know it).
static std::string rank_suffix() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* v = std::getenv(var)) return std::string(" rank ") + v;
  }
  return std::string();
}

static std::string report(const char* kind, const char* stmt, const char* file, int line, const char* func,
                          const std::string& message, const std::string& hint) {
  std::string r = "[scalelab] " + std::string(kind) + " failed in " + func + " (" + file + ":" + std::to_string(line) +
                  ")" + rank_suffix();
  if (!message.empty()) r += "\n[scalelab]   " + message;
  if (stmt && *stmt) r += "\n[scalelab]   stmt: " + std::string(stmt);
  if (!hint.empty()) r += "\n[scalelab]   hint: " + hint;
  return r;
}

void fail(const char* kind, const char* stmt, const char* file, int line, const char* func, const std::string& message,
          const std::string& hint) {
  throw Error(report(kind, stmt, file, line, func, message, hint));
}

void fail_oom(const char* file, int line, const char* func, const std::string& message, const std::string& hint) {
  throw OutOfMemory(report("allocation", "", file, line, func, message, hint));
}

}  // namespace scalelab::detail
