"""`python -m meshmuon ...` is the `meshmuon` CLI."""
import sys

from ._cli import main

sys.exit(main())
