#!/usr/bin/env python3
"""scripts/check_mistakes.py — every planted mistake must fail the graded check it targets.

  scripts/check_mistakes.py [--build-dir build-mistakes] [--lab NN]... [--only ID]... [--jobs N]
                            [--list] [--lint] [--all-checks] [--no-baseline] [--baseline-from BUILD]
                            [--like BUILD] [--verbose]

A planted mistake (docs/grading.md "Planted mistakes") is a small patch of a reference file's TODO
blocks, tests/mistakes/labNN/<id>.patch, described in tests/mistakes/labNN/manifest.json with the ONE
graded check it must trip. For each selected mistake this script
  1. restores a copy of solutions/ (<build>/mistakes-src/solutions; solutions/ itself is never touched)
     and applies the patch with `patch -p1 --fuzz=0` (a patch that does not apply exactly fails loudly);
  2. insists the patch changed only the body of the TODO fence it names (tests/lint/check_fences.py);
  3. rebuilds incrementally only the graded program that holds the check (the build's reference track
     compiles from the copy: -DSL_SOLUTIONS_DIR=<copy>, -DSL_BUILD_LEARNER=OFF; CPU only, or with
     --like BUILD that build's CUDA/oneDNN/-march settings, so that ccache serves every other object);
  4. runs only that check through ctest (`ctest -R '^labNN.<check>.reference$'`) and reads its record as
     scripts/grade does (its functions are imported, not copied): status failed = caught; a crash or a
     timeout of the check counts as caught too and is reported as such; passed = NOT CAUGHT; a record
     of another check, or not_implemented / skipped = wrong check (a speed check compares the patched
     program with a copy of the unpatched reference's, <build>/unpatched-reference, SL_PERF_REFERENCE_DIR);
  5. restores the copy.
Before the first mistake it runs the selected checks once on the unpatched copy (the baseline): a check
that already fails there could not tell a mistake from a broken build, so the run stops. With
--baseline-from BUILD, a check whose reference record in BUILD says passed and is newer than every source
is not run again (scripts/test.sh: the grader has just run them all on the same sources).
Prints one table (mistake, check, result, seconds) and exits 0 only if every mistake was caught.

  --lint        only steps 1, 2 and 5 for every mistake, and its id against what it does (name_problems:
                the id's words against its "mistake" text and the lines it changes); no build, a few seconds
  --all-checks  also run every other graded check of the lab on each mistake and list those that fail
                (slower; shows what else a mistake trips, for writing hints)
  --list        print the selected mistakes and exit
  --cover       only the first mistake of each graded check (CI; all of them: no flag)
  --uncovered   list every graded check of every lab (its README's check table, which ctest
                lint.readme_check_tables holds equal to what `scripts/grade NN --list` prints) that no
                manifest entry targets; no build, a second
"""
import argparse
import filecmp
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MISTAKES_DIR = os.path.join(REPO, "tests", "mistakes")
TRACK = "reference"


sys.path.insert(0, os.path.join(REPO, "tests", "lint"))
import lab_docs  # noqa: E402  (tests/lint/lab_docs.py: load_script)

grade = lab_docs.load_script("grade", REPO)  # scripts/grade as a module: its build, ctest and record functions
check_fences = grade.check_fences  # tests/lint/check_fences.py, as scripts/grade imports it
lab_manifests = grade.lab_manifests  # scripts/lib/labs.py: each lab's manifest, labs/NN_name/lab.json


# ---------------------------------------------------------------------------------------------
# The manifests

