#!/usr/bin/env python3
"""test_reformat_mistakes.py — scripts/reformat_mistakes.py on a scratch repository (ctest
lint.reformat_mistakes_selftest): one badly laid-out reference file, one planted patch of it, committed;
then `reformat_mistakes.py --format`. Passes when
  - the file is now clang-format's layout, and the rewritten patch applies to it with --fuzz=0;
  - the patched file equals clang-format of the old patched file (the mistake survived, formatted);
  - the patch's header (what it plants, what must trip) is kept word for word;
  - a working-tree file changed otherwise than by formatting is refused (exit 1, the file named).
Skips visibly where clang-format is not installed.
"""
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(REPO, "scripts", "reformat_mistakes.py")
REL = "solutions/01_demo/demo.cpp"

OLD = """// demo.cpp: a reference file laid out by hand.
int   add_one( int a ){
  // TODO(lab01-1) BEGIN  add one
  return a+1;
  // TODO(lab01-1) END
}
int twice(int a)
{ return 2*a; }
"""
PATCH = """Planted mistake lab01-demo (a header kept word for word).
Must trip: lab01.demo

--- a/solutions/01_demo/demo.cpp
+++ b/solutions/01_demo/demo.cpp
@@ -1,7 +1,7 @@
 // demo.cpp: a reference file laid out by hand.
 int   add_one( int a ){
   // TODO(lab01-1) BEGIN  add one
-  return a+1;
+  return a+2;
   // TODO(lab01-1) END
 }
 int twice(int a)
"""


def sh(cmd, cwd, stdin=None):
    return subprocess.run(cmd, cwd=cwd, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def write(root, rel, text):
    os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
    with open(os.path.join(root, rel), "w") as f:
        f.write(text)


def make_repo(tmp):
    shutil.copy(os.path.join(REPO, ".clang-format"), os.path.join(tmp, ".clang-format"))
    write(tmp, REL, OLD)
    write(tmp, "tests/mistakes/lab01/lab01-demo.patch", PATCH)
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "old layout"]):
        r = sh(cmd, tmp)
        assert r.returncode == 0, r.stdout


def main():
    if shutil.which("clang-format") is None:
        print("SKIPPED: clang-format is not installed (apt-get install clang-format)")
        return 0
    failures = []
    with tempfile.TemporaryDirectory(prefix="sl_reformat_test_") as tmp:
        make_repo(tmp)
        r = sh([sys.executable, TOOL, "--root", tmp, "--format"], tmp)
        print(r.stdout)
        if r.returncode != 0:
            failures.append(f"--format exited {r.returncode}")
        new_file = open(os.path.join(tmp, REL)).read()
        formatted_old = sh(["clang-format", "--style=file", f"--assume-filename={os.path.join(tmp, REL)}"], tmp,
                           OLD).stdout
        if new_file != formatted_old or new_file == OLD:
            failures.append("the reference file is not clang-format's layout of the old one")
        patch_text = open(os.path.join(tmp, "tests/mistakes/lab01/lab01-demo.patch")).read()
        if not patch_text.startswith(PATCH.split("--- a/")[0]):
            failures.append("the patch's header was not kept")
        a = sh(["patch", "-p1", "--batch", "--fuzz=0", "--dry-run", "-d", tmp], tmp, patch_text)
        if a.returncode != 0:
            failures.append("the rewritten patch does not apply with --fuzz=0: " + a.stdout)
        else:
            sh(["patch", "-p1", "--batch", "--fuzz=0", "-d", tmp], tmp, patch_text)
            want = sh(["clang-format", "--style=file", f"--assume-filename={os.path.join(tmp, REL)}"], tmp,
                      OLD.replace("a+1", "a+2")).stdout
            if open(os.path.join(tmp, REL)).read() != want:
                failures.append("patched formatted file != clang-format(old patched file)")
    with tempfile.TemporaryDirectory(prefix="sl_reformat_test_") as tmp:  # changed otherwise: refused
        make_repo(tmp)
        write(tmp, REL, OLD.replace("twice", "thrice"))
        r = sh([sys.executable, TOOL, "--root", tmp, "--format"], tmp)
        if r.returncode != 1 or f"{REL} in the working tree is not clang-format" not in r.stdout:
            failures.append(f"a file changed otherwise was not refused (exit {r.returncode}):\n{r.stdout}")
    for f in failures:
        print("FAIL: " + f)
    print("test_reformat_mistakes: " + ("FAILED" if failures else "passed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
