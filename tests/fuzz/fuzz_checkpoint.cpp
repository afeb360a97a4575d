// fuzz_checkpoint.cpp — libFuzzer target: the checkpoint reader (common/src/model/checkpoint.cpp) on any
// bytes. Every input must open and give every section back, or be refused with scalelab::Error; a crash, a
// sanitizer report or a hang is a finding. Built with -DSL_FUZZ=ON (tests/fuzz/CMakeLists.txt).
#include <cstddef>  // defines: size_t
#include <cstdint>  // defines: uint8_t
#include <string>

#include <nlohmann/json.hpp>  // defines: nlohmann::json::exception

#include "fuzz_input.h"                 // defines: fuzz::input_file
#include "scalelab/core/error.h"        // defines: scalelab::Error
#include "scalelab/model/checkpoint.h"  // defines: CheckpointReader

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = scalelab::fuzz::input_file("ckpt", data, size);
  if (path.empty()) return 0;
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
