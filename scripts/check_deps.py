#!/usr/bin/env python3
"""check_deps.py — is scripts/install_deps.sh complete? Every file the build found must come from a
Debian package that the script installs, or that one of its packages pulls in through Depends.

A machine that earlier work left with extra packages hides a missing install step: the build finds
the extra files and CI stays green, while a fresh machine cannot configure (oneDNN's CMake config
needed OpenCL's development files, a Recommends that `--no-install-recommends` skips). This check
finds that case on any machine, without a fresh one:

  1. the files the configure found: every FILEPATH/PATH entry of <build>/CMakeCache.txt that names an
     existing file (a library, a program, a header directory, a package's CMake config directory);
  2. once built, the files the build used: every header the compiler read (`ninja -t deps`) and every
     shared library the programs load (`ldd` on bin/ and tests/);
  3. each file -> its package (`dpkg -S`); a package is fine when it is in the closure of the
     install_deps.sh list under Depends/Pre-Depends (`apt-cache depends --recurse`, no Recommends,
     since the script installs with --no-install-recommends), or of priority required (always there).

Fails (exit 1) naming each package that is neither, with a file that needs it and where the build
found it. Files of no package (the CUDA Toolkit under /usr/local/cuda, a pyenv python) are listed
as a note: install_deps.sh cannot install them and the README says where they come from.

  scripts/check_deps.py --build-dir build                 # as CI runs it (ctest build.deps_complete)
  scripts/check_deps.py --build-dir build --packages "cmake g++ ..."   # check another list
  scripts/check_deps.py --build-dir build --configure-only             # skip step 2
"""
import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(cmd, check=True, **kw):
    return subprocess.run(cmd, check=check, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def listed_packages(args):
    if args.packages is not None:
        return args.packages.split()
    out = run([str(ROOT / "scripts" / "install_deps.sh"), "--list"]).stdout
    return out.split()


def closure(pkgs):
    """Every package apt installs for `pkgs` with --no-install-recommends (each alternative counted)."""
    out = run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
               "--no-breaks", "--no-replaces", "--no-enhances"] + pkgs).stdout
    names = set()
    for line in out.splitlines():
        if line and not line[0].isspace() and not line.startswith("<"):  # "<virtual>": its providers follow
            names.add(line.strip().split(":")[0])
        elif line.startswith("    "):  # a provider of a virtual package
            names.add(line.strip().split(":")[0])
    required = run(["dpkg-query", "-W", "-f", "${Package} ${Priority}\n"]).stdout
    for line in required.splitlines():
        name, _, prio = line.partition(" ")
        if prio.strip() == "required":
            names.add(name)
    return names


def cache_files(build):
    """(variable, path) for the CMakeCache entries that name existing files or directories."""
    cache = build / "CMakeCache.txt"
    if not cache.is_file():
        sys.exit(f"[scalelab] check_deps: {cache} not found\n[scalelab]   hint: configure first: "
                 f"cmake -S . -B {build} -G Ninja")
    found = []
    for line in cache.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.+-]+):(FILEPATH|PATH)=(.+)$", line)
        if not m:
            continue
        var, _, value = m.groups()
        if var.startswith("CMAKE_INSTALL") or "NOTFOUND" in value:
            continue
        for v in value.split(";"):
            p = Path(v)
            if not p.is_absolute() or not p.exists():
                continue
            if ROOT in p.resolve().parents or p.resolve() == ROOT or build.resolve() in p.resolve().parents:
                continue  # the project's own files
            if p.is_dir():
                configs = sorted(p.glob("*onfig.cmake")) + sorted(p.glob("*-config.cmake"))
                if configs:
                    p = configs[0]  # a package's config directory: its config file says whose it is
            found.append((var, str(p)))
    return found


