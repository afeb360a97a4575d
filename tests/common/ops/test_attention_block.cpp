// test_attention_block.cpp — the block attention ops of context parallelism (attention_forward_block,
// attention_backward_block, attention_merge; CPU twin common/src/ops/cpu/attention_flash.cpp, through the
// Tensor-level dispatch): a sequence cut into blocks at any boundaries, every query block computed against
// every key/value block and merged, gives the dense flash op's out and lse (and the materialized op's out);
// the blocks' backward, summed, gives the dense backward's dq, dk, dv. Also the zig-zag pairing of 2cp chunks
// (rank r holds chunks r and 2cp-1-r), fully and partly masked blocks, the merge's -inf rules, the shape
// errors and the op costs. The CUDA twins against these: tests/common/ops/test_ops_cuda.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "close_to_scale.h"        // defines: close_to_scale (the kTol criterion)
#include "expect_error.h"          // defines: error_message, contains
#include "seq_rows.h"              // defines: seq_rows, add_seq_rows, lse_rows, set_lse_rows, minus_inf
#include "scalelab/core/tensor.h"  // defines: Tensor, DType, Shape
#include "scalelab/ops/op_cost.h"  // defines: op_cost::attention_*_block, attention_block_pairs
#include "scalelab/ops/ops.h"      // defines: the Tensor-level ops under test

namespace {

using scalelab::DType;
using scalelab::Shape;
using scalelab::Tensor;
using scalelab::test::close_to_scale;
using scalelab::test::contains;
using scalelab::test::error_message;
using scalelab::test::add_seq_rows;
using scalelab::test::lse_rows;
using scalelab::test::minus_inf;
using scalelab::test::seq_rows;
using scalelab::test::set_lse_rows;
namespace op_cost = scalelab::op_cost;

// Blocks merged against the dense flash op, fp32: the same sums in another order (a block's keys summed
// apart, then one rescale per merge), like the flash op against the materialized one (test_attention_flash.cpp
// measures ~2e-7 of max|want| there). Criterion as close_to_scale's: |got - want| <= kTol (max|want| + |want_i|).
// A merge without the rescale, a mask by local positions or a block skipped errs by O(1) of max|want|.
constexpr double kTol = 1e-5;

std::vector<float> uniform(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<float> x(n);
  for (auto& v : x) v = -1.0f + 2.0f * static_cast<float>(gen() / 4294967296.0);
  return x;
}

Tensor cpu_tensor(const Shape& shape, const std::vector<float>& values) {
  Tensor t = Tensor::empty(shape, DType::F32);
  std::copy(values.begin(), values.end(), t.data<float>());
  return t;
}
std::vector<float> values(const Tensor& t) { return {t.data<float>(), t.data<float>() + t.numel()}; }

struct Block {
  int t0, n;  // positions [t0, t0 + n) of the sequence
};
// Boundaries -> blocks: {0, 5, 12, 20} -> [0,5), [5,12), [12,20).
std::vector<Block> blocks_of(const std::vector<int>& cuts) {
  std::vector<Block> out;
  for (size_t i = 0; i + 1 < cuts.size(); i++) out.push_back({cuts[i], cuts[i + 1] - cuts[i]});
  return out;
}
// The zig-zag: T cut into 2cp chunks as equal as may be; rank r's query and key/value blocks are chunks r and
// 2cp-1-r, in that order. Returned rank-major: ranks[r] = {chunk r, chunk 2cp-1-r}.
std::vector<std::vector<Block>> zigzag(int T, int cp) {
  std::vector<int> cuts;
  for (int i = 0; i <= 2 * cp; i++) cuts.push_back(static_cast<int>(int64_t{T} * i / (2 * cp)));
  const std::vector<Block> chunks = blocks_of(cuts);
  std::vector<std::vector<Block>> ranks;
  for (int r = 0; r < cp; r++) ranks.push_back({chunks[r], chunks[2 * cp - 1 - r]});
  return ranks;
}

struct Shape4 {
  int B, T, C, NH;
};

// The dense references and the split computation for one qkv.
struct Case {
  Shape4 s;
  Tensor qkv, dout;  // (B,T,3C), (B,T,C)
  Tensor out, lse;   // merged over the blocks: (B,T,C), (B,NH,T)
  Tensor dqkv;       // the blocks' backward summed: (B,T,3C)
  Case(const Shape4& shape, uint32_t seed)
      : s(shape),
        qkv(cpu_tensor({s.B, s.T, 3 * s.C}, uniform(size_t(s.B) * s.T * 3 * s.C, seed))),
        dout(cpu_tensor({s.B, s.T, s.C}, uniform(size_t(s.B) * s.T * s.C, seed + 1))),
        out(Tensor::zeros({s.B, s.T, s.C})),
        lse(Tensor::empty({s.B, s.NH, s.T})),
        dqkv(Tensor::zeros({s.B, s.T, 3 * s.C})) {}
  Tensor q(const Block& b) const { return seq_rows(qkv, b.t0, b.n, 0, s.C); }
  Tensor kv(const Block& b) const { return seq_rows(qkv, b.t0, b.n, s.C, 2 * s.C); }

