// test_sim_comm_mpi.cpp — the sim communicator (common/src/comm/sim.cpp) under mpiexec with 2 and 4 ranks
// (sl_add_mpi_test; main(): tests/support/mpi/mpi_main.cpp). Virtual times against link times worked out by
// hand with a link of round figures (docs/simulation.md "Virtual time: the rules" 4-5), results against the
// mpi backend's bit for bit, NCCL's contract (host tensors refused), and the same times on a second run.
// Each TEST starts the virtual clock at 0 on every rank and stops it at its end (RAII), so the other tests
// and mpi_main's own calls keep the wall clock. Every rank runs every collective; checks are EXPECT_.
#include <gtest/gtest.h>

#include <chrono>  // defines: std::chrono::milliseconds
#include <cstdint>
#include <cstring>  // defines: std::memcmp
#include <memory>
#include <string>
#include <thread>  // defines: std::this_thread::sleep_for
#include <vector>

#include "expect_error.h"               // defines: error_message, contains
#include "mpi_test.h"                   // defines: test::world
#include "scalelab/comm/comm.h"         // defines: Communicator, make_communicator, LinkModel, Topology, CommEvent
#include "scalelab/comm/host_values.h"  // defines: broadcast_string
#include "scalelab/core/bf16.h"         // defines: float_to_bf16
#include "scalelab/core/clock.h"        // defines: VirtualClock
#include "scalelab/core/tensor.h"       // defines: Tensor, DType, Device

namespace {

using scalelab::CommEvent;
using scalelab::Communicator;
using scalelab::Device;
using scalelab::DType;
using scalelab::LinkModel;
using scalelab::ReduceOp;
using scalelab::Tensor;
using scalelab::VirtualClock;
using scalelab::WorkPtr;
namespace test = scalelab::test;

// Round figures, so the times below can be worked out by hand: 0.1 ms a call, 1 ms a hop, 1 MB/s.
constexpr double kBase = 1e-4, kAlpha = 1e-3, kBandwidth = 1e6;  // s, s, bytes/s
LinkModel round_link() {
  LinkModel l;
  l.name = "round";
  l.base_s = kBase;
  l.alpha_s = kAlpha;
  l.bandwidth_bytes_per_s = kBandwidth;
  return l;
}
// The link's seconds by hand (comm.h LinkModel): S = payload bytes, n ranks; a group of one rank moves nothing.
double all_reduce_s(double S, int n) {
  return n == 1 ? 0.0 : kBase + 2 * (n - 1) * kAlpha + 2.0 * (n - 1) / n * S / kBandwidth;
}
double p2p_s(double S) { return kBase + kAlpha + S / kBandwidth; }
double barrier_s(int n) { return n == 1 ? 0.0 : kBase + 2 * (n - 1) * kAlpha; }

constexpr double kTol = 1e-12;  // s: sums of a few doubles of these sizes

// The virtual clock on, both streams at 0 on every rank, for one TEST; off at its end.
struct VirtualTime {
  VirtualTime() { VirtualClock::get().start(); }
  ~VirtualTime() { VirtualClock::get().stop(); }
};

// A sim world with the round link (made after the clock is on: the backend requires it).
std::unique_ptr<Communicator> sim_world() {
  std::unique_ptr<Communicator> c = scalelab::make_communicator("sim");
  c->set_link_model(round_link());
  return c;
}

double compute_s() { return VirtualClock::get().compute_s(); }

// A SIM tensor holding h's values (the host writes a device tensor through a copy), and back.
Tensor to_sim(const Tensor& h) {
  Tensor d = Tensor::empty(h.shape(), h.dtype(), Device::SIM);
  d.copy_from(h);
  return d;
}
Tensor to_host(const Tensor& d) {
  Tensor h = Tensor::empty(d.shape(), d.dtype());
  h.copy_from(d);
  return h;
}

// (n) f32 values that differ per rank and are not small integers, so a reduction's order shows in its bits.
Tensor ragged(int64_t n, int rank, DType dt = DType::F32) {
  Tensor t = Tensor::empty({n}, dt);
  for (int64_t i = 0; i < n; ++i) {
    const float v = 1.0f / static_cast<float>(3 + 7 * rank + i) + 0.1f * static_cast<float>(i % 11);
    if (dt == DType::F32) t.data<float>()[i] = v;
    if (dt == DType::BF16) t.data<scalelab::bf16>()[i] = scalelab::float_to_bf16(v);
    if (dt == DType::I32) t.data<int32_t>()[i] = static_cast<int32_t>(100 * rank + i);
  }
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// ---------------------------------------------------------------------------------------------
// Virtual times

TEST(SimComm, CollectiveStartsAtTheLatestMemberAndEndsAfterTheLink) {
  VirtualTime vt;
  auto sim = sim_world();
  const int r = sim->rank(), n = sim->size();
  Tensor d = to_sim(ragged(1000, r));              // 4000 bytes
  VirtualClock::get().advance_compute(0.010 * r);  // rank r issues at 10 r ms
  WorkPtr w = sim->all_reduce_async(d, ReduceOp::Sum, "late members");
  w->wait();
  const double start = 0.010 * (n - 1), end = start + all_reduce_s(4000, n);
  EXPECT_NEAR(compute_s(), end, kTol) << "the compute stream waits for the call's end";
  EXPECT_NEAR(VirtualClock::get().comm_s(), end, kTol) << "the communication stream ends with the call";
  const std::vector<CommEvent> ev = sim->events();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].op, "all_reduce");
  EXPECT_NEAR(ev[0].issue_ms, 10.0 * r, 1e-9);
  EXPECT_NEAR(ev[0].start_ms, 1e3 * start, 1e-9) << "a collective starts when its last member has";
  EXPECT_NEAR(ev[0].end_ms, 1e3 * end, 1e-9);
  EXPECT_NEAR(ev[0].modeled_ms, 1e3 * all_reduce_s(4000, n), 1e-9);
  EXPECT_NEAR(ev[0].wait_ms, 1e3 * (end - 0.010 * r), 1e-9) << "the wait is all the time the caller lost";
  EXPECT_EQ(ev[0].simulated, n > 1) << "the link decided its time";
  EXPECT_TRUE(ev[0].async);
}

