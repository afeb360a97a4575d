// dispatch.cpp — the Tensor-level GPT-2 ops (scalelab::<op>, declared in scalelab/ops/ops.h): the one
// dispatch point of every op (docs/style.md 26). Each op checks dtypes, shapes and devices, naming the offending
// tensor and its shape (the same checks for both devices), then hands its tensors' pointers and sizes to
// run_twin, which calls the twin of their device: scalelab::cuda::<op> (common/src/ops/cuda/) for CUDA
// tensors, scalelab::cpu::<op> (common/src/ops/cpu/) otherwise, both declared once in scalelab/ops/twins.h.
// In a build without the CUDA backend, CUDA tensors throw with a hint. On the simulated GPU (Device::SIM) the
// CPU twin computes and the op's modelled time (its op_cost:: from the shapes checked here) is charged to
// the virtual clock. Every op is device code (DeviceCodeScope, tensor.h): it reads its tensors' memory.
// Tests: tests/common/ops/test_ops_cpu.cpp, tests/common/ops/test_ops_cuda.cpp
#include <chrono>  // defines: std::chrono::steady_clock (the op profile)
#include <climits>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <utility>

#include "scalelab/core/clock.h"      // defines: VirtualClock (the simulated GPU's compute stream)
#include "scalelab/core/device.h"     // defines: device_synchronize
#include "scalelab/core/error.h"      // defines: SL_CHECK, SL_CHECK_HINT, SL_FAIL
#include "scalelab/core/sim_gpu.h"    // defines: sim_gpu (the active GPU model), sim_skips_data
#include "scalelab/ops/op_cost.h"     // defines: OpCost, op_seconds, op_cost::<op>
#include "scalelab/ops/op_profile.h"  // defines: op_profile_enabled, op_profile_add
#include "scalelab/ops/ops.h"         // defines: the scalelab:: ops implemented here
#include "scalelab/ops/twins.h"       // defines: their cpu:: and cuda:: twins (the cuda:: ones exist with CUDA only)

