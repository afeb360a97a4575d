// fuzz_input.h — the libFuzzer targets' common step: the readers take a path (they map or stream the file),
// so each input is written to a file of this process's own, /tmp/sl_fuzz_<stem>_<pid>.bin, rewritten per input.
#pragma once

#include <unistd.h>  // defines: getpid

#include <cstddef>  // defines: size_t
#include <cstdint>  // defines: uint8_t
#include <cstdio>   // defines: std::fopen, std::fwrite
#include <string>

namespace scalelab::fuzz {

// The file now holding data[0, size); "" when it cannot be written (the input is then skipped).
inline std::string input_file(const char* stem, const uint8_t* data, size_t size) {
  const std::string path = "/tmp/sl_fuzz_" + std::string(stem) + "_" + std::to_string(::getpid()) + ".bin";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return "";
  const bool written = std::fwrite(data, 1, size, f) == size;
  return std::fclose(f) == 0 && written ? path : "";
}

}  // namespace scalelab::fuzz