def load_manifests():
    """Every tests/mistakes/labNN/manifest.json, as a list of mistakes (dicts) with 'lab' and 'patch_path'.
    Each mistake patches one of the lab's twins as its manifest (labs/NN_name/lab.json) names them."""
    mistakes, seen = [], {}
    labs = {lab["number"]: lab for lab in lab_manifests.load(REPO)}
    for path in sorted(glob.glob(os.path.join(MISTAKES_DIR, "lab[0-9][0-9]", "manifest.json"))):
        lab_dir = os.path.dirname(path)
        lab = os.path.basename(lab_dir)[3:]
        with open(path) as f:
            doc = json.load(f)
        if doc.get("lab") != lab:
            sys.exit(f"check_mistakes: {path}: \"lab\" is {doc.get('lab')!r}, the folder says {lab!r}")
        if lab not in labs or not labs[lab]["twins"]:
            sys.exit(f"check_mistakes: {path}: lab {lab} has no manifest with TODO twins (labs/{lab}_*/lab.json)")
        twins = [f"{labs[lab]['solutions_dir']}/{t}" for t in labs[lab]["twins"]]
        for entry in doc.get("mutations", []):
            where = f"{path}: mutation {entry.get('id', '?')!r}"
            for key in ("id", "file", "patch", "fence", "check", "mistake", "concept"):
                if not entry.get(key):
                    sys.exit(f"check_mistakes: {where}: missing \"{key}\"")
            if entry["id"] in seen:
                sys.exit(f"check_mistakes: {where}: id already used in {seen[entry['id']]}")
            seen[entry["id"]] = path
            if not re.fullmatch(rf"lab{lab}\.[a-z0-9_]+", entry["check"]):
                sys.exit(f"check_mistakes: {where}: check {entry['check']!r} is not a lab{lab}.<check id>")
            if entry["file"] not in twins:
                sys.exit(f"check_mistakes: {where}: file {entry['file']!r} is not a twin of lab {lab} "
                         f"({', '.join(twins)}: its manifest's \"twins\")")
            patch_path = os.path.join(lab_dir, entry["patch"])
            if not os.path.isfile(patch_path):
                sys.exit(f"check_mistakes: {where}: no patch file {patch_path}")
            mistakes.append(dict(entry, lab=lab, patch_path=patch_path))
    return mistakes


# ---------------------------------------------------------------------------------------------
# The patched copy of solutions/

def restore_copy(src_root):
    """Makes <src_root>/solutions equal to solutions/, rewriting only the files that differ. A rewritten
    file gets a fresh modification time (copyfile, not copy2), so the build recompiles it."""
    source = os.path.join(REPO, "solutions")
    target = os.path.join(src_root, "solutions")
    wanted = set()
    for dirpath, _, files in os.walk(source):
        for name in files:
            rel = os.path.relpath(os.path.join(dirpath, name), source)
            wanted.add(rel)
            dst = os.path.join(target, rel)
            if not os.path.exists(dst) or not filecmp.cmp(os.path.join(source, rel), dst, shallow=False):
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copyfile(os.path.join(source, rel), dst)
    for dirpath, _, files in os.walk(target):  # e.g. a file a patch created, or one removed from solutions/
        for name in files:
            rel = os.path.relpath(os.path.join(dirpath, name), target)
            if rel not in wanted:
                os.remove(os.path.join(target, rel))


def apply_patch(src_root, mistake):
    """Applies the mistake's patch to the copy. Returns "" or what went wrong."""
    rc, out = grade.run(["patch", "-p1", "--batch", "--forward", "--fuzz=0", "--no-backup-if-mismatch",
                         "--reject-file=-", "-d", src_root, "-i", os.path.abspath(mistake["patch_path"])])
    if rc != 0:
        return "patch does not apply: " + " | ".join(out.strip().splitlines()[-3:])
    return ""


def fence_problems(src_root, mistake):
    """The patch may change only the body of the fence it names. Returns "" or what it changed besides."""
    rel = mistake["file"]
    with open(os.path.join(REPO, rel), encoding="utf-8", newline="") as f:
        original = f.read()
    try:
        with open(os.path.join(src_root, rel), encoding="utf-8", newline="") as f:
            mutated = f.read()
    except OSError as e:
        return f"{rel}: {e}"
    if mutated == original:
        return f"the patch did not change {rel}"
    lab = mistake["lab"]
    problems = check_fences.compare_pair(mutated, original, rel + " (mutated)", rel, lab_nn=lab)
    if problems:
        return "; ".join(p.message for p in problems) + "".join("\n" + p.diff for p in problems if p.diff)
    # A TODO may span several fences of one id (a forward and its backward): compare all of an id's bodies.
    def bodies(text):
        out = {}
        for f in check_fences.parse(text, rel, lab).fences:
            out.setdefault(f.fence_id, []).append(f.body)
        return out
    before, after = bodies(original), bodies(mutated)
    changed = sorted(k for k in before if before[k] != after.get(k))
    if changed != [mistake["fence"]]:
        return f"the patch changes the bodies of {changed}, the manifest says {mistake['fence']}"
    # Any other file of the copy must be untouched.
    for dirpath, _, files in os.walk(os.path.join(src_root, "solutions")):
        for name in files:
            other = os.path.relpath(os.path.join(dirpath, name), src_root)
            if other != rel and not (os.path.exists(os.path.join(REPO, other)) and
                                     filecmp.cmp(os.path.join(REPO, other), os.path.join(src_root, other),
                                                 shallow=False)):
                return f"the patch changes {other} too; a mistake patches only {rel}"
    return ""


