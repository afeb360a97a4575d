// host_values.cpp — collectives of host values through the communicator's device (host_values.h).
#include "scalelab/comm/host_values.h"

#include <algorithm>  // defines: std::max
#include <cstring>    // defines: std::memcpy
#include <string>
#include <vector>

#include "scalelab/core/error.h"    // defines: SL_FAIL
#include "scalelab/core/sim_gpu.h"  // defines: SimRealDataScope (--timing-only)
#include "scalelab/core/tensor.h"   // defines: Tensor, DType

namespace scalelab {

namespace {

// The dtype a host value travels as (the communicator moves f32, bf16 and i32).
DType dtype_for(float) { return DType::F32; }
DType dtype_for(int32_t) { return DType::I32; }

// A CPU tensor of the values: (n) f32 or i32.
template <typename T>
Tensor host_tensor(const std::vector<T>& values) {
  Tensor h = Tensor::empty({static_cast<int64_t>(values.size())}, dtype_for(T{}));
  if (!values.empty()) std::memcpy(h.raw(), values.data(), values.size() * sizeof(T));
  return h;
}

template <typename T>
std::vector<T> host_values(const Tensor& h) {
  std::vector<T> out(static_cast<size_t>(h.numel()));
  if (!out.empty()) std::memcpy(out.data(), h.raw(), out.size() * sizeof(T));
  return out;
}

// The tensor the communicator moves for host tensor h: h itself where the backend takes CPU tensors, else
// a copy on its device (a cudaMemcpy on a GPU; on the simulated one, charged to the host link).
Tensor on_device(Communicator& comm, const Tensor& h) {
  if (comm.device() == Device::CPU) return h;
  Tensor d = Tensor::empty(h.shape(), h.dtype(), comm.device(), MemCategory::Comm);
  d.copy_from(h);
  return d;
}

// An empty tensor for an output, on the communicator's device (or h itself on a CPU backend).
Tensor output_on_device(Communicator& comm, const Tensor& h) {
  if (comm.device() == Device::CPU) return h;
  return Tensor::empty(h.shape(), h.dtype(), comm.device(), MemCategory::Comm);
}

// Back to the host tensor (nothing to do when the communicator moved h itself).
void to_host(Tensor& h, const Tensor& d) {
  if (d.raw() != h.raw()) h.copy_from(d);
}

// An in-place collective (call: an all_reduce, a broadcast) of `values`, on a tensor of comm.device().
template <typename T, typename F>
std::vector<T> in_place_on_device(Communicator& comm, const std::vector<T>& values, F&& call) {
  SimRealDataScope real_data;  // --timing-only: host values are control, not arithmetic: they move for real
  Tensor h = host_tensor(values);
  Tensor d = on_device(comm, h);
  call(d);
  to_host(h, d);
  return host_values<T>(h);
}

template <typename T>
std::vector<T> all_reduce_on_device(Communicator& comm, const std::vector<T>& values, ReduceOp op,
                                    const std::string& tag) {
  return in_place_on_device(comm, values, [&](Tensor& d) { comm.all_reduce(d, op, tag); });
}

template <typename T>
std::vector<T> all_gather_on_device(Communicator& comm, const std::vector<T>& values, const std::string& tag) {
  SimRealDataScope real_data;  // as in in_place_on_device
  Tensor h_in = host_tensor(values);
  Tensor h_out = Tensor::empty({comm.size() * h_in.numel()}, h_in.dtype());  // (size * n)
  Tensor d_in = on_device(comm, h_in);
  Tensor d_out = output_on_device(comm, h_out);
  comm.all_gather(d_in, d_out, tag);
  to_host(h_out, d_out);
  return host_values<T>(h_out);
}

}  // namespace

std::vector<float> all_reduce_values(Communicator& comm, const std::vector<float>& values, ReduceOp op,
                                     const std::string& tag) {
  return all_reduce_on_device(comm, values, op, tag);
}

std::vector<int32_t> all_reduce_values(Communicator& comm, const std::vector<int32_t>& values, ReduceOp op,
                                       const std::string& tag) {
  return all_reduce_on_device(comm, values, op, tag);
}

float all_reduce_value(Communicator& comm, float x, ReduceOp op, const std::string& tag) {
  return all_reduce_on_device(comm, std::vector<float>{x}, op, tag)[0];
}

int32_t all_reduce_value(Communicator& comm, int32_t x, ReduceOp op, const std::string& tag) {
  return all_reduce_on_device(comm, std::vector<int32_t>{x}, op, tag)[0];
}

double all_reduce_value(Communicator& comm, double x, ReduceOp op, const std::string& tag) {
  std::vector<int32_t> mine(2);  // the double's 8 bytes as two i32 words
  std::memcpy(mine.data(), &x, sizeof(double));
  const std::vector<int32_t> all = all_gather_on_device(comm, mine, tag);
  double result = 0;
  for (int r = 0; r < comm.size(); ++r) {
    double v = 0;
    std::memcpy(&v, all.data() + 2 * r, sizeof(double));
    result = r == 0 ? v : op == ReduceOp::Max ? std::max(result, v) : result + v;
  }
  return op == ReduceOp::Avg ? result / comm.size() : result;
}

bool any_rank(Communicator& comm, bool flag, const std::string& tag) {
  return all_reduce_value(comm, static_cast<int32_t>(flag ? 1 : 0), ReduceOp::Max, tag) != 0;
}

std::vector<int32_t> broadcast_values(Communicator& comm, const std::vector<int32_t>& values, int root,
                                      const std::string& tag) {
  return in_place_on_device(comm, values, [&](Tensor& d) { comm.broadcast(d, root, tag); });
}

std::string broadcast_string(Communicator& comm, const std::string& s, int root, const std::string& tag,
                             int max_bytes) {
  SL_CHECK_HINT(max_bytes >= 0, "give the longest string's bytes, e.g. 1023", "broadcast_string: max_bytes %d",
                max_bytes);
  const size_t words = (static_cast<size_t>(max_bytes) + 1 + 3) / 4;  // room for a NUL, whole i32 words
  std::vector<int32_t> buf(words, 0);
  if (comm.rank() == root) std::memcpy(buf.data(), s.data(), std::min(s.size(), static_cast<size_t>(max_bytes)));
  buf = broadcast_values(comm, buf, root, tag);
  const char* bytes = reinterpret_cast<const char*>(buf.data());
  return std::string(bytes, strnlen(bytes, static_cast<size_t>(max_bytes)));
}

std::vector<float> all_gather_values(Communicator& comm, const std::vector<float>& values, const std::string& tag) {
  return all_gather_on_device(comm, values, tag);
}

std::vector<int32_t> all_gather_values(Communicator& comm, const std::vector<int32_t>& values, const std::string& tag) {
  return all_gather_on_device(comm, values, tag);
}

std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& s, const std::string& tag) {
  const int n = comm.size();
  // 1. Every rank's length, so each knows how much to expect.
  const std::vector<int32_t> lens =
      all_gather_values(comm, std::vector<int32_t>{static_cast<int32_t>(s.size())}, tag + " lengths");
  const int32_t max_len = *std::max_element(lens.begin(), lens.end());
  // 2. The bytes, padded to the longest string and packed into i32 words (4 bytes a word).
  const size_t words = (static_cast<size_t>(max_len) + 3) / 4;
  std::vector<int32_t> mine(words, 0);
  if (!s.empty()) std::memcpy(mine.data(), s.data(), s.size());
  const std::vector<int32_t> all = all_gather_values(comm, mine, tag + " bytes");
  std::vector<std::string> out(static_cast<size_t>(n));
  const char* bytes = reinterpret_cast<const char*>(all.data());
  for (int r = 0; r < n; ++r) out[r].assign(bytes + r * words * 4, static_cast<size_t>(lens[r]));
  return out;
}

}  // namespace scalelab
