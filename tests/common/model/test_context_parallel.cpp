// test_context_parallel.cpp — the model split along the sequence (ModelShard::cp_rank / cp_size / cp_zigzag,
// scalelab/model/context_parallel.h): cp models, one per rank of an in-process group (threads, a barrier at
// each exchange), with a test-only context-parallel point that hands every rank the keys and values of every
// slice and computes attention with the block ops of ops.h, give the dense model's loss and gradients; the
// shard's positions (cp_chunks); the errors of bad layouts. One process, CPU. Lab 10 builds the real ring.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "close_to_scale.h"                   // defines: close_to_scale
#include "expect_error.h"                     // defines: error_message, contains
#include "seq_rows.h"                         // defines: seq_rows, add_seq_rows, lse_rows, set_lse_rows, minus_inf
#include "scalelab/model/context_parallel.h"  // defines: ContextParallel, CpChunk, cp_chunks
#include "scalelab/model/gpt2.h"              // defines: GPT2, GPTConfig, ModelShard
#include "scalelab/ops/ops.h"  // defines: attention_forward_block, attention_backward_block, attention_merge

namespace {

using namespace scalelab;
using scalelab::test::add_seq_rows;
using scalelab::test::close_to_scale;
using scalelab::test::contains;
using scalelab::test::error_message;
using scalelab::test::lse_rows;
using scalelab::test::minus_inf;
using scalelab::test::seq_rows;
using scalelab::test::set_lse_rows;

// The cp models against the dense one, fp32: the same model with attention's sums split into blocks and
// merged (the ops' own error, test_attention_block.cpp: ~4e-7 of the scale) and the cp group's sum of
// gradients in another order, through ~30 ops. A position embedding at the wrong rows, a mask by local
// positions or a key/value gradient left on the wrong rank errs by O(1) of the scale.
constexpr double kTol = 1e-5;

GPTConfig small() { return GPTConfig{32, 64, 2, 4, 32}; }  // maxT 32, V 64, L 2, NH 4, C 32

Tensor random_tokens(int B, int T, int V, uint32_t seed) {
  std::mt19937 gen(seed);
  Tensor t = Tensor::empty({B, T}, DType::I32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = static_cast<int32_t>(gen() % V);
  return t;
}

// The rank's slice of tokens (B, T): its chunks' positions, in its row order -> (B, T_local).
Tensor slice_tokens(const Tensor& tokens, const std::vector<CpChunk>& chunks, int T_local) {
  const int64_t B = tokens.size(0), T = tokens.size(1);
  Tensor out = Tensor::empty({B, T_local}, DType::I32);
  for (int64_t b = 0; b < B; b++)
    for (const CpChunk& c : chunks)
      for (int i = 0; i < c.length; i++)
        out.data<int32_t>()[b * T_local + c.row + i] = tokens.data<int32_t>()[b * T + c.position + i];
  return out;
}

// A barrier for the ranks' threads (C++17 has no std::barrier).
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t generation = generation_;
    if (++waiting_ == n_) {
      waiting_ = 0;
      generation_++;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != generation; });
    }
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int n_, waiting_ = 0;
  int64_t generation_ = 0;
};

// What the ranks of the in-process group share: each rank's q and kv at the current attention call, its
// chunks, and in the backward the key/value gradients each rank computed for each owner.
struct Exchange {
  explicit Exchange(int cp) : barrier(cp), q(cp), kv(cp), chunks(cp), dkv_for(cp, std::vector<Tensor>(cp)) {}
  Barrier barrier;
  std::vector<Tensor> q, kv;                 // [rank]: (B, Tl, C), (B, Tl, 2C)
  std::vector<std::vector<CpChunk>> chunks;  // [rank]
  std::vector<std::vector<Tensor>> dkv_for;  // [owner][from]: (B, Tl, 2C), rank from's queries' share
};

// The test-only point: not a ring, every rank reads every other rank's keys and values from the Exchange
// (what the ring would bring it, all at once) and runs the block ops: each of its query chunks against every
// key/value chunk of every rank, merged. The backward gives each owner the dk, dv its keys got from every
// rank's queries, summed in rank order.
class InProcessContextParallel : public ContextParallel {
 public:
  InProcessContextParallel(Exchange& ex, int rank) : ex_(ex), rank_(rank) {}