TEST(SimComm, AsyncCallOverlapsComputeAndWaitAddsOnlyTheRemainder) {
  VirtualTime vt;
  auto sim = sim_world();
  if (sim->size() < 2) GTEST_SKIP() << "one rank: every call takes no time";
  const int n = sim->size();
  Tensor a = to_sim(ragged(500, sim->rank())), b = to_sim(ragged(500, sim->rank()));
  const double T = all_reduce_s(2000, n);
  // A: issued at 0, compute for 0.4 T meanwhile, then wait: 0.6 T exposed.
  WorkPtr wa = sim->all_reduce_async(a, ReduceOp::Sum, "a");
  EXPECT_FALSE(wa->test()) << "not finished at 0 of " << T << " s";
  VirtualClock::get().advance_compute(0.4 * T);
  EXPECT_FALSE(wa->test());
  wa->wait();
  EXPECT_NEAR(compute_s(), T, kTol);
  // B: issued at T, compute for 3 T meanwhile: finished before the wait, which adds nothing.
  WorkPtr wb = sim->all_reduce_async(b, ReduceOp::Sum, "b");
  VirtualClock::get().advance_compute(3 * T);
  EXPECT_TRUE(wb->test()) << "ended at 2 T, the compute stream is at 4 T";
  wb->wait();
  EXPECT_NEAR(compute_s(), 4 * T, kTol) << "a finished call does not hold the compute stream";
  const std::vector<CommEvent> ev = sim->events();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_NEAR(ev[0].wait_ms, 1e3 * 0.6 * T, 1e-9);
  EXPECT_NEAR(ev[1].start_ms, 1e3 * T, 1e-9);
  EXPECT_NEAR(ev[1].end_ms, 1e3 * 2 * T, 1e-9);
  EXPECT_EQ(ev[1].wait_ms, 0.0) << "fully hidden";
}

