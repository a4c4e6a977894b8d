"""The `meshmuon` console script: runs the native `meshmuon` CLI that the wheel carries in meshmuon/bin/."""
import os
import sys


def binary() -> str:
    """Path of the native `meshmuon` executable inside the installed package."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "meshmuon")


def main() -> int:
    exe = binary()
    if not os.access(exe, os.X_OK):
        print(f"meshmuon: the native CLI is missing at {exe}; reinstall the package (pip install .)",
              file=sys.stderr)
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(exe, [exe, *sys.argv[1:]])
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