  // Every query block against every key/value block (in the order of kv_order, one list per query block),
  // merged into an accumulator that starts at out 0, lse -inf; then the backward of every pair, given the
  // merged (final) out and lse, summed into dqkv.
  void run(const std::vector<Block>& q_blocks, const std::vector<std::vector<Block>>& kv_order) {
    for (size_t i = 0; i < q_blocks.size(); i++) {
      const Block& qb = q_blocks[i];
      Tensor acc_out = Tensor::zeros({s.B, qb.n, s.C}), acc_lse = minus_inf({s.B, s.NH, qb.n});
      Tensor part_out = Tensor::empty({s.B, qb.n, s.C}), part_lse = Tensor::empty({s.B, s.NH, qb.n});
      for (const Block& kb : kv_order[i]) {
        scalelab::attention_forward_block(part_out, part_lse, q(qb), kv(kb), s.NH, qb.t0, kb.t0);
        scalelab::attention_merge(acc_out, acc_lse, part_out, part_lse, s.NH);
      }
      add_seq_rows(out, acc_out, qb.t0, 0);
      set_lse_rows(lse, acc_lse, qb.t0);
    }
    for (size_t i = 0; i < q_blocks.size(); i++) {
      const Block& qb = q_blocks[i];
      const Tensor out_q = seq_rows(out, qb.t0, qb.n, 0, s.C), lse_q = lse_rows(lse, qb.t0, qb.n);
      const Tensor dout_q = seq_rows(dout, qb.t0, qb.n, 0, s.C);
      for (const Block& kb : kv_order[i]) {
        Tensor dq = Tensor::zeros({s.B, qb.n, s.C}), dkv = Tensor::zeros({s.B, kb.n, 2 * s.C});
        scalelab::attention_backward_block(dq, dkv, dout_q, q(qb), kv(kb), out_q, lse_q, s.NH, qb.t0, kb.t0);
        add_seq_rows(dqkv, dq, qb.t0, 0);
        add_seq_rows(dqkv, dkv, kb.t0, s.C);
      }
    }
  }

