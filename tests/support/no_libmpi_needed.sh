#!/usr/bin/env bash
# MPI is loaded at run time (src/comm/mpi/mpi_api.h): no shipped binary may list libmpi in its
# dynamic section (a wheel cannot carry the cluster's MPI, and `import meshmuon` must work without
# one). Usage: no_libmpi_needed.sh [--control FILE] FILE...
#   FILE:            readelf -d must list NEEDED entries, none of them libmpi*
#   --control FILE:  a program that does link MPI (a dist test): its libmpi entry must be seen, so
#                    the check above cannot pass by not seeing anything.
set -u
status=0
needed() { readelf -d "$1" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
while [[ $# -gt 0 ]]; do
  if [[ "$1" == "--control" ]]; then
    libs=$(needed "$2")
    if grep -q '^libmpi' <<<"$libs"; then
      echo "control ok: $2 needs $(grep '^libmpi' <<<"$libs" | tr '\n' ' ')"
    else
      echo "FAIL: control $2 should list libmpi in readelf -d but does not (is the check blind?)"; status=1
    fi
    shift 2
    continue
  fi
  libs=$(needed "$1")
  if [[ -z "$libs" ]]; then
    echo "FAIL: readelf -d $1 lists no NEEDED entries (missing file or no readelf?)"; status=1
  elif grep -q '^libmpi' <<<"$libs"; then
    echo "FAIL: $1 needs $(grep '^libmpi' <<<"$libs" | tr '\n' ' ')(MPI must be loaded at run time)"; status=1
  else
    echo "ok: $1 needs $(tr '\n' ' ' <<<"$libs")"
  fi
  shift
done
exit $status
