// test_comm.cpp — the communicator without MPI (common/src/comm/comm.cpp, local.cpp,
// link_model.cpp): the local backend (world size 1), the argument checks, the event log, the
// link model's alpha-beta formulas and nccl-tests' bus factors. Multi-rank tests of the mpi backend:
// tests/common/comm/test_comm_mpi.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "expect_error.h"          // defines: error_message, contains
#include "scalelab/core/bf16.h"    // defines: bf16, float_to_bf16, bf16_to_float
#include "scalelab/comm/comm.h"    // defines: Communicator, make_communicator, LinkModel, bus_factor, CommEvent
#include "scalelab/comm/link_spec.h"  // defines: parse_link
#include "scalelab/core/tensor.h"  // defines: Tensor, DType

namespace {

using scalelab::bf16;
using scalelab::bus_factor;
using scalelab::CommEvent;
using scalelab::Communicator;
using scalelab::DType;
using scalelab::LinkModel;
using scalelab::make_communicator;
using scalelab::parse_link;
using scalelab::ReduceOp;
using scalelab::Tensor;
using scalelab::Topology;
using scalelab::test::contains;
using scalelab::test::error_message;

constexpr double kRel = 1e-12;  // double arithmetic of the same formula in another order

Tensor iota(int64_t n, DType dt = DType::F32) {
  Tensor t = Tensor::empty({n}, dt);
  for (int64_t i = 0; i < n; ++i) {
    if (dt == DType::F32) t.data<float>()[i] = static_cast<float>(i);
    if (dt == DType::I32) t.data<int32_t>()[i] = static_cast<int32_t>(i);
    if (dt == DType::BF16) t.data<bf16>()[i] = scalelab::float_to_bf16(static_cast<float>(i % 256));
  }
  return t;
}

// Environment variable set for one scope (the launcher's variables, for make_communicator).
struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  const char* name_;
};

// ---------------------------------------------------------------------------------------------
TEST(CommLocal, AutoIsLocalWhenRunDirectly) {
  auto c = make_communicator("auto");
  EXPECT_EQ(c->backend(), "local");
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(make_communicator("local")->backend(), "local");
}

TEST(CommLocal, UnknownOrMissingBackendsAreRefusedWithAHint) {
  EXPECT_TRUE(contains(error_message([] { make_communicator("gloo"); }), "use auto, local, mpi, nccl or sim"));
#ifndef SL_WITH_NCCL
  EXPECT_TRUE(contains(error_message([] { make_communicator("nccl"); }), "--backend mpi"));
#endif
  // Under mpirun -np 2, "local" would let every rank train alone: refused.
  ScopedEnv launched("OMPI_COMM_WORLD_SIZE", "2");
  const std::string msg = error_message([] { make_communicator("local"); });
  EXPECT_TRUE(contains(msg, "the launcher started 2 ranks")) << msg;
}

TEST(CommLocal, CollectivesOfOneRankLeaveOrCopyTheValues) {
  auto c = make_communicator("local");
  for (int64_t n : {0, 1, 7, 1000}) {
    for (DType dt : {DType::F32, DType::BF16, DType::I32}) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
        if (dt == DType::I32 && op == ReduceOp::Avg) continue;
        Tensor buf = iota(n, dt);
        c->all_reduce(buf, op);
        EXPECT_EQ(std::memcmp(buf.raw(), iota(n, dt).raw(), buf.nbytes()), 0) << n << " " << reduce_op_name(op);
      }
      Tensor out = Tensor::zeros({n}, dt);
      c->reduce_scatter(iota(n, dt), out, ReduceOp::Sum);
      EXPECT_EQ(std::memcmp(out.raw(), iota(n, dt).raw(), out.nbytes()), 0);
      Tensor gathered = Tensor::zeros({n}, dt);
      c->all_gather(iota(n, dt), gathered);
      EXPECT_EQ(std::memcmp(gathered.raw(), iota(n, dt).raw(), gathered.nbytes()), 0);
      Tensor b = iota(n, dt);
      c->broadcast(b, /*root=*/0);
      EXPECT_EQ(std::memcmp(b.raw(), iota(n, dt).raw(), b.nbytes()), 0);
    }
  }
  // In place: out is in.
  Tensor x = iota(5);
  c->all_gather(x, x);
  c->reduce_scatter(x, x, ReduceOp::Max);
  EXPECT_EQ(x.data<float>()[4], 4.0f);
  c->barrier();
}