# ---------------------------------------------------------------------------------------------
# The name says what the patch does

# A mistake's id names what it does ("lab05-no-divide-by-microsteps"); a name that says one thing while the
# patch does another hides a grader gap (that id once removed the data-parallel average, and no check ran
# train_step with m > 1). Each word (or pair of words) of the id that this table knows must be found in the
# manifest's "mistake" text; an arithmetic word must also be found in a line the patch adds or removes
# (comments left out). Words the table does not know are not judged.
NAME_TEXT = {  # id word -> regex the "mistake" text must match (case-insensitive)
    "divide": r"divid|/|scale|halv", "divides": r"divid|/|scale",
    "microsteps": r"micro|\bm\b", "microstep": r"micro|\bm\b",
    "zero-grad": r"zero", "sum": r"sum|add", "summed": r"sum|add", "sums": r"sum|add",
    "average": r"averag|mean", "averaged": r"averag|mean|divid", "avg": r"averag",
    "barrier": r"barrier", "marker": r"marker", "manifest": r"manifest", "checksum": r"checksum",
    "clip": r"clip", "norm": r"norm", "broadcast": r"broadcast", "gather": r"gather",
    "allgather": r"all-gather|allgather|all_gather", "replicas": r"replica|data.parallel", "loss": r"loss",
    "warmup": r"warm", "nan": r"nan", "std": r"std|standard", "seed": r"seed", "epoch": r"epoch",
    "bias": r"bias", "tied": r"tied|wte", "incomplete": r"complete", "embeddings": r"embedding|wte",
}
NAME_CODE = {  # id word -> regex some changed code line of the patch must match
    "divide": r"/|scale|divid", "divides": r"/|scale|divid", "zero-grad": r"zero_grad",
    "sum": r"Sum|sum|\+", "summed": r"Sum|sum|\+", "sums": r"Sum|sum|\+",
    "average": r"Avg|averag|/|scale|mean", "averaged": r"Avg|averag|/|scale|mean", "avg": r"Avg|averag",
    "barrier": r"barrier", "nan": r"isfinite|nan", "std": r"std|var",
}


def changed_code(patch_text):
    """The lines a unified diff adds or removes (after its header lines), comments dropped, as one string."""
    at = patch_text.find("\n--- ")
    lines = []
    for line in (patch_text[at:] if at >= 0 else patch_text).splitlines():
        if line[:1] in "+-" and not line.startswith(("+++", "---")):
            lines.append(re.sub(r"//.*", "", line[1:]))
    return "\n".join(lines)


def name_problems(mistake, patch_text):
    """What the id says that neither the "mistake" text nor (for arithmetic) the patch's changed lines do:
    a list of lines, empty when the name agrees with both."""
    words = mistake["id"].split("-")[1:]  # after labNN
    terms = words + [a + "-" + b for a, b in zip(words, words[1:])]
    code = changed_code(patch_text)
    out = []
    for t in terms:
        if t in NAME_TEXT and not re.search(NAME_TEXT[t], mistake["mistake"], re.I):
            out.append(f"the id says '{t}', its \"mistake\" text does not (/{NAME_TEXT[t]}/)")
        if t in NAME_CODE and not re.search(NAME_CODE[t], code):
            out.append(f"the id says '{t}', no line the patch changes does (/{NAME_CODE[t]}/)")
    return out


# ---------------------------------------------------------------------------------------------
# Build and run

# The settings --like copies from another build: the ones that change how common/ compiles, so that with
# ccache (CMake SL_CCACHE) the mistakes' build takes every object but the patched track's from the cache.
# SL_WERROR too (its -Werror is on every command line); the patched copy's own warnings stay warnings
# (sl_add_lab in cmake/scalelab.cmake), so a mistake that leaves a variable unused still builds.
LIKE_KEYS = ("SL_WITH_CUDA", "CMAKE_CUDA_ARCHITECTURES", "SL_WITH_DNNL", "SL_NATIVE", "SL_WITH_MPI", "SL_WERROR")


