"""dmuon.bench: benchmarks run as `python -m dmuon.bench <command>` (see __main__.py)."""
