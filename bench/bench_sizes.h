// bench_sizes.h — the size argument of the plain-MPI baselines (bench/mpi_allreduce_plain.cpp,
// bench/mpi_sendrecv_plain.cpp): "1M" -> 1048576 bytes, K, M, G powers of 1024 as in lab00_setup and
// nccl-tests' -b/-e. Header-only: each baseline is one program of its own.
#pragma once

#include <cctype>  // defines: std::isdigit, std::toupper
#include <string>

// Bytes of `s` (digits, then optionally K, M or G); -1 when it is not a size.
inline long long parse_bytes(const std::string& s) {
  size_t digits = 0;
  while (digits < s.size() && std::isdigit(static_cast<unsigned char>(s[digits]))) ++digits;
  if (digits == 0 || digits + 1 < s.size()) return -1;
  long long v = std::stoll(s.substr(0, digits));
  if (digits < s.size()) {
    const char unit = static_cast<char>(std::toupper(static_cast<unsigned char>(s[digits])));
    if (unit != 'K' && unit != 'M' && unit != 'G') return -1;
    v <<= unit == 'K' ? 10 : unit == 'M' ? 20 : 30;
  }
  return v;
}