def build_files(build):
    """(where, path) of headers the compiler read and shared libraries the programs load."""
    found = []
    if (build / ".ninja_deps").exists():
        out = run(["ninja", "-C", str(build), "-t", "deps"], check=False).stdout
        headers = {ln.strip() for ln in out.splitlines() if ln.startswith("    ")}
        for h in sorted(headers):
            p = Path(h)
            if p.is_absolute() and p.exists() and ROOT not in p.resolve().parents:
                found.append(("header (ninja -t deps)", h))
    libs = set()
    for d in ("bin", "bin/reference", "tests"):
        for exe in sorted((build / d).glob("*")) if (build / d).is_dir() else []:
            if exe.is_file() and os.access(exe, os.X_OK):
                out = run(["ldd", str(exe)], check=False).stdout
                for m in re.finditer(r"=> (/\S+)", out):
                    libs.add(m.group(1))
    for lib in sorted(libs):
        found.append(("shared library (ldd)", lib))
    return found


def owners(paths):
    """path -> set of packages (empty: no package owns it). One dpkg -S call for all."""
    candidates = {}
    for p in paths:
        c = [p, os.path.realpath(p)]
        c += [x[len("/usr"):] for x in c if x.startswith("/usr/")]  # merged /usr: dpkg may own /lib/...
        c += ["/usr" + x for x in c if not x.startswith("/usr/")]
        candidates[p] = list(dict.fromkeys(c))
    flat = sorted({c for cs in candidates.values() for c in cs})
    owned = {}
    for i in range(0, len(flat), 500):
        out = run(["dpkg-query", "-S"] + flat[i:i + 500], check=False).stdout
        for line in out.splitlines():
            if line.startswith("diversion "):
                continue
            pkgs, sep, path = line.partition(": ")
            if not sep:
                continue
            owned.setdefault(path.strip(), set()).update(x.strip().split(":")[0] for x in pkgs.split(","))
    return {p: set().union(*(owned.get(c, set()) for c in cs)) for p, cs in candidates.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--packages", help="space-separated list to check instead of install_deps.sh --list")
    ap.add_argument("--configure-only", action="store_true", help="only the CMakeCache entries")
    ap.add_argument("--verbose", action="store_true", help="print every file and its package")
    args = ap.parse_args()
    build = Path(args.build_dir)
    if not build.is_absolute():
        build = (Path.cwd() / build)

    listed = listed_packages(args)
    have = closure(listed)
    files = cache_files(build) + ([] if args.configure_only else build_files(build))
    who = owners([p for _, p in files])

    missing = {}   # package -> (where, path) of the first file that needs it
    unowned = {}   # path -> where
    for where, path in files:
        pkgs = who[path]
        if not pkgs:
            unowned.setdefault(path, where)
            continue
        if args.verbose:
            print(f"  {path} ({where}) <- {', '.join(sorted(pkgs))}")
        if pkgs & have:
            continue  # a directory owned by many packages passes when one of them is installed
        for pkg in sorted(pkgs):
            missing.setdefault(pkg, (where, path))

    n_pkgs = len({p for ps in who.values() for p in ps})
    print(f"[scalelab] check_deps: {len(files)} files the build found or used, from {n_pkgs} packages; "
          f"install_deps.sh lists {len(listed)} packages, {len(have)} with their Depends")
    if unowned:
        roots = sorted({"/".join(p.split("/")[:4]) for p in unowned})
        print(f"[scalelab]   note: {len(unowned)} files belong to no Debian package (not installable by "
              f"install_deps.sh), under: {', '.join(roots)}")
    if missing:
        for pkg, (where, path) in sorted(missing.items()):
            print(f"[scalelab] check_deps: package {pkg} is used by the build but not installed by "
                  f"scripts/install_deps.sh: {path} ({where})", file=sys.stderr)
        print(f"[scalelab]   hint: add {' '.join(sorted(missing))} to the pkgs list in scripts/install_deps.sh "
              f"(or stop the build from using it); a fresh machine would not have it", file=sys.stderr)
        return 1
    print("[scalelab] check_deps: complete: every package the build uses is installed by scripts/install_deps.sh")
    return 0


if __name__ == "__main__":
    sys.exit(main())
