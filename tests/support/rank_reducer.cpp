// rank_reducer.cpp — grading::RankReducer on a communicator (rank_reducer.h).
#include "rank_reducer.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "scalelab/core/tensor.h"  // defines: Tensor, DType

namespace scalelab::test {

grading::RankReducer make_rank_reducer(std::shared_ptr<Communicator> comm) {
  grading::RankReducer r;
  r.rank = comm->rank();
  r.size = comm->size();

  r.all_and = [comm](bool local_ok) {
    Tensor passed = Tensor::empty({1}, DType::I32);  // (1) i32: 1 if this rank passed
    passed.data<int32_t>()[0] = local_ok ? 1 : 0;
    comm->all_reduce(passed, ReduceOp::Sum, "grading all_and");
    return passed.data<int32_t>()[0] == comm->size();
  };

  r.all_gather = [comm](const std::string& local) {
    const int n = comm->size();
    // 1. Every rank's length, so each knows how much to expect.
    Tensor my_len = Tensor::empty({1}, DType::I32);  // (1) i32
    my_len.data<int32_t>()[0] = static_cast<int32_t>(local.size());
    Tensor lens = Tensor::empty({n}, DType::I32);    // (n) i32
    comm->all_gather(my_len, lens, "grading all_gather lengths");
    int32_t max_len = 0;
    for (int r = 0; r < n; ++r) max_len = std::max(max_len, lens.data<int32_t>()[r]);
    // 2. The bytes, padded to the longest string and packed into i32 words (the communicator moves
    //    elements of f32, bf16 or i32; 4 bytes per word).
    const int64_t words = (max_len + 3) / 4;
    Tensor mine = Tensor::zeros({words}, DType::I32);         // (words) i32
    if (!local.empty()) std::memcpy(mine.raw(), local.data(), local.size());
    Tensor all = Tensor::empty({n * words}, DType::I32);      // (n * words) i32
    comm->all_gather(mine, all, "grading all_gather bytes");
    std::vector<std::string> out(static_cast<size_t>(n));
    const char* bytes = static_cast<const char*>(all.raw());
    for (int r = 0; r < n; ++r) out[r].assign(bytes + r * words * 4, static_cast<size_t>(lens.data<int32_t>()[r]));
    return out;
  };
  return r;
}

}  // namespace scalelab::test
