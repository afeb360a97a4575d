#!/usr/bin/env python3
"""hindi_sync.py — every Hindi page (<page>.hi.md beside <page>.md, a quiz*.hi.json) in step with its twin.

A Hindi page translates the prose and keeps the parts a learner types or looks up byte for byte
(docs/translation.md). For every <page>.hi.md with an English <page>.md this lint checks:
  (a) the same parts: the task table (rows with a `labNN-K` id: ids, code spans, links, numbers), the check
      table (rows with a `labNN.check` id or the total: ids, code spans, points), the fenced code blocks, and
      the section anchors (an `<a id="ANCHOR"></a>` line before each heading, ANCHOR the GitHub anchor of the
      English heading at the same place and level); a hints.hi.md instead has hints.md's TODO ids and tiers
      (tests/lint/lab_docs.py reads both). Line 1 links back to <page>.md, and <page>.md links to
      <page>.hi.md near its top.
  (b) staleness: line 2 is `<!-- hi-sync: en=<page>.md parts=HASH prose=HASH -->`, hashed from the English page
      when the Hindi page was last brought up to date. `parts` (one short hash per part, dot-separated) that
      no longer matches the English page FAILS, naming the parts that changed; only `prose` differing is a
      WARNING ("Hindi page may be stale"); no stamp FAILS.
A quiz.hi.json has quiz.json's pass mark, questions, answers, choice keys, measures, commands and
tolerances; only "text", "why", "unit" and the choices' texts are translated ({placeholders} kept).

  tests/lint/hindi_sync.py [--root REPO]            exit 0 when every Hindi file is in step, 1 otherwise
  tests/lint/hindi_sync.py --stamp <file>.hi.md...   write line 2 from the English page now (after updating it)
Registered as ctest lint.hindi_sync; its own test: tests/lint/test_hindi_sync.py. Python standard library only.
"""
import argparse
import hashlib
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab_docs  # noqa: E402  (tests/lint/lab_docs.py: the hints parser)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SKIP_DIRS = {".git", "runs", "data", "deps", "node_modules", "third_party"}
STAMP = re.compile(r"^<!-- hi-sync: en=(\S+) parts=(\S+) prose=(\S+) -->$")
ANCHOR_LINE = re.compile(r'^<a id="([^"]+)"></a>\s*$')
HEADING = re.compile(r"^(#{1,3})\s+(.*?)\s*#*\s*$")
TASK_ID = re.compile(r"`lab\d\d-\d+`")
CHECK_ID = re.compile(r"`lab\d\d\.[a-z0-9_]+`")
PART_NAMES = ("task table", "check table", "code blocks", "anchors")  # the order of the hashes in parts=
QUIZ_TEXT_FIELDS = {"text", "why", "unit"}  # translated; every other field of a question is copied


# ---------------------------------------------------------------------------------------------
# Reading a page: its code blocks, headings, tables and the rest (the prose)

def blocks(text):
    """Splits a markdown text into (kind, lines): "code" for a fenced block (fences included), "text" otherwise."""
    out, cur, fence = [], [], None
    for line in text.splitlines():
        m = re.match(r"^\s*(`{3,}|~{3,})", line)
        if fence is None and m:
            if cur:
                out.append(("text", cur))
            cur, fence = [line], m.group(1)
        elif fence is not None:
            cur.append(line)
            if line.strip().startswith(fence) and line.strip().strip(fence[0]) == "":
                out.append(("code", cur))
                cur, fence = [], None
        else:
            cur.append(line)
    if cur:
        out.append(("code" if fence else "text", cur))
    return out


def github_anchor(heading, seen):
    """GitHub's anchor of a heading: lowercase, punctuation but '-' and '_' dropped, spaces to '-';
    a repeated one gets -1, -2, ..."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    base = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
    n = seen.get(base, 0)
    seen[base] = n + 1
    return base if n == 0 else f"{base}-{n}"


def _cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _links(cell):
    """A cell's link targets, a Hindi twin's name read as its English page's (README.hi.md as README.md)."""
    return [re.sub(r"\.hi\.md\b", ".md", t) for t in re.findall(r"\]\(([^)]*)\)", cell)]