  // The dense ops on the whole sequence, and the checks.
  void expect_dense() const {
    Tensor want_out = Tensor::empty({s.B, s.T, s.C}), want_lse = Tensor::empty({s.B, s.NH, s.T});
    scalelab::attention_forward_flash(want_out, want_lse, qkv, s.NH);
    Tensor mat_out = Tensor::empty({s.B, s.T, s.C}), att = Tensor::empty({s.B, s.NH, s.T, s.T});
    scalelab::attention_forward(mat_out, att, qkv, s.NH);
    Tensor want_dqkv = Tensor::zeros({s.B, s.T, 3 * s.C});
    scalelab::attention_backward_flash(want_dqkv, dout, qkv, want_out, want_lse, s.NH);
    EXPECT_TRUE(close_to_scale("merged out vs flash", values(out), values(want_out), kTol));
    EXPECT_TRUE(close_to_scale("merged out vs materialized", values(out), values(mat_out), kTol));
    EXPECT_TRUE(close_to_scale("merged lse vs flash", values(lse), values(want_lse), kTol));
    EXPECT_TRUE(close_to_scale("summed dqkv vs flash", values(dqkv), values(want_dqkv), kTol));
  }
};

// Every query block against every key/value block, in block order.
std::vector<std::vector<Block>> all_pairs(const std::vector<Block>& blocks) {
  return std::vector<std::vector<Block>>(blocks.size(), blocks);
}

// ---------------------------------------------------------------------------------------------

TEST(AttentionBlockCpu, BlocksMergedEqualTheDenseAttention) {
  struct Split {
    Shape4 s;
    std::vector<int> cuts;
    const char* what;
  };
  const Split splits[] = {
      {{2, 64, 64, 4}, {0, 32, 64}, "2 equal blocks"},
      {{1, 37, 36, 3}, {0, 10, 23, 37}, "3 blocks of 10, 13, 14 (T = 37, HS = 12)"},
      {{2, 130, 100, 4}, {0, 33, 65, 97, 130}, "4 blocks off the tiles (HS = 25)"},
      {{1, 41, 48, 2}, {0, 1, 40, 41}, "blocks of 1, 39, 1"},
  };
  for (const Split& sp : splits) {
    SCOPED_TRACE(sp.what);
    Case c(sp.s, 11);
    const std::vector<Block> blocks = blocks_of(sp.cuts);
    c.run(blocks, all_pairs(blocks));
    c.expect_dense();
  }
}

// The same in reversed key order: the merge is order-free up to rounding (the ring visits the blocks in a
// different order on every rank).
TEST(AttentionBlockCpu, MergeOrderDoesNotMatter) {
  Case c({2, 48, 32, 2}, 21);
  const std::vector<Block> blocks = blocks_of({0, 16, 32, 48});
  std::vector<std::vector<Block>> order;
  for (size_t i = 0; i < blocks.size(); i++) order.push_back({blocks[2], blocks[1], blocks[0]});
  c.run(blocks, order);
  c.expect_dense();
}

// Zig-zag (Brandon et al. 2023; Llama 3, Dubey et al. 2024, Sec. 3.3.2): 2cp chunks, rank r holds chunks r
// and 2cp-1-r, each of its query chunks against every rank's two key/value chunks, the ring's order (its own
// first, then rank r-1's, r-2's, ...). T = 37 with cp = 2: chunks of 9, 9, 9, 10 (T not divisible by 2cp).
TEST(AttentionBlockCpu, ZigZagChunksMergedEqualTheDenseAttention) {
  const Shape4 shapes[] = {{2, 64, 64, 4}, {1, 96, 48, 2}, {1, 37, 36, 3}};
  const int cps[] = {2, 3, 2};
  for (int i = 0; i < 3; i++) {
    const int cp = cps[i];
    SCOPED_TRACE("cp = " + std::to_string(cp) + ", T = " + std::to_string(shapes[i].T));
    Case c(shapes[i], 31);
    const auto ranks = zigzag(shapes[i].T, cp);
    std::vector<Block> q_blocks;
    std::vector<std::vector<Block>> kv_order;
    for (int r = 0; r < cp; r++) {
      std::vector<Block> ring;  // the key/value chunks rank r sees, in the ring's order
      for (int step = 0; step < cp; step++)
        for (const Block& b : ranks[(r - step + cp) % cp]) ring.push_back(b);
      for (const Block& qb : ranks[r]) {
        q_blocks.push_back(qb);
        kv_order.push_back(ring);
      }
    }
    c.run(q_blocks, kv_order);
    c.expect_dense();
  }
}

// The zig-zag's point: with a plain split into cp blocks the last rank sees every earlier key (cp^2 - ... pairs
// ramp), with the zig-zag every rank has the same number of visible pairs when 2cp divides T.
TEST(AttentionBlockCpu, ZigZagBalancesTheVisiblePairs) {
  const int T = 96;
  for (int cp : {2, 3, 4}) {
    const auto ranks = zigzag(T, cp);
    std::vector<double> work(cp, 0.0), plain(cp, 0.0);
    for (int r = 0; r < cp; r++) {
      for (const Block& qb : ranks[r])
        for (const auto& kv_rank : ranks)
          for (const Block& kb : kv_rank) work[r] += op_cost::attention_block_pairs(qb.n, kb.n, qb.t0, kb.t0);
      const int n = T / cp;
      for (int j = 0; j < cp; j++) plain[r] += op_cost::attention_block_pairs(n, n, r * n, j * n);
    }
    double total = 0;
    for (double w : work) total += w;
    EXPECT_EQ(total, T * (T + 1) / 2.0) << "cp " << cp;  // every causal pair once
    for (int r = 1; r < cp; r++) EXPECT_EQ(work[r], work[0]) << "cp " << cp << " rank " << r;
    EXPECT_GT(plain[cp - 1], (2 * cp - 2) * plain[0]) << "cp " << cp;  // the plain split's last rank: ~(2cp-1)x
  }
}

// A block whose keys all lie after its queries: out 0, lse -inf, and the backward adds nothing. A block
// straddling the diagonal: the rows before the first key are empty, the others are the dense op's rows.
TEST(AttentionBlockCpu, FullyMaskedRowsGiveZeroOutAndMinusInfinityLse) {
  const Shape4 s{2, 24, 32, 2};
  Case c(s, 41);
  const Block qb{0, 8}, kb{8, 8};  // queries 0..7, keys 8..15: nothing visible
  Tensor out = cpu_tensor({s.B, qb.n, s.C}, uniform(size_t(s.B) * qb.n * s.C, 42));  // garbage: must be overwritten
  Tensor lse = Tensor::zeros({s.B, s.NH, qb.n});
  scalelab::attention_forward_block(out, lse, c.q(qb), c.kv(kb), s.NH, qb.t0, kb.t0);
  for (float v : values(out)) ASSERT_EQ(v, 0.0f);
  for (float v : values(lse)) ASSERT_EQ(v, -INFINITY);
  // Backward against that block, with some finite final lse: adds exactly nothing.
  const std::vector<float> dq0 = uniform(size_t(s.B) * qb.n * s.C, 43),
                           dkv0 = uniform(size_t(s.B) * kb.n * 2 * s.C, 44);
  Tensor dq = cpu_tensor({s.B, qb.n, s.C}, dq0), dkv = cpu_tensor({s.B, kb.n, 2 * s.C}, dkv0);
  Tensor final_lse = Tensor::zeros({s.B, s.NH, qb.n});
  scalelab::attention_backward_block(dq, dkv, seq_rows(c.dout, qb.t0, qb.n, 0, s.C), c.q(qb), c.kv(kb), out, final_lse,
                                     s.NH, qb.t0, kb.t0);
  EXPECT_EQ(values(dq), dq0);
  EXPECT_EQ(values(dkv), dkv0);

  // Partly masked: queries at 4..11 against keys at 8..15: rows 0..3 (positions 4..7) see nothing.
  const Block q2{4, 8};
  Tensor out2 = Tensor::empty({s.B, q2.n, s.C}), lse2 = Tensor::empty({s.B, s.NH, q2.n});
  scalelab::attention_forward_block(out2, lse2, c.q(q2), c.kv(kb), s.NH, q2.t0, kb.t0);
  for (int64_t r = 0; r < s.B * s.NH; r++)
    for (int t = 0; t < q2.n; t++) {
      const float v = lse2.data<float>()[r * q2.n + t];
      if (t < 4) EXPECT_EQ(v, -INFINITY) << "row " << t;
      else EXPECT_TRUE(std::isfinite(v)) << "row " << t;
    }
  // Merging the empty rows into an accumulator changes nothing; the full check is the merged tests above.
  Tensor acc = cpu_tensor({s.B, q2.n, s.C}, uniform(size_t(s.B) * q2.n * s.C, 45));
  Tensor acc_lse = cpu_tensor({s.B, s.NH, q2.n}, uniform(size_t(s.B) * s.NH * q2.n, 46));
  const std::vector<float> acc0 = values(acc), acc_lse0 = values(acc_lse);
  Tensor empty_out = Tensor::zeros({s.B, q2.n, s.C}), empty_lse = minus_inf({s.B, s.NH, q2.n});
  scalelab::attention_merge(acc, acc_lse, empty_out, empty_lse, s.NH);
  EXPECT_EQ(values(acc), acc0);
  EXPECT_EQ(values(acc_lse), acc_lse0);
}

// The merge rule on known values (one row, HS = 2), against the formula in double.
TEST(AttentionBlockCpu, MergeFollowsTheOnlineSoftmaxRule) {
  Tensor out = cpu_tensor({1, 1, 2}, {1.0f, -2.0f}), lse = cpu_tensor({1, 1, 1}, {0.5f});
  const Tensor part = cpu_tensor({1, 1, 2}, {3.0f, 4.0f}), part_lse = cpu_tensor({1, 1, 1}, {-1.0f});
  scalelab::attention_merge(out, lse, part, part_lse, 1);
  const double l = std::log(std::exp(0.5) + std::exp(-1.0));
  const double wa = std::exp(0.5 - l), wb = std::exp(-1.0 - l);
  EXPECT_NEAR(lse.data<float>()[0], l, 1e-6);
  EXPECT_NEAR(out.data<float>()[0], wa * 1.0 + wb * 3.0, 1e-6);
  EXPECT_NEAR(out.data<float>()[1], wa * -2.0 + wb * 4.0, 1e-6);
  // An accumulator at its start (out 0, lse -inf) takes the part exactly.
  Tensor acc = Tensor::zeros({1, 1, 2}), acc_lse = cpu_tensor({1, 1, 1}, {-INFINITY});
  scalelab::attention_merge(acc, acc_lse, part, part_lse, 1);
  EXPECT_EQ(values(acc), values(part));
  EXPECT_EQ(acc_lse.data<float>()[0], -1.0f);
}

TEST(AttentionBlockCpu, ShapeErrorsNameTheTensor) {
  const int B = 2, Tq = 4, Tk = 6, C = 8, NH = 2;
  Tensor q = Tensor::zeros({B, Tq, C}), kv = Tensor::zeros({B, Tk, 2 * C});
  Tensor out = Tensor::empty({B, Tq, C}), lse = Tensor::empty({B, NH, Tq});
  Tensor qkv_like = Tensor::zeros({B, Tk, 3 * C});
  std::string msg = error_message([&] { scalelab::attention_forward_block(out, lse, q, qkv_like, NH, 0, 0); });
  EXPECT_TRUE(contains(msg, "kv must be (2, Tk, 16)")) << msg;
  Tensor bad_lse = Tensor::empty({B, NH, Tk});
  msg = error_message([&] { scalelab::attention_forward_block(out, bad_lse, q, kv, NH, 0, 0); });
  EXPECT_TRUE(contains(msg, "lse has shape")) << msg;
  msg = error_message([&] { scalelab::attention_forward_block(out, lse, q, kv, NH, -1, 0); });
  EXPECT_TRUE(contains(msg, "q_offset = -1")) << msg;
  msg = error_message([&] { scalelab::attention_forward_block(out, lse, q, kv, 3, 0, 0); });
  EXPECT_TRUE(contains(msg, "not divisible by NH=3")) << msg;
  Tensor dq = Tensor::zeros({B, Tq, C}), dkv_bad = Tensor::zeros({B, Tq, 2 * C});
  msg = error_message([&] { scalelab::attention_backward_block(dq, dkv_bad, out, q, kv, out, lse, NH, 0, 0); });
  EXPECT_TRUE(contains(msg, "dkv has shape")) << msg;
  Tensor lse_bad = Tensor::empty({B, NH, Tq + 1});
  msg = error_message([&] { scalelab::attention_merge(out, lse_bad, out, lse, NH); });
  EXPECT_TRUE(contains(msg, "lse has shape")) << msg;
}

// The costs count the visible pairs only: the dense causal square's T(T+1)/2 in one block, nothing for a
// fully masked block, Tq*Tk for a block wholly in the past; any split of the sequence sums to the flash op's FLOPs.
TEST(AttentionBlockCpu, OpCostCountsTheVisiblePairs) {
  EXPECT_EQ(op_cost::attention_block_pairs(64, 64, 0, 0), 64 * 65 / 2);
  EXPECT_EQ(op_cost::attention_block_pairs(8, 8, 0, 8), 0);
  EXPECT_EQ(op_cost::attention_block_pairs(8, 16, 32, 0), 8 * 16);
  EXPECT_EQ(op_cost::attention_block_pairs(4, 8, 4, 6), 0 + 0 + 1 + 2);  // positions 4..7 vs 6..13
  const int64_t B = 2, T = 96, C = 64, NH = 4;
  const std::vector<Block> blocks = blocks_of({0, 20, 50, 96});
  double fwd = 0, bwd = 0;
  for (const Block& qb : blocks)
    for (const Block& kb : blocks) {
      fwd += op_cost::attention_forward_block(B, qb.n, kb.n, C, NH, qb.t0, kb.t0).flops;
      bwd += op_cost::attention_backward_block(B, qb.n, kb.n, C, NH, qb.t0, kb.t0).flops;
    }
  EXPECT_EQ(fwd, op_cost::attention_forward_flash(B, T, C, NH).flops);
  EXPECT_EQ(bwd, op_cost::attention_backward_flash(B, T, C, NH).flops);
  EXPECT_EQ(op_cost::attention_forward_block(B, 8, 8, C, NH, 0, 8).flops, 0.0);
  EXPECT_GT(op_cost::attention_merge(B, T, C, NH).bytes, 0.0);
}

}  // namespace
