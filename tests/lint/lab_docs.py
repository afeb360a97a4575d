#!/usr/bin/env python3
"""lab_docs.py — read what a lab's documents promise: the README's check table and the hints file.

Shared by scripts/grade (which TODOs a failing check needs, for its "more help" line), scripts/hint
(the tiers it prints) and tests/lint/check_lab_docs.py (the ctests that hold both to the grader and the
TODO fences). Python standard library only.

The README's check table (docs/grading.md "The README's check table") is the one markdown table of
labs/NN_name/README.md whose header has a `check` and a `points` column:

    | check | points | TODOs | what it must do |
    |---|---:|---|---|
    | `lab03.bucket_layout` | 3 | `lab03-3` | ... |
    | **total** | **33** | | ... |

The hints file labs/NN_name/hints.md has one `## labNN-K` section per TODO fence and under each
`### tier 1`, `### tier 2`, `### tier 3`: tier 1 a question that points at the idea, tier 2 the approach
and the names involved, tier 3 the steps, close to the code. Text before the first `##` is a preamble.
"""
import importlib.machinery
import importlib.util
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECK_ID = re.compile(r"`(lab\d\d\.[a-z0-9_]+)`")
TODO_ID = re.compile(r"\blab(\d\d)-(\d+)\b")
TIERS = (1, 2, 3)


def lab_dir(lab, root=REPO):
    """labs/NN_name for a two-digit lab number, or None."""
    labs = os.path.join(root, "labs")
    for name in sorted(os.listdir(labs)) if os.path.isdir(labs) else []:
        if name.startswith(f"{lab}_") and os.path.isdir(os.path.join(labs, name)):
            return os.path.join(labs, name)
    return None


def _cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def check_table(readme_text):
    """The README's check table: {"rows": [{"id", "points", "todos", "line"}], "total": int or None,
    "errors": [...]}; rows is empty when the README has no such table."""
    lines = readme_text.splitlines()
    out = {"rows": [], "total": None, "errors": []}
    tables = 0
    i = 0
    while i < len(lines):
        line = lines[i]
        header = [c.lower() for c in _cells(line)] if line.lstrip().startswith("|") else []
        if "check" in header and "points" in header and i + 1 < len(lines) and set(lines[i + 1]) <= set("|-: "):
            tables += 1
            col = {name: header.index(name) for name in ("check", "points", "todos") if name in header}
            i += 2
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                cells = _cells(lines[i])
                first = cells[col["check"]] if col["check"] < len(cells) else ""
                points_text = (cells[col["points"]] if col["points"] < len(cells) else "").strip("* ")
                if "total" in first.lower():
                    out["total"] = int(points_text) if points_text.isdigit() else None
                    if out["total"] is None:
                        out["errors"].append(f"line {i + 1}: the total row's points '{points_text}' is not a number")
                else:
                    m = CHECK_ID.search(first)
                    if not m or not points_text.isdigit():
                        out["errors"].append(f"line {i + 1}: a row of the check table needs `labNN.<check>` and "
                                             f"its points: {lines[i].strip()}")
                    else:
                        todos = cells[col["todos"]] if "todos" in col and col["todos"] < len(cells) else ""
                        out["rows"].append({"id": m.group(1), "points": int(points_text), "line": i + 1,
                                            "todos": [f"lab{a}-{b}" for a, b in TODO_ID.findall(todos)]})
                i += 1
            continue
        i += 1
    if tables > 1:
        out["errors"].append(f"{tables} tables have `check` and `points` columns; the README has exactly one "
                             "check table (the others say what they check without points)")
    return out


def todos_of_checks(lab, root=REPO):
    """{check id: [TODO ids]} from the lab README's check table ({} without one)."""
    d = lab_dir(lab, root)
    path = os.path.join(d, "README.md") if d else ""
    if not path or not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return {r["id"]: r["todos"] for r in check_table(f.read())["rows"]}


def hints(text):
    """{"lab03-5": {1: "...", 2: "...", 3: "..."}} from a hints.md text, and a list of format errors."""
    sections, errors = {}, []
    todo, tier = None, None
    for number, line in enumerate(text.splitlines(), start=1):
        m2 = re.match(r"^##\s+(\S+)\s*$", line)
        m3 = re.match(r"^###\s+tier\s+(\d+)\s*$", line)
        if m2:
            todo, tier = m2.group(1), None
            if not re.fullmatch(r"lab\d\d-\d+", todo):
                errors.append(f"line {number}: '## {todo}': a section is named after its TODO, e.g. '## lab03-5'")
            if todo in sections:
                errors.append(f"line {number}: '## {todo}' appears twice")
            sections[todo] = {}
        elif m3:
            if todo is None:
                errors.append(f"line {number}: '### tier {m3.group(1)}' before any '## labNN-K' section")
                continue
            tier = int(m3.group(1))
            if tier not in TIERS or tier in sections[todo]:
                errors.append(f"line {number}: {todo} has a tier {tier} it should not (tiers 1, 2, 3, once each)")
            sections[todo][tier] = ""
        elif line.startswith("#") and re.match(r"^#{1,3}\s", line) and todo is not None:
            errors.append(f"line {number}: '{line.strip()}': only '## labNN-K' and '### tier N' headings")
        elif todo is not None and tier is not None:
            sections[todo][tier] += line + "\n"
    for todo, tiers in sections.items():
        for t in TIERS:
            if not tiers.get(t, "").strip():
                errors.append(f"{todo}: tier {t} is missing or empty")
        for t in tiers:
            tiers[t] = tiers[t].strip("\n")
    return sections, errors


def read_hints(lab, root=REPO, name="hints.md"):
    """(sections, errors, path) of labs/NN_name/hints.md (or name: hints.hi.md, the Hindi one); sections is
    {} when the file does not exist."""
    d = lab_dir(lab, root)
    path = os.path.join(d, name) if d else ""
    if not path or not os.path.isfile(path):
        return {}, [], path
    with open(path, encoding="utf-8") as f:
        sections, errors = hints(f.read())
    return sections, errors, path


def load_script(name, root=REPO):
    """scripts/<name> (a Python script without the .py suffix, e.g. "grade") as a module."""
    path = os.path.join(root, "scripts", name)
    loader = importlib.machinery.SourceFileLoader(f"sl_{name}", path)
    spec = importlib.util.spec_from_loader(f"sl_{name}", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
