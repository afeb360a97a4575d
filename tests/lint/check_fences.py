#!/usr/bin/env python3
"""check_fences.py — a lab's twin files declare the same functions, and hold the TODO functions only.

docs/design.md "How the two tracks link": labs/NN_name/<topic>.cpp (the learner's, with TODO stubs) and
solutions/NN_name/<topic>.cpp (the reference) are twins: they hold the lab's TODO functions and nothing else,
and differ only between

    // TODO(labNN-K) BEGIN  <what to write>
    ...                                        <- learner: hints + throw scalelab::NotImplemented("labNN-K ...")
    // TODO(labNN-K) END                       <- reference: the code

Everything else of the lab (helpers, classes, the parts of the algorithm that are not the learner's) is
written once, in labs/NN_name/ (sl_add_lab's GIVEN in labs/CMakeLists.txt), and compiled into both tracks.
For every solutions/NN_name/*.cpp|*.h this checks:
  - its twin labs/NN_name/<same file> exists;
  - the fences pair up (BEGIN then END of the same id, no nesting), and their ids carry the lab's NN;
  - both files have the same fences, in the same order, with identical BEGIN and END lines;
  - outside the fence bodies the files are byte-identical: the same includes, namespaces and signatures
    (a unified diff shows where not);
  - no reference fence body throws NotImplemented (the reference implements every TODO);
  - the reference holds TODO functions only: every block at namespace scope (a function body, a class)
    contains a TODO fence, so given code cannot creep back into the twins;
and that no other source file of labs/NN_name (a given file, a header, the driver) has a TODO fence.
These hold on a learner's working tree too, whatever the learner wrote inside the fences.

  --pristine   also: every learner fence body throws scalelab::NotImplemented("labNN-K ...") with its own id
               (true only of the untouched kit: scripts/test.sh runs it on CI's tree)

  tests/lint/check_fences.py [--root REPO] [--lab NN] [--pristine]   exit 0 when clean, 1 with a report
Registered as ctest lint.check_fences by tests/lint/CMakeLists.txt (without --pristine); scripts/grade
imports it (compare_lab, shared_files) to warn a learner who changed code that is not theirs, and
scripts/check_mistakes.py (compare_pair, parse) to keep each planted mistake inside its fence.
Its own test: tests/lint/test_check_fences.py.
"""
import argparse
import bisect
import difflib
import os
import re
import sys
from dataclasses import dataclass, field

# "// TODO(lab01-2) BEGIN  FLOPs per token ..." or "// TODO(lab01-2) END"
FENCE_RE = re.compile(r"^\s*//\s*TODO\((lab(\d\d)-(\d+))\)\s+(BEGIN|END)\b")
SOURCE_EXTS = (".cpp", ".h", ".cu", ".cuh")


@dataclass
class Fence:
    fence_id: str     # "lab01-2"
    begin: int        # 1-based line numbers of the BEGIN and END lines
    end: int
    body: str         # the lines strictly between them


@dataclass
class Parsed:
    fences: list = field(default_factory=list)
    skeleton: list = field(default_factory=list)  # the file's lines, each fence body replaced by one marker
    errors: list = field(default_factory=list)


@dataclass
class Problem:
    path: str         # the file the problem is about (relative to the repo root)
    message: str
    diff: str = ""    # a unified diff, when the problem is a difference outside the fences


def parse(text, rel_path, lab_nn=None):
    """Splits a file into its fences and its skeleton (everything outside the fence bodies)."""
    out = Parsed()
    lines = text.splitlines(keepends=True)
    open_fence = None  # (id, begin line number, body lines)
    for number, line in enumerate(lines, start=1):
        m = FENCE_RE.match(line)
        if not m:
            if open_fence is None:
                out.skeleton.append(line)
            else:
                open_fence[2].append(line)
            continue
        fence_id, nn, kind = m.group(1), m.group(2), m.group(4)
        if lab_nn is not None and nn != lab_nn:
            out.errors.append(f"{rel_path}:{number}: TODO({fence_id}) is in lab {lab_nn}'s folder; "
                              f"fence ids are lab{lab_nn}-K")
        if kind == "BEGIN":
            if open_fence is not None:
                out.errors.append(f"{rel_path}:{number}: TODO({fence_id}) BEGIN inside TODO({open_fence[0]}), "
                                  f"opened on line {open_fence[1]}: fences do not nest")
                continue
            open_fence = (fence_id, number, [])
            out.skeleton.append(line)
        else:
            if open_fence is None:
                out.errors.append(f"{rel_path}:{number}: TODO({fence_id}) END without a BEGIN")
                out.skeleton.append(line)
                continue
            if fence_id != open_fence[0]:
                out.errors.append(f"{rel_path}:{number}: TODO({fence_id}) END closes TODO({open_fence[0]}) "
                                  f"BEGIN of line {open_fence[1]}")
            out.fences.append(Fence(open_fence[0], open_fence[1], number, "".join(open_fence[2])))
            out.skeleton.append(f"    <body of TODO({open_fence[0]})>\n")
            out.skeleton.append(line)
            open_fence = None
    if open_fence is not None:
        out.errors.append(f"{rel_path}:{open_fence[1]}: TODO({open_fence[0]}) BEGIN has no END")
    return out