TEST(SimComm, RecvPostedEarlyEndsAtTheSendStartPlusTheLink) {
  VirtualTime vt;
  auto sim = sim_world();
  if (sim->size() < 2) GTEST_SKIP() << "messages need two ranks";
  const int r = sim->rank(), peer = r ^ 1;  // pairs (0, 1), (2, 3)
  const bool sender = r % 2 == 1;
  const double T = p2p_s(400);  // 100 f32
  Tensor buf = to_sim(ragged(100, r));
  if (sender) {
    VirtualClock::get().advance_compute(0.050);  // the send starts at 50 ms
    sim->send(buf, peer, "late send");
    EXPECT_NEAR(compute_s(), 0.050 + T, kTol) << "a send ends at its start + the link's time";
  } else {
    WorkPtr w = sim->recv_async(buf, peer, "early recv");  // posted at 0
    w->wait();
    EXPECT_NEAR(compute_s(), 0.050 + T, kTol) << "the message cannot arrive before the send started + the link";
    EXPECT_TRUE(same_bytes(to_host(buf), ragged(100, peer)));
  }
  // A recv posted long after the message arrived ends as it starts: the send starts 1 s later, the recv 2 s.
  const double later = compute_s() + 2.0;
  VirtualClock::get().advance_compute(sender ? 1.0 : 2.0);
  if (sender) {
    sim->send(buf, peer, "second");
  } else {
    sim->recv(buf, peer, "second");
    EXPECT_NEAR(compute_s(), later, kTol) << "the recv's own start is later than the send's start + the link";
  }
  const std::vector<CommEvent> ev = sim->events();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].op, sender ? "send" : "recv");
  EXPECT_NEAR(ev[0].start_ms, sender ? 50.0 : 0.0, 1e-9);
  EXPECT_NEAR(ev[0].end_ms, 1e3 * (0.050 + T), 1e-9);
  EXPECT_EQ(ev[0].peer, peer);
}

TEST(SimComm, CallsAreOrderedOnTheCommunicationStream) {
  VirtualTime vt;
  auto sim = sim_world();
  if (sim->size() < 2) GTEST_SKIP() << "messages need two ranks";
  const int r = sim->rank(), n = sim->size(), peer = r ^ 1;
  const double T = all_reduce_s(400, n), P = p2p_s(400);
  Tensor a = to_sim(ragged(100, r)), b = to_sim(ragged(100, r)), m1 = to_sim(ragged(100, r)),
         m2 = to_sim(ragged(100, r));
  // Two collectives issued at 0: the second starts when the first ends.
  WorkPtr wa = sim->all_reduce_async(a, ReduceOp::Sum, "first");
  WorkPtr wb = sim->all_reduce_async(b, ReduceOp::Sum, "second");
  wb->wait();
  wa->wait();
  EXPECT_NEAR(compute_s(), 2 * T, kTol);
  // Two sends (or recvs) issued at 2 T run side by side; a collective issued with them starts after both.
  WorkPtr p1 = r % 2 == 0 ? sim->send_async(m1, peer, "m1") : sim->recv_async(m1, peer, "m1");
  EXPECT_FALSE(p1->test()) << "ends at 2 T + P";  // asking does not put it ahead of m2 on the stream
  WorkPtr p2 = r % 2 == 0 ? sim->send_async(m2, peer, "m2") : sim->recv_async(m2, peer, "m2");
  WorkPtr wc = sim->all_reduce_async(a, ReduceOp::Sum, "after the messages");
  wc->wait();
  EXPECT_NEAR(compute_s(), 2 * T + P + T, kTol);
  p1->wait();
  p2->wait();
  // Every communicator of the rank shares its stream: a call of a split group waits for the world's.
  std::unique_ptr<Communicator> half = sim->split(r % 2, r, "half");
  WorkPtr ww = sim->all_reduce_async(a, ReduceOp::Sum, "world");
  half->all_reduce(b, ReduceOp::Sum, "half");
  const double half_link = half->link_model().seconds("all_reduce", 400, half->size());
  EXPECT_NEAR(compute_s(), 3 * T + P + T + half_link, kTol);
  ww->wait();
  const std::vector<CommEvent> ev = sim->events();
  ASSERT_EQ(ev.size(), 6u);
  EXPECT_NEAR(ev[1].start_ms, 1e3 * T, 1e-9) << "the second waits for the first";
  EXPECT_NEAR(ev[2].start_ms, 1e3 * 2 * T, 1e-9) << "messages start at their issue";
  EXPECT_NEAR(ev[3].start_ms, 1e3 * 2 * T, 1e-9) << "side by side, not one after the other";
  EXPECT_NEAR(ev[4].start_ms, 1e3 * (2 * T + P), 1e-9) << "a collective waits for the messages before it";
  const std::vector<CommEvent> hev = half->events();
  ASSERT_EQ(hev.size(), 1u);
  EXPECT_NEAR(hev[0].start_ms, 1e3 * (3 * T + P + T), 1e-9) << "the half group's call waits for the world's";
}

