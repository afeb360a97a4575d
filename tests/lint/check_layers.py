#!/usr/bin/env python3
"""check_layers.py — common/ is built in layers, and an include never points up (docs/design.md
"common/ in layers"). Fails, naming file, line and the include, when:

  - a file of layer L (common/include/scalelab/L/... or common/src/L/...) includes a header of a layer
    L may not use:
        core     core
        ops      core, ops
        comm     core, comm                   (ops and comm are siblings: neither includes the other)
        model    core, ops, comm, model
        data     core, data                   (token shards, tokenizer, batches: plain host data, no model)
        measure  core, ops, comm, model, data, measure
        driver   every layer                  (the training loop: a library above the layers, scalelab_driver)
  - any file of the repository (common/, labs/, solutions/, tests/, tools/, bench/) includes a scalelab
    header without naming its layer ("scalelab/gpt2.h" instead of "scalelab/model/gpt2.h"), or a header
    that does not exist;
  - a file under common/include/scalelab/ or common/src/ sits in no layer folder.

  tests/lint/check_layers.py --root .      # as ctest lint.layers runs it
"""
import argparse
import re
import sys
from pathlib import Path

ALLOWED = {
    "core": {"core"},
    "ops": {"core", "ops"},
    "comm": {"core", "comm"},
    "model": {"core", "ops", "comm", "model"},
    "data": {"core", "data"},
    "measure": {"core", "ops", "comm", "model", "data", "measure"},
    "driver": {"core", "ops", "comm", "model", "data", "measure", "driver"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"scalelab/([^"]+)"')
SOURCE_EXT = {".h", ".cpp", ".cu", ".cuh", ".inc"}
TREES = ("common", "labs", "solutions", "tests", "tools", "bench")


def layer_of(rel):
    """The layer of a file under common/, or None; rel is relative to the repository root."""
    parts = rel.parts
    if parts[:3] == ("common", "include", "scalelab") and len(parts) > 4:
        return parts[3]
    if parts[:2] == ("common", "src") and len(parts) > 3:
        return parts[2]
    return None


def check(root):
    errors = []
    inc_root = root / "common" / "include" / "scalelab"
    for tree in TREES:
        base = root / tree
        if not base.is_dir():
            continue
        for f in sorted(base.rglob("*")):
            if f.suffix not in SOURCE_EXT or not f.is_file():
                continue
            rel = f.relative_to(root)
            in_common = rel.parts[:3] == ("common", "include", "scalelab") or rel.parts[:2] == ("common", "src")
            layer = layer_of(rel)
            if in_common and layer not in ALLOWED:
                errors.append(f"{rel}: not inside a layer folder ({', '.join(ALLOWED)}): move it into one")
                continue
            for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                target = m.group(1)
                tparts = target.split("/")
                if len(tparts) < 2 or tparts[0] not in ALLOWED:
                    errors.append(f"{rel}:{n}: #include \"scalelab/{target}\" names no layer: write "
                                  f"\"scalelab/<{'|'.join(ALLOWED)}>/{tparts[-1]}\"")
                    continue
                if not (inc_root / target).is_file():
                    errors.append(f"{rel}:{n}: #include \"scalelab/{target}\": no such header under common/include")
                    continue
                if layer is not None and tparts[0] not in ALLOWED[layer]:
                    errors.append(f"{rel}:{n}: layer {layer} includes \"scalelab/{target}\" from layer {tparts[0]}, "
                                  f"which points up (layer {layer} may include: {', '.join(sorted(ALLOWED[layer]))}); "
                                  f"move the code it needs down a layer, or this code up")
    return errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=".")
    args = ap.parse_args()
    root = Path(args.root).resolve()
    errors = check(root)
    for e in errors:
        print(e)
    if errors:
        print(f"check_layers: {len(errors)} problem(s) (docs/design.md \"common/ in layers\")")
        return 1
    print("check_layers: every include names its layer and none points up")
    return 0


if __name__ == "__main__":
    sys.exit(main())
