// cp_given.cpp — lab 10's given code, one file compiled into both tracks (sl_add_lab's GIVEN in
// labs/CMakeLists.txt): the model shard of a layout (lab 05's reference split with tp > 1), the points'
// constructors and the chunks of any rank, the row copies along the sequence, and the gradient average over a
// group. Declared in labs/10_context_parallel/context_parallel_lab.h. Your part:
// labs/10_context_parallel/context_parallel_lab.cpp.
#include <cmath>   // defines: INFINITY
#include <string>  // defines: std::to_string

#include "context_parallel_lab.h"
#include "scalelab/core/error.h"  // defines: SL_CHECK
#include "tensor_parallel.h"      // defines: lab05::block_split (lab 05's reference)

namespace scalelab::lab10 {
inline namespace SL_TRACK_LAB10 {

ModelShard shard_of(const Layout& layout) {
  ModelShard s;
  s.tp_rank = layout.tp_rank;
  s.tp_size = layout.tp;
  if (layout.tp > 1) s.tp_split = &lab05::block_split;  // lab 05's column/row split of each block tensor
  s.cp_rank = layout.cp_rank;
  s.cp_size = layout.cp;
  s.cp_zigzag = layout.zigzag;
  return s;
}

Groups split_groups(Communicator& world, const Layout& layout) {
  // rank = tp_rank + tp (cp_rank + cp dp_rank): the color numbers the other two coordinates.
  Groups g;
  g.tp = world.split(/*color=*/layout.cp_rank + layout.cp * layout.dp_rank, /*key=*/layout.tp_rank, "tp");
  g.cp = world.split(/*color=*/layout.tp_rank + layout.tp * layout.dp_rank, /*key=*/layout.cp_rank, "cp");
  g.dp = world.split(/*color=*/layout.tp_rank + layout.tp * layout.cp_rank, /*key=*/layout.dp_rank, "dp");
  return g;
}

// The chunks of group rank `owner`: what cp_chunks gives that rank's model.
static std::vector<CpChunk> chunks_of_rank(const GPTConfig& cfg, int cp, bool zigzag, int owner, int T_local) {
  ModelShard s;
  s.cp_rank = owner;
  s.cp_size = cp;
  s.cp_zigzag = zigzag;
  return cp_chunks(s, cfg, T_local);
}

RingAttention::RingAttention(Communicator& cp_group, const GPTConfig& cfg, bool zigzag, bool overlap)
    : comm_(cp_group), cfg_(cfg), zigzag_(zigzag), overlap_(overlap) {}
std::vector<CpChunk> RingAttention::chunks_of(int owner, int T_local) const {
  return chunks_of_rank(cfg_, comm_.size(), zigzag_, owner, T_local);
}

AllGatherAttention::AllGatherAttention(Communicator& cp_group, const GPTConfig& cfg, bool zigzag)
    : comm_(cp_group), cfg_(cfg), zigzag_(zigzag) {}
std::vector<CpChunk> AllGatherAttention::chunks_of(int owner, int T_local) const {
  return chunks_of_rank(cfg_, comm_.size(), zigzag_, owner, T_local);
}

// =============================================================================================
// Row copies along the sequence. On a simulated GPU they stand for the strided copy kernels a GPU would run
// (device code: DeviceCodeScope); their time is not charged (B x rows x width floats, small beside attention).
// =============================================================================================
Tensor seq_rows(const Tensor& x, int64_t t0, int64_t n, int64_t c0, int64_t w) {
  DeviceCodeScope device_code;
  SL_CHECK(x.device() != Device::CUDA, "lab 10's context-parallel points run on host memory: --device cpu or sim");
  const int64_t B = x.size(0), T = x.size(1), W = x.size(2);
  Tensor y = Tensor::empty({B, n, w}, DType::F32, x.device(), MemCategory::Workspace);
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < n; t++)
      for (int64_t c = 0; c < w; c++)
        y.data<float>()[(b * n + t) * w + c] = x.data<float>()[(b * T + t0 + t) * W + c0 + c];
  return y;
}

void add_seq_rows(Tensor& x, const Tensor& y, int64_t t0, int64_t c0) {
  DeviceCodeScope device_code;
  const int64_t B = x.size(0), T = x.size(1), W = x.size(2), n = y.size(1), w = y.size(2);
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < n; t++)
      for (int64_t c = 0; c < w; c++)
        x.data<float>()[(b * T + t0 + t) * W + c0 + c] += y.data<float>()[(b * n + t) * w + c];
}

Tensor lse_rows(const Tensor& lse, int64_t t0, int64_t n) {
  DeviceCodeScope device_code;
  const int64_t BH = lse.size(0) * lse.size(1), T = lse.size(2);
  Tensor y = Tensor::empty({lse.size(0), lse.size(1), n}, DType::F32, lse.device(), MemCategory::Workspace);
  for (int64_t r = 0; r < BH; r++)
    for (int64_t t = 0; t < n; t++) y.data<float>()[r * n + t] = lse.data<float>()[r * T + t0 + t];
  return y;
}

void set_lse_rows(Tensor& lse, const Tensor& y, int64_t t0) {
  DeviceCodeScope device_code;
  const int64_t BH = lse.size(0) * lse.size(1), T = lse.size(2), n = y.size(2);
  for (int64_t r = 0; r < BH; r++)
    for (int64_t t = 0; t < n; t++) lse.data<float>()[r * T + t0 + t] = y.data<float>()[r * n + t];
}

Tensor scratch(const Shape& shape, Device device) {
  return Tensor::zeros(shape, DType::F32, device, MemCategory::Workspace);
}

Tensor minus_inf(const Shape& shape, Device device) {
  Tensor t = Tensor::empty(shape, DType::F32, device, MemCategory::Workspace);
  DeviceCodeScope device_code;
  for (int64_t i = 0; i < t.numel(); i++) t.data<float>()[i] = -INFINITY;
  return t;
}

Tensor slice_sequence(const Tensor& tokens, const std::vector<CpChunk>& chunks, int T_local) {
  DeviceCodeScope device_code;
  const int64_t B = tokens.size(0), T = tokens.size(1);
  Tensor out = Tensor::empty({B, T_local}, DType::I32, tokens.device());
  for (int64_t b = 0; b < B; b++)
    for (const CpChunk& c : chunks)
      for (int i = 0; i < c.length; i++)
        out.data<int32_t>()[b * T_local + c.row + i] = tokens.data<int32_t>()[b * T + c.position + i];
  return out;
}

void average_grads(GPT2& model, Communicator& group, const char* what) {
  for (int u = 0; u < model.num_units(); ++u)
    if (model.owns_unit(u))
      group.all_reduce(model.unit_grads(u), ReduceOp::Avg, std::string(what) + " unit " + std::to_string(u));
}

}  // namespace SL_TRACK_LAB10
}  // namespace scalelab::lab10