TEST(SimComm, BarrierEndsAtTheLatestArrivalPlusTheLink) {
  VirtualTime vt;
  auto sim = sim_world();
  const int r = sim->rank(), n = sim->size();
  VirtualClock::get().advance_compute(0.003 * r);
  sim->barrier();
  EXPECT_NEAR(compute_s(), 0.003 * (n - 1) + barrier_s(n), kTol);
}

// ---------------------------------------------------------------------------------------------
// Results and the contract

TEST(SimComm, ResultsEqualTheMpiBackendBitForBit) {
  VirtualTime vt;
  auto sim = sim_world();
  Communicator& mpi = test::world();  // the mpi backend (local when run directly: the same arithmetic)
  const int r = sim->rank(), n = sim->size();
  for (DType dt : {DType::F32, DType::BF16}) {
    for (int64_t count : {int64_t{1}, int64_t{37}, int64_t{4096}, int64_t{100003}}) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
        Tensor h = ragged(count, r, dt), d = to_sim(h);
        mpi.all_reduce(h, op, "mpi");
        sim->all_reduce(d, op, "sim");
        EXPECT_TRUE(same_bytes(h, to_host(d)))
            << "all_reduce " << scalelab::reduce_op_name(op) << " of " << count << " " << scalelab::dtype_name(dt);
      }
      Tensor in = ragged(count * n, r, dt), out = Tensor::empty({count}, dt), d_out = to_sim(out);
      mpi.reduce_scatter(in, out, ReduceOp::Sum, "mpi");
      sim->reduce_scatter(to_sim(in), d_out, ReduceOp::Sum, "sim");
      EXPECT_TRUE(same_bytes(out, to_host(d_out))) << "reduce_scatter of " << count * n;
      Tensor mine = ragged(count, r, dt), all = Tensor::empty({count * n}, dt), d_all = to_sim(all);
      mpi.all_gather(mine, all, "mpi");
      sim->all_gather(to_sim(mine), d_all, "sim");
      EXPECT_TRUE(same_bytes(all, to_host(d_all))) << "all_gather of " << count;
      Tensor bc = ragged(count, r, dt), d_bc = to_sim(bc);
      mpi.broadcast(bc, n - 1, "mpi");
      sim->broadcast(d_bc, n - 1, "sim");
      EXPECT_TRUE(same_bytes(bc, to_host(d_bc))) << "broadcast of " << count;
    }
  }
  if (n > 1) {  // a ring: send to the next, recv from the previous
    Tensor got = to_sim(Tensor::zeros({999}));
    sim->sendrecv(to_sim(ragged(999, r)), (r + 1) % n, got, (r + n - 1) % n, "ring");
    EXPECT_TRUE(same_bytes(to_host(got), ragged(999, (r + n - 1) % n)));
  }
}

