#!/usr/bin/env bash
# Fetches, on a machine WITH a Debian bookworm package registry and PyPI, what scripts/gpu_check.sh
# needs on a GPU machine WITHOUT them: the Debian packages (OpenBLAS, LAPACKE, GoogleTest, Open MPI,
# fmt, spdlog, nlohmann-json, CLI11 and their library dependencies) into shared/debs/, and the
# build-time Python packages pinned in scripts/requirements.txt (nanobind) as wheels for the GPU
# machine's Python (3.12) into shared/wheels/. shared/ travels with the tree to the GPU machine and
# is ignored by git: never commit it. gpu_check.sh unpacks the .debs with `dpkg-deb -x` into a
# prefix and the wheels onto PYTHONPATH; nothing is installed here.
#
# Usage: bash scripts/fetch_gpu_debs.sh [DEST]      (DEST defaults to shared/debs; wheels go beside it)
# Needs: apt-get, apt-cache (run `apt-get update` first if the lists are stale), pip.
set -euo pipefail

DEST=${1:-shared/debs}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOTS=(
  libopenblas-dev libopenblas0-pthread libopenblas-pthread-dev   # BLAS (dlopen'd by meshmuon)
  liblapacke-dev liblapacke liblapack3 libblas3                  # LAPACKE: the tests' SVD oracle
  libgtest-dev libgmock-dev                                      # GoogleTest
  libopenmpi-dev openmpi-bin                                     # mpi communicator (optional there)
  libfmt-dev libspdlog-dev nlohmann-json3-dev libcli11-dev       # build dependencies of meshmuon
)
# The C runtime, the compiler toolchain and other base packages the GPU machine has already: never
# unpacked over it (libgfortran5, which OpenBLAS needs, is kept).
SKIP_RE='^(libc6|libc6-dev|libc-dev-bin|linux-libc-dev|libgcc-s1|libstdc\+\+6|libstdc\+\+-[0-9]+-dev|gcc-[0-9]+-base|gcc-[0-9]+|cpp-[0-9]+|g\+\+-[0-9]+|gfortran-[0-9]+|libgfortran-[0-9]+-dev|libgcc-[0-9]+-dev|libcc1-0|libgomp1|libitm1|libatomic1|libasan[0-9]|liblsan0|libtsan[0-9]|libubsan1|libquadmath0|libgmp10|libisl[0-9]+|libmpfr6|libmpc3|binutils.*|libbinutils|libctf.*|libgprofng0|libjansson4|m4|autoconf|automake|autotools-dev|libcrypt1|libcrypt-dev|zlib1g|debconf|debianutils|dpkg|tar|perl.*|libperl.*|libselinux1|libsepol2|libsemanage.*|libpcre2-8-0|libzstd1|liblzma5|libbz2-1\.0|libmd0|libacl1|libaudit.*|libcap-ng0|libpam.*|passwd|adduser|libtinfo6|libedit2|libbsd0|libdb5\.3|libgdbm.*|libssl3|libudev1|openssh-client|libcbor.*|libfido2-1|libgssapi.*|libkrb5.*|libk5crypto3|libkeyutils1|libcom-err2|libuuid1|libtirpc.*|libnsl.*|rpcsvc-proto)$'

command -v apt-get >/dev/null && command -v apt-cache >/dev/null || { echo "fetch_gpu_debs: needs apt-get and apt-cache" >&2; exit 1; }
mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd)

# The dependency closure as apt resolves it on an empty system (Depends and PreDepends, first
# alternatives, no Recommends), without the base packages above.
mapfile -t PKGS < <(apt-get -s -o Dir::State::status=/dev/null install --no-install-recommends "${ROOTS[@]}" 2>/dev/null |
                    awk '/^Inst /{print $2}' | sort -u | grep -Ev "$SKIP_RE")
((${#PKGS[@]})) || { echo "fetch_gpu_debs: apt resolved nothing (run apt-get update?)" >&2; exit 1; }
echo "fetch_gpu_debs: ${#PKGS[@]} packages into $DEST"
cd "$DEST"
failed=()
for p in "${PKGS[@]}"; do
  ls "${p}"_*.deb >/dev/null 2>&1 && continue   # already fetched
  apt-get download -qq "$p" >/dev/null 2>&1 || failed+=("$p")
done
if ((${#failed[@]})); then
  echo "fetch_gpu_debs: could not download: ${failed[*]}" >&2
fi
{
  echo "# fetched by scripts/fetch_gpu_debs.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(. /etc/os-release && echo "$PRETTY_NAME")"
  ls -1 ./*.deb | sed 's|^\./||'
} > MANIFEST.txt
echo "fetch_gpu_debs: $(ls -1 ./*.deb | wc -l) .deb files, $(du -sh . | cut -f1); list in $DEST/MANIFEST.txt"

# The build-time Python packages, exactly the versions the build is tested with (the GPU machine has
# its own nanobind, whose version may differ): pure wheels, for its Python 3.12.
WHEELS=$(dirname "$DEST")/wheels
mkdir -p "$WHEELS"
for pkg in nanobind; do
  pin=$(grep -E "^$pkg==" "$HERE/requirements.txt" || true)
  [[ -n "$pin" ]] || { echo "fetch_gpu_debs: $pkg is not pinned in scripts/requirements.txt" >&2; exit 1; }
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    -d "$WHEELS" "$pin" || { echo "fetch_gpu_debs: could not download $pin" >&2; exit 1; }
done
echo "fetch_gpu_debs: wheels in $WHEELS: $(ls "$WHEELS" | tr '\n' ' ')"
