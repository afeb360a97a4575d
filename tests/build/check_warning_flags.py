#!/usr/bin/env python3
"""check_warning_flags.py — does every source the build compiles get the warnings, and with SL_WERROR=ON
are they errors? (cmake/scalelab.cmake sl_target_defaults; docs/grading.md "Warnings, sanitizers, format")

A target created without sl_target_defaults compiles silently: before this check, the CUDA library
(scalelab_cuda) and the tests' support library got no warning flags at all. Reads <build>/compile_commands.json
and, for each source under the repository:
  C++ (.cpp)  needs -Wall -Wextra                      and, with SL_WERROR=ON, -Werror
  CUDA (.cu)  needs -Xcompiler=-Wall,-Wextra,...       and, with SL_WERROR=ON, -Xcompiler=-Werror and
              (the host compiler's half of the file)   -Werror=all-warnings (nvcc's own diagnostics)
Fails (exit 1) naming each source that lacks one.

--prove compiles three planted warnings with the build's own command lines (the command of a real .cpp and
of a real .cu, the source swapped for a scratch file) and expects each to FAIL: an unused variable in C++
(g++ -Werror), an unused variable in a kernel (nvcc's front end, #177-D) and a signed/unsigned comparison in
the host code of a .cu (only g++ sees it: -Xcompiler=-Werror). Skips visibly where SL_WERROR is OFF.

  tests/build/check_warning_flags.py --build-dir build            # ctest build.warning_flags
  tests/build/check_warning_flags.py --build-dir build --prove    # ctest build.werror_catches_warnings
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

CXX_FLAGS = ["-Wall", "-Wextra"]
CXX_ERROR_FLAGS = ["-Werror"]
CUDA_FLAGS = ["-Xcompiler=-Wall,-Wextra"]  # a prefix: -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter
CUDA_ERROR_FLAGS = ["-Xcompiler=-Werror", "-Werror=all-warnings"]

# The planted warnings of --prove: (language, what it plants, source text, a word the failing compile prints).
PLANTS = [
    ("cpp", "an unused variable (g++ -Wunused-variable)",
     "int sl_planted_warning() {\n  int unused_variable = 0;\n  return 1;\n}\n", "unused_variable"),
    ("cu", "an unused variable in a kernel (nvcc #177-D)",
     "__global__ void sl_planted_kernel(float* x) {\n  int unused_variable = 0;\n  x[0] = 1.0f;\n}\n",
     "unused_variable"),
    ("cu", "a signed/unsigned comparison in host code (g++ -Wsign-compare, through -Xcompiler)",
     "#include <vector>\nint sl_planted_host(const std::vector<int>& v) {\n  int s = 0;\n"
     "  for (int i = 0; i < v.size(); ++i) s += v[i];\n  return s;\n}\n", "sign-compare"),
]


def cache_value(build_dir, name):
    for line in (build_dir / "CMakeCache.txt").read_text().splitlines():
        m = re.match(rf"{name}:[A-Z]+=(.*)$", line)
        if m:
            return m.group(1)
    return ""


def is_on(value):
    return value.upper() in ("ON", "1", "TRUE", "YES", "Y")


def entries(build_dir):
    """(source, arguments, directory) of every source of the repository the build compiles."""
    root = Path(cache_value(build_dir, "CMAKE_HOME_DIRECTORY")).resolve()
    path = build_dir / "compile_commands.json"
    if not path.exists():
        sys.exit(f"check_warning_flags: {path} not found\n  hint: configure with cmake (CMAKE_EXPORT_COMPILE_COMMANDS "
                 "is ON in CMakeLists.txt)")
    out = []
    for e in json.loads(path.read_text()):
        src = Path(e["file"]).resolve()
        if root not in src.parents or build_dir.resolve() in src.parents:
            continue  # a generated or outside source is not ours to check
        args = e["arguments"] if "arguments" in e else shlex.split(e["command"])
        out.append((src.relative_to(root), src, args, e["directory"]))
    return out


def check_flags(build_dir, werror):
    missing = []
    counts = {"cpp": 0, "cu": 0}
    for rel, src, args, _ in entries(build_dir):
        lang = "cu" if src.suffix == ".cu" else "cpp"
        counts[lang] += 1
        need = CXX_FLAGS + (CXX_ERROR_FLAGS if werror else []) if lang == "cpp" else \
            CUDA_FLAGS + (CUDA_ERROR_FLAGS if werror else [])
        for flag in need:
            # CUDA_FLAGS[0] is a prefix of the full -Xcompiler list; every other flag must match a whole argument.
            if not any(a == flag or (flag.startswith("-Xcompiler=") and a.startswith(flag + ",")) for a in args):
                missing.append(f"  {rel}: no {flag}")
    print(f"check_warning_flags: {counts['cpp']} C++ and {counts['cu']} CUDA sources, "
          f"SL_WERROR={'ON' if werror else 'OFF'}")
    if counts["cpp"] == 0:
        print("check_warning_flags: FAIL: no C++ source of the repository in compile_commands.json")
        return 1
    if missing:
        print(f"check_warning_flags: FAIL: {len(missing)} missing flags (a target without sl_target_defaults?):")
        print("\n".join(missing))
        print("  hint: call sl_target_defaults(<target>) (cmake/scalelab.cmake) for the target that compiles them")
        return 1
    print("check_warning_flags: passed: every source gets the warnings" + (" as errors" if werror else ""))
    return 0


def swap_source(args, src, scratch_src, scratch_obj):
    """The same command line with the source and the object replaced (and no dependency file written)."""
    out, skip = [], False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a in ("-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a in ("-MD", "-MMD"):
            continue
        if a == "-o":
            out += ["-o", str(scratch_obj)]
            skip = True
            continue
        out.append(str(scratch_src) if Path(a).name == src.name and Path(a).resolve() == src else a)
    return out


def prove(build_dir, werror):
    if not werror:
        print("SKIPPED: SL_WERROR is OFF in this build (configure with -DSL_WERROR=ON, as scripts/test.sh does)")
        return 0
    by_lang = {}
    for rel, src, args, directory in entries(build_dir):
        by_lang.setdefault("cu" if src.suffix == ".cu" else "cpp", (rel, src, args, directory))
    failed = 0
    with tempfile.TemporaryDirectory(prefix="sl_werror_") as tmp:
        for lang, what, text, word in PLANTS:
            if lang not in by_lang:
                print(f"  skipped: {what}: no .{lang} source in this build (CUDA off?)")
                continue
            rel, src, args, directory = by_lang[lang]
            scratch = Path(tmp) / f"planted_{len(os.listdir(tmp))}.{lang}"
            scratch.write_text(text)
            cmd = swap_source(args, src, scratch, scratch.with_suffix(".o"))
            r = subprocess.run(cmd, cwd=directory, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if r.returncode != 0 and word in r.stdout and "error" in r.stdout:
                print(f"  caught: {what} fails the compile (command of {rel})")
            else:
                failed += 1
                print(f"  FAIL: {what} did not fail the compile (exit {r.returncode}; command of "
                      f"{rel}):\n    {shlex.join(cmd)}\n{r.stdout}")
    if failed:
        print(f"check_warning_flags --prove: FAIL: {failed} planted warnings compiled")
        return 1
    print("check_warning_flags --prove: passed: every planted warning is an error")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--prove", action="store_true", help="compile planted warnings; each must fail")
    a = ap.parse_args()
    build_dir = Path(a.build_dir).resolve()
    werror = is_on(cache_value(build_dir, "SL_WERROR"))
    return prove(build_dir, werror) if a.prove else check_flags(build_dir, werror)


if __name__ == "__main__":
    sys.exit(main())
