#!/usr/bin/env python3
"""bench/netns_cluster.py — lab 07's placement over a real, rate-limited link: two nodes on this machine.

Brings up a two-node cluster of network namespaces (scripts/netns_cluster.sh: TCP between the nodes over a
veth link limited by tc tbf to --rate, shared memory inside a node), then, per rate:
  1. the link's alpha and beta: lab 00's all_reduce sweep on 2 nodes x 1 rank (each rank on its own node, so
     every byte crosses the link). For 2 ranks the kit's model (docs/communicator.md "The simulated link") is
     t(S) = base + 2 alpha + S / B; the fit: a = base + 2 alpha, the median time of the sizes <= 1 KiB, and B
     from the least-squares slope of t against S over the sizes >= 256 KiB.
  2. lab 07 on 2 nodes x 2 ranks, tp 2 x pp 2 x dp 1 (1F1B, m micro-batches), in two orders: tp-dp-pp puts
     each tensor-parallel group inside a node (pp and the tied embedding's all-reduce cross the link),
     pp-tp-dp puts each tp group across the nodes (pp inside). The same two layouts on one node (all shared
     memory) are the baseline. Runs alternate, --repeats times; medians of the slowest rank's step.
  3. the prediction, the planner's rule (solutions/09_planner/planner.cpp step_time: a 1F1B step is
     (m + pp - 1) slots, a slot a micro-batch's forward + backward + its tp and pp messages): the same layout's
     step on one node (measured) + (m + pp - 1) x the link model's time per micro-batch of the messages that
     cross the link + the once-a-step calls that cross (the tied embedding's all-reduce), each message priced
     with the fitted a and B (all_reduce: a + S/B; send: a/2 + S/B, alpha a hop), counted from the log's
     per-group calls and bytes (the step records' "groups"; only the sends of the pp group: a message is
     charged once).
  4. the simulator's prediction: the same layout on --device sim (virtual time, 4 ranks on this node as 2
     simulated nodes: --ranks-per-node 2, --link free inside a node, --inter-link the fitted link as measured
     figures, alpha = a / 2, base 0, bw = B: docs/communicator.md "A measured link"), once with the fitted
     link and once with a free one; the difference is the link's share of the simulated step, added to the
     measured one-node step (the simulated GPU's compute is not this CPU's).
Prints and writes <out>/netns_cluster.md (the table) and <out>/results.json.

  bench/netns_cluster.py --build-dir build --rates none,1gbit,100mbit   # about 4 minutes on 2 cores (root)
Needs root, network namespaces, mpirun, the corpus (data/kjv) and the build's bin/lab00_setup and
bin/reference/lab07_parallel_3d. Tears the cluster down at the end, also on an error or Ctrl-C.
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = os.path.join(REPO, "scripts", "netns_cluster.sh")
NAME, SUBNET = "sl-bench", "10.78.0"
DIR = "/tmp/" + NAME
ORDERS = {"tp-dp-pp": "tp inside a node", "pp-tp-dp": "tp across the link"}


def sh(cmd, env=None, timeout=600):
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        sys.exit(f"netns_cluster.py: {' '.join(cmd)} exited {p.returncode}:\n{(p.stdout + p.stderr)[-3000:]}")
    return p.stdout


def cluster_env():
    """The environment netns_cluster.sh writes to <dir>/env (mpirun's rsh agent and the cluster's subnet)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for line in open(os.path.join(DIR, "env")):
        if line.startswith("export "):
            for kv in line.split()[1:]:
                k, v = kv.split("=", 1)
                env[k] = v
    return env


def mpirun(ppr, on_cluster, args):
    """mpirun of ppr ranks per node: on the two namespace nodes, or (on_cluster False) on this one node."""
    if on_cluster:
        return ["mpirun", "--hostfile", os.path.join(DIR, "hostfile"), "--map-by", f"ppr:{ppr}:node",
                "--bind-to", "none", "-x", "PATH", "-x", "OMP_NUM_THREADS"] + args
    return ["mpirun", "-np", str(2 * ppr), "--oversubscribe", "--bind-to", "none"] + args


def fit_link(a, rate, env):
    run_id = f"lab00-{rate}"
    sh(mpirun(1, True, [os.path.join(a.build_dir, "bin", "lab00_setup"), "--skip-gemm", "--threads", "1",
                        "--min-bytes", "8", "--max-bytes", a.max_bytes, "--factor", "4", "--memcpy-bytes", "1M",
                        "--log-dir", a.log_dir, "--run-id", run_id]), env=env)
    pts = []
    for line in open(os.path.join(a.log_dir, "lab00", run_id, "rank0.jsonl")):
        r = json.loads(line)
        if r.get("type") == "collective" and r.get("op") == "all_reduce":
            pts.append((r["size_bytes"], r["time_ms"] / 1e3))
    small = [t for s, t in pts if s <= 1024]
    big = [(s, t) for s, t in pts if s >= 256 * 1024]
    if not small or len(big) < 2:
        sys.exit(f"netns_cluster.py: too few sizes to fit ({pts}); raise --max-bytes")
    ms, mt = statistics.mean(s for s, _ in big), statistics.mean(t for _, t in big)
    slope = sum((s - ms) * (t - mt) for s, t in big) / sum((s - ms) ** 2 for s, _ in big)
    return {"a_s": statistics.median(small), "B": 1.0 / slope, "points": pts}