TEST(CommLocal, BadArgumentsNameTheRankTheOpAndTheSizes) {
  auto c = make_communicator("local");
  Tensor in = Tensor::zeros({10});
  Tensor out3 = Tensor::zeros({3});
  std::string msg = error_message([&] { c->reduce_scatter(in, out3, ReduceOp::Sum); });
  EXPECT_TRUE(contains(msg, "reduce_scatter of 10 elements over 1 ranks on rank 0: out has 3 elements, expected 10"))
      << msg;
  msg = error_message([&] { c->all_gather(out3, in); });
  EXPECT_TRUE(contains(msg, "all_gather of 3 elements per rank over 1 ranks on rank 0: out has 10 elements")) << msg;
  Tensor ints = Tensor::zeros({4}, DType::I32);
  msg = error_message([&] { c->all_reduce(ints, ReduceOp::Avg); });
  EXPECT_TRUE(contains(msg, "avg of i32")) << msg;
  EXPECT_TRUE(contains(msg, "hint: reduce integers with Sum")) << msg;
  msg = error_message([&] { c->reduce_scatter(in, ints, ReduceOp::Sum); });
  EXPECT_TRUE(contains(msg, "in is f32, out is i32")) << msg;
  msg = error_message([&] { c->broadcast(in, /*root=*/1); });
  EXPECT_TRUE(contains(msg, "broadcast on rank 0 of 1: root 1 is out of range")) << msg;
  msg = error_message([&] { c->send(in, /*peer=*/0); });
  EXPECT_TRUE(contains(msg, "send on rank 0 of 1: peer 0 is not another rank")) << msg;
  EXPECT_TRUE(contains(msg, "mpirun -np 2")) << msg;
  msg = error_message([&] { c->recv(in, /*peer=*/1); });
  EXPECT_TRUE(contains(msg, "recv on rank 0 of 1")) << msg;
  EXPECT_TRUE(contains(error_message([&] { c->split(-1, 0); }), "color -1"));
  // Nothing refused was recorded.
  EXPECT_TRUE(c->events().empty());
}

TEST(CommLocal, EventLogRecordsEveryCall) {
  auto c = make_communicator("local");
  const double t0 = Communicator::now_ms();
  Tensor g = iota(1000);
  c->all_reduce(g, ReduceOp::Sum, "bucket 0");
  c->all_reduce_async(g, ReduceOp::Avg, "bucket 1")->wait();
  Tensor h = iota(16, DType::BF16);
  Tensor full = Tensor::zeros({16}, DType::BF16);
  EXPECT_TRUE(c->all_gather_async(h, full, "layer h.5")->test());
  c->barrier();

  const std::vector<CommEvent> ev = c->events();
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[0].op, "all_reduce");
  EXPECT_EQ(ev[0].tag, "bucket 0");
  EXPECT_EQ(ev[0].count, 1000);
  EXPECT_EQ(ev[0].payload_bytes, 4000);
  EXPECT_EQ(ev[0].bus_bytes, 0);  // one rank moves nothing
  EXPECT_FALSE(ev[0].async);
  EXPECT_TRUE(ev[1].async);
  EXPECT_EQ(ev[1].tag, "bucket 1");
  EXPECT_EQ(ev[2].op, "all_gather");
  EXPECT_EQ(ev[2].dtype, DType::BF16);
  EXPECT_EQ(ev[2].payload_bytes, 32);
  EXPECT_EQ(ev[3].op, "barrier");
  for (const CommEvent& e : ev) {
    EXPECT_GE(e.issue_ms, t0);
    EXPECT_LE(e.issue_ms, e.start_ms);
    EXPECT_LE(e.start_ms, e.end_ms);
    EXPECT_LE(e.end_ms, Communicator::now_ms());
    EXPECT_FALSE(e.simulated);
  }
  c->clear_events();
  EXPECT_TRUE(c->events().empty());
  c->all_reduce(g, ReduceOp::Max);
  EXPECT_EQ(c->events().size(), 1u);
}

// wait_ms is the caller's blocked time. Local calls finish before they return, so no wait ever blocks:
// blocking or async, waited or not, every event says 0. (The mpi test holds an op with a link model.)
TEST(CommLocal, CallsThatFinishBeforeTheWaitReportZeroWaitMs) {
  auto c = make_communicator("local");
  Tensor g = iota(1000);
  c->all_reduce(g, ReduceOp::Sum, "blocking");
  c->all_reduce_async(g, ReduceOp::Sum, "waited")->wait();
  { scalelab::WorkPtr dropped = c->all_reduce_async(g, ReduceOp::Sum, "dropped"); }
  c->barrier();
  const std::vector<CommEvent> ev = c->events();
  ASSERT_EQ(ev.size(), 4u);
  for (const CommEvent& e : ev) EXPECT_EQ(e.wait_ms, 0.0) << e.op << " '" << e.tag << "'";
}