namespace scalelab {

namespace {

constexpr const char* kCudaHint =
    "rebuild where nvcc is found (cmake -DSL_WITH_CUDA=ON, see docs/cuda_backend.md), or run with --device cpu";

// The device every tensor argument lives on (nullptr entries, i.e. optional outputs, are skipped).
// Mixing devices is an error: no op copies between devices behind the caller's back.
Device device_of(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  int index = 0;
  for (const Tensor* t : tensors) {
    if (t != nullptr) {
      if (first == nullptr) first = t;
      SL_CHECK_HINT(t->device() == first->device(), "move every argument to one device with Tensor::copy_from",
                    "%s: tensor argument %d %s is on %s, but the first is %s on %s", op, index,
                    shape_str(t->shape()).c_str(), device_name(t->device()), shape_str(first->shape()).c_str(),
                    device_name(first->device()));
    }
    index++;
  }
  return first != nullptr ? first->device() : Device::CPU;
}

// Throws unless every entry of indices (n i32 values, on either device) lies in [0, limit): a token id
// outside the vocabulary would read or write outside wte / probs. Reports the first bad entry. On the GPU
// the check runs as a kernel and copies one index back, so it synchronises (once per call).
void check_index_range(const char* op, const char* what, const Tensor& indices, int64_t limit) {
  if (indices.device() == Device::SIM && sim_skips_data()) return;  // --timing-only: there are no token ids
  const int32_t* idx = indices.data<int32_t>();
  int64_t bad = -1;  // index of the first entry outside [0, limit)
  int32_t bad_value = 0;
  if (indices.device() == Device::CUDA) {
#ifdef SL_WITH_CUDA
    bad = cuda::first_index_out_of_range(idx, indices.numel(), limit, &bad_value);
#else
    SL_FAIL(kCudaHint, "%s: got CUDA tensors, but this build has no CUDA backend", op);
#endif
  } else {
    for (int64_t i = 0; i < indices.numel() && bad < 0; i++) {
      if (idx[i] < 0 || idx[i] >= limit) {
        bad = i;
        bad_value = idx[i];
      }
    }
  }
  SL_CHECK_HINT(bad < 0, "token ids must be < the vocabulary size of the model",
                "%s: %s[%lld] = %d is outside [0, %lld) (%s has shape %s)", op, what, static_cast<long long>(bad),
                bad_value, static_cast<long long>(limit), what, shape_str(indices.shape()).c_str());
}

}  // namespace

// The checks below expand inside each op, so an error report names the op (its function) and the line.
// SL_OPS_DTYPE(t, dt): tensor t has dtype dt.
#define SL_OPS_DTYPE(t, dt)                                                                                         \
  SL_CHECK((t).dtype() == (dt), "%s must be %s, got %s with shape %s", #t, dtype_name(dt), dtype_name((t).dtype()), \
           shape_str((t).shape()).c_str())
// SL_OPS_SHAPE(t, expected): tensor t has exactly the shape expected (a Shape).
#define SL_OPS_SHAPE(t, expected)                                                                         \
  SL_CHECK((t).shape() == (expected), "%s has shape %s, expected %s", #t, shape_str((t).shape()).c_str(), \
           shape_str(expected).c_str())
// SL_OPS_NUMEL(t, n): tensor t has n elements (any shape).
#define SL_OPS_NUMEL(t, n)                                                                    \
  SL_CHECK((t).numel() == (n), "%s has shape %s (%lld elements), expected %lld elements", #t, \
           shape_str((t).shape()).c_str(), static_cast<long long>((t).numel()), static_cast<long long>(n))
// SL_OPS_NDIM(t, n): tensor t has n dimensions.
#define SL_OPS_NDIM(t, n) \
  SL_CHECK((t).ndim() == (n), "%s has shape %s, expected %d dimensions", #t, shape_str((t).shape()).c_str(), (n))
// SL_OPS_FITS_INT(v): a size passed to a twin (and to BLAS, LP64 build) as int.
#define SL_OPS_FITS_INT(v) \
  SL_CHECK((v) > 0 && (v) <= INT_MAX, "%s = %lld must be in [1, INT_MAX]", #v, static_cast<long long>(v))

namespace {

// ---------------------------------------------------------------------------------------------
// The dispatch, one helper for every op:
//   run_twin(__func__, {&out, &inp, ...}, op_cost::gelu_forward(n), SL_TWINS(gelu_forward), out.data<float>(),
//            inp.data<float>(), n);
// calls cuda::gelu_forward(args...) when the listed tensors live on the GPU, cpu::gelu_forward(args...)
// otherwise (nullptr entries, optional tensors, are skipped). The two twins have the same signature by
// construction (twins.h declares both from twin_ops.inc). On SIM tensors it first charges the op's cost
// (charge_sim below). Throws when the tensors sit on different devices, and for CUDA tensors in a build
// without the CUDA backend, where SL_TWINS names no cuda:: function.
template <class T>
struct NonDeduced {  // the CUDA twin's type is taken from the CPU twin's, so nullptr fits it too
  using type = T;
};
// While the op profile is on (op_profile.h), times the op it encloses: from its construction to its
// destruction, after the twin returned (a GPU op after a device synchronize). Only the outermost op of a
// thread counts, should one op ever call another.
class OpTimer {
 public:
  OpTimer(const char* op, Device device) : op_(op), device_(device), outer_(depth()++ == 0) {
    if (outer_) t0_ = std::chrono::steady_clock::now();
  }
  ~OpTimer() {
    --depth();
    if (!outer_) return;
    if (device_ == Device::CUDA) device_synchronize(device_);
    op_profile_add(op_, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count());
  }
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

 private:
  static int& depth() {
    thread_local int d = 0;
    return d;
  }
  const char* op_;
  Device device_;
  bool outer_;
  std::chrono::steady_clock::time_point t0_;
};

// docs/simulation.md rules 1-2: an op on the simulated GPU queues its modelled seconds on the compute stream
// of the virtual clock (VirtualClock::charge_device: nothing inside an UnchargedDeviceWork), and the op
// profile (op_profile.h) records those modelled ms, not the CPU's wall time. Throws, with a hint, when no GPU model is active (sim_gpu).
void charge_sim(const char* op, const OpCost& cost) {
  const double seconds = op_seconds(cost, sim_gpu());
  VirtualClock::get().charge_device(seconds);
  op_profile_add(op, 1e3 * seconds);  // does nothing while the profile is off
}

// docs/simulation.md rule 8: an op whose tensors all lie in host memory (MemPlace::Host: lab 04's offloaded
// AdamW and its casts) while a simulated GPU is active is the host's own work: its op_cost bytes at the
// host's memory bandwidth (GpuModel::host_op_seconds), on the host thread. The host issues the GPU's work
// and waits for it (rule 1), so its busy time advances the compute stream's "now", as clock_pause_ms does;
// copies in flight on the copy streams keep running meanwhile. Not dropped by an UnchargedDeviceWork (it is
// not the device's work).
void charge_host_if_simulated(std::initializer_list<const Tensor*> tensors, const OpCost& cost) {
  if (!sim_gpu_active() || !VirtualClock::get().on()) return;
  bool any = false;
  for (const Tensor* t : tensors) {
    if (t == nullptr || !t->defined()) continue;
    if (t->place() != MemPlace::Host) return;
    any = true;
  }
  if (!any) return;
  VirtualClock::get().advance_compute(sim_gpu().host_op_seconds(cost.bytes));
}

template <class R, class... P, class... A>
R run_twin(const char* op, std::initializer_list<const Tensor*> tensors, const OpCost& cost, R (*cpu_twin)(P...),
           typename NonDeduced<R (*)(P...)>::type cuda_twin, A&&... args) {
  const Device device = device_of(op, tensors);
  if (device == Device::SIM) charge_sim(op, cost);
  if (device == Device::CPU) charge_host_if_simulated(tensors, cost);
  // --timing-only (docs/simulation.md "Timing-only runs"): the time is charged, the arithmetic skipped. The one
  // op with a result, sum_squares, returns 0: a norm built from it reads as finite, and clips nothing.
  if (device == Device::SIM && sim_skips_data()) return R();
  std::optional<OpTimer> timer;  // the profile's entry for this call (wall time), written when it goes out of scope
  if (op_profile_enabled() && device != Device::SIM) timer.emplace(op, device);
  if (device == Device::CUDA) {
    SL_CHECK_HINT(cuda_twin != nullptr, kCudaHint, "%s: got CUDA tensors, but this build has no CUDA backend", op);
    return cuda_twin(std::forward<A>(args)...);
  }
  return cpu_twin(std::forward<A>(args)...);
}

}  // namespace

#ifdef SL_WITH_CUDA
#define SL_TWINS(op) &cpu::op, &cuda::op
#else
#define SL_TWINS(op) &cpu::op, nullptr
#endif

// ---------------------------------------------------------------------------------------------
// Encoder (token + position embedding)

void encoder_forward(Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe) {
  DeviceCodeScope device_code;
  SL_OPS_DTYPE(tokens, DType::I32);
  SL_OPS_DTYPE(wte, DType::F32);
  SL_OPS_DTYPE(wpe, DType::F32);
  SL_OPS_DTYPE(out, DType::F32);
  SL_OPS_NDIM(tokens, 2);  // (B,T)
  SL_OPS_NDIM(wte, 2);     // (V,C)
  SL_OPS_NDIM(wpe, 2);     // (maxT,C)
  const int64_t B = tokens.size(0), T = tokens.size(1), V = wte.size(0), C = wte.size(1);
  SL_OPS_FITS_INT(B);
  SL_OPS_FITS_INT(T);
  SL_OPS_FITS_INT(C);
  SL_OPS_SHAPE(out, (Shape{B, T, C}));
  SL_CHECK(wpe.size(1) == C && wpe.size(0) >= T, "wpe has shape %s, expected (maxT >= T=%lld, C=%lld)",
           shape_str(wpe.shape()).c_str(), static_cast<long long>(T), static_cast<long long>(C));
  check_index_range(__func__, "tokens", tokens, V);
  run_twin(__func__, {&out, &tokens, &wte, &wpe}, op_cost::encoder_forward(B, T, C), SL_TWINS(encoder_forward),
           out.data<float>(), tokens.data<int32_t>(), wte.data<float>(), wpe.data<float>(), static_cast<int>(B),
           static_cast<int>(T), static_cast<int>(C));
}

void encoder_backward(Tensor& dwte, Tensor& dwpe, const Tensor& dout, const Tensor& tokens) {
  DeviceCodeScope device_code;
  SL_OPS_DTYPE(dwte, DType::F32);
  SL_OPS_DTYPE(dwpe, DType::F32);
  SL_OPS_DTYPE(dout, DType::F32);
  SL_OPS_DTYPE(tokens, DType::I32);
  SL_OPS_NDIM(tokens, 2);  // (B,T)
  SL_OPS_NDIM(dwte, 2);    // (V,C)
  SL_OPS_NDIM(dwpe, 2);    // (maxT,C)
  const int64_t B = tokens.size(0), T = tokens.size(1), V = dwte.size(0), C = dwte.size(1);
  SL_OPS_FITS_INT(B);
  SL_OPS_FITS_INT(T);
  SL_OPS_FITS_INT(C);
  SL_OPS_SHAPE(dout, (Shape{B, T, C}));
  SL_CHECK(dwpe.size(1) == C && dwpe.size(0) >= T, "dwpe has shape %s, expected (maxT >= T=%lld, C=%lld)",
           shape_str(dwpe.shape()).c_str(), static_cast<long long>(T), static_cast<long long>(C));
  check_index_range(__func__, "tokens", tokens, V);
  run_twin(__func__, {&dwte, &dwpe, &dout, &tokens}, op_cost::encoder_backward(B, T, C), SL_TWINS(encoder_backward),
           dwte.data<float>(), dwpe.data<float>(), dout.data<float>(), tokens.data<int32_t>(), static_cast<int>(B),
           static_cast<int>(T), static_cast<int>(C));
}

// ---------------------------------------------------------------------------------------------
// LayerNorm. inp (N,C) or (B,T,C): C is the last dimension, N the product of the others.

void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp, const Tensor& weight,
                       const Tensor& bias) {
  DeviceCodeScope device_code;
  SL_OPS_DTYPE(out, DType::F32);
  SL_OPS_DTYPE(mean, DType::F32);
  SL_OPS_DTYPE(rstd, DType::F32);
  SL_OPS_DTYPE(inp, DType::F32);
  SL_OPS_DTYPE(weight, DType::F32);
  SL_OPS_DTYPE(bias, DType::F32);
  SL_CHECK(inp.ndim() >= 2, "inp has shape %s, expected (N, C) or (B, T, C)", shape_str(inp.shape()).c_str());
  const int64_t C = inp.size(-1);
  SL_OPS_FITS_INT(C);  // before dividing by it
  const int64_t N = inp.numel() / C;
  SL_OPS_SHAPE(out, inp.shape());
  SL_OPS_SHAPE(weight, (Shape{C}));
  SL_OPS_SHAPE(bias, (Shape{C}));
  SL_OPS_NUMEL(mean, N);  // one per row: (N) or (B,T)
  SL_OPS_NUMEL(rstd, N);
  run_twin(__func__, {&out, &mean, &rstd, &inp, &weight, &bias}, op_cost::layernorm_forward(N, C),
           SL_TWINS(layernorm_forward), out.data<float>(), mean.data<float>(), rstd.data<float>(), inp.data<float>(),
           weight.data<float>(), bias.data<float>(), N, static_cast<int>(C));
}

void layernorm_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias, const Tensor& dout, const Tensor& inp,
                        const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  DeviceCodeScope device_code;
  SL_OPS_DTYPE(dinp, DType::F32);
  SL_OPS_DTYPE(dweight, DType::F32);
  SL_OPS_DTYPE(dbias, DType::F32);
  SL_OPS_DTYPE(dout, DType::F32);
  SL_OPS_DTYPE(inp, DType::F32);
  SL_OPS_DTYPE(weight, DType::F32);
  SL_OPS_DTYPE(mean, DType::F32);
  SL_OPS_DTYPE(rstd, DType::F32);
  SL_CHECK(inp.ndim() >= 2, "inp has shape %s, expected (N, C) or (B, T, C)", shape_str(inp.shape()).c_str());
  const int64_t C = inp.size(-1);
  SL_OPS_FITS_INT(C);  // before dividing by it
  const int64_t N = inp.numel() / C;
  SL_OPS_SHAPE(dinp, inp.shape());
  SL_OPS_SHAPE(dout, inp.shape());
  SL_OPS_SHAPE(weight, (Shape{C}));
  SL_OPS_SHAPE(dweight, (Shape{C}));
  SL_OPS_SHAPE(dbias, (Shape{C}));
  SL_OPS_NUMEL(mean, N);
  SL_OPS_NUMEL(rstd, N);
  run_twin(__func__, {&dinp, &dweight, &dbias, &dout, &inp, &weight, &mean, &rstd}, op_cost::layernorm_backward(N, C),
           SL_TWINS(layernorm_backward), dinp.data<float>(), dweight.data<float>(), dbias.data<float>(),
           dout.data<float>(), inp.data<float>(), weight.data<float>(), mean.data<float>(), rstd.data<float>(), N,
           static_cast<int>(C));
}

// ---------------------------------------------------------------------------------------------
// Matmul (linear layer). inp (N,C) or (B,T,C); out has the same leading elements with OC last.

namespace {

struct LinearDims {
  int64_t N, C, OC;  // rows, input features, output features
};

// The checks every matmul shares, fp32 or bf16 (`operand` is the dtype of inp and weight): weight (OC,C);
// inp (..., C), read as (N,C); `y` (out in the forward, dout in the backward, named `y_name` in errors)
// (..., OC) with N*OC elements and dtype `y_dtype`; the bias or its gradient (OC,) fp32 when given.
// Errors name the op (`op`, the caller's __func__) and the tensor, as the other ops' checks do.
LinearDims check_linear(const char* op, const char* y_name, const Tensor& y, DType y_dtype, const Tensor& inp,
                        const Tensor& weight, DType operand, const char* bias_name, const Tensor* bias) {
  auto check_dtype = [op](const char* name, const Tensor& t, DType want) {
    SL_CHECK(t.dtype() == want, "%s: %s must be %s, got %s with shape %s", op, name, dtype_name(want),
             dtype_name(t.dtype()), shape_str(t.shape()).c_str());
  };
  check_dtype(y_name, y, y_dtype);
  check_dtype("inp", inp, operand);
  check_dtype("weight", weight, operand);
  SL_CHECK(weight.ndim() == 2, "%s: weight has shape %s, expected 2 dimensions (OC, C)", op,
           shape_str(weight.shape()).c_str());
  const int64_t OC = weight.size(0), C = weight.size(1);
  SL_CHECK(inp.ndim() >= 2 && inp.size(-1) == C, "%s: inp has shape %s, expected (..., C=%lld) to match weight %s", op,
           shape_str(inp.shape()).c_str(), static_cast<long long>(C), shape_str(weight.shape()).c_str());
  const int64_t N = C > 0 ? inp.numel() / C : 0;
  for (const auto& [name, v] : {std::pair<const char*, int64_t>{"OC", OC}, {"C", C}, {"N", N}})
    SL_CHECK(v > 0 && v <= INT_MAX, "%s: %s = %lld must be in [1, INT_MAX]", op, name, static_cast<long long>(v));
  SL_CHECK(y.ndim() >= 2 && y.size(-1) == OC && y.numel() == N * OC,
           "%s: %s has shape %s, expected (N=%lld, OC=%lld) or (B, T, OC) for inp %s and weight %s", op, y_name,
           shape_str(y.shape()).c_str(), static_cast<long long>(N), static_cast<long long>(OC),
           shape_str(inp.shape()).c_str(), shape_str(weight.shape()).c_str());
  if (bias != nullptr) {
    check_dtype(bias_name, *bias, DType::F32);
    SL_CHECK(bias->shape() == (Shape{OC}), "%s: %s has shape %s, expected %s", op, bias_name,
             shape_str(bias->shape()).c_str(), shape_str(Shape{OC}).c_str());
  }
  return {N, C, OC};
}

// The backward's outputs, each optional: dweight like weight, dinp like inp, all fp32; at least one of dinp
// and dweight, and dbias only with dweight (the bias gradient belongs to the weight pass, ops.h).
void check_linear_grads(const char* op, const Tensor* dinp, const Tensor* dweight, const Tensor* dbias,
                        const Tensor& inp, const Tensor& weight) {
  SL_CHECK_HINT(dinp != nullptr || dweight != nullptr, "pass dinp, dweight or both",
                "%s: no gradient asked for (dinp and dweight are both nullptr)", op);
  SL_CHECK_HINT(dweight != nullptr || dbias == nullptr,
                "the bias gradient is computed with the weight gradient: pass dbias in the call that passes dweight",
                "%s: dbias without dweight", op);
  if (dweight != nullptr)
    SL_CHECK(dweight->dtype() == DType::F32 && dweight->shape() == weight.shape(),
             "%s: dweight is %s %s, expected f32 %s (weight's shape)", op, dtype_name(dweight->dtype()),
             shape_str(dweight->shape()).c_str(), shape_str(weight.shape()).c_str());
  if (dinp != nullptr)
    SL_CHECK(dinp->dtype() == DType::F32 && dinp->shape() == inp.shape(),
             "%s: dinp is %s %s, expected f32 %s (inp's shape)", op, dtype_name(dinp->dtype()),
             shape_str(dinp->shape()).c_str(), shape_str(inp.shape()).c_str());
}

}  // namespace

void matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor* bias) {
  DeviceCodeScope device_code;
  const LinearDims d = check_linear(__func__, "out", out, DType::F32, inp, weight, DType::F32, "bias", bias);
  const float* bias_ptr = bias != nullptr ? bias->data<float>() : nullptr;
  run_twin(__func__, {&out, &inp, &weight, bias}, op_cost::matmul_forward(d.N, d.C, d.OC, bias != nullptr),
           SL_TWINS(matmul_forward), out.data<float>(), inp.data<float>(), weight.data<float>(), bias_ptr, d.N,
           static_cast<int>(d.C), static_cast<int>(d.OC));
}