TEST(SimComm, HostTensorsAreRefusedWithTheNcclMessage) {
  VirtualTime vt;
  auto sim = sim_world();
  const int r = sim->rank();
  EXPECT_EQ(sim->backend(), "sim");
  EXPECT_EQ(sim->device(), Device::SIM);
  Tensor host = ragged(8, r);
  const std::string msg = test::error_message([&] { sim->all_reduce(host, ReduceOp::Sum, "host"); });
  EXPECT_TRUE(test::contains(msg, "all_reduce on rank " + std::to_string(r) + ": the tensor lives on the cpu")) << msg;
  EXPECT_TRUE(test::contains(msg, "the sim backend moves sim tensors only, as NCCL does")) << msg;
  EXPECT_TRUE(test::contains(msg, "comm/host_values.h")) << msg;
  Tensor d = to_sim(host);
  EXPECT_TRUE(test::contains(test::error_message([&] { sim->all_gather(d, host, "host out"); }), "lives on the cpu"));
  EXPECT_TRUE(sim->events().empty()) << "a refused call is never issued";
  // The mpi backend refuses SIM tensors: they go through the sim backend, which times them.
  if (test::world().backend() == "mpi") {
    const std::string mpi_msg = test::error_message([&] { test::world().all_reduce(d, ReduceOp::Sum, "sim on mpi"); });
    EXPECT_TRUE(test::contains(mpi_msg, "--backend sim")) << mpi_msg;
  }
  // The sim backend's calls still match on every rank afterwards.
  sim->all_reduce(d, ReduceOp::Sum, "after the refusals");
  EXPECT_EQ(sim->events().size(), 1u);
}

// The driver's old run-id broadcast (the driver library's run_id_all_ranks before comm/host_values.h): a host tensor,
// which NCCL cannot move. The helper stages it through the communicator's device.
std::string old_broadcast_string(Communicator& comm, const std::string& s) {
  constexpr int kMaxChars = 128;
  Tensor buf = Tensor::zeros({kMaxChars}, DType::I32);  // (kMaxChars,) i32 on the host
  for (int i = 0; i < kMaxChars && i < static_cast<int>(s.size()); ++i) buf.data<int32_t>()[i] = s[i];
  comm.broadcast(buf, /*root=*/0, "run id");
  std::string out;
  for (int i = 0; i < kMaxChars && buf.data<int32_t>()[i] != 0; ++i) out += static_cast<char>(buf.data<int32_t>()[i]);
  return out;
}

TEST(SimComm, OldBroadcastStringFailsTheHostValueHelperPasses) {
  VirtualTime vt;
  auto sim = sim_world();
  const bool root = sim->rank() == 0;
  const std::string id = "20261204-230044-a1b2";
  EXPECT_EQ(old_broadcast_string(test::world(), root ? id : ""), id) << "the old way works on the mpi backend";
  const std::string msg = test::error_message([&] { old_broadcast_string(*sim, root ? id : ""); });
  EXPECT_TRUE(test::contains(msg, "broadcast on rank " + std::to_string(sim->rank()) + ": the tensor lives on the cpu"))
      << msg;
  EXPECT_EQ(scalelab::broadcast_string(*sim, root ? id : "", /*root=*/0, "run id"), id);
}

TEST(SimComm, RefusedWhileTheVirtualClockIsOff) {
  std::unique_ptr<Communicator> sim;
  {
    VirtualTime vt;
    sim = sim_world();
  }  // the clock is off again
  Tensor d = to_sim(ragged(4, 0));
  const std::string msg = test::error_message([&] { sim->all_reduce(d, ReduceOp::Sum); });
  EXPECT_TRUE(test::contains(msg, "the virtual clock is off")) << msg;
  EXPECT_TRUE(test::contains(msg, "--device sim")) << msg;
  const std::string make = test::error_message([] { scalelab::make_communicator("sim"); });
  EXPECT_TRUE(test::contains(make, "backend 'sim' times every call in virtual time")) << make;
  EXPECT_TRUE(test::contains(make, "--device sim")) << make;
}