TEST(CommLocal, SplitGivesAWorldOfOneWithTheParentsLinkModel) {
  auto c = make_communicator("local");
  c->set_link_model(LinkModel::preset("pcie"));
  auto sub = c->split(/*color=*/3, /*key=*/7);
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(sub->rank(), 0);
  EXPECT_EQ(sub->link_model().name, "pcie");
  // With one rank the link model has nothing to model.
  Tensor g = iota(1 << 20);
  sub->all_reduce(g, ReduceOp::Sum);
  EXPECT_EQ(sub->events().at(0).modeled_ms, 0.0);
  EXPECT_FALSE(sub->events().at(0).simulated);
}

TEST(CommLocal, GroupsAreNamedAndEventsSayWhichGroupCarriedThem) {
  auto c = make_communicator("local");
  EXPECT_EQ(c->name(), "world");
  EXPECT_EQ(c->world_ranks(), std::vector<int>{0});
  auto tp = c->split(0, 0, "tp");
  EXPECT_EQ(tp->name(), "tp");
  EXPECT_EQ(tp->world_ranks(), std::vector<int>{0});
  EXPECT_EQ(tp->split(1, 0)->name(), "tp");                         // the two-argument form keeps the name
  EXPECT_EQ(c->split(Communicator::kNoColor, 0, "none"), nullptr);  // joins no group
  Tensor g = iota(4);
  tp->all_reduce(g, ReduceOp::Sum);
  EXPECT_EQ(tp->events().at(0).group, "tp");
  EXPECT_EQ(tp->events().at(0).world_ranks, std::vector<int>{0});
  // A negative color other than kNoColor is a mistake, as before.
  EXPECT_TRUE(contains(error_message([&] { c->split(-2, 0, "bad"); }), "Communicator::kNoColor"));
}

TEST(CommLocal, SendrecvWithoutAPeerIsRefused) {
  auto c = make_communicator("local");
  Tensor a = iota(4), b = iota(4);
  const std::string msg = error_message([&] { c->sendrecv(a, 0, b, 0, "stage 0"); });
  EXPECT_TRUE(contains(msg, "sendrecv (its send) on rank 0 of 1: peer 0 is not another rank")) << msg;
  EXPECT_TRUE(c->events().empty());
}

// The wait timeout (comm.h set_wait_timeout): SL_COMM_WAIT_TIMEOUT_S is seconds as a plain number, 0
// is "wait forever", unset is kDefaultWaitTimeoutS (no program waits for ever on a stopped rank), anything
// else is refused naming the value; make_communicator applies it and split() passes it on. (Timeouts
// firing: tests/common/comm/test_comm_mpi.cpp, CommMpi.WaitTimeout*.)
TEST(CommLocal, WaitTimeoutComesFromTheEnvironmentAndBadValuesAreRefused) {
  unsetenv("SL_COMM_WAIT_TIMEOUT_S");
  EXPECT_EQ(scalelab::wait_timeout_from_env(), scalelab::kDefaultWaitTimeoutS);
  EXPECT_EQ(make_communicator("local")->wait_timeout(), scalelab::kDefaultWaitTimeoutS);
  EXPECT_GT(scalelab::kDefaultWaitTimeoutS, 0.0);  // the default: a bounded wait
  for (const auto& [value, seconds] : std::vector<std::pair<const char*, double>>{
           {"", scalelab::kDefaultWaitTimeoutS}, {"0", 0.0}, {"30", 30.0}, {"2.5", 2.5}, {"1e-3", 1e-3}}) {
    ScopedEnv env("SL_COMM_WAIT_TIMEOUT_S", value);
    EXPECT_EQ(scalelab::wait_timeout_from_env(), seconds) << "'" << value << "'";
  }
  for (const char* bad : {"-1", "2s", "two", "inf", "nan", " ", "1 2"}) {
    ScopedEnv env("SL_COMM_WAIT_TIMEOUT_S", bad);
    const std::string msg = error_message([] { scalelab::wait_timeout_from_env(); });
    EXPECT_TRUE(contains(msg, "SL_COMM_WAIT_TIMEOUT_S='" + std::string(bad) + "' is not a number of seconds")) << msg;
    EXPECT_TRUE(contains(msg, "hint: seconds as a plain number")) << msg;
    // make_communicator refuses too, before any backend starts
    EXPECT_TRUE(contains(error_message([] { make_communicator("local"); }), "SL_COMM_WAIT_TIMEOUT_S")) << bad;
  }
  {
    ScopedEnv env("SL_COMM_WAIT_TIMEOUT_S", "1.5");
    auto c = make_communicator("local");
    EXPECT_EQ(c->wait_timeout(), 1.5);
    EXPECT_EQ(c->split(0, 0, "pp")->wait_timeout(), 1.5);  // children inherit
    c->set_wait_timeout(0.25);
    EXPECT_EQ(c->split(0, 0)->wait_timeout(), 0.25);
    // The local backend never waits: calls complete as before.
    Tensor g = iota(4);
    c->all_reduce(g, ReduceOp::Sum);
    EXPECT_EQ(g.data<float>()[3], 3.0f);
  }
  auto c = make_communicator("local");
  EXPECT_TRUE(contains(error_message([&] { c->set_wait_timeout(-1.0); }), "-1 seconds"));
  EXPECT_TRUE(contains(error_message([&] { c->set_wait_timeout(std::nan("")); }), "hint: give seconds >= 0"));
  c->set_wait_timeout(0.0);
  EXPECT_EQ(c->wait_timeout(), 0.0);
  EXPECT_FALSE(scalelab::comm_wait_timed_out());  // nothing timed out in this process
}