  void attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, int NH,
                         const std::vector<CpChunk>& chunks) override {
    publish(qkv, chunks);
    const int64_t B = qkv.size(0), C = qkv.size(2) / 3;
    out.zero_();  // the chunks' rows cover it: each is added once below
    for (const CpChunk& c : chunks) {
      const Tensor q_c = seq_rows(ex_.q[rank_], c.row, c.length, 0, C);
      Tensor acc = Tensor::zeros({B, c.length, C}), acc_lse = minus_inf({B, NH, c.length});
      Tensor part = Tensor::empty({B, c.length, C}), part_lse = Tensor::empty({B, NH, c.length});
      for (size_t j = 0; j < ex_.kv.size(); j++)
        for (const CpChunk& d : ex_.chunks[j]) {
          attention_forward_block(part, part_lse, q_c, seq_rows(ex_.kv[j], d.row, d.length, 0, 2 * C), NH, c.position,
                                  d.position);
          attention_merge(acc, acc_lse, part, part_lse, NH);
        }
      add_seq_rows(out, acc, c.row, 0);
      set_lse_rows(lse, acc_lse, c.row);
    }
    ex_.barrier.wait();  // every rank has read the Exchange before the next call overwrites it
  }

  void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                          int NH, const std::vector<CpChunk>& chunks) override {
    publish(qkv, chunks);
    const int64_t B = qkv.size(0), Tl = qkv.size(1), C = qkv.size(2) / 3;
    const int cp = static_cast<int>(ex_.kv.size());
    Tensor dq = Tensor::zeros({B, Tl, C});
    for (int j = 0; j < cp; j++) ex_.dkv_for[j][rank_] = Tensor::zeros({B, ex_.kv[j].size(1), 2 * C});
    for (const CpChunk& c : chunks) {
      const Tensor q_c = seq_rows(ex_.q[rank_], c.row, c.length, 0, C);
      const Tensor dout_c = seq_rows(dout, c.row, c.length, 0, C), out_c = seq_rows(out, c.row, c.length, 0, C);
      const Tensor lse_c = lse_rows(lse, c.row, c.length);
      Tensor dq_c = Tensor::zeros({B, c.length, C});
      for (int j = 0; j < cp; j++)
        for (const CpChunk& d : ex_.chunks[j]) {
          Tensor dkv_d = Tensor::zeros({B, d.length, 2 * C});
          attention_backward_block(dq_c, dkv_d, dout_c, q_c, seq_rows(ex_.kv[j], d.row, d.length, 0, 2 * C), out_c,
                                   lse_c, NH, c.position, d.position);
          add_seq_rows(ex_.dkv_for[j][rank_], dkv_d, d.row, 0);
        }
      add_seq_rows(dq, dq_c, c.row, 0);
    }
    ex_.barrier.wait();  // every rank's shares are in
    add_seq_rows(dqkv, dq, 0, 0);
    for (int from = 0; from < cp; from++) add_seq_rows(dqkv, ex_.dkv_for[rank_][from], 0, C);
    ex_.barrier.wait();  // every rank has read its shares before the next call overwrites them
  }

 private:
  // This rank's q (B, Tl, C) and kv (B, Tl, 2C) out of qkv (B, Tl, 3C), and its chunks, for every rank to read.
  void publish(const Tensor& qkv, const std::vector<CpChunk>& chunks) {
    const int64_t Tl = qkv.size(1), C = qkv.size(2) / 3;
    ex_.q[rank_] = seq_rows(qkv, 0, Tl, 0, C);
    ex_.kv[rank_] = seq_rows(qkv, 0, Tl, C, 2 * C);
    ex_.chunks[rank_] = chunks;
    ex_.barrier.wait();  // every rank's q, kv and chunks are in
  }
  Exchange& ex_;
  int rank_;
};

std::vector<float> values(const Tensor& t) { return {t.data<float>(), t.data<float>() + t.numel()}; }