def lab07(a, order, on_cluster, run_id, env, extra=()):
    sh(mpirun(2, on_cluster, [os.path.join(a.build_dir, "bin", "reference", "lab07_parallel_3d"), *extra,
                              "--tp", "2", "--pp", "2", "--dp", "1", "--order", order, "--model", a.model,
                              "--seq-len", str(a.seq_len), "--micro-batch", str(a.micro_batch),
                              "--micro-batches", str(a.micro_batches), "--steps", str(a.steps), "--threads", "1",
                              "--val-every", "0", "--val-batches", "1", "--sample-tokens", "0", "--timeline-steps",
                              "0", "--quiet", "--log-dir", a.log_dir, "--run-id", run_id]), env=env)
    ranks = []
    for path in sorted(glob.glob(os.path.join(a.log_dir, "lab07", run_id, "rank*.jsonl"))):
        host, steps, summary = "", [], {}
        for line in open(path):
            r = json.loads(line)
            if r["type"] == "run":
                host = r.get("hostname", "")
            elif r["type"] == "step" and r["step"] >= 1:
                steps.append(r)
            elif r["type"] == "summary":
                summary = r
        ranks.append({"host": host, "steps": steps, "summary": summary})
    hosts = [r["host"] for r in ranks]
    if on_cluster and hosts != [f"{NAME}-n0"] * 2 + [f"{NAME}-n1"] * 2:
        sys.exit(f"netns_cluster.py: {run_id}: ranks on {hosts}, not 2 per node in rank order")
    step_ms = max(statistics.median(s["step_ms"] for s in r["steps"]) for r in ranks)
    return {"step_ms": step_ms, "tokens_per_s": ranks[0]["summary"]["tokens_per_s"],
            "hosts": hosts, "final_loss": ranks[0]["summary"]["final_loss"],
            "groups": [r["steps"][-1]["groups"] for r in ranks]}


def link_spec(link):
    """The fitted link as --link's measured figures: a = base + 2 alpha with base 0, so alpha = a / 2."""
    return f"alpha={1e6 * link['a_s'] / 2:.2f}us,bw={link['B'] / 1e6:.3f}MB/s"


def sim_link_ms(a, order, link, rate, env):
    """The link's share of lab 07's simulated step (virtual time): the step with the fitted link across the
    2 simulated nodes minus the step with a free one."""
    steps = {}
    for name, inter in (("fitted", link_spec(link)), ("free", "free")):
        steps[name] = lab07(a, order, False, f"{rate}-{order}-sim-{name}", env,
                            ["--device", "sim", "--ranks-per-node", "2", "--link", "free", "--inter-link", inter])["step_ms"]
    return steps["fitted"] - steps["free"], steps