void matmul_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout, const Tensor& inp,
                     const Tensor& weight) {
  DeviceCodeScope device_code;
  const LinearDims d = check_linear(__func__, "dout", dout, DType::F32, inp, weight, DType::F32, "dbias", dbias);
  check_linear_grads(__func__, dinp, dweight, dbias, inp, weight);
  float* dinp_ptr = dinp != nullptr ? dinp->data<float>() : nullptr;
  float* dweight_ptr = dweight != nullptr ? dweight->data<float>() : nullptr;
  float* dbias_ptr = dbias != nullptr ? dbias->data<float>() : nullptr;
  run_twin(__func__, {dinp, dweight, dbias, &dout, &inp, &weight},
           op_cost::matmul_backward(d.N, d.C, d.OC, dinp != nullptr, dweight != nullptr, dbias != nullptr),
           SL_TWINS(matmul_backward), dinp_ptr, dweight_ptr, dbias_ptr, dout.data<float>(), inp.data<float>(),
           weight.data<float>(), d.N, static_cast<int>(d.C), static_cast<int>(d.OC));
}

// bf16 operands (PrecisionPolicy::bf16_compute): the same checks, with inp, weight and dout bf16 and
// everything the op writes (and the bias) fp32.
void matmul_forward_bf16(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor* bias) {
  DeviceCodeScope device_code;
  const LinearDims d = check_linear(__func__, "out", out, DType::F32, inp, weight, DType::BF16, "bias", bias);
  const float* bias_ptr = bias != nullptr ? bias->data<float>() : nullptr;
  run_twin(__func__, {&out, &inp, &weight, bias}, op_cost::matmul_forward(d.N, d.C, d.OC, bias != nullptr, DType::BF16),
           SL_TWINS(matmul_forward_bf16), out.data<float>(), inp.data<bf16>(), weight.data<bf16>(), bias_ptr, d.N,
           static_cast<int>(d.C), static_cast<int>(d.OC));
}

