#!/usr/bin/env python3
"""check_lab_docs.py — a lab's README and hints promise what the grader and the code deliver.

  tests/lint/check_lab_docs.py [--root REPO] [--build-dir BUILD] [--lab NN]...

For every lab with TODO fences (its manifest labs/NN_name/lab.json names twins: scripts/lib/labs.py):
  hints   labs/NN_name/hints.md has exactly one `## labNN-K` section per fence of the lab's files, each
          with a non-empty `### tier 1`, `### tier 2` and `### tier 3` (tests/lint/lab_docs.py). Required
          for a lab with graded checks; checked whenever the file exists.
  task    the README's first `## ` heading is `## Your task`: the task comes before the lesson.
With --build-dir (a configured and built tree), for every lab with graded checks there:
  table   the README's check table (the one table with `check` and `points` columns) lists exactly the
          checks the grader runs for the lab, with the same points (scripts/grade --list: each graded
          program describes its checks, nothing runs); its total row equals their sum; every TODO it
          names is a fence of the lab, and every fence is named by some check.
Exit 0 when clean, 1 with one line per problem. ctests: lint.lab_hints (no build) and
lint.readme_check_tables (--build-dir). Its own test: tests/lint/test_lab_docs.py.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts", "lib"))
import check_fences  # noqa: E402
import lab_docs  # noqa: E402
import labs as lab_manifests  # noqa: E402  (scripts/lib/labs.py: which labs have TODOs)


def fence_ids(root, lab_name):
    """The TODO ids of labs/<lab_name>/*, in file order."""
    ids = []
    d = os.path.join(root, "labs", lab_name)
    for name in sorted(os.listdir(d)):
        if name.endswith(check_fences.SOURCE_EXTS):
            with open(os.path.join(d, name), encoding="utf-8") as f:
                ids += [fence.fence_id for fence in check_fences.parse(f.read(), name).fences]
    return ids


def hint_problems(root, lab, lab_name, required):
    sections, errors, path = lab_docs.read_hints(lab, root)
    rel = os.path.relpath(path, root) if path else f"labs/{lab_name}/hints.md"
    if not sections and not errors:
        return [f"{rel}: missing (lab {lab} has graded checks: every TODO needs its tiers)"] if required else []
    problems = [f"{rel}: {e}" for e in errors]
    fences = fence_ids(root, lab_name)
    for todo in fences:
        if todo not in sections:
            problems.append(f"{rel}: no '## {todo}' section (the fence is in labs/{lab_name}/)")
    for todo in sections:
        if todo not in fences:
            problems.append(f"{rel}: '## {todo}' is no TODO fence of labs/{lab_name}/")
    return problems


def task_first_problems(root, lab_name):
    path = os.path.join(root, "labs", lab_name, "README.md")
    if not os.path.isfile(path):
        return [f"labs/{lab_name}/README.md: missing"]
    with open(path, encoding="utf-8") as f:
        headings = [ln.strip() for ln in f if ln.startswith("## ")]
    if not headings or headings[0] != "## Your task":
        first = headings[0] if headings else "none"
        return [f"labs/{lab_name}/README.md: the first '## ' heading is '{first}'; the task comes first: '## Your task'"]
    return []


def table_problems(root, lab, lab_name, declared):
    """declared: [(check id, points)] as the grader sees them."""
    rel = f"labs/{lab_name}/README.md"
    with open(os.path.join(root, rel), encoding="utf-8") as f:
        table = lab_docs.check_table(f.read())
    problems = [f"{rel}: {e}" for e in table["errors"]]
    if not table["rows"]:
        return problems + [f"{rel}: no check table (a table with `check` and `points` columns) for the grader's "
                           f"{len(declared)} checks"]
    readme = {r["id"]: r for r in table["rows"]}
    grader = dict(declared)
    for cid, points in declared:
        if cid not in readme:
            problems.append(f"{rel}: the check table lacks `{cid}` ({points} points), which scripts/grade {lab} runs")
        elif readme[cid]["points"] != points:
            problems.append(f"{rel}:{readme[cid]['line']}: `{cid}` has {readme[cid]['points']} points in the table, "
                            f"{points} in the grader")
    for cid, row in readme.items():
        if cid not in grader:
            problems.append(f"{rel}:{row['line']}: `{cid}` is in the check table, but scripts/grade {lab} has no such check")
    total = sum(points for _, points in declared)
    if table["total"] is None:
        problems.append(f"{rel}: the check table has no total row ('| **total** | **{total}** | ...')")
    elif table["total"] != total:
        problems.append(f"{rel}: the check table's total is {table['total']}, the grader's checks add up to {total}")
    fences = set(fence_ids(root, lab_name))
    named = set()
    for row in table["rows"]:
        for todo in row["todos"]:
            named.add(todo)
            if todo not in fences:
                problems.append(f"{rel}:{row['line']}: `{row['id']}` names {todo}, which is no TODO fence of the lab")
    for todo in sorted(fences - named, key=lambda t: int(t.split("-")[1])):
        problems.append(f"{rel}: no check in the table names {todo} (the TODOs column): which check tests it?")
    return problems


def main(argv=None):
    ap = argparse.ArgumentParser(description="a lab's README and hints.md agree with the grader and the fences")
    ap.add_argument("--root", default=os.path.normpath(os.path.join(HERE, "..", "..")), help="repository root")
    ap.add_argument("--build-dir", help="a built tree: also compare each README's check table with the grader")
    ap.add_argument("--lab", action="append", help="only this lab (NN); repeatable")
    args = ap.parse_args(argv)
    root = os.path.abspath(args.root)
    labs = {lab["number"]: os.path.basename(lab["dir"]) for lab in lab_manifests.load(root)
            if lab["twins"] and (not args.lab or lab["number"] in args.lab)}

    graded = {}  # lab -> [(id, points)], from the build
    if args.build_dir:
        grade = lab_docs.load_script("grade", root)
        build = os.path.abspath(args.build_dir)
        tests = grade.list_tests(build)
        for nn in labs:
            selected = grade.graded_tests(tests, nn, "reference")
            if selected:
                graded[nn] = [(r["check_id"], int(r["check_points"])) for r in grade.describe_checks(selected, "reference")]

    problems = []
    for nn, name in labs.items():
        problems += hint_problems(root, nn, name, required=nn in graded)
        if nn in graded or os.path.isfile(os.path.join(root, "labs", name, "hints.md")):
            problems += task_first_problems(root, name)
        if nn in graded:
            problems += table_problems(root, nn, name, graded[nn])
    for p in problems:
        print(f"FAIL {p}")
    what = "hints and task-first READMEs" + (f", check tables of labs {', '.join(sorted(graded))}" if graded else "")
    print(f"check_lab_docs: {len(labs)} lab(s), {what}: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