def stub_throws_own_id(body, fence_id):
    """The learner's stub: throw scalelab::NotImplemented("lab01-2 ...") naming this fence's id."""
    return re.search(r'throw\s+scalelab::NotImplemented\(\s*"' + re.escape(fence_id) + r'[ "]', body) is not None


# ---------------------------------------------------------------------------------------------
# The blocks at namespace scope of a C++ file

def code_only(text):
    """text with comments and the insides of string and character literals blanked out (same length, same
    newlines), so that the braces and semicolons left are the code's own."""
    out, i, n = list(text), 0, len(text)

    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            blank(i, j)
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^()\\\s]{0,16})\(', text[i:])
            if not m:
                i += 1
                continue
            close = ")" + m.group(1) + '"'
            j = text.find(close, i + m.end())
            j = n if j < 0 else j + len(close)
            blank(i + 1, j)
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # a digit separator: 1'000'000
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            blank(i + 1, min(j, n))
            i = j + 1
        else:
            i += 1
    return "".join(out)


def namespace_scope_blocks(text):
    """[(first line, last line, head)] of every brace block at namespace scope: function bodies, classes,
    initialisers. Namespace braces are walked into, not reported. Lines are 1-based; head is the code
    before the block's opening brace, on one line (e.g. "int rate(int a, int b)")."""
    code = code_only(text)
    line_starts = [0] + [m.end() for m in re.finditer(r"\n", code)]
    line_of = lambda pos: bisect.bisect_right(line_starts, pos)  # noqa: E731
    blocks, stack, head_start = [], [], 0  # stack: "namespace" or "block" per open brace
    for pos, c in enumerate(code):
        if c == "{":
            head = code[head_start:pos]
            if "block" in stack:
                stack.append("block")
            elif re.search(r"\bnamespace\b[\w\s:]*$", head) or re.search(r'\bextern\s*"\s*"\s*$', head):
                stack.append("namespace")
                head_start = pos + 1
            else:
                stack.append("block")
                first = head_start + (len(head) - len(head.lstrip()))
                blocks.append([line_of(first), None, " ".join(head.split())])
        elif c == "}" and stack:
            kind = stack.pop()
            if kind == "block" and "block" not in stack:
                blocks[-1][1] = line_of(pos)
            if "block" not in stack:
                head_start = pos + 1
        elif c == ";" and "block" not in stack:
            head_start = pos + 1
    return [(a, b if b is not None else len(line_starts), h) for a, b, h in blocks]


def blocks_without_fences(text, fences):
    """The namespace-scope blocks of text that hold no TODO fence: code that is not a TODO function."""
    return [(a, b, h) for a, b, h in namespace_scope_blocks(text) if not any(a <= f.begin <= b for f in fences)]


# ---------------------------------------------------------------------------------------------
# The checks

def compare_pair(learner_text, solution_text, learner_rel, solution_rel, lab_nn=None, pristine=False,
                 given_hint="the lab's given file"):
    """Problems between one learner twin and its reference twin (an empty list when they agree).
    pristine=True: the kit as shipped, whose every learner fence still throws its NotImplemented stub."""
    problems = []
    learner = parse(learner_text, learner_rel, lab_nn)
    solution = parse(solution_text, solution_rel, lab_nn)
    problems += [Problem(learner_rel, e) for e in learner.errors]
    problems += [Problem(solution_rel, e) for e in solution.errors]

    learner_ids = [f.fence_id for f in learner.fences]
    solution_ids = [f.fence_id for f in solution.fences]
    if learner_ids != solution_ids:
        problems.append(Problem(learner_rel, f"fences differ: {learner_rel} has {learner_ids or 'none'}, "
                                             f"{solution_rel} has {solution_ids or 'none'} (same ids, same order)"))

    if learner.skeleton != solution.skeleton:
        # Line numbers in the hunks count each folded fence body as one line.
        diff = "".join(difflib.unified_diff(solution.skeleton, learner.skeleton,
                                            fromfile=solution_rel + " (fence bodies folded)",
                                            tofile=learner_rel + " (fence bodies folded)"))
        problems.append(Problem(learner_rel, f"{learner_rel} differs from {solution_rel} outside the TODO fences",
                                diff))

    if pristine:
        for f in learner.fences:
            if not stub_throws_own_id(f.body, f.fence_id):
                problems.append(Problem(learner_rel, f"{learner_rel}:{f.begin}: the body of TODO({f.fence_id}) "
                                                     f"must throw scalelab::NotImplemented(\"{f.fence_id} ...\")"))
    for f in solution.fences:
        if "NotImplemented(" in f.body:
            problems.append(Problem(solution_rel, f"{solution_rel}:{f.begin}: the reference's TODO({f.fence_id}) "
                                                  f"throws NotImplemented: the reference implements every TODO"))
    if not solution.errors:
        for first, _, head in blocks_without_fences(solution_text, solution.fences):
            problems.append(Problem(solution_rel, f"{solution_rel}:{first}: `{head[:80]}` holds no TODO fence: "
                                                  f"a twin holds the TODO functions only; given code goes in "
                                                  f"{given_hint}, compiled into both tracks"))
    return problems


def lab_dirs(root):
    """{"01": "01_single_device", ...} for every solutions/NN_name folder."""
    found = {}
    solutions = os.path.join(root, "solutions")
    if os.path.isdir(solutions):
        for name in sorted(os.listdir(solutions)):
            m = re.match(r"^(\d\d)_", name)
            if m and os.path.isdir(os.path.join(solutions, name)):
                found[m.group(1)] = name
    return found


def read(path):
    with open(path, encoding="utf-8", newline="") as f:  # newline="": keep \r\n visible to the comparison
        return f.read()


def sources(folder):
    """Source files below folder, relative to it, sorted."""
    found = []
    for dirpath, _, files in os.walk(folder):
        for name in files:
            if name.endswith(SOURCE_EXTS):
                found.append(os.path.relpath(os.path.join(dirpath, name), folder))
    return sorted(found)


def shared_files(root, lab_name):
    """The source files of labs/<lab_name> that are not twins (relative to root): the given files, the
    headers, the driver. Both tracks compile them as they are, so none of them is the learner's to edit."""
    twins = set(sources(os.path.join(root, "solutions", lab_name)))
    lab = os.path.join(root, "labs", lab_name)
    return [os.path.join("labs", lab_name, rel) for rel in sources(lab) if rel not in twins]


def compare_lab(root, lab_name, pristine=False):
    """Problems of one lab (e.g. "01_single_device"): its twins, and the fences of its other files."""
    problems = []
    lab_nn = lab_name[:2]
    given = [f for f in shared_files(root, lab_name) if f.endswith((".cpp", ".cu")) and
             os.path.basename(f) != "main.cpp"]
    given_hint = " or ".join(given) if given else f"a given file in labs/{lab_name}/"
    sol_dir = os.path.join(root, "solutions", lab_name)
    for rel in sources(sol_dir):
        solution_rel = os.path.join("solutions", lab_name, rel)
        learner_rel = os.path.join("labs", lab_name, rel)
        learner_path = os.path.join(root, learner_rel)
        solution_text = read(os.path.join(root, solution_rel))
        if not os.path.exists(learner_path):
            problems.append(Problem(solution_rel, f"{solution_rel} has no twin: {learner_rel} does not exist"))
            continue
        problems += compare_pair(read(learner_path), solution_text, learner_rel, solution_rel, lab_nn, pristine,
                                 given_hint)
    for rel in shared_files(root, lab_name):
        for f in parse(read(os.path.join(root, rel)), rel, lab_nn).fences:
            problems.append(Problem(rel, f"{rel}:{f.begin}: TODO({f.fence_id}) in a file with no reference twin "
                                         f"(solutions/{lab_name}/{os.path.basename(rel)}): a TODO lives in a twin"))
    return problems


def compare_all(root, labs=None, pristine=False):
    problems = []
    for nn, lab_name in lab_dirs(root).items():
        if labs is None or nn in labs:
            problems += compare_lab(root, lab_name, pristine)
    return problems


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description="a lab's twins declare the same functions and hold TODO functions only")
    ap.add_argument("--root", default=os.path.normpath(os.path.join(here, "..", "..")), help="repository root")
    ap.add_argument("--lab", action="append", help="only this lab (NN); repeatable")
    ap.add_argument("--pristine", action="store_true",
                    help="also: every learner fence still throws its NotImplemented stub (the untouched kit)")
    args = ap.parse_args(argv)
    labs = lab_dirs(args.root)
    if args.lab:
        labs = {nn: name for nn, name in labs.items() if nn in args.lab}
    problems = compare_all(args.root, set(labs), pristine=args.pristine)
    for p in problems:
        print(f"FAIL {p.message}")
        if p.diff:
            print(p.diff, end="" if p.diff.endswith("\n") else "\n")
    print(f"check_fences{' --pristine' if args.pristine else ''}: {len(labs)} lab(s) "
          f"({', '.join(labs.values()) or 'none'}), {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
