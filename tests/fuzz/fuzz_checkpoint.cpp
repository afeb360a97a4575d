// fuzz_checkpoint.cpp — libFuzzer target: the checkpoint reader (common/src/model/checkpoint.cpp) on any
// bytes. Every input must open and give every section back, or be refused with scalelab::Error; a crash, a
// sanitizer report or a hang is a finding. Built with -DSL_FUZZ=ON (tests/fuzz/CMakeLists.txt).
#include <unistd.h>  // defines: getpid

#include <cstddef>  // defines: size_t
#include <cstdint>  // defines: uint8_t
#include <cstdio>   // defines: std::fopen, std::fwrite
#include <string>

#include <nlohmann/json.hpp>  // defines: nlohmann::json::exception

#include "scalelab/core/error.h"        // defines: scalelab::Error
#include "scalelab/model/checkpoint.h"  // defines: CheckpointReader

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/sl_fuzz_ckpt_" + std::to_string(::getpid()) + ".bin";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  for (bool verify : {false, true}) {
    try {
      scalelab::CheckpointReader reader(path, verify);
      for (const std::string& name : reader.names()) {
        try {
          (void)reader.bytes(name);
          (void)reader.json(name);  // most sections are not JSON: refused, never a crash
        } catch (const scalelab::Error&) {
        } catch (const nlohmann::json::exception&) {  // a section that is not JSON: also a refusal
        }
      }
    } catch (const scalelab::Error&) {
    }
  }
  return 0;
}