// ---------------------------------------------------------------------------------------------
// The simulated topology: node = world_rank / ranks_per_node; a group inside one node takes intra.
TEST(CommTopology, GroupsInsideANodeTakeTheIntraLinkOthersTheInter) {
  Topology t;
  t.ranks_per_node = 4;
  t.intra = LinkModel::preset("nvlink");
  t.inter = LinkModel::preset("infiniband");
  EXPECT_EQ(t.node_of(0), 0);
  EXPECT_EQ(t.node_of(3), 0);
  EXPECT_EQ(t.node_of(4), 1);
  EXPECT_TRUE(t.within_one_node({0, 1, 2, 3}));
  EXPECT_TRUE(t.within_one_node({5, 7}));
  EXPECT_TRUE(t.within_one_node({6}));
  EXPECT_FALSE(t.within_one_node({3, 4}));
  EXPECT_EQ(t.link_for({4, 5}).name, "nvlink");
  EXPECT_EQ(t.link_for({1, 5}).name, "infiniband");
  t.ranks_per_node = 0;
  EXPECT_TRUE(contains(error_message([&] { t.node_of(1); }), "ranks_per_node is 0"));
}

TEST(CommTopology, RanksPerNodeComeFromTheLauncherElseOneNode) {
  EXPECT_EQ(scalelab::ranks_per_node_from_env(8), 8);  // started directly: all ranks on one node
  {
    ScopedEnv slurm("SLURM_TASKS_PER_NODE", "4(x2)");  // srun: 4 tasks on each of 2 nodes
    EXPECT_EQ(scalelab::ranks_per_node_from_env(8), 4);
    ScopedEnv ompi("OMPI_COMM_WORLD_LOCAL_SIZE", "2");  // OpenMPI's mpirun comes first
    EXPECT_EQ(scalelab::ranks_per_node_from_env(8), 2);
  }
  ScopedEnv per_node("SLURM_NTASKS_PER_NODE", "3");
  EXPECT_EQ(scalelab::ranks_per_node_from_env(6), 3);
}

TEST(CommTopology, SetTopologyChoosesTheLinkSetLinkModelMeansOneLinkForAll) {
  auto c = make_communicator("local");
  EXPECT_EQ(c->topology().ranks_per_node, 1);  // a world of one rank
  Topology t;
  t.ranks_per_node = 0;  // keep
  t.intra = LinkModel::preset("nvlink");
  t.inter = LinkModel::preset("ethernet100");
  c->set_topology(t);
  EXPECT_EQ(c->topology().ranks_per_node, 1);
  EXPECT_EQ(c->link_model().name, "nvlink");                                 // one rank: inside one node
  EXPECT_EQ(c->split(0, 0, "child")->topology().inter.name, "ethernet100");  // inherited
  c->set_link_model(LinkModel::preset("pcie"));
  EXPECT_EQ(c->link_model().name, "pcie");
  EXPECT_EQ(c->topology().intra.name, "pcie");
  EXPECT_EQ(c->topology().inter.name, "pcie");
  t.ranks_per_node = -1;
  const std::string msg = error_message([&] { c->set_topology(t); });
  EXPECT_TRUE(contains(msg, "ranks_per_node -1")) << msg;
}