void matmul_backward_bf16(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout, const Tensor& inp,
                          const Tensor& weight) {
  DeviceCodeScope device_code;
  const LinearDims d = check_linear(__func__, "dout", dout, DType::BF16, inp, weight, DType::BF16, "dbias", dbias);
  check_linear_grads(__func__, dinp, dweight, dbias, inp, weight);
  float* dinp_ptr = dinp != nullptr ? dinp->data<float>() : nullptr;
  float* dweight_ptr = dweight != nullptr ? dweight->data<float>() : nullptr;
  float* dbias_ptr = dbias != nullptr ? dbias->data<float>() : nullptr;
  run_twin(__func__, {dinp, dweight, dbias, &dout, &inp, &weight},
           op_cost::matmul_backward(d.N, d.C, d.OC, dinp != nullptr, dweight != nullptr, dbias != nullptr, DType::BF16),
           SL_TWINS(matmul_backward_bf16), dinp_ptr, dweight_ptr, dbias_ptr, dout.data<bf16>(), inp.data<bf16>(),
           weight.data<bf16>(), d.N, static_cast<int>(d.C), static_cast<int>(d.OC));
}

// ---------------------------------------------------------------------------------------------
// Causal self-attention. qkv (B,T,3C), out (B,T,C), att (B,NH,T,T).

namespace {

struct QkvDims {
  int B, T, C;  // batch, time, channels (q | k | v each C wide)
};

// The checks every attention op shares: qkv is (B, T, 3C) fp32 and C is a multiple of NH.
QkvDims check_qkv(const char* op, const Tensor& qkv, int NH) {
  SL_CHECK(qkv.dtype() == DType::F32, "%s: qkv must be f32, got %s with shape %s", op, dtype_name(qkv.dtype()),
           shape_str(qkv.shape()).c_str());
  SL_CHECK(qkv.ndim() == 3, "%s: qkv has shape %s, expected 3 dimensions (B, T, 3C)", op,
           shape_str(qkv.shape()).c_str());
  const int64_t B = qkv.size(0), T = qkv.size(1), C3 = qkv.size(2), C = C3 / 3;
  SL_CHECK(C3 % 3 == 0, "%s: qkv has shape %s: the last dimension must be 3*C (q | k | v)", op,
           shape_str(qkv.shape()).c_str());
  for (const auto& [name, v] : {std::pair<const char*, int64_t>{"B", B}, {"T", T}, {"3C", C3}})
    SL_CHECK(v > 0 && v <= INT_MAX, "%s: %s = %lld must be in [1, INT_MAX]", op, name, static_cast<long long>(v));
  SL_CHECK(NH > 0 && C % NH == 0, "%s: C=%lld not divisible by NH=%d (qkv %s)", op, static_cast<long long>(C), NH,
           shape_str(qkv.shape()).c_str());
  return {static_cast<int>(B), static_cast<int>(T), static_cast<int>(C)};
}

}  // namespace

