// fixture.cpp — the fixture reader and tensors_close (fixture.h).
#include "fixture.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

#include "scalelab/core/error.h"  // defines: SL_CHECK, SL_CHECK_HINT
#include "scalelab/ops/ops.h"     // defines: cast

#ifndef SL_SOURCE_DIR
#error "SL_SOURCE_DIR (the repository root) must be defined by CMake (tests/CMakeLists.txt)"
#endif

namespace scalelab::test {

const Fixture& Fixture::load(const std::string& file_name) {
  // Cache: one parse per file per process (gtest runs every TEST of a program in one process).
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Fixture>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(file_name);
  if (it != cache.end()) return *it->second;

  auto fx = std::make_unique<Fixture>();
  fx->path_ = std::string(SL_SOURCE_DIR) + "/tests/fixtures/" + file_name;
  std::ifstream in(fx->path_);
  SL_CHECK_HINT(in.good(),
                "the fixtures are committed under tests/fixtures/; regenerate with "
                "tests/fixtures/gen_gpt2_fixture.py (see its header)",
                "cannot open fixture %s", fx->path_.c_str());
  try {
    fx->json_ = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    SL_CHECK_HINT(false, "regenerate the fixture (tests/fixtures/gen_gpt2_fixture.py)", "cannot parse %s: %s",
                  fx->path_.c_str(), e.what());
  }
  return *cache.emplace(file_name, std::move(fx)).first->second;
}

GPTConfig Fixture::config() const {
  SL_CHECK(json_.contains("config"), "fixture %s has no \"config\"", path_.c_str());
  const auto& c = json_["config"];
  GPTConfig cfg;
  cfg.max_seq_len = c.at("max_seq_len").get<int>();
  cfg.vocab_size = c.at("vocab_size").get<int>();
  cfg.n_layer = c.at("n_layer").get<int>();
  cfg.n_head = c.at("n_head").get<int>();
  cfg.n_embd = c.at("n_embd").get<int>();
  return cfg;
}

int Fixture::B() const { return static_cast<int>(number("B")); }
int Fixture::T() const { return static_cast<int>(number("T")); }

double Fixture::number(const std::string& key) const {
  SL_CHECK(json_.contains(key) && json_[key].is_number(), "fixture %s has no number \"%s\"", path_.c_str(),
           key.c_str());
  return json_[key].get<double>();
}

const nlohmann::json& Fixture::tensor_entry(const std::string& name) const {
  SL_CHECK(has(name), "fixture %s has no tensor \"%s\"", path_.c_str(), name.c_str());
  return json_["tensors"][name];
}

bool Fixture::has(const std::string& name) const {
  return json_.contains("tensors") && json_["tensors"].contains(name);
}

Shape Fixture::shape(const std::string& name) const { return tensor_entry(name).at("shape").get<Shape>(); }

std::vector<double> Fixture::array(const std::string& name) const {
  const auto& e = tensor_entry(name);
  std::vector<double> data = e.at("data").get<std::vector<double>>();
  SL_CHECK(static_cast<int64_t>(data.size()) == numel_of(shape(name)), "fixture tensor %s: %zu values for shape %s",
           name.c_str(), data.size(), shape_str(shape(name)).c_str());
  return data;
}

std::vector<float> Fixture::array_f32(const std::string& name) const {
  std::vector<double> d = array(name);
  return std::vector<float>(d.begin(), d.end());  // round to nearest fp32
}

std::vector<double> Fixture::values(const std::vector<std::string>& path) const {
  const nlohmann::json* node = &json_;
  std::string where;
  for (const std::string& key : path) {
    where += "/" + key;
    SL_CHECK(node->contains(key), "fixture %s has no \"%s\"", path_.c_str(), where.c_str());
    node = &(*node)[key];
  }
  return node->get<std::vector<double>>();
}

Tensor Fixture::int_tensor(const std::string& key) const {
  SL_CHECK(json_.contains(key) && json_[key].is_array(), "fixture %s has no int array \"%s\"", path_.c_str(),
           key.c_str());
  std::vector<int32_t> v = json_[key].get<std::vector<int32_t>>();
  SL_CHECK(static_cast<int64_t>(v.size()) == int64_t{B()} * T(), "\"%s\" has %zu values, expected B*T = %d*%d",
           key.c_str(), v.size(), B(), T());
  Tensor t = Tensor::empty({B(), T()}, DType::I32);  // (B,T) i32, CPU
  std::memcpy(t.data<int32_t>(), v.data(), v.size() * sizeof(int32_t));
  return t;
}

void Fixture::load_params(GPT2& model, const std::string& prefix) const {
  for (const ParamInfo& info : model.param_table()) {
    const std::string key = prefix + info.name;
    SL_CHECK(shape(key) == info.shape, "parameter %s: model shape %s, fixture \"%s\" shape %s", info.name.c_str(),
             shape_str(info.shape).c_str(), key.c_str(), shape_str(shape(key)).c_str());
    std::vector<float> h_values = array_f32(key);
    Tensor h_f32 = Tensor::empty(info.shape, DType::F32);  // host staging, fp32
    std::memcpy(h_f32.data<float>(), h_values.data(), h_values.size() * sizeof(float));
    Tensor dst = model.param(info.name);  // a view into the model's unit buffer
    if (dst.dtype() == DType::F32) {
      dst.copy_from(h_f32);  // any device
    } else {
      Tensor h_cast = Tensor::empty(info.shape, dst.dtype());  // e.g. bf16, round to nearest even
      cast(h_cast, h_f32);
      dst.copy_from(h_cast);
    }
  }
}

::testing::AssertionResult tensors_close(const std::string& name, const float* actual,
                                         const std::vector<double>& expected, double rtol, double atol) {
  const int64_t n = static_cast<int64_t>(expected.size());
  // All arithmetic in double, so the check itself adds no error worth mentioning.
  double err2 = 0, ref2 = 0, act2 = 0, max_abs = 0;
  int64_t max_idx = 0;
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) {
    const double a = actual[i], b = expected[i], d = std::fabs(a - b);
    if (!std::isfinite(a)) finite = false;
    err2 += d * d;
    ref2 += b * b;
    act2 += a * a;
    if (d > max_abs || !std::isfinite(d)) {
      max_abs = d;
      max_idx = i;
    }
  }
  const double err = std::sqrt(err2), ref = std::sqrt(ref2), act = std::sqrt(act2);
  const double bound = rtol * ref + atol * std::sqrt(static_cast<double>(n));
  const double rel = ref > 0 ? err / ref : err;

