#!/usr/bin/env bash
# The CPython interpreters the wheels are built for and tested with, one line each: "X.Y PATH".
# Looks for CPython 3.10, 3.11, 3.12 and 3.13 as python3.X on PATH, under pyenv's versions and in
# /usr/local/bin and /usr/bin, keeping the first that runs and has venv. MESHMUON_WHEEL_PYTHONS
# (e.g. "3.11 3.12") narrows the list. Used by scripts/build_wheel.sh and tests/wheel/cleanroom.sh.
# Usage: bash scripts/pythons.sh
set -euo pipefail
wanted=${MESHMUON_WHEEL_PYTHONS:-3.10 3.11 3.12 3.13}
pyenv_root=${PYENV_ROOT:-}
if [[ -z $pyenv_root ]] && command -v pyenv >/dev/null 2>&1; then pyenv_root=$(pyenv root 2>/dev/null || true); fi
[[ -z $pyenv_root && -d $HOME/.pyenv ]] && pyenv_root=$HOME/.pyenv
for v in $wanted; do
  shopt -s nullglob
  candidates=()
  [[ -n $pyenv_root ]] && candidates+=("$pyenv_root"/versions/"$v".*/bin/python"$v")
  p=$(command -v "python$v" 2>/dev/null || true)
  [[ -n $p ]] && candidates+=("$p")
  candidates+=(/usr/local/bin/python"$v" /usr/bin/python"$v")
  for c in "${candidates[@]}"; do
    # a pyenv shim answers for versions it does not serve: ask the interpreter itself
    if [[ -x $c ]] && "$c" -c "import sys, venv; assert sys.version_info[:2] == tuple(map(int, '$v'.split('.')))" >/dev/null 2>&1; then
      echo "$v $c"
      break
    fi
  done
done