void attention_forward(Tensor& out, Tensor& att, const Tensor& qkv, int NH) {
  DeviceCodeScope device_code;
  SL_OPS_DTYPE(out, DType::F32);
  SL_OPS_DTYPE(att, DType::F32);
  const auto [B, T, C] = check_qkv(__func__, qkv, NH);
  SL_OPS_SHAPE(out, (Shape{B, T, C}));
  SL_OPS_SHAPE(att, (Shape{B, NH, T, T}));
  run_twin(__func__, {&out, &att, &qkv}, op_cost::attention_forward(B, T, C, NH), SL_TWINS(attention_forward),
           out.data<float>(), att.data<float>(), qkv.data<float>(), B, T, C, NH);
}

void attention_backward(Tensor& dqkv, Tensor& datt, const Tensor& dout, const Tensor& qkv, const Tensor& att, int NH) {
  DeviceCodeScope device_code;
  SL_OPS_DTYPE(dqkv, DType::F32);
  SL_OPS_DTYPE(datt, DType::F32);
  SL_OPS_DTYPE(dout, DType::F32);
  SL_OPS_DTYPE(qkv, DType::F32);
  SL_OPS_DTYPE(att, DType::F32);
  const auto [B, T, C] = check_qkv(__func__, qkv, NH);
  SL_OPS_SHAPE(dqkv, qkv.shape());
  SL_OPS_SHAPE(dout, (Shape{B, T, C}));
  SL_OPS_SHAPE(att, (Shape{B, NH, T, T}));
  SL_OPS_SHAPE(datt, (Shape{B, NH, T, T}));
  run_twin(__func__, {&dqkv, &datt, &dout, &qkv, &att}, op_cost::attention_backward(B, T, C, NH),
           SL_TWINS(attention_backward), dqkv.data<float>(), datt.data<float>(), dout.data<float>(), qkv.data<float>(),
           att.data<float>(), B, T, C, NH);
}

// Flash-style attention: the same qkv checks; lse (B,NH,T) replaces att (B,NH,T,T). The CUDA twin checks
// its own limit (HS <= 128) and says so.
void attention_forward_flash(Tensor& out, Tensor& lse, const Tensor& qkv, int NH) {
  DeviceCodeScope device_code;
  SL_OPS_DTYPE(out, DType::F32);
  SL_OPS_DTYPE(lse, DType::F32);
  const auto [B, T, C] = check_qkv(__func__, qkv, NH);
  SL_OPS_SHAPE(out, (Shape{B, T, C}));
  SL_OPS_SHAPE(lse, (Shape{B, NH, T}));
  run_twin(__func__, {&out, &lse, &qkv}, op_cost::attention_forward_flash(B, T, C, NH),
           SL_TWINS(attention_forward_flash), out.data<float>(), lse.data<float>(), qkv.data<float>(), B, T, C, NH);
}

void attention_backward_flash(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                              int NH) {
  DeviceCodeScope device_code;
  SL_OPS_DTYPE(dqkv, DType::F32);
  SL_OPS_DTYPE(dout, DType::F32);
  SL_OPS_DTYPE(qkv, DType::F32);
  SL_OPS_DTYPE(out, DType::F32);
  SL_OPS_DTYPE(lse, DType::F32);
  const auto [B, T, C] = check_qkv(__func__, qkv, NH);
  SL_OPS_SHAPE(dqkv, qkv.shape());
  SL_OPS_SHAPE(dout, (Shape{B, T, C}));
  SL_OPS_SHAPE(out, (Shape{B, T, C}));
  SL_OPS_SHAPE(lse, (Shape{B, NH, T}));
  run_twin(__func__, {&dqkv, &dout, &qkv, &out, &lse}, op_cost::attention_backward_flash(B, T, C, NH),
           SL_TWINS(attention_backward_flash), dqkv.data<float>(), dout.data<float>(), qkv.data<float>(),
           out.data<float>(), lse.data<float>(), B, T, C, NH);
}

namespace {

struct BlockDims {
  int B, Tq, Tk, C;  // batch, the block's queries, its keys, channels
};

// The checks the block ops share: q (B,Tq,C) and kv (B,Tk,2C) fp32 with the same B and C, C a multiple of
// NH, offsets >= 0 (positions in the sequence).
BlockDims check_block(const char* op, const Tensor& q, const Tensor& kv, int NH, int q_offset, int kv_offset) {
  SL_CHECK(q.dtype() == DType::F32 && kv.dtype() == DType::F32, "%s: q and kv must be f32, got %s and %s", op,
           dtype_name(q.dtype()), dtype_name(kv.dtype()));
  SL_CHECK(q.ndim() == 3 && kv.ndim() == 3, "%s: q has shape %s and kv %s, expected (B, Tq, C) and (B, Tk, 2C)", op,
           shape_str(q.shape()).c_str(), shape_str(kv.shape()).c_str());
  const int64_t B = q.size(0), Tq = q.size(1), C = q.size(2), Tk = kv.size(1);
  SL_CHECK_HINT(kv.size(0) == B && kv.size(2) == 2 * C, "kv holds k | v of each key row: (B, Tk, 2C)",
                "%s: q has shape %s, so kv must be (%lld, Tk, %lld), got %s", op, shape_str(q.shape()).c_str(),
                static_cast<long long>(B), static_cast<long long>(2 * C), shape_str(kv.shape()).c_str());
  for (const auto& [name, v] : {std::pair<const char*, int64_t>{"B", B}, {"Tq", Tq}, {"Tk", Tk}, {"2C", 2 * C}})
    SL_CHECK(v > 0 && v <= INT_MAX, "%s: %s = %lld must be in [1, INT_MAX]", op, name, static_cast<long long>(v));
  SL_CHECK(NH > 0 && C % NH == 0, "%s: C=%lld not divisible by NH=%d (q %s)", op, static_cast<long long>(C), NH,
           shape_str(q.shape()).c_str());
  SL_CHECK_HINT(q_offset >= 0 && kv_offset >= 0, "offsets are the blocks' first positions in the sequence",
                "%s: q_offset = %d and kv_offset = %d must be >= 0", op, q_offset, kv_offset);
  return {static_cast<int>(B), static_cast<int>(Tq), static_cast<int>(Tk), static_cast<int>(C)};
}

}  // namespace

void attention_forward_block(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& kv, int NH, int q_offset,
                             int kv_offset) {
  DeviceCodeScope device_code;
  SL_OPS_DTYPE(out, DType::F32);
  SL_OPS_DTYPE(lse, DType::F32);
  const auto [B, Tq, Tk, C] = check_block(__func__, q, kv, NH, q_offset, kv_offset);
  SL_OPS_SHAPE(out, (Shape{B, Tq, C}));
  SL_OPS_SHAPE(lse, (Shape{B, NH, Tq}));
  run_twin(__func__, {&out, &lse, &q, &kv}, op_cost::attention_forward_block(B, Tq, Tk, C, NH, q_offset, kv_offset),
           SL_TWINS(attention_forward_block), out.data<float>(), lse.data<float>(), q.data<float>(), kv.data<float>(),
           B, Tq, Tk, C, NH, q_offset, kv_offset);
}

