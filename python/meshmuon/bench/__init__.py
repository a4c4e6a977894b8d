"""meshmuon.bench: benchmarks run as `python -m meshmuon.bench <command>` (see __main__.py)."""
