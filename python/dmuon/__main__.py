"""`python -m dmuon ...` is the `dmuon` CLI."""
import sys

from ._cli import main

sys.exit(main())