void attention_backward_block(Tensor& dq, Tensor& dkv, const Tensor& dout, const Tensor& q, const Tensor& kv,
                              const Tensor& out, const Tensor& lse, int NH, int q_offset, int kv_offset) {
  DeviceCodeScope device_code;
  SL_OPS_DTYPE(dq, DType::F32);
  SL_OPS_DTYPE(dkv, DType::F32);
  SL_OPS_DTYPE(dout, DType::F32);
  SL_OPS_DTYPE(out, DType::F32);
  SL_OPS_DTYPE(lse, DType::F32);
  const auto [B, Tq, Tk, C] = check_block(__func__, q, kv, NH, q_offset, kv_offset);
  SL_OPS_SHAPE(dq, q.shape());
  SL_OPS_SHAPE(dkv, kv.shape());
  SL_OPS_SHAPE(dout, (Shape{B, Tq, C}));
  SL_OPS_SHAPE(out, (Shape{B, Tq, C}));
  SL_OPS_SHAPE(lse, (Shape{B, NH, Tq}));
  run_twin(__func__, {&dq, &dkv, &dout, &q, &kv, &out, &lse},
           op_cost::attention_backward_block(B, Tq, Tk, C, NH, q_offset, kv_offset), SL_TWINS(attention_backward_block),
           dq.data<float>(), dkv.data<float>(), dout.data<float>(), q.data<float>(), kv.data<float>(),
           out.data<float>(), lse.data<float>(), B, Tq, Tk, C, NH, q_offset, kv_offset);
}

void attention_merge(Tensor& out, Tensor& lse, const Tensor& out_part, const Tensor& lse_part, int NH) {
  DeviceCodeScope device_code;
  SL_OPS_DTYPE(out, DType::F32);
  SL_OPS_DTYPE(lse, DType::F32);
  SL_OPS_DTYPE(out_part, DType::F32);
  SL_OPS_DTYPE(lse_part, DType::F32);
  SL_OPS_NDIM(out, 3);  // (B,T,C)
  const int64_t B = out.size(0), T = out.size(1), C = out.size(2);
  SL_OPS_FITS_INT(B);
  SL_OPS_FITS_INT(T);
  SL_OPS_FITS_INT(C);
  SL_CHECK(NH > 0 && C % NH == 0, "attention_merge: C=%lld not divisible by NH=%d (out %s)", static_cast<long long>(C),
           NH, shape_str(out.shape()).c_str());
  SL_OPS_SHAPE(out_part, out.shape());
  SL_OPS_SHAPE(lse, (Shape{B, NH, T}));
  SL_OPS_SHAPE(lse_part, (Shape{B, NH, T}));
  run_twin(__func__, {&out, &lse, &out_part, &lse_part}, op_cost::attention_merge(B, T, C, NH),
           SL_TWINS(attention_merge), out.data<float>(), lse.data<float>(), out_part.data<float>(),
           lse_part.data<float>(), static_cast<int>(B), static_cast<int>(T), static_cast<int>(C), NH);
}

// ---------------------------------------------------------------------------------------------
// Elementwise: GELU and the residual add (any shapes with matching element counts).

void gelu_forward(Tensor& out, const Tensor& inp) {
  DeviceCodeScope device_code;
  SL_OPS_DTYPE(out, DType::F32);
  SL_OPS_DTYPE(inp, DType::F32);
  SL_OPS_NUMEL(out, inp.numel());
  run_twin(__func__, {&out, &inp}, op_cost::gelu_forward(inp.numel()), SL_TWINS(gelu_forward), out.data<float>(),
           inp.data<float>(), inp.numel());
}

void gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  DeviceCodeScope device_code;
  SL_OPS_DTYPE(dinp, DType::F32);
  SL_OPS_DTYPE(inp, DType::F32);
  SL_OPS_DTYPE(dout, DType::F32);
  SL_OPS_NUMEL(dinp, inp.numel());
  SL_OPS_NUMEL(dout, inp.numel());
  run_twin(__func__, {&dinp, &inp, &dout}, op_cost::gelu_backward(inp.numel()), SL_TWINS(gelu_backward),
           dinp.data<float>(), inp.data<float>(), dout.data<float>(), inp.numel());
}

void add_bias_(Tensor& out, const Tensor& bias) {
  DeviceCodeScope device_code;
  SL_OPS_DTYPE(out, DType::F32);
  SL_OPS_DTYPE(bias, DType::F32);
  SL_OPS_NDIM(bias, 1);
  const int64_t OC = bias.numel();
  SL_OPS_FITS_INT(OC);
  SL_CHECK(out.ndim() >= 1 && out.size(-1) == OC, "out has shape %s, expected (..., OC=%lld) to match bias %s",
           shape_str(out.shape()).c_str(), static_cast<long long>(OC), shape_str(bias.shape()).c_str());
  run_twin(__func__, {&out, &bias}, op_cost::add_bias(out.numel() / OC, OC), SL_TWINS(add_bias), out.data<float>(),
           bias.data<float>(), out.numel() / OC, static_cast<int>(OC));
}

void residual_forward(Tensor& out, const Tensor& a, const Tensor& b) {
  DeviceCodeScope device_code;
  SL_OPS_DTYPE(out, DType::F32);
  SL_OPS_DTYPE(a, DType::F32);
  SL_OPS_DTYPE(b, DType::F32);
  SL_OPS_NUMEL(b, a.numel());
  SL_OPS_NUMEL(out, a.numel());
  run_twin(__func__, {&out, &a, &b}, op_cost::residual_forward(a.numel()), SL_TWINS(residual_forward),
           out.data<float>(), a.data<float>(), b.data<float>(), a.numel());
}

void residual_backward(Tensor& da, Tensor& db, const Tensor& dout) {
  DeviceCodeScope device_code;
  SL_OPS_DTYPE(da, DType::F32);
  SL_OPS_DTYPE(db, DType::F32);
  SL_OPS_DTYPE(dout, DType::F32);
  SL_OPS_NUMEL(da, dout.numel());
  SL_OPS_NUMEL(db, dout.numel());
  run_twin(__func__, {&da, &db, &dout}, op_cost::residual_backward(dout.numel()), SL_TWINS(residual_backward),
           da.data<float>(), db.data<float>(), dout.data<float>(), dout.numel());
}

// ---------------------------------------------------------------------------------------------
// Softmax + cross-entropy. logits (B,T,V) (or (N,V)); targets and losses one per row.

