// tp_groups.cpp — lab 05's given code, one file compiled into both tracks (sl_add_lab's GIVEN in
// labs/CMakeLists.txt): the model shard of a layout, MegatronPoints' constructor and group size, and the
// average over the data-parallel replicas. Declared in labs/05_tensor_parallel/tensor_parallel.h. Your part,
// the tensor-parallel points and the step: labs/05_tensor_parallel/tensor_parallel.cpp (the reference's:
// solutions/05_tensor_parallel/tensor_parallel.cpp).
#include "tensor_parallel.h"

#include <string>  // defines: std::to_string

namespace scalelab::lab05 {
inline namespace SL_TRACK_LAB05 {

ModelShard shard_of(const Layout& layout) {
  ModelShard s;
  s.tp_rank = layout.tp_rank;
  s.tp_size = layout.tp;
  s.sequence_parallel = layout.sequence_parallel;
  s.tp_split = &block_split;  // your rule (lab05-9): how each block tensor is cut
  return s;
}

MegatronPoints::MegatronPoints(Communicator& tp_group, bool sequence_parallel)
    : comm_(tp_group), sequence_parallel_(sequence_parallel) {}
int MegatronPoints::size() const { return comm_.size(); }
int MegatronPoints::rank() const { return comm_.rank(); }

// =============================================================================================
// Data parallel on top: the replicas of a tensor-parallel group
// =============================================================================================
void average_over_replicas(GPT2& model, Communicator& dp_group) {
  for (int u = 0; u < model.num_units(); ++u)
    if (model.owns_unit(u)) dp_group.all_reduce(model.unit_grads(u), ReduceOp::Avg, "dp unit " + std::to_string(u));
}

}  // namespace SL_TRACK_LAB05
}  // namespace scalelab::lab05