def cache_values(build):
    """{name: value} of build's CMakeCache.txt ({} when it has none)."""
    values = {}
    path = os.path.join(build, "CMakeCache.txt")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                m = re.match(r"([A-Za-z_]+):[A-Z]+=(.*)$", line.rstrip("\n"))
                if m:
                    values[m.group(1)] = m.group(2)
    return values


def like_settings(like):
    """{name: value} of `like`'s cache for LIKE_KEYS; CPU only without --like."""
    if not like:
        return {"SL_WITH_CUDA": "OFF"}
    values = cache_values(like)
    if not values:
        sys.exit(f"check_mistakes: --like {like}: no CMakeCache.txt there (configure that build first)")
    return {k: v for k, v in values.items() if k in LIKE_KEYS}


def configure(build, src_root, like):
    """Configures the mistakes' build once: tests on, learner track off, reference from the copy; CPU only, or
    with --like the compile settings of another build (its objects then come from ccache)."""
    solutions = os.path.join(src_root, "solutions")
    settings = dict(like_settings(like), SL_SOLUTIONS_DIR=solutions)
    have = cache_values(build)
    if all(have.get(k) == v for k, v in settings.items()):
        return
    args = [f"-D{k}={v}" for k, v in settings.items()]
    print(f"== configuring {build} ({' '.join(args)})", flush=True)
    rc, out = grade.run(["cmake", "-S", REPO, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                         "-DSL_BUILD_TESTS=ON", "-DSL_BUILD_LEARNER=OFF"] + args)
    if rc != 0:
        print(grade.tail(out, 60))
        sys.exit(f"check_mistakes: configuring {build} failed (the output is above)")


def target_of(test):
    """The CMake target of the graded program a ctest runs: tests/bin/reference/<name> -> <name>_reference
    (sl_add_graded_test in cmake/scalelab.cmake)."""
    for arg in test["command"]:
        m = re.search(r"[/\\]tests[/\\]bin[/\\]" + TRACK + r"[/\\]([A-Za-z0-9_]+)$", arg)
        if m:
            return f"{m.group(1)}_{TRACK}"
    return None


def run_checks(build, tests, jobs, verbose):
    """Runs the ctests, returns {name: (row as scripts/grade builds it, how it ended)}, where how is
    "record" (the check wrote its record), "timeout" or "crash: <ctest's exit>"."""
    for t in tests:  # a stale record must never stand in for a run that crashed
        path = grade.record_path(t)
        for old in ([path] + grade.rank_record_paths(path)) if path else []:
            if os.path.exists(old):
                os.remove(old)
    outcomes = grade.run_ctest(build, tests, jobs, verbose)
    results = {}
    for t in tests:
        outcome = outcomes.get(t["name"])
        wrote = grade.read_record(grade.record_path(t) or "") is not None
        row = grade.grade_test(t, outcome)
        exit_code = (outcome or {}).get("exit", "")
        how = "record" if wrote else ("timeout" if exit_code == "Timeout" else f"crash: {exit_code or 'no record'}")
        results[t["name"]] = (row, how)
    return results


def judge(mistake, row, how):
    """(result word, detail) of the intended check's outcome on a mistake."""
    status = row.get("check_status")
    if how == "record" and row.get("check_id") != mistake["check"]:
        return "wrong check", f"the record is of {row.get('check_id')}"
    if status == "failed":
        if how == "record":
            first = next((ln for ln in row.get("check_message", "").splitlines() if ln.strip()), "")
            return "caught", first
        return f"caught ({how})", ""
    if status == "passed":
        return "NOT CAUGHT", row.get("check_measured", "")
    return "wrong check", f"status {status}: {row.get('check_message', '')}"


