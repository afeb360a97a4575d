// fuzz_shard.cpp — libFuzzer target: the token shard reader (common/src/data/shard.cpp) on any bytes.
// Every input must open and read to the end, or be refused with scalelab::Error; a crash, a sanitizer
// report or a hang is a finding. Built with -DSL_FUZZ=ON (tests/fuzz/CMakeLists.txt); run by scripts/fuzz.sh.
#include <cstddef>  // defines: size_t
#include <cstdint>  // defines: uint8_t, int32_t
#include <string>
#include <vector>

#include "fuzz_input.h"           // defines: fuzz::input_file
#include "scalelab/core/error.h"  // defines: scalelab::Error
#include "scalelab/data/shard.h"  // defines: MappedShard, read_shard

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = scalelab::fuzz::input_file("shard", data, size);
  if (path.empty()) return 0;
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