def _fixed(cell):
    """What a translation must keep of a table cell: its code spans, its link targets, a bare number."""
    kept = re.findall(r"`[^`]*`", cell) + _links(cell)
    number = cell.strip("* ")
    if re.fullmatch(r"-?\d+(\.\d+)?", number):
        kept.append(number)
    return kept


def parse(text):
    """{"task table": [...], "check table": [...], "code blocks": [...], "anchors": [...], "prose": [...],
    "hi anchors": [...], "code sections": [...], "english links": {...}}: the English page's parts (anchors
    from its headings) and prose; "hi anchors" are the `<a id>` lines of a Hindi page with the level of the
    heading that follows each; "code sections" the anchor of the section holding each code block; "english
    links" {section anchor: the anchors its links into an English page (*.md, not *.hi.md) name}."""
    out = {name: [] for name in PART_NAMES}
    out["prose"], out["hi anchors"], out["problems"], out["code sections"] = [], [], [], []
    out["english links"] = {}
    seen, section, anchored = {}, "", False
    for kind, lines in blocks(text):
        if kind == "code":
            out["code blocks"].append("\n".join(lines))
            out["code sections"].append(section)
            continue
        i = 0
        while i < len(lines):
            line = lines[i]
            a = ANCHOR_LINE.match(line)
            h = HEADING.match(line)
            if a:
                nxt = HEADING.match(lines[i + 1]) if i + 1 < len(lines) else None
                if nxt is None:
                    out["problems"].append(f"anchor '{a.group(1)}' is not on the line just before a heading")
                out["hi anchors"].append(f"{'#' * len(nxt.group(1)) if nxt else '?'} {a.group(1)}")
                section, anchored = a.group(1), True
            elif h:
                out["anchors"].append(f"{h.group(1)} {github_anchor(h.group(2), seen)}")
                if not anchored:
                    out["problems"].append(f"heading '{line.strip()[:60]}' has no <a id=\"...\"></a> line before it")
                section = section if anchored else out["anchors"][-1].split(" ", 1)[1]
                anchored = False
            elif line.lstrip().startswith("|") and i + 1 < len(lines) and set(lines[i + 1].strip()) <= set("|-: "):
                rows = []
                i += 2
                while i < len(lines) and lines[i].lstrip().startswith("|"):
                    rows.append(_cells(lines[i]))
                    i += 1
                firsts = " ".join(r[0] for r in rows if r)
                which = "task table" if TASK_ID.search(firsts) else "check table" if CHECK_ID.search(firsts) else None
                if which and not out[which]:
                    out[which] = rows
                    out[which + " header"] = _cells(line)
                else:
                    out["prose"].extend("|".join(r) for r in rows)
                continue
            else:
                out["prose"].append(line)
                for target, anchor in re.findall(r"\]\(([^)\s#]*)#([^)\s]+)\)", line):
                    if target.endswith(".md") and not target.endswith(".hi.md"):
                        out["english links"].setdefault(section, set()).add(anchor)
            i += 1
    return out


def prose_columns(header):
    """The columns of a task or check table that are prose ("what it must do"): translated freely."""
    return {k for k, name in enumerate(header) if name.lower().startswith("what")}


def fixed_rows(rows, prose_cols):
    """A table's rows as what a translation keeps: code spans, link targets and numbers of every cell
    (only the link targets of a prose cell)."""
    return [" ".join(k for j, c in enumerate(r) for k in (_links(c) if j in prose_cols
                                                            else _fixed(c))) for r in rows]


def english_parts(p):
    """The English page's parts, the tables reduced to what a translation keeps; the prose cells of the
    two tables join the prose."""
    out = dict(p)
    out["prose"] = list(p["prose"])
    for name in ("task table", "check table"):
        cols = prose_columns(p.get(name + " header", []))
        out[name] = fixed_rows(p[name], cols)
        out["prose"] += [r[j] for r in p[name] for j in sorted(cols) if j < len(r)]
    return out


def _hash(items):
    return hashlib.sha256("\n\x00".join(items).encode("utf-8")).hexdigest()[:8]


