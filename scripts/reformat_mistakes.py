#!/usr/bin/env python3
"""scripts/reformat_mistakes.py — rewrite the planted patches after clang-format has changed the files they patch.

A planted mistake (tests/mistakes/labNN/*.patch, docs/grading.md "Planted mistakes") or sanitizer plant
(tests/sanitize/plants/*.patch) is a unified diff that must apply with `patch --fuzz=0`. Formatting the
tree (.clang-format) moves and rewraps the lines those diffs name, so each is made again, mechanically:

  1. OLD   = the patched file as it was before formatting (`git show REV:path`, REV default HEAD);
  2. the patch applied to OLD (patch -p1 --fuzz=0: it must apply there, as it did in CI);
  3. NEW   = the file in the working tree, which must be exactly clang-format(OLD) (anything else changed
             since REV would be silently folded into the patch, so that is refused);
  4. the new patch = the patch's own text up to its first `--- a/` line (what it plants, what must trip)
     + `diff -u` of NEW against clang-format(OLD patched), 3 lines of context, paths a/ and b/.
The formatting is done with the same .clang-format (clang-format --style=file, per file path).

  scripts/reformat_mistakes.py --format            # clang-format -i every C++/CUDA file git tracks, then (1-4)
  scripts/reformat_mistakes.py                     # (1-4) only: the tree was formatted already (not committed)
  scripts/reformat_mistakes.py --old HEAD~1        # the formatting is committed: HEAD~1 is the tree before it
  then: scripts/check_mistakes.py --lint           # every patch applies and stays inside its TODO fence
Exit 0 when every patch was regenerated (or needed nothing), 1 naming each one that could not be.
Its own test: tests/lint/test_reformat_mistakes.py (ctest lint.reformat_mistakes_selftest).
"""
import argparse
import difflib
import glob
import os
import subprocess
import sys
import tempfile
import time

PATCH_GLOBS = ("tests/mistakes/lab[0-9][0-9]/*.patch", "tests/sanitize/plants/*.patch")
SOURCE_GLOBS = ("*.cpp", "*.h", "*.cu", "*.cuh")


