# scripts/lib/venv.sh — the notebooks' Python environment, made once and reused (sourced by
# scripts/notebooks.sh and scripts/scale_demo.sh, so both make it the same way).
#   source "$ROOT/scripts/lib/venv.sh"
#   sl_notebooks_venv "$VENV" notebooks      # "notebooks": the prefix of its "== ..." progress lines
# Makes VENV with python3 -m venv if it has no bin/python, and (re)installs the pinned
# notebooks/requirements.txt when VENV/.requirements.sha256 does not match that file (first time, or
# after the file changed). Needs $ROOT (the repository) and a die MESSAGE HINT function from the caller.

sl_notebooks_venv() {
  local venv="$1" who="$2"
  local req="$ROOT/notebooks/requirements.txt"
  local stamp="$venv/.requirements.sha256"  # sha256sum of requirements.txt when it was last installed
  if [[ ! -x "$venv/bin/python" ]]; then
    echo "== $who: creating $venv"
    python3 -m venv "$venv" || die "python3 -m venv failed" "apt-get install python3-venv (Debian/Ubuntu), then rerun"
  fi
  if [[ ! -f "$stamp" ]] || ! sha256sum --status -c "$stamp" 2>/dev/null; then
    echo "== $who: installing notebooks/requirements.txt into $venv"
    local t0=$SECONDS
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req" \
      || die "pip install failed" "check network access to PyPI, or delete $venv and rerun"
    sha256sum "$req" > "$stamp"
    echo "   installed in $((SECONDS - t0)) s"
  fi
}