def stamp_of(en_text, en_name):
    """The stamp line a Hindi page carries once it matches the English page en_text."""
    p = english_parts(parse(en_text))
    parts = ".".join(_hash(p[name]) for name in PART_NAMES)
    return f"<!-- hi-sync: en={en_name} parts={parts} prose={_hash(p['prose'])} -->"


# ---------------------------------------------------------------------------------------------
# Comparing

def _diff(name, en, hi):
    """Lines naming what differs between the English and the Hindi lists of one part (a code block by its
    first differing line)."""
    out = []
    if len(en) != len(hi):
        out.append(f"{name}: the English page has {len(en)}, the Hindi page {len(hi)}")
    for k, (e, h) in enumerate(zip(en, hi), 1):
        if e != h:
            pairs = list(zip(e.splitlines(), h.splitlines())) or [(e, h)]
            e_line, h_line = next(((a, b) for a, b in pairs if a != b), pairs[-1])
            out.append(f"{name} #{k}: English '{e_line[:90]}', Hindi '{h_line[:90]}'")
    return out


def hints_problems(en_text, hi_text):
    en, en_err = lab_docs.hints(en_text)
    hi, hi_err = lab_docs.hints(hi_text)
    out = [f"hints format: {e}" for e in hi_err]
    if list(en) != list(hi):
        out.append(f"TODO ids: English {', '.join(en)}; Hindi {', '.join(hi)}")
    for todo in en:
        if todo in hi and sorted(en[todo]) != sorted(hi[todo]):
            out.append(f"{todo}: English tiers {sorted(en[todo])}, Hindi tiers {sorted(hi[todo])}")
    return out


def page_problems(hi_path, en_path):
    """(failures, warnings) of one Hindi page against its English twin."""
    with open(en_path, encoding="utf-8") as f:
        en_text = f.read()
    with open(hi_path, encoding="utf-8") as f:
        hi_text = f.read()
    en_name, hi_name = os.path.basename(en_path), os.path.basename(hi_path)
    fails, warns = [], []
    hi_lines = hi_text.splitlines()
    if not hi_lines or not hi_lines[0].startswith(f"[English]({en_name})"):
        fails.append(f"line 1 must link back: [English]({en_name}) · हिन्दी")
    if f"[हिन्दी]({hi_name})" not in "\n".join(en_text.splitlines()[:4]):
        fails.append(f"{en_name} must link to it near its top (after its title): [हिन्दी]({hi_name})")
    raw_en, hi = parse(en_text), parse(hi_text)
    en = english_parts(raw_en)
    for name in ("task table", "check table"):  # the Hindi table's prose columns are the English one's
        hi[name] = fixed_rows(hi[name], prose_columns(raw_en.get(name + " header", [])))
    if hi_name == "hints.hi.md":
        fails += hints_problems(en_text, hi_text)
        names = ("code blocks",)
    else:
        fails += hi["problems"]
        fails += _diff("anchors", en["anchors"], hi["hi anchors"])
        names = ("task table", "check table", "code blocks")
    # A section the Hindi page leaves in English, by a link to it and without code blocks of its own, needs
    # none of the English section's code blocks (docs/translation.md "Long measurement sections").
    deferred = {sec for sec, anchors in hi["english links"].items() if sec in anchors} - set(hi["code sections"])
    en["code blocks"] = [c for c, sec in zip(en["code blocks"], en["code sections"]) if sec not in deferred]
    for name in names:
        fails += _diff(name, en[name], hi[name])
    m = STAMP.match(hi_lines[1]) if len(hi_lines) > 1 else None
    if not m:
        fails.append(f"no sync stamp on line 2 (write it: tests/lint/hindi_sync.py --stamp {os.path.relpath(hi_path)})")
        return fails, warns
    now = STAMP.match(stamp_of(en_text, en_name))
    old_parts, new_parts = m.group(2).split("."), now.group(2).split(".")
    moved = [n for n, a, b in zip(PART_NAMES, old_parts, new_parts) if a != b]
    if len(old_parts) != len(new_parts):
        moved = list(PART_NAMES)
    if moved:
        fails.append("Hindi page older than its English page's last change to: " + ", ".join(moved) +
                     f" (bring them over from {en_name}, then --stamp)")
    elif m.group(3) != now.group(3):
        warns.append(f"Hindi page may be stale: {en_name}'s prose changed since the stamp (read the English "
                     "page's history, update the Hindi prose, then --stamp)")
    return fails, warns