def print_table(rows):
    id_w = max([len(r["id"]) for r in rows] + [7])
    check_w = max([len(r["check"]) for r in rows] + [5])
    res_w = max([len(r["result"]) for r in rows] + [6])
    print(f"\n{'mistake':<{id_w}}  {'check':<{check_w}}  {'result':<{res_w}}  {'seconds':>7}")
    for r in rows:
        print(f"{r['id']:<{id_w}}  {r['check']:<{check_w}}  {r['result']:<{res_w}}  {r['seconds']:7.1f}")
        if r.get("detail") and not r["result"].startswith("caught"):
            for line in r["detail"].splitlines()[:12]:
                print(" " * 4 + line)
        if r.get("also"):
            print(" " * 4 + "also fails: " + ", ".join(r["also"]))


# ---------------------------------------------------------------------------------------------

def newest_source_mtime():
    """The newest modification time of a file the reference track's checks are built from."""
    newest = 0.0
    for top in ("common", "labs", "solutions", "tests", "cmake", "CMakeLists.txt"):
        path = os.path.join(REPO, top)
        if os.path.isfile(path):
            newest = max(newest, os.path.getmtime(path))
        for dirpath, _, files in os.walk(path):
            for name in files:
                newest = max(newest, os.path.getmtime(os.path.join(dirpath, name)))
    return newest


def baseline_from_records(other_build, baseline):
    """--baseline-from BUILD: the checks of `baseline` that BUILD's reference records (scripts/grade NN --track
    reference, run there after the last change to any source) show passed need no baseline run here: the copy
    is solutions/ itself until a patch is applied. Returns the checks still to run."""
    others = {t["name"]: t for t in grade.list_tests(other_build)}
    newest = newest_source_mtime()
    left = []
    for t in baseline:
        o = others.get(t["name"])
        path = grade.record_path(o) if o else None
        fresh = path is not None and os.path.exists(path) and os.path.getmtime(path) > newest
        if not fresh or grade.grade_test(o, None).get("check_status") != "passed":
            left.append(t)
    print(f"== baseline: {len(baseline) - len(left)} of {len(baseline)} checks passed in {other_build}'s reference "
          f"records, newer than every source", flush=True)
    return left


def covering(mistakes):
    """The first mistake of every (lab, check): each graded check that has mistakes is still proven by one
    it catches, at about 60 % of the cost of all of them (CI's 30 minutes on 2 cores; scripts/test.sh).
    Every patch of every fence still applies inside its fence: --lint checks them all, in seconds."""
    chosen, checks = [], set()
    for m in mistakes:
        c = (m["lab"], m["check"])
        if c not in checks:
            chosen.append(m)
            checks.add(c)
    return chosen


def graded_checks():
    """[(lab, check id, points)] of every lab with TODO twins, in lab and table order: the rows of each
    labs/NN_name/README.md check table (tests/lint/lab_docs.py check_table). ctest lint.readme_check_tables
    insists that table lists exactly the checks the grader runs, with their points, so no build is needed."""
    out = []
    for lab in lab_manifests.load(REPO):
        if not lab["twins"]:
            continue
        path = os.path.join(REPO, lab["dir"], "README.md")
        with open(path, encoding="utf-8") as f:
            table = lab_docs.check_table(f.read())
        if table["errors"] or not table["rows"]:
            sys.exit(f"check_mistakes: {path}: cannot read its check table: "
                     f"{'; '.join(table['errors']) or 'no table with check and points columns'}")
        out += [(lab["number"], row["id"], row["points"]) for row in table["rows"]]
    return out


def print_uncovered(mistakes, labs=None):
    """--uncovered: prints every graded check no mistake targets (of `labs`, or all), and mistakes whose check
    no lab has. Returns 0 (the list is information: a check that observes only given code has no mistake to plant,
    docs/grading.md "What the learner decides")."""
    checks = [c for c in graded_checks() if not labs or c[0] in labs]
    targeted = {m["check"] for m in mistakes}
    uncovered = [(lab, cid, points) for lab, cid, points in checks if cid not in targeted]
    for _, cid, points in uncovered:
        print(f"{cid:<56} {points:>3} points")
    known = {cid for _, cid, _ in graded_checks()}
    for m in mistakes:
        if m["check"] not in known:
            print(f"{m['id']}: targets {m['check']}, which no lab's check table lists")
    print(f"\n{len(uncovered)} of {len(checks)} graded checks have no planted mistake "
          f"({len(checks) - len(uncovered)} are targeted by "
          f"{sum(m['check'] in {c[1] for c in checks} for m in mistakes)} mistakes)")
    return 0