def run(cmd, root, stdin=None):
    r = subprocess.run(cmd, cwd=root, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return r.returncode, r.stdout, r.stderr


def clang_format(binary, root, rel, text):
    """text formatted as the file rel of the tree would be (its .clang-format, its language)."""
    rc, out, err = run([binary, "--style=file", f"--assume-filename={os.path.join(root, rel)}"], root, stdin=text)
    if rc != 0:
        raise RuntimeError(f"clang-format failed on {rel}: {err.strip()}")
    return out


def format_tree(binary, root):
    """clang-format -i on every C++/CUDA file git tracks. Returns (files, lines changed)."""
    rc, out, err = run(["git", "ls-files", *SOURCE_GLOBS], root)
    if rc != 0:
        sys.exit(f"reformat_mistakes: git ls-files failed: {err.strip()}")
    files = out.split()
    changed = 0
    for rel in files:
        with open(os.path.join(root, rel), encoding="utf-8", newline="") as f:
            before = f.read()
        after = clang_format(binary, root, rel, before)
        if after != before:
            changed += sum(1 for line in difflib.unified_diff(before.splitlines(), after.splitlines(), n=0)
                           if line.startswith("-") and not line.startswith("---"))
            with open(os.path.join(root, rel), "w", encoding="utf-8", newline="") as f:
                f.write(after)
    return len(files), changed


def split_patch(text):
    """(header, [(path, section text)]) of a patch: the header is everything before the first `--- a/`."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines)
              if line.startswith("--- a/") and i + 1 < len(lines) and lines[i + 1].startswith("+++ b/")]
    if not starts:
        return text, []
    sections = []
    for k, i in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(lines)
        path = lines[i][len("--- a/"):].split("\t")[0].strip()
        sections.append((path, "".join(lines[i:end])))
    return "".join(lines[:starts[0]]), sections


def apply_section(old_text, rel, section):
    """old_text with one file's section of a patch applied (patch -p1 --fuzz=0), or raises."""
    with tempfile.TemporaryDirectory(prefix="sl_reformat_") as tmp:
        path = os.path.join(tmp, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(old_text)
        r = subprocess.run(["patch", "-p1", "--batch", "--forward", "--fuzz=0", "--no-backup-if-mismatch",
                            "--reject-file=-", "-d", tmp], input=section, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            raise RuntimeError("does not apply to the old file: " + " | ".join(r.stdout.strip().splitlines()[-2:]))
        with open(path, encoding="utf-8", newline="") as f:
            return f.read()


def unified(rel, before, after):
    """`diff -u` of two texts, as the patches are written (a/ and b/ paths, no timestamps)."""
    return "".join(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                        fromfile=f"a/{rel}", tofile=f"b/{rel}", n=3))


def regenerate(root, old_rev, binary):
    """Rewrites every planted patch under root. Returns (rewritten, unchanged, problems)."""
    old_cache, new_cache, problems = {}, {}, []
    rewritten = unchanged = 0
    patches = sorted(p for g in PATCH_GLOBS for p in glob.glob(os.path.join(root, g)))
    for patch_path in patches:
        name = os.path.relpath(patch_path, root)
        with open(patch_path, encoding="utf-8", newline="") as f:
            text = f.read()
        header, sections = split_patch(text)
        if not sections:
            problems.append(f"{name}: no `--- a/<path>` section")
            continue
        body = []
        try:
            for rel, section in sections:
                if rel not in old_cache:
                    rc, out, err = run(["git", "show", f"{old_rev}:{rel}"], root)
                    if rc != 0:
                        raise RuntimeError(f"{rel} is not in {old_rev}: {err.strip()}")
                    old_cache[rel] = out
                    with open(os.path.join(root, rel), encoding="utf-8", newline="") as f:
                        new_cache[rel] = f.read()
                    if clang_format(binary, root, rel, out) != new_cache[rel]:
                        raise RuntimeError(f"{rel} in the working tree is not clang-format of {old_rev}:{rel} (changed "
                                           "otherwise too; regenerate against the tree just before formatting)")
                patched = apply_section(old_cache[rel], rel, section)
                body.append(unified(rel, new_cache[rel], clang_format(binary, root, rel, patched)))
        except RuntimeError as e:
            problems.append(f"{name}: {e}")
            continue
        if not all(body):
            problems.append(f"{name}: after formatting, the patch changes nothing (formatting absorbed the mistake)")
            continue
        new_text = header + "".join(body)
        if new_text == text:
            unchanged += 1
            continue
        with open(patch_path, "w", encoding="utf-8", newline="") as f:
            f.write(new_text)
        rewritten += 1
    return rewritten, unchanged, problems


def main():
    ap = argparse.ArgumentParser(prog="scripts/reformat_mistakes.py", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="the repository (default: this script's)")
    ap.add_argument("--old", default="HEAD", metavar="REV",
                    help="the commit the patches apply to, before formatting (default HEAD)")
    ap.add_argument("--format", action="store_true",
                    help="first clang-format -i every C++/CUDA file git tracks in the working tree")
    ap.add_argument("--clang-format", default="clang-format", help="the clang-format program (14 or newer)")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    t0 = time.monotonic()
    if args.format:
        files, changed = format_tree(args.clang_format, root)
        print(f"reformat_mistakes: formatted {files} files: {changed} lines changed "
              f"({time.monotonic() - t0:.1f} s)", flush=True)
    t1 = time.monotonic()
    rewritten, unchanged, problems = regenerate(root, args.old, args.clang_format)
    print(f"reformat_mistakes: {rewritten} patches rewritten, {unchanged} unchanged, {len(problems)} failed "
          f"({time.monotonic() - t1:.1f} s)")
    for p in problems:
        print("  FAIL " + p)
    if not problems:
        print("  next: scripts/check_mistakes.py --lint (every patch applies and stays inside its TODO fence)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