void softmax_crossentropy_forward(Tensor& losses, Tensor& probs, const Tensor& logits, const Tensor& targets) {
  DeviceCodeScope device_code;
  SL_OPS_DTYPE(losses, DType::F32);
  SL_OPS_DTYPE(probs, DType::F32);
  SL_OPS_DTYPE(logits, DType::F32);
  SL_OPS_DTYPE(targets, DType::I32);
  SL_CHECK(logits.ndim() >= 2, "logits has shape %s, expected (B, T, V)", shape_str(logits.shape()).c_str());
  const int64_t V = logits.size(-1);
  SL_OPS_FITS_INT(V);  // before dividing by it
  const int64_t N = logits.numel() / V;
  SL_OPS_SHAPE(probs, logits.shape());
  SL_OPS_NUMEL(targets, N);  // (B,T)
  SL_OPS_NUMEL(losses, N);   // (B,T)
  check_index_range(__func__, "targets", targets, V);
  run_twin(__func__, {&losses, &probs, &logits, &targets}, op_cost::softmax_crossentropy_forward(N, V),
           SL_TWINS(softmax_crossentropy_forward), losses.data<float>(), probs.data<float>(), logits.data<float>(),
           targets.data<int32_t>(), N, static_cast<int>(V));
}

void softmax_crossentropy_backward(Tensor& dlogits, const Tensor& probs, const Tensor& targets, float dloss) {
  DeviceCodeScope device_code;
  SL_OPS_DTYPE(dlogits, DType::F32);
  SL_OPS_DTYPE(probs, DType::F32);
  SL_OPS_DTYPE(targets, DType::I32);
  SL_CHECK(probs.ndim() >= 2, "probs has shape %s, expected (B, T, V)", shape_str(probs.shape()).c_str());
  const int64_t V = probs.size(-1);
  SL_OPS_FITS_INT(V);  // before dividing by it
  const int64_t N = probs.numel() / V;
  SL_OPS_SHAPE(dlogits, probs.shape());
  SL_OPS_NUMEL(targets, N);
  check_index_range(__func__, "targets", targets, V);
  run_twin(__func__, {&dlogits, &probs, &targets}, op_cost::softmax_crossentropy_backward(N, V),
           SL_TWINS(softmax_crossentropy_backward), dlogits.data<float>(), probs.data<float>(), targets.data<int32_t>(),
           dloss, N, static_cast<int>(V));
}

// ---------------------------------------------------------------------------------------------
// The vocabulary split across a tensor-parallel group. logits (N,Vl) or (B,T,Vl); per-row tensors (N).

namespace {
// The rows of a logits-shaped tensor: (..., Vl) -> N = numel / Vl.
int64_t vocab_rows(const char* op, const Tensor& logits) {
  SL_CHECK(logits.dtype() == DType::F32 && logits.ndim() >= 2,
           "%s: logits must be f32 (N, Vl) or (B, T, Vl), got "
           "%s %s",
           op, dtype_name(logits.dtype()), shape_str(logits.shape()).c_str());
  const int64_t Vl = logits.size(-1);
  SL_CHECK(Vl > 0 && Vl <= INT_MAX, "%s: Vl = %lld must be in [1, INT_MAX]", op, static_cast<long long>(Vl));
  return logits.numel() / Vl;
}
void check_rows(const char* op, const char* name, const Tensor& t, DType dt, int64_t N) {
  SL_CHECK(t.dtype() == dt && t.numel() == N, "%s: %s must be %s with %lld elements (one per row), got %s %s", op, name,
           dtype_name(dt), static_cast<long long>(N), dtype_name(t.dtype()), shape_str(t.shape()).c_str());
}
}  // namespace

void encoder_forward_vocab_shard(Tensor& out, const Tensor& tokens, const Tensor& wte_shard, const Tensor* wpe,
                                 int64_t vocab_begin) {
  DeviceCodeScope device_code;
  SL_OPS_DTYPE(tokens, DType::I32);
  SL_OPS_DTYPE(wte_shard, DType::F32);
  SL_OPS_DTYPE(out, DType::F32);
  SL_OPS_NDIM(tokens, 2);     // (B,T)
  SL_OPS_NDIM(wte_shard, 2);  // (Vl,C)
  const int64_t B = tokens.size(0), T = tokens.size(1), Vl = wte_shard.size(0), C = wte_shard.size(1);
  SL_OPS_FITS_INT(B);
  SL_OPS_FITS_INT(T);
  SL_OPS_FITS_INT(C);
  SL_OPS_FITS_INT(Vl);
  SL_OPS_NUMEL(out, B * T * C);
  SL_CHECK(vocab_begin >= 0, "vocab_begin %lld must be >= 0", static_cast<long long>(vocab_begin));
  if (wpe != nullptr)
    SL_CHECK(wpe->dtype() == DType::F32 && wpe->ndim() == 2 && wpe->size(1) == C && wpe->size(0) >= T,
             "wpe has shape %s, expected (maxT >= T=%lld, C=%lld) f32", shape_str(wpe->shape()).c_str(),
             static_cast<long long>(T), static_cast<long long>(C));
  run_twin(__func__, {&out, &tokens, &wte_shard, wpe}, op_cost::encoder_forward_vocab_shard(B, T, C, wpe != nullptr),
           SL_TWINS(encoder_forward_vocab_shard), out.data<float>(), tokens.data<int32_t>(), wte_shard.data<float>(),
           wpe != nullptr ? wpe->data<float>() : nullptr, vocab_begin, static_cast<int>(Vl), static_cast<int>(B),
           static_cast<int>(T), static_cast<int>(C));
}

void encoder_backward_vocab_shard(Tensor& dwte_shard, Tensor* dwpe, const Tensor& dout, const Tensor& tokens,
                                  int64_t vocab_begin) {
  DeviceCodeScope device_code;
  SL_OPS_DTYPE(tokens, DType::I32);
  SL_OPS_DTYPE(dwte_shard, DType::F32);
  SL_OPS_DTYPE(dout, DType::F32);
  SL_OPS_NDIM(tokens, 2);      // (B,T)
  SL_OPS_NDIM(dwte_shard, 2);  // (Vl,C)
  const int64_t B = tokens.size(0), T = tokens.size(1), Vl = dwte_shard.size(0), C = dwte_shard.size(1);
  SL_OPS_FITS_INT(B);
  SL_OPS_FITS_INT(T);
  SL_OPS_FITS_INT(C);
  SL_OPS_FITS_INT(Vl);
  SL_OPS_NUMEL(dout, B * T * C);
  if (dwpe != nullptr)
    SL_CHECK(dwpe->dtype() == DType::F32 && dwpe->ndim() == 2 && dwpe->size(1) == C && dwpe->size(0) >= T,
             "dwpe has shape %s, expected (maxT >= T=%lld, C=%lld) f32", shape_str(dwpe->shape()).c_str(),
             static_cast<long long>(T), static_cast<long long>(C));
  run_twin(__func__, {&dwte_shard, dwpe, &dout, &tokens},
           op_cost::encoder_backward_vocab_shard(B, T, C, Vl, dwpe != nullptr), SL_TWINS(encoder_backward_vocab_shard),
           dwte_shard.data<float>(), dwpe != nullptr ? dwpe->data<float>() : nullptr, dout.data<float>(),
           tokens.data<int32_t>(), vocab_begin, static_cast<int>(Vl), static_cast<int>(B), static_cast<int>(T),
           static_cast<int>(C));
}

