"""Exit 0 when every pinned requirement in the given file is installed at its version, else 1.

Used by scripts/setup.sh so that `make test` calls pip only when something is missing.
"""
import sys
from importlib import metadata


def main(path: str) -> int:
    ok = True
    for line in open(path):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, version = line.partition("==")
        try:
            have = metadata.version(name.strip())
        except metadata.PackageNotFoundError:
            print(f"missing: {name}")
            ok = False
            continue
        if version and have.split("+")[0] != version.strip():
            print(f"version: {name} {have} != {version}")
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
