"""Execute the notebooks headless (scripts/notebooks.sh runs this inside .venv-notebooks/).

    python notebooks/execute.py --check-clean                 # committed notebooks carry no outputs
    python notebooks/execute.py --runs-root /tmp/logs/runs --out /tmp/nb-out [NOTEBOOK ...]

Each notebook gets its parameters injected in a new cell right after the cell tagged "parameters"
(what papermill does): runs_root=<--runs-root> and plot_dir=<--out>/<notebook name>, where the
plots land as PNG; the executed copy is written to <--out>/<notebook>.ipynb. Exits 1 when a cell
raises (the error and the cell are printed) or when --check-clean finds outputs.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent


def notebooks(names: list[str]) -> list[Path]:
    return [Path(n).resolve() for n in names] if names else sorted(HERE.glob("*.ipynb"))


def dirty_cells(nb) -> list[int]:
    """Indices of code cells with outputs or an execution count (a notebook saved after running)."""
    return [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count"))]


def check_clean(paths: list[Path]) -> bool:
    ok = True
    for p in paths:
        bad = dirty_cells(nbformat.read(p, as_version=4))
        if bad:
            ok = False
            print(f"FAIL: {p.relative_to(HERE.parent)} has outputs in cells {bad}; commit notebooks without outputs:\n"
                  f"  hint: .venv-notebooks/bin/python notebooks/execute.py --strip {p.relative_to(HERE.parent)}")
    return ok


def strip(paths: list[Path]) -> None:
    for p in paths:
        nb = nbformat.read(p, as_version=4)
        for c in nb.cells:
            if c.cell_type == "code":
                c.outputs, c.execution_count = [], None
        nbformat.write(nb, p)


def inject(nb, params: dict) -> None:
    """Insert a cell setting `params` after the cell tagged "parameters" (first cell if none)."""
    at = next((i + 1 for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])), 0)
    src = "# Injected by notebooks/execute.py\n" + "\n".join(f"{k} = {v!r}" for k, v in params.items())
    cell = nbformat.v4.new_code_cell(src)
    cell.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(at, cell)


def execute(path: Path, runs_root: str, out: Path, timeout_s: int) -> bool:
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    inject(nb, {"runs_root": runs_root, "plot_dir": str(out / path.stem)})
    t0 = time.monotonic()
    client = NotebookClient(nb, timeout=timeout_s, kernel_name="python3", resources={"metadata": {"path": str(HERE)}})
    ok = True
    try:
        client.execute()
    except CellExecutionError as e:
        ok = False
        print(f"FAIL: {path.name}: a cell raised\n{e}")
    nbformat.write(nb, out / path.name)
    pngs = sorted((out / path.stem).glob("*.png")) if (out / path.stem).is_dir() else []
    print(f"{'ok  ' if ok else 'FAIL'} {path.name}: {time.monotonic() - t0:.1f} s, {len(pngs)} plots -> {out / path.stem}")
    for c in nb.cells:  # the notebook's own messages (e.g. "no runs: skipped")
        for o in c.get("outputs", []):
            if o.get("output_type") == "stream" and o.get("text", "").strip():
                print("     | " + o["text"].strip().replace("\n", "\n     | "))
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebooks", nargs="*", help="default: every notebooks/*.ipynb")
    ap.add_argument("--check-clean", action="store_true", help="only check that no notebook has outputs")
    ap.add_argument("--strip", action="store_true", help="remove outputs and execution counts in place")
    ap.add_argument("--runs-root", default=str(HERE.parent / "runs"), help="directory holding lab01/, lab03/, ...")
    ap.add_argument("--out", default=None, help="executed notebooks and plots (required to execute)")
    ap.add_argument("--timeout-s", type=int, default=300, help="per cell")
    a = ap.parse_args()
    paths = notebooks(a.notebooks)
    if a.strip:
        strip(paths)
        return 0
    if a.check_clean:
        return 0 if check_clean(paths) else 1
    if not a.out:
        ap.error("--out DIR is needed to execute")
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    results = [execute(p, str(Path(a.runs_root).resolve()), out, a.timeout_s) for p in paths]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