void logits_row_max(Tensor& maxes, const Tensor& logits) {
  DeviceCodeScope device_code;
  const int64_t N = vocab_rows(__func__, logits);
  check_rows(__func__, "maxes", maxes, DType::F32, N);
  run_twin(__func__, {&maxes, &logits}, op_cost::logits_row_max(N, logits.size(-1)), SL_TWINS(logits_row_max),
           maxes.data<float>(), logits.data<float>(), N, static_cast<int>(logits.size(-1)));
}

void crossentropy_vocab_shard_partials(Tensor& sumexp, Tensor& target_logit, const Tensor& logits, const Tensor& maxes,
                                       const Tensor& targets, int64_t vocab_begin) {
  DeviceCodeScope device_code;
  const int64_t N = vocab_rows(__func__, logits);
  check_rows(__func__, "sumexp", sumexp, DType::F32, N);
  check_rows(__func__, "target_logit", target_logit, DType::F32, N);
  check_rows(__func__, "maxes", maxes, DType::F32, N);
  check_rows(__func__, "targets", targets, DType::I32, N);
  run_twin(__func__, {&sumexp, &target_logit, &logits, &maxes, &targets},
           op_cost::crossentropy_vocab_shard_partials(N, logits.size(-1)), SL_TWINS(crossentropy_vocab_shard_partials),
           sumexp.data<float>(), target_logit.data<float>(), logits.data<float>(), maxes.data<float>(),
           targets.data<int32_t>(), vocab_begin, N, static_cast<int>(logits.size(-1)));
}

void crossentropy_vocab_shard_finish(Tensor& losses, Tensor& probs, const Tensor& logits, const Tensor& maxes,
                                     const Tensor& sumexp, const Tensor& target_logit) {
  DeviceCodeScope device_code;
  const int64_t N = vocab_rows(__func__, logits);
  SL_OPS_SHAPE(probs, logits.shape());
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"losses", &losses},
                                {"maxes", &maxes},
                                {"sumexp", &sumexp},
                                {"target_logit", &target_logit}})
    check_rows(__func__, name, *t, DType::F32, N);
  run_twin(__func__, {&losses, &probs, &logits, &maxes, &sumexp, &target_logit},
           op_cost::crossentropy_vocab_shard_finish(N, logits.size(-1)), SL_TWINS(crossentropy_vocab_shard_finish),
           losses.data<float>(), probs.data<float>(), logits.data<float>(), maxes.data<float>(), sumexp.data<float>(),
           target_logit.data<float>(), N, static_cast<int>(logits.size(-1)));
}

void crossentropy_vocab_shard_backward(Tensor& dlogits, const Tensor& probs, const Tensor& targets, int64_t vocab_begin,
                                       float dloss) {
  DeviceCodeScope device_code;
  const int64_t N = vocab_rows(__func__, probs);
  SL_OPS_SHAPE(dlogits, probs.shape());
  check_rows(__func__, "targets", targets, DType::I32, N);
  run_twin(__func__, {&dlogits, &probs, &targets}, op_cost::crossentropy_vocab_shard_backward(N, probs.size(-1)),
           SL_TWINS(crossentropy_vocab_shard_backward), dlogits.data<float>(), probs.data<float>(),
           targets.data<int32_t>(), vocab_begin, dloss, N, static_cast<int>(probs.size(-1)));
}

// ---------------------------------------------------------------------------------------------
// Optimizer updates, reductions, casts.

void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int64_t t) {
  DeviceCodeScope device_code;
  SL_OPS_DTYPE(param, DType::F32);
  SL_OPS_DTYPE(grad, DType::F32);
  SL_OPS_DTYPE(m, DType::F32);
  SL_OPS_DTYPE(v, DType::F32);
  SL_OPS_NUMEL(grad, param.numel());
  SL_OPS_NUMEL(m, param.numel());
  SL_OPS_NUMEL(v, param.numel());
  SL_CHECK(t >= 1, "AdamW step t=%lld must be >= 1 (the bias correction divides by 1 - beta^t)",
           static_cast<long long>(t));
  run_twin(__func__, {&param, &grad, &m, &v}, op_cost::adamw_update(param.numel()), SL_TWINS(adamw_update),
           param.data<float>(), grad.data<float>(), m.data<float>(), v.data<float>(), param.numel(), lr, beta1, beta2,
           eps, weight_decay, t);
}

void sgd_update(Tensor& param, const Tensor& grad, float lr, float weight_decay) {
  DeviceCodeScope device_code;
  SL_OPS_DTYPE(param, DType::F32);
  SL_OPS_DTYPE(grad, DType::F32);
  SL_OPS_NUMEL(grad, param.numel());
  run_twin(__func__, {&param, &grad}, op_cost::sgd_update(param.numel()), SL_TWINS(sgd_update), param.data<float>(),
           grad.data<float>(), param.numel(), lr, weight_decay);
}

double sum_squares(const Tensor& t) {
  DeviceCodeScope device_code;
  SL_OPS_DTYPE(t, DType::F32);
  return run_twin(__func__, {&t}, op_cost::sum_squares(t.numel()), SL_TWINS(sum_squares), t.data<float>(), t.numel());
}

void scale_(Tensor& t, float s) {
  DeviceCodeScope device_code;
  SL_OPS_DTYPE(t, DType::F32);
  run_twin(__func__, {&t}, op_cost::scale(t.numel()), SL_TWINS(scale), t.data<float>(), t.numel(), s);
}

void add_(Tensor& t, const Tensor& x) { residual_forward(t, t, x); }

void cast(Tensor& dst, const Tensor& src) {
  DeviceCodeScope device_code;
  SL_OPS_NUMEL(dst, src.numel());
  if (dst.dtype() == src.dtype()) {
    device_of(__func__, {&dst, &src});
    if (dst.raw() != src.raw()) dst.copy_from(src);  // same dtype: a copy (memcpy or cudaMemcpy)
  } else if (src.dtype() == DType::F32 && dst.dtype() == DType::BF16) {
    run_twin(__func__, {&dst, &src}, op_cost::cast(src.numel(), DType::BF16, DType::F32), SL_TWINS(cast_f32_to_bf16),
             dst.data<bf16>(), src.data<float>(), src.numel());
  } else if (src.dtype() == DType::BF16 && dst.dtype() == DType::F32) {
    run_twin(__func__, {&dst, &src}, op_cost::cast(src.numel(), DType::F32, DType::BF16), SL_TWINS(cast_bf16_to_f32),
             dst.data<float>(), src.data<bf16>(), src.numel());
  } else {
    SL_FAIL("cast converts f32 <-> bf16 (or copies one dtype); token ids (i32) are not cast",
            "cannot cast %s %s to %s %s", dtype_name(src.dtype()), shape_str(src.shape()).c_str(),
            dtype_name(dst.dtype()), shape_str(dst.shape()).c_str());
  }
}

}  // namespace scalelab
