#!/usr/bin/env bash
# Runs meshmuon's Python suite under another PyTorch release, in a virtual environment of its own (the
# GPU machines of this project have torch 2.11; `make test` runs 2.13). From PyPI this installs
# torch's CUDA build with its nvidia-* wheels (about 3 GB); the suite runs on the CPU.
#
# Usage: bash scripts/test_torch_version.sh 2.11.0 [pytest args...]   (from the repository root)
#   VENV=/opt/venv-torch<version>   where the environment lives (reused when it exists)
# Exit status: pytest's.
set -euo pipefail
version=${1:?usage: test_torch_version.sh TORCH_VERSION [pytest args...]}
shift
[[ -f pyproject.toml && -d python/meshmuon ]] || { echo "test_torch_version: run from the meshmuon repository root" >&2; exit 2; }
VENV=${VENV:-/opt/venv-torch${version//./}}
PY=${PYTHON:-python3}
if [[ ! -x "$VENV/bin/python" ]]; then
  "$PY" -m venv "$VENV"
fi
# the pins of scripts/requirements.txt, torch replaced by the version under test
mapfile -t pins < <(grep -E '^[A-Za-z]' scripts/requirements.txt | grep -vE '^(torch|nvidia-)')
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==$version" "${pins[@]}"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation \
  --config-settings=build-dir="build-torch${version//./}" .
echo "test_torch_version: torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)') in $VENV"
exec "$VENV/bin/python" -m pytest tests/python tests/demo -q -p no:cacheprovider "$@"
