// fixture.h — reads the PyTorch reference fixtures (tests/fixtures/*.json, written by
// tests/fixtures/gen_gpt2_fixture.py) and compares our fp32 tensors with their float64 values.
// Part of sl_test_support (tests/CMakeLists.txt). Used by tests/common/model/test_gpt2_fixture.cpp.
// The JSON layout is documented at the top of the generator script.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>  // defines: nlohmann::json

#include "scalelab/model/gpt2.h"   // defines: GPTConfig, GPT2
#include "scalelab/core/tensor.h"  // defines: Tensor, Shape

namespace scalelab::test {

// One fixture file, parsed once. Every accessor throws scalelab::Error naming the missing key.
class Fixture {
 public:
  // Reads SL_SOURCE_DIR "/tests/fixtures/<file_name>", e.g. Fixture::load("gpt2_tiny.json").
  // Parsed files are cached, so each test may call this without re-reading 0.5 MB of JSON.
  static const Fixture& load(const std::string& file_name);

  const nlohmann::json& json() const { return json_; }  // the whole document
  const std::string& path() const { return path_; }

  GPTConfig config() const;                     // "config" as a GPTConfig
  int B() const;                                // batch size of "tokens"/"targets"
  int T() const;                                // sequence length
  double number(const std::string& key) const;  // a top-level number, e.g. "loss"

  // Named arrays under "tensors" (parameters "<name>", gradients "grad.<name>", "logits", ...),
  // flat in row-major order (last index fastest), as float64 or rounded to fp32.
  bool has(const std::string& name) const;
  Shape shape(const std::string& name) const;
  std::vector<double> array(const std::string& name) const;
  std::vector<float> array_f32(const std::string& name) const;

  // A top-level array of numbers, e.g. json()["adamw"]["losses"] via values({"adamw", "losses"}).
  std::vector<double> values(const std::vector<std::string>& path) const;

  // "tokens" or "targets" as a (B,T) i32 tensor on the CPU.
  Tensor int_tensor(const std::string& key) const;

  // Copies every parameter of `model` from the tensor "<prefix><name>" (prefix "" = the initial
  // parameters, "adamw_final." = after the AdamW steps) into model.param(name), converting to the
  // model's parameter dtype (fp32, or bf16 with round-to-nearest-even via scalelab::cast) and
  // copying to its device. Throws if a name is missing or a shape differs.
  void load_params(GPT2& model, const std::string& prefix = "") const;

 private:
  const nlohmann::json& tensor_entry(const std::string& name) const;
  std::string path_;
  nlohmann::json json_;
};

// Per-tensor closeness in the L2 sense (the fixture issue's criterion):
//   ||actual - expected||_2 <= rtol * ||expected||_2 + atol * sqrt(n)
// A relative bound on the whole tensor tolerates the rounding noise of fp32 sums in any order,
// while an elementwise rtol would fail on the entries that are nearly zero by cancellation.
// atol * sqrt(n) is the same bound for a tensor whose expected values are (nearly) all zero: an
// RMS error of atol per element. `actual` must point at expected.size() floats (host memory).
// On success prints one line (max error and margin, as llm.c's check_tensor does); on failure the
// message gives n, the norms, the bound, the max abs error with its index and the first 5 indices
// whose elementwise error exceeds rtol*|expected| + atol, with both values (docs/style.md 29).
::testing::AssertionResult tensors_close(const std::string& name, const float* actual,
                                         const std::vector<double>& expected, double rtol, double atol);
// Convenience: a host fp32 tensor (e.g. model.grad(name)) against a fixture array.
::testing::AssertionResult tensors_close(const std::string& name, const Tensor& actual,
                                         const std::vector<double>& expected, double rtol, double atol);

}  // namespace scalelab::test
