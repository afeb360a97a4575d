// batch.cpp — a batch into a model's tensors, and the loader state's 64-byte record (scalelab/data/batch.h).
#include "scalelab/data/batch.h"

#include <algorithm>  // defines: std::copy
#include <cstring>    // defines: std::memcmp, std::memcpy

#include "little_endian.h"        // defines: detail::store_le, load_le
#include "scalelab/core/error.h"  // defines: SL_CHECK, SL_CHECK_HINT

namespace scalelab::data {

using detail::load_le;
using detail::store_le;

void load_batch(const Batch& b, Tensor& x, Tensor& y) {
  const Shape want{b.B, b.T};
  SL_CHECK(x.shape() == want && y.shape() == want && x.dtype() == DType::I32 && y.dtype() == DType::I32,
           "batch is (%d, %d) i32; inputs %s and targets %s must be the same", b.B, b.T, shape_str(x.shape()).c_str(),
           shape_str(y.shape()).c_str());
  Tensor h_x = Tensor::empty(want, DType::I32, Device::CPU, MemCategory::Data);  // (B, T) staging on the host
  Tensor h_y = Tensor::empty(want, DType::I32, Device::CPU, MemCategory::Data);  // (B, T)
  std::copy(b.inputs.begin(), b.inputs.end(), h_x.data<int32_t>());
  std::copy(b.targets.begin(), b.targets.end(), h_y.data<int32_t>());
  x.copy_from(h_x);
  y.copy_from(h_y);
}

// =============================================================================================
// LoaderState: 64 bytes, little-endian
// =============================================================================================
//   0 magic "SLLOADR1" | 8 u32 version=1 | 12 u32 B | 16 u32 T | 20 u32 dp_size | 24 u32 dp_rank
//   28 u32 shuffle | 32 u64 seed | 40 u64 epoch | 48 u64 batch_in_epoch | 56 u64 tokens_total
namespace {
constexpr char kStateMagic[9] = "SLLOADR1";
constexpr uint32_t kStateVersion = 1;
}  // namespace

std::vector<uint8_t> LoaderState::to_bytes() const {
  std::vector<uint8_t> b(kBytes, 0);
  std::memcpy(b.data(), kStateMagic, 8);
  store_le(&b[8], kStateVersion, 4);
  store_le(&b[12], static_cast<uint32_t>(B), 4);
  store_le(&b[16], static_cast<uint32_t>(T), 4);
  store_le(&b[20], static_cast<uint32_t>(dp_size), 4);
  store_le(&b[24], static_cast<uint32_t>(dp_rank), 4);
  store_le(&b[28], shuffle ? 1 : 0, 4);
  store_le(&b[32], seed, 8);
  store_le(&b[40], static_cast<uint64_t>(epoch), 8);
  store_le(&b[48], static_cast<uint64_t>(batch_in_epoch), 8);
  store_le(&b[56], static_cast<uint64_t>(tokens_total), 8);
  return b;
}

LoaderState LoaderState::from_bytes(const std::vector<uint8_t>& b) {
  SL_CHECK_HINT(b.size() == kBytes, "pass exactly the bytes LoaderState::to_bytes() returned",
                "loader state is %zu bytes, expected %zu", b.size(), kBytes);
  SL_CHECK_HINT(std::memcmp(b.data(), kStateMagic, 8) == 0, "was this record written by LoaderState::to_bytes()?",
                "not a loader state (first 8 bytes are not \"SLLOADR1\")");
  const uint32_t version = static_cast<uint32_t>(load_le(&b[8], 4));
  SL_CHECK_HINT(version == kStateVersion, "this checkpoint comes from another scalelab version",
                "unsupported loader state version %u (this build reads %u)", version, kStateVersion);
  LoaderState s;
  s.B = static_cast<int32_t>(load_le(&b[12], 4));
  s.T = static_cast<int32_t>(load_le(&b[16], 4));
  s.dp_size = static_cast<int32_t>(load_le(&b[20], 4));
  s.dp_rank = static_cast<int32_t>(load_le(&b[24], 4));
  s.shuffle = load_le(&b[28], 4) != 0;
  s.seed = load_le(&b[32], 8);
  s.epoch = static_cast<int64_t>(load_le(&b[40], 8));
  s.batch_in_epoch = static_cast<int64_t>(load_le(&b[48], 8));
  s.tokens_total = static_cast<int64_t>(load_le(&b[56], 8));
  return s;
}

}  // namespace scalelab::data
