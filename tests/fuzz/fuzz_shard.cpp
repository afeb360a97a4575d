// fuzz_shard.cpp — libFuzzer target: the token shard reader (common/src/data/shard.cpp) on any bytes.
// Every input must open and read to the end, or be refused with scalelab::Error; a crash, a sanitizer
// report or a hang is a finding. Built with -DSL_FUZZ=ON (tests/fuzz/CMakeLists.txt); run by scripts/fuzz.sh.
#include <unistd.h>  // defines: getpid

#include <cstddef>  // defines: size_t
#include <cstdint>  // defines: uint8_t, int32_t
#include <cstdio>   // defines: std::fopen, std::fwrite
#include <string>
#include <vector>

#include "scalelab/core/error.h"  // defines: scalelab::Error
#include "scalelab/data/shard.h"  // defines: MappedShard, read_shard

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The readers take a path (they map the file): the input goes to a file of this process's own.
  static const std::string path = "/tmp/sl_fuzz_shard_" + std::to_string(::getpid()) + ".bin";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  for (bool verify : {false, true}) {
    try {
      scalelab::data::MappedShard shard(path, verify);
      const int64_t n = shard.token_count();
      std::vector<int32_t> out(static_cast<size_t>(n < 4096 ? n : 4096));
      if (!out.empty())
        shard.copy_tokens(n - static_cast<int64_t>(out.size()), static_cast<int64_t>(out.size()), out.data());
    } catch (const scalelab::Error&) {
    }
  }
  try {
    (void)scalelab::data::read_shard(path);
  } catch (const scalelab::Error&) {
  }
  return 0;
}
