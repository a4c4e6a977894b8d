#!/usr/bin/env bash
# Installs what meshmuon needs and is missing: Debian packages through apt-get, PyPI packages through
# pip (pinned). Idempotent and fast when everything is present. Run by `make setup` / `make test`.
set -euo pipefail

APT_PACKAGES=(
  g++ make pkg-config ccache ninja-build cmake
  libopenblas-dev liblapacke-dev          # BLAS (loaded at run time) and LAPACKE (test oracle)
  libopenmpi-dev openmpi-bin              # mpi communicator backend, mpirun for tests
  zlib1g-dev                              # CRC-32 of checkpoint files
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev libfmt-dev libspdlog-dev
)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# CMake >= 3.24 is required; Debian bookworm ships 3.25.
if ! cmake --version >/dev/null 2>&1; then
  echo "setup: cmake not usable after install" >&2
  exit 1
fi

PY=${PYTHON:-python3}
if [[ -f scripts/requirements.txt ]] && command -v "$PY" >/dev/null 2>&1; then
  if ! "$PY" scripts/check_requirements.py scripts/requirements.txt >/dev/null 2>&1; then
    echo "setup: installing PyPI packages from scripts/requirements.txt"
    "$PY" -m pip install -q --disable-pip-version-check -r scripts/requirements.txt
  fi
fi
# The training frameworks of meshmuon.integrations (tests/python/integrations), never replacing
# torch: pip gets a constraint of the torch already installed. Files named *-nodeps.txt hold
# packages whose declared dependencies must not be followed (they would pull in what meshmuon does
# not use, or another torch); their imports' own needs are pinned in requirements-integrations.txt.
if command -v "$PY" >/dev/null 2>&1 && "$PY" -c "import torch" >/dev/null 2>&1; then
  constraints=$(mktemp)
  trap 'rm -f "$constraints"' EXIT
  "$PY" -c "import torch; print('torch==' + torch.__version__.split('+')[0])" >"$constraints"
  for req in scripts/requirements-integrations.txt scripts/requirements-integrations-nodeps.txt; do
    [[ -f "$req" ]] || continue
    if ! "$PY" scripts/check_requirements.py "$req" >/dev/null 2>&1; then
      nodeps=()
      [[ "$req" == *-nodeps.txt ]] && nodeps=(--no-deps)
      echo "setup: installing PyPI packages from $req"
      "$PY" -m pip install -q --disable-pip-version-check "${nodeps[@]}" -c "$constraints" -r "$req"
    fi
  done
  # triton for the torchtitan llama3 test only, in a folder of its own (scripts/requirements-triton.txt).
  triton_site=${MESHMUON_TRITON_SITE:-${XDG_CACHE_HOME:-$HOME/.cache}/meshmuon/triton-3.7.1}
  if [[ ! -f "$triton_site/.complete" ]]; then
    echo "setup: installing triton into $triton_site (for tests/python/integrations/test_torchtitan.py)"
    rm -rf "$triton_site"
    "$PY" -m pip install -q --disable-pip-version-check --no-deps --target "$triton_site" -r scripts/requirements-triton.txt
    touch "$triton_site/.complete"
  fi
fi
echo "setup: ok"