def predicted_extra_ms(a, link, run, crossing):
    """The link model's time the crossing groups add to a step (see the file's head), slowest rank."""
    m, pp = a.micro_batches, 2
    worst = 0.0
    for g in run["groups"]:
        per_micro, per_step = 0.0, 0.0
        if "tp" in crossing:  # every tp call an all_reduce (no sequence parallelism)
            per_micro += (g["tp"]["calls"] * link["a_s"] + g["tp"]["payload_bytes"] / link["B"]) / m
        if "pp" in crossing:  # the activation/gradient messages: half the pp group's calls are the sends
            sends = m  # one send per micro-batch per stage of two (forward out of stage 0, gradient out of 1)
            per_micro += sends * (link["a_s"] / 2 + (a.micro_batch * a.seq_len * a.n_embd * 4) / link["B"]) / m
            e = g["embedding"]  # the tied embedding's gradient all-reduce, once a step
            per_step += e["calls"] * link["a_s"] + e["payload_bytes"] / link["B"]
        worst = max(worst, 1e3 * ((m + pp - 1) * per_micro + per_step))
    return worst


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--rates", default="none,1gbit,100mbit", help="tbf rates of the link, comma-separated")
    ap.add_argument("--repeats", type=int, default=5, help="alternating runs per layout; medians")
    ap.add_argument("--model", default="demo")
    ap.add_argument("--n-embd", type=int, default=192, help="C of --model (the pp message is B x T x C floats)")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--max-bytes", default="4M")
    ap.add_argument("--out", default=os.path.join("runs", "netns_cluster"))
    a = ap.parse_args()
    a.build_dir = os.path.abspath(a.build_dir)
    a.out = os.path.abspath(a.out)
    a.log_dir = os.path.join(a.out, "logs")
    os.makedirs(a.log_dir, exist_ok=True)
    base_env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    results = {"config": {k: v for k, v in vars(a).items()}, "rates": {}}
    t0 = time.time()
    results["load_start"] = os.getloadavg()[0]
    try:
        for rate in a.rates.split(","):
            subprocess.run([CLUSTER, "down", "--name", NAME], cwd=REPO, capture_output=True)
            sh([CLUSTER, "up", "--name", NAME, "--subnet", SUBNET, "--nodes", "2", "--slots", "2", "--rate", rate])
            env = cluster_env()
            link = fit_link(a, rate, env)
            print(f"{rate}: a = base + 2 alpha = {1e6 * link['a_s']:.0f} us, B = {link['B'] / 1e6:.1f} MB/s",
                  flush=True)
            runs = {(o, w): [] for o in ORDERS for w in ("one node", "two nodes")}
            for k in range(a.repeats):  # alternating: every layout once per round
                for order in ORDERS:
                    for where in ("one node", "two nodes"):
                        rid = f"{rate}-{order}-{where.replace(' ', '')}-{k}"
                        runs[(order, where)].append(lab07(a, order, where == "two nodes", rid,
                                                          env if where == "two nodes" else base_env))
            rows = []
            for order, what in ORDERS.items():
                one = runs[(order, "one node")]
                two = runs[(order, "two nodes")]
                base = statistics.median(r["step_ms"] for r in one)
                meas = statistics.median(r["step_ms"] for r in two)
                crossing = ("tp",) if order == "pp-tp-dp" else ("pp",)
                extra = statistics.median(predicted_extra_ms(a, link, r, crossing) for r in two)
                pred = base + extra
                sim_extra, sim_steps = sim_link_ms(a, order, link, rate, base_env)
                sim_pred = base + sim_extra
                rows.append({"order": order, "what": what, "one_node_step_ms": base, "step_ms": meas,
                             "tokens_per_s": statistics.median(r["tokens_per_s"] for r in two),
                             "one_node_tokens_per_s": statistics.median(r["tokens_per_s"] for r in one),
                             "predicted_extra_ms": extra, "predicted_step_ms": pred,
                             "error": (pred - meas) / meas, "hosts": two[0]["hosts"],
                             "link_spec": link_spec(link), "sim_step_ms": sim_steps, "sim_extra_ms": sim_extra,
                             "sim_predicted_step_ms": sim_pred, "sim_error": (sim_pred - meas) / meas,
                             "steps_ms": [r["step_ms"] for r in two], "one_node_steps_ms": [r["step_ms"] for r in one],
                             "final_loss": [two[0]["final_loss"], one[0]["final_loss"]]})
            results["rates"][rate] = {"link": {"a_s": link["a_s"], "B": link["B"], "points": link["points"]},
                                      "rows": rows}
            for r in rows:
                print(f"  {r['order']} ({r['what']}): {r['step_ms']:.1f} ms/step measured (one node "
                      f"{r['one_node_step_ms']:.1f}), predicted {r['predicted_step_ms']:.1f} "
                      f"({100 * r['error']:+.0f} %), simulated with --inter-link {r['link_spec']}: "
                      f"{r['sim_predicted_step_ms']:.1f} ({100 * r['sim_error']:+.0f} %), "
                      f"{r['tokens_per_s']:.0f} tokens/s", flush=True)
    finally:
        subprocess.run([CLUSTER, "down", "--name", NAME], cwd=REPO, capture_output=True)
    results["wall_s"] = time.time() - t0
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    md = table(a, results)
    with open(os.path.join(a.out, "netns_cluster.md"), "w") as f:
        f.write(md)
    print(md)


def table(a, results):
    load = os.getloadavg()[0]
    lines = [f"`bench/netns_cluster.py --rates {a.rates} --repeats {a.repeats}` ({results['wall_s']:.0f} s), "
             f"{time.strftime('%Y-%m-%d', time.gmtime())}, load average {results['load_start']:.1f} at the start", "",
             f"lab 07, model {a.model}, tp 2 x pp 2 x dp 1, 1F1B, m {a.micro_batches} x micro-batch {a.micro_batch} "
             f"x T {a.seq_len}, {a.steps - 1} timed steps, 4 ranks (2 per node) of 1 thread on {os.cpu_count()} "
             f"cores, medians of {a.repeats} alternating runs; load average {load:.1f} at the end", "",
             "| link rate | fitted a = base + 2 alpha | fitted B | order | tp groups | step ms, one node | "
             "step ms, two nodes (runs) | tokens/s, two nodes | predicted step ms | error | "
             "--device sim: link's share, ms | sim-predicted step ms | error |",
             "|---|--:|--:|---|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for rate, res in results["rates"].items():
        link = res["link"]
        for r in res["rows"]:
            lines.append(f"| {rate} | {1e6 * link['a_s']:.0f} us | {link['B'] / 1e6:.1f} MB/s | `{r['order']}` | "
                         f"{r['what']} | {r['one_node_step_ms']:.1f} | {r['step_ms']:.1f} "
                         f"({'-'.join(f'{x:.0f}' for x in (min(r['steps_ms']), max(r['steps_ms'])))}) | "
                         f"{r['tokens_per_s']:,.0f} | "
                         f"{r['predicted_step_ms']:.1f} | {100 * r['error']:+.0f} % | "
                         f"{r['sim_extra_ms']:.1f} | {r['sim_predicted_step_ms']:.1f} | {100 * r['sim_error']:+.0f} % |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