  if (finite && err <= bound) {
    // margin = bound / error: how many times the error would have to grow before the test fails
    std::printf("  [fixture] ok  %-38s n=%-5lld max|a-b|=%.2e @%-5lld ||a-b||/||b||=%.2e  margin %.0fx\n", name.c_str(),
                static_cast<long long>(n), max_abs, static_cast<long long>(max_idx), rel,
                err > 0 ? bound / err : INFINITY);
    return ::testing::AssertionSuccess();
  }

  std::ostringstream os;
  os.precision(9);
  os << name << ": n=" << n << (finite ? "" : " (NON-FINITE values in actual)") << "\n"
     << "  ||a-b||=" << err << "  >  bound rtol*||b|| + atol*sqrt(n) = " << rtol << "*" << ref << " + " << atol
     << "*sqrt(" << n << ") = " << bound << "\n"
     << "  ||a||=" << act << "  ||b||=" << ref << "  ||a-b||/||b||=" << rel << "\n"
     << "  max |a-b| = " << max_abs << " at index " << max_idx << " (actual " << actual[max_idx] << ", expected "
     << expected[max_idx] << ")\n"
     << "  first differing indices (|a-b| > rtol*|b| + atol):";
  int shown = 0;
  for (int64_t i = 0; i < n && shown < 5; ++i) {
    const double a = actual[i], b = expected[i];
    if (!(std::fabs(a - b) <= rtol * std::fabs(b) + atol)) {
      os << "\n    [" << i << "] actual " << a << "  expected " << b << "  diff " << a - b;
      ++shown;
    }
  }
  if (shown == 0) os << " none (the error is spread thinly over many elements)";
  return ::testing::AssertionFailure() << os.str();
}

::testing::AssertionResult tensors_close(const std::string& name, const Tensor& actual,
                                         const std::vector<double>& expected, double rtol, double atol) {
  if (actual.dtype() != DType::F32 || actual.device() != Device::CPU || actual.numel() != int64_t(expected.size())) {
    return ::testing::AssertionFailure() << name << ": expected a CPU f32 tensor of " << expected.size()
                                         << " elements, got " << dtype_name(actual.dtype()) << " "
                                         << shape_str(actual.shape())
                                         << (actual.device() == Device::CPU ? " on CPU" : " on CUDA");
  }
  return tensors_close(name, actual.data<float>(), expected, rtol, atol);
}

}  // namespace scalelab::test