def quiz_problems(en, hi):
    """What differs between quiz.json and quiz.hi.json beyond the translated text fields."""
    out = []
    if en.get("pass") != hi.get("pass"):
        out.append(f"\"pass\": English {en.get('pass')}, Hindi {hi.get('pass')}")
    eq, hq = en.get("questions", []), hi.get("questions", [])
    if len(eq) != len(hq):
        out.append(f"questions: English {len(eq)}, Hindi {len(hq)}")
    for i, (e, h) in enumerate(zip(eq, hq), 1):
        if set(e) != set(h):
            out.append(f"question {i}: fields English {sorted(e)}, Hindi {sorted(h)}")
        for key in sorted(set(e) & set(h) - QUIZ_TEXT_FIELDS):
            if key == "choices" and isinstance(h[key], dict):
                en_value, hi_value, what = sorted(e[key]), sorted(h[key]), "choice keys"
            else:
                en_value, hi_value, what = e[key], h[key], f"\"{key}\""
            if en_value != hi_value:
                out.append(f"question {i}: {what} English {en_value}, Hindi {hi_value}")
        for key in sorted(QUIZ_TEXT_FIELDS & set(h)):
            if not isinstance(h[key], str):
                out.append(f"question {i}: \"{key}\" must be text")
        if isinstance(h.get("choices"), dict) and not all(isinstance(v, str) for v in h["choices"].values()):
            out.append(f"question {i}: every choice must be text")
        for key in ("text", "why"):
            ep, hp = (set(re.findall(r"\{(\w+)\}", str(q.get(key, "")))) for q in (e, h))
            if ep != hp:
                out.append(f"question {i}: \"{key}\" placeholders English {sorted(ep)}, Hindi {sorted(hp)}")
    return out


def hindi_files(root):
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS and not x.startswith((".", "build")))
        for name in sorted(files):
            if name.endswith(".hi.md") or (name.startswith("quiz") and name.endswith(".hi.json")):
                yield os.path.join(d, name)


def twin(path):
    return path[:-len(".hi.md")] + ".md" if path.endswith(".hi.md") else path[:-len(".hi.json")] + ".json"


def check(root):
    """Prints one line per problem; returns the number of failing files."""
    failed = n = 0
    for path in hindi_files(root):
        rel, en = os.path.relpath(path, root), twin(path)
        if not os.path.isfile(en):
            continue  # no English twin: not a translation
        n += 1
        if path.endswith(".json"):
            try:
                with open(en, encoding="utf-8") as f, open(path, encoding="utf-8") as g:
                    fails, warns = quiz_problems(json.load(f), json.load(g)), []
            except ValueError as e:
                fails, warns = [f"not readable JSON ({e})"], []
        else:
            fails, warns = page_problems(path, en)
        for w in warns:
            print(f"WARNING {rel}: {w}")
        for x in fails:
            print(f"FAIL {rel}: {x}")
        failed += bool(fails)
    print(f"hindi_sync: {n} Hindi files against their English twins, {failed} failing")
    return failed


def stamp(paths):
    for path in paths:
        en = twin(path)
        if not path.endswith(".hi.md") or not os.path.isfile(en):
            sys.exit(f"hindi_sync: --stamp takes <page>.hi.md files beside their <page>.md; {path} is not one")
        with open(en, encoding="utf-8") as f:
            line = stamp_of(f.read(), os.path.basename(en))
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        if len(lines) > 1 and STAMP.match(lines[1]):
            lines[1] = line
        else:
            lines.insert(1, line)
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(lines))
        print(f"stamped {path}: {line}")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="hindi_sync.py", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--root", default=REPO)
    ap.add_argument("--stamp", nargs="+", metavar="FILE", help="write the sync stamp of these Hindi pages")
    args = ap.parse_args(argv)
    if args.stamp:
        stamp(args.stamp)
        return 0
    return 1 if check(os.path.abspath(args.root)) else 0


if __name__ == "__main__":
    sys.exit(main())
