"""Owner placement (meshmuon.torch.own): chosen matrices whole on one owner rank each, beside FSDP2.
The mechanism is in placement.py's docstring; the files are its concepts."""
from .placement import OwnerPlacement, own

__all__ = ["OwnerPlacement", "own"]