TEST(SimComm, SplitGivesSimGroupsWithTheirTopologysLink) {
  VirtualTime vt;
  std::unique_ptr<Communicator> sim = scalelab::make_communicator("sim");
  const int r = sim->rank(), n = sim->size();
  EXPECT_EQ(sim->link_model().name, "nvlink") << "without a link set: NVLink inside a node (every rank here)";
  scalelab::Topology t;
  t.ranks_per_node = 2;  // nodes {0, 1}, {2, 3}
  t.intra = LinkModel::preset("nvlink");
  t.inter = round_link();
  sim->set_topology(t);
  std::unique_ptr<Communicator> pairs = sim->split(r / 2, r, "pairs");    // within a node
  std::unique_ptr<Communicator> across = sim->split(r % 2, r, "across");  // across nodes when n = 4
  EXPECT_EQ(pairs->backend(), "sim");
  EXPECT_EQ(pairs->name(), "pairs");
  EXPECT_EQ(pairs->link_model().name, "nvlink");
  EXPECT_EQ(across->link_model().name, n > 2 ? "round" : "nvlink");
  EXPECT_EQ(sim->link_model().name, n > 2 ? "round" : "nvlink");
  Tensor d = to_sim(ragged(250, r));  // 1000 bytes
  across->all_reduce(d, ReduceOp::Sum, "across");
  EXPECT_NEAR(compute_s(), across->link_model().seconds("all_reduce", 1000, across->size()), kTol);
  if (n > 2) {
    EXPECT_NEAR(compute_s(), all_reduce_s(1000, 2), kTol) << "the inter-node link, by hand";
  }
  EXPECT_EQ(sim->split(Communicator::kNoColor, r), nullptr);
}

// ---------------------------------------------------------------------------------------------
// Determinism

// A small program: uneven compute, async collectives overlapping it, a ring of messages, a broadcast,
// a barrier. Returns its events and the final compute time. Rank 1 may dawdle in real time first.
struct ProgramRun {
  std::vector<CommEvent> events;
  double end_s = 0;
};
ProgramRun small_program(bool dawdle) {
  VirtualTime vt;
  auto sim = sim_world();
  const int r = sim->rank(), n = sim->size();
  Tensor a = to_sim(ragged(3000, r)), b = to_sim(ragged(700, r)), got = to_sim(Tensor::zeros({700}));
  VirtualClock& vc = VirtualClock::get();
  for (int step = 0; step < 3; ++step) {
    if (dawdle && r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(30));  // real time only
    vc.advance_compute(0.002 * (r + 1));
    WorkPtr w = sim->all_reduce_async(a, ReduceOp::Avg, "bucket");
    vc.advance_compute(0.001 * (n - r));
    if (n > 1) sim->sendrecv(b, (r + 1) % n, got, (r + n - 1) % n, "ring");
    w->wait();
    sim->broadcast(b, step % n, "bcast");
  }
  sim->barrier();
  return {sim->events(), vc.compute_s()};
}

TEST(SimComm, TheSameProgramTwiceGivesIdenticalVirtualTimes) {
  const ProgramRun first = small_program(/*dawdle=*/false);
  const ProgramRun second = small_program(/*dawdle=*/true);  // rank 1 sleeps 30 ms of real time per step
  EXPECT_EQ(first.end_s, second.end_s) << "bit for bit";
  EXPECT_GT(first.end_s, 0.0);
  ASSERT_EQ(first.events.size(), second.events.size());
  for (size_t i = 0; i < first.events.size(); ++i) {
    const CommEvent &x = first.events[i], &y = second.events[i];
    EXPECT_EQ(x.op, y.op);
    EXPECT_EQ(x.issue_ms, y.issue_ms) << i << " " << x.op << " " << x.tag;
    EXPECT_EQ(x.start_ms, y.start_ms) << i << " " << x.op << " " << x.tag;
    EXPECT_EQ(x.end_ms, y.end_ms) << i << " " << x.op << " " << x.tag;
    EXPECT_EQ(x.wait_ms, y.wait_ms) << i << " " << x.op << " " << x.tag;
  }
}

}  // namespace