// The dense model's loss and unit gradients on (tokens, targets) against cp models' (their mean).
void expect_cp_equals_dense(int cp, bool zigzag) {
  SCOPED_TRACE("cp " + std::to_string(cp) + (zigzag ? " zig-zag" : " contiguous"));
  const GPTConfig cfg = small();
  const int B = 2, T = 16, Tl = T / cp;
  const Tensor tokens = random_tokens(B, T, cfg.vocab_size, 1), targets = random_tokens(B, T, cfg.vocab_size, 2);
  GPT2 dense(cfg, PrecisionPolicy::fp32(), Device::CPU, 7);
  dense.zero_grad();
  const float dense_loss = dense.forward(tokens, &targets);
  dense.backward();

  Exchange ex(cp);
  std::vector<InProcessContextParallel> points;
  std::vector<GPT2> models;
  for (int r = 0; r < cp; r++) {
    ModelShard shard;
    shard.cp_rank = r;
    shard.cp_size = cp;
    shard.cp_zigzag = zigzag;
    points.emplace_back(ex, r);
    models.emplace_back(cfg, shard, PrecisionPolicy::fp32(), Device::CPU, 7);
  }
  std::vector<float> losses(cp);
  std::vector<std::thread> threads;
  for (int r = 0; r < cp; r++)
    threads.emplace_back([&, r] {
      GPT2& m = models[r];
      m.set_context_parallel(&points[r]);
      const std::vector<CpChunk> chunks = cp_chunks(m.shard(), cfg, Tl);
      const Tensor tok = slice_tokens(tokens, chunks, Tl), tgt = slice_tokens(targets, chunks, Tl);
      m.zero_grad();
      losses[r] = m.forward(tok, &tgt);
      m.backward();
    });
  for (std::thread& t : threads) t.join();

  // The group's average: each rank's mean over its B*T/cp tokens; gradients summed over the group / cp.
  double loss = 0;
  for (float l : losses) loss += l / cp;
  EXPECT_NEAR(loss, dense_loss, kTol * std::fabs(dense_loss));
  for (int u = 0; u < dense.num_units(); u++) {
    std::vector<float> mean(static_cast<size_t>(dense.unit_grads(u).numel()), 0.0f);
    for (int r = 0; r < cp; r++) {
      const std::vector<float> g = values(models[r].unit_grads(u));
      for (size_t i = 0; i < g.size(); i++) mean[i] += g[i] / static_cast<float>(cp);
    }
    EXPECT_TRUE(close_to_scale("unit " + std::to_string(u) + " gradient", mean, values(dense.unit_grads(u)), kTol));
  }
}

TEST(ContextParallel, ContiguousSlicesGiveTheDenseLossAndGradients) {
  expect_cp_equals_dense(2, false);
  expect_cp_equals_dense(4, false);
}

TEST(ContextParallel, ZigZagSlicesGiveTheDenseLossAndGradients) {
  expect_cp_equals_dense(2, true);
  expect_cp_equals_dense(4, true);
}

TEST(ContextParallel, ChunksOfEachRank) {
  const GPTConfig cfg = small();
  ModelShard s;
  s.cp_size = 4;
  s.cp_rank = 1;
  std::vector<CpChunk> c = cp_chunks(s, cfg, 8);  // T = 32: rank 1 holds positions 8..15
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].position, 8);
  EXPECT_EQ(c[0].row, 0);
  EXPECT_EQ(c[0].length, 8);
  s.cp_zigzag = true;  // 8 chunks of 4: rank 1 holds chunks 1 and 6
  c = cp_chunks(s, cfg, 8);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].position, 4);
  EXPECT_EQ(c[0].row, 0);
  EXPECT_EQ(c[1].position, 24);
  EXPECT_EQ(c[1].row, 4);
  EXPECT_EQ(c[1].length, 4);
  c = cp_chunks(ModelShard::dense(), cfg, 20);  // cp 1: the whole sequence
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].position, 0);
  EXPECT_EQ(c[0].length, 20);
}

TEST(ContextParallel, BadLayoutsAreRefusedWithTheNumbers) {
  const GPTConfig cfg = small();
  ModelShard s;
  s.cp_size = 2;
  s.cp_rank = 2;
  std::string msg = error_message([&] { s.validate(cfg); });
  EXPECT_TRUE(contains(msg, "context-parallel rank 2 of 2")) << msg;
  s.cp_rank = 1;
  s.cp_zigzag = true;
  msg = error_message([&] { cp_chunks(s, cfg, 5); });  // T = 10 is not divisible by 2cp = 4
  EXPECT_TRUE(contains(msg, "T_local=5 is odd")) << msg;
  msg = error_message([&] { cp_chunks(s, cfg, 20); });  // T = 40 > max_seq_len 32
  EXPECT_TRUE(contains(msg, "T = 2 x 20 = 40")) << msg;
  ModelShard sp = s;
  sp.tp_size = 2;
  sp.sequence_parallel = true;
  msg = error_message([&] { sp.validate(cfg); });
  EXPECT_TRUE(contains(msg, "sequence parallel with cp=2")) << msg;
  GPT2 m(cfg, s, PrecisionPolicy::fp32(), Device::CPU, 7);
  EXPECT_EQ(m.attention(), AttentionImpl::Flash);
  msg = error_message([&] { m.set_attention(AttentionImpl::Materialized); });
  EXPECT_TRUE(contains(msg, "context-parallel shard")) << msg;
  const Tensor tok = random_tokens(1, 4, cfg.vocab_size, 3);
  msg = error_message([&] { m.forward(tok, &tok); });
  EXPECT_TRUE(contains(msg, "cp=2 shard without a context-parallel point")) << msg;
}

}  // namespace