// ---------------------------------------------------------------------------------------------
TEST(CommBusFactor, MatchesNcclTests) {
  EXPECT_DOUBLE_EQ(bus_factor("all_reduce", 2), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor("all_reduce", 4), 1.5);
  EXPECT_DOUBLE_EQ(bus_factor("all_reduce", 8), 1.75);
  EXPECT_DOUBLE_EQ(bus_factor("all_gather", 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor("reduce_scatter", 8), 0.875);
  EXPECT_DOUBLE_EQ(bus_factor("broadcast", 4), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor("send", 2), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor("all_reduce", 1), 0.0);  // n/a for one rank
  EXPECT_TRUE(contains(error_message([] { bus_factor("allreduce", 2); }), "unknown op 'allreduce'"));
  EXPECT_STREQ(scalelab::reduce_op_name(ReduceOp::Avg), "avg");
}

TEST(CommLinkModel, PresetsCarryTheirFigures) {
  const LinkModel none = LinkModel::preset("none");
  EXPECT_FALSE(none.enabled());
  EXPECT_EQ(none.seconds("all_reduce", 1 << 20, 4), 0.0);
  const LinkModel free = LinkModel::preset("free");  // modelled (replaces the sim backend's links), costing 0 s
  EXPECT_TRUE(free.enabled());
  for (const char* op : {"all_reduce", "all_gather", "send", "recv", "barrier"})
    EXPECT_EQ(free.seconds(op, 1 << 20, 4), 0.0) << op;
  struct Want {
    const char* name;
    double alpha_us, gb_per_s;
  };
  for (const Want& w :
       {Want{"nvlink", 3.4, 370}, Want{"pcie", 5.7, 25}, Want{"ethernet100", 14, 12}, Want{"infiniband", 14, 46}}) {
    const LinkModel m = LinkModel::preset(w.name);
    EXPECT_TRUE(m.enabled());
    EXPECT_EQ(m.name, w.name);
    EXPECT_DOUBLE_EQ(m.alpha_s, w.alpha_us * 1e-6) << w.name;
    EXPECT_DOUBLE_EQ(m.bandwidth_bytes_per_s, w.gb_per_s * 1e9) << w.name;
    EXPECT_DOUBLE_EQ(m.base_s, 8.4e-6) << w.name;
  }
  const std::string msg = error_message([] { LinkModel::preset("nvlink5"); });
  EXPECT_TRUE(contains(msg, "none, free, nvlink, pcie, ethernet100, infiniband")) << msg;
}

TEST(CommLinkModel, ParseLinkTakesPresetsOrMeasuredFiguresAndNamesWhatIsWrong) {
  EXPECT_EQ(parse_link("pcie").alpha_s, LinkModel::preset("pcie").alpha_s);  // a preset's name
  const LinkModel m = parse_link("alpha=25us,bw=118MB/s");
  EXPECT_TRUE(m.enabled());
  EXPECT_EQ(m.name, "alpha=25us,bw=118MB/s");
  EXPECT_DOUBLE_EQ(m.alpha_s, 25e-6);
  EXPECT_DOUBLE_EQ(m.bandwidth_bytes_per_s, 118e6);
  EXPECT_EQ(m.base_s, 0.0);  // not given: none
  // A send of 1 MB over it: alpha + S / B (one hop, no base).
  EXPECT_NEAR(m.seconds("send", 1000000, 2), 25e-6 + 1e6 / 118e6, 1e-12);
  const LinkModel g = parse_link("bw=1Gbit/s,base=0.5ms,alpha=2e3ns");  // any order, other units
  EXPECT_DOUBLE_EQ(g.bandwidth_bytes_per_s, 125e6);
  EXPECT_DOUBLE_EQ(g.base_s, 0.5e-3);
  EXPECT_DOUBLE_EQ(g.alpha_s, 2e-6);
  struct Bad {
    const char* spec;
    const char* says;
  };
  for (const Bad& b : {Bad{"alpha=25us", "needs both alpha"}, Bad{"bw=1GB/s", "needs both alpha"},
                       Bad{"alpha=25,bw=1GB/s", "cannot read 'alpha=25'"}, Bad{"alpha=25us,bw=1GB", "'bw=1GB'"},
                       Bad{"alpha=-1us,bw=1GB/s", "'alpha=-1us'"}, Bad{"alpha=1us,bw=0MB/s", "'bw=0MB/s'"},
                       Bad{"alpha=1us,bw=1GB/s,beta=2", "'beta=2'"}, Bad{"alpha=1us,alpha=2us,bw=1GB/s", "each once"},
                       Bad{"alpha=1us,,bw=1GB/s", "cannot read ''"}}) {
    const std::string msg = error_message([&] { parse_link(b.spec); });
    EXPECT_TRUE(contains(msg, b.says)) << b.spec << ": " << msg;
    EXPECT_TRUE(contains(msg, "alpha=25us,bw=118MB/s")) << b.spec << ": " << msg;  // the hint shows the form
  }
  EXPECT_TRUE(contains(error_message([] { parse_link("nvlink5"); }), "nvlink, pcie"));
}

TEST(CommLinkModel, AllReduceOfOneMegabyteOverFourRanksIsTheRingFormula) {
  const double S = 1 << 20;  // bytes per rank
  const int n = 4;
  for (const char* name : {"nvlink", "pcie", "ethernet100", "infiniband"}) {
    const LinkModel m = LinkModel::preset(name);
    // all_reduce: base + 2(n-1) alpha + 2(n-1)/n S / B
    const double want = m.base_s + 2.0 * (n - 1) * m.alpha_s + 2.0 * (n - 1) / n * S / m.bandwidth_bytes_per_s;
    EXPECT_NEAR(m.seconds("all_reduce", 1 << 20, n), want, kRel * want) << name;
  }
  // The numbers themselves, for ethernet100: 8.4 + 6*14 us + 1.5 MiB / 12 GB/s = 92.4 + 131.072 us.
  EXPECT_NEAR(LinkModel::preset("ethernet100").seconds("all_reduce", 1 << 20, 4), 223.472e-6, 1e-12);
}

TEST(CommLinkModel, EveryOpFollowsItsFormula) {
  LinkModel m;
  m.name = "test";
  m.alpha_s = 10e-6;
  m.base_s = 1e-6;
  m.bandwidth_bytes_per_s = 1e9;
  const double S = 8000;  // bytes of the event's payload
  const int n = 8;
  auto near = [](double got, double want) { EXPECT_NEAR(got, want, 1e-15 + kRel * want); };
  near(m.seconds("all_reduce", 8000, n), 1e-6 + 14 * 10e-6 + 2.0 * 7 / 8 * S / 1e9);
  near(m.seconds("reduce_scatter", 8000, n), 1e-6 + 7 * 10e-6 + 7.0 / 8 * S / 1e9);    // S = the input
  near(m.seconds("all_gather", 8000, n), 1e-6 + 7 * 10e-6 + 7.0 / 8 * (n * S) / 1e9);  // S = one chunk
  near(m.seconds("broadcast", 8000, n), 1e-6 + 7 * 10e-6 + S / 1e9);
  near(m.seconds("send", 8000, n), 1e-6 + 10e-6 + S / 1e9);
  near(m.seconds("recv", 8000, n), 1e-6 + 10e-6 + S / 1e9);
  near(m.seconds("barrier", 0, n), 1e-6 + 14 * 10e-6);
  EXPECT_EQ(m.seconds("all_reduce", 8000, 1), 0.0);  // nothing to move among one rank
}

}  // namespace

// run_on_all_ranks: the exit code a multi-rank main() returns (on one rank nothing is aborted).
TEST(RunOnAllRanks, ReturnsTheBodysCodeThreeForATodoOneForOtherErrors) {
  EXPECT_EQ(scalelab::run_on_all_ranks("local", [](scalelab::Communicator& c) { return c.size() == 1 ? 7 : 0; }), 7);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(scalelab::run_on_all_ranks("local",
                                       [](scalelab::Communicator&) -> int {
                                         throw scalelab::NotImplemented("lab03-2 all_reduce_grads_naive");
                                       }),
            3);
  EXPECT_EQ(scalelab::run_on_all_ranks("local", [](scalelab::Communicator&) -> int { SL_FAIL("", "boom"); }), 1);
  EXPECT_EQ(scalelab::run_on_all_ranks("no-such-backend", [](scalelab::Communicator&) { return 0; }), 1);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("[rank 0]"), std::string::npos) << err;
  EXPECT_NE(err.find("lab03-2"), std::string::npos) << err;
}