def main():
    ap = argparse.ArgumentParser(prog="scripts/check_mistakes.py", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build-mistakes"),
                    help="the mistakes' own build directory (default: build-mistakes)")
    ap.add_argument("--lab", action="append", help="only this lab (NN); repeatable")
    ap.add_argument("--only", action="append", help="only this mistake id; repeatable")
    ap.add_argument("--cover", action="store_true",
                    help="only the first mistake of each graded check, in manifest order "
                         "(every check proven by a mistake it catches; what CI runs)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="parallel build jobs")
    ap.add_argument("--list", action="store_true", help="print the selected mistakes and exit")
    ap.add_argument("--lint", action="store_true", help="only apply each patch and check its fences (no build)")
    ap.add_argument("--uncovered", action="store_true",
                    help="list the graded checks (each lab README's check table) that no mistake targets; no build")
    ap.add_argument("--all-checks", action="store_true", help="also run the lab's other checks on each mistake")
    ap.add_argument("--no-baseline", action="store_true", help="skip running the checks on the unpatched copy")
    ap.add_argument("--verbose", action="store_true", help="show ctest's output")
    ap.add_argument("--baseline-from", metavar="BUILD",
                    help="take the baseline of the checks that BUILD's reference records show passed, when they are "
                         "newer than every source (scripts/test.sh: scripts/grade all --track reference just ran)")
    ap.add_argument("--like", metavar="BUILD",
                    help="compile with that build's settings (CUDA, oneDNN, -march): with ccache its objects are "
                         "reused (scripts/test.sh passes its own build); default: CPU only")
    args = ap.parse_args()
    for nn in args.lab or []:
        if not re.fullmatch(r"\d\d", nn):
            ap.error(f"--lab takes two digits (03), not '{nn}'")
        if lab_manifests.find(nn, REPO) is None:
            ap.error(f"--lab {nn}: there is no lab {nn} (labs/NN_name/lab.json)")

    mistakes = load_manifests()
    if args.uncovered:
        return print_uncovered(mistakes, args.lab)
    if args.lab:
        mistakes = [m for m in mistakes if m["lab"] in args.lab]
    if args.only:
        unknown = set(args.only) - {m["id"] for m in mistakes}
        if unknown:
            ap.error(f"no mistake with id {', '.join(sorted(unknown))} (--list shows them)")
        mistakes = [m for m in mistakes if m["id"] in args.only]
    if args.cover:
        mistakes = covering(mistakes)
    if not mistakes:
        ap.error("no mistake selected")
    if args.list:
        for m in mistakes:
            print(f"{m['id']:<36} {m['check']:<48} {m['fence']}\n    {m['mistake']}")
        return 0

    build = os.path.abspath(args.build_dir)
    src_root = os.path.join(build, "mistakes-src")
    os.makedirs(src_root, exist_ok=True)
    restore_copy(src_root)
    t_start = time.monotonic()

    if args.lint:
        bad = 0
        for m in mistakes:
            problem = apply_patch(src_root, m) or fence_problems(src_root, m)
            if not problem:
                with open(m["patch_path"], encoding="utf-8") as f:
                    problem = "; ".join(name_problems(m, f.read()))
            restore_copy(src_root)
            print(f"{m['id']:<36} {'ok' if not problem else 'FAIL ' + problem}")
            bad += bool(problem)
        print(f"\n{len(mistakes) - bad} of {len(mistakes)} patches apply, stay inside their TODO fence and do what "
              "their name says")
        return 1 if bad else 0

    configure(build, src_root, args.like)
    # Build every graded program of the selected labs first: ctest lists a test's command only once
    # its program exists, and the command names the program (the target) a mistake must rebuild.
    labs = sorted({m["lab"] for m in mistakes})
    first = [f"graded_lab{lab}_{TRACK}" for lab in labs]
    print(f"== building {' '.join(first)}", flush=True)
    t0 = time.monotonic()
    rc, out = grade.run(["cmake", "--build", build, "-j", str(args.jobs), "--target"] + first)
    if rc != 0:
        print(grade.tail(out, 60))
        sys.exit("check_mistakes: the unpatched reference does not build (output above)")
    print(f"   {time.monotonic() - t0:.1f} s", flush=True)
    # The speed checks run the track's program against the reference's (tests/perf/perf_compare.h). Here the
    # reference track IS the patched copy, so both would be the mistake: the checks get a copy of the
    # unpatched reference's programs, taken now, through SL_PERF_REFERENCE_DIR (ctest passes it on).
    unpatched = os.path.join(build, "unpatched-reference")
    shutil.rmtree(unpatched, ignore_errors=True)
    shutil.copytree(os.path.join(build, "bin", "reference"), unpatched)
    os.environ["SL_PERF_REFERENCE_DIR"] = unpatched
    tests = {t["name"]: t for t in grade.list_tests(build)}
    for m in mistakes:
        name = f"{m['check']}.{TRACK}"
        if name not in tests:
            sys.exit(f"check_mistakes: {m['id']}: no ctest {name} in {build} (is the check id right? "
                     f"`ctest --test-dir {build} -N -L {TRACK}` lists them)")
        m["test"] = tests[name]
        m["target"] = target_of(tests[name])
        if not m["target"]:
            sys.exit(f"check_mistakes: {m['id']}: cannot tell the program of {name} from its command")
    lab_tests = {lab: grade.graded_tests(list(tests.values()), lab, TRACK) for lab in labs}

    # Baseline: the unpatched reference must pass every check the mistakes will be judged by.
    if args.all_checks:
        baseline = [t for lab in sorted(lab_tests) for t in lab_tests[lab]]
    else:
        baseline = list({m["test"]["name"]: m["test"] for m in mistakes}.values())
    if args.baseline_from and not args.no_baseline:
        baseline = baseline_from_records(args.baseline_from, baseline)
    if not args.no_baseline and baseline:
        print(f"== baseline: {len(baseline)} checks on the unpatched reference", flush=True)
        t0 = time.monotonic()
        results = run_checks(build, baseline, args.jobs, args.verbose)
        broken = [n for n, (row, _) in results.items() if row.get("check_status") not in ("passed", "skipped")]
        skipped = [n for n, (row, _) in results.items() if row.get("check_status") == "skipped"]
        print(f"   {time.monotonic() - t0:.1f} s", flush=True)
        if skipped:
            sys.exit(f"check_mistakes: skipped on the unpatched reference (no MPI?): {', '.join(skipped)}; "
                     f"a skipped check cannot catch a mistake")
        if broken:
            sys.exit(f"check_mistakes: the unpatched reference already fails {', '.join(broken)} in {build}: "
                     f"fix that first (scripts/grade NN --track reference)")

    rows = []
    for m in mistakes:
        t0 = time.monotonic()
        row = {"id": m["id"], "check": m["check"], "result": "", "detail": "", "also": []}
        restore_copy(src_root)
        try:
            problem = apply_patch(src_root, m)
            if problem:
                row.update(result="patch failed", detail=problem)
            elif (problem := fence_problems(src_root, m)):
                row.update(result="outside fence", detail=problem)
            else:
                selected = lab_tests[m["lab"]] if args.all_checks else [m["test"]]
                build_targets = sorted({target_of(t) for t in selected})
                rc, out = grade.run(["cmake", "--build", build, "-j", str(args.jobs), "--target"] + build_targets)
                if rc != 0:
                    row.update(result="build failed", detail=grade.tail(out, 12))
                else:
                    results = run_checks(build, selected, args.jobs if args.all_checks else 1, args.verbose)
                    check_row, how = results[m["test"]["name"]]
                    result, detail = judge(m, check_row, how)
                    row.update(result=result, detail=detail)
                    row["also"] = sorted(r["check_id"] for n, (r, _) in results.items()
                                         if n != m["test"]["name"] and r.get("check_status") != "passed")
        finally:
            restore_copy(src_root)  # also when interrupted: the next run must start clean
        row["seconds"] = time.monotonic() - t0
        rows.append(row)
        print(f"   {m['id']}: {row['result']} ({row['seconds']:.1f} s)", flush=True)

    print_table(rows)
    caught = sum(r["result"].startswith("caught") for r in rows)
    total_s = time.monotonic() - t_start
    print(f"\n{caught} of {len(rows)} planted mistakes caught by their check; {total_s:.0f} s in all "
          f"({sum(r['seconds'] for r in rows):.0f} s for the mistakes)")
    return 0 if caught == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
