"""Character-level data for the demo: the shipped public-domain text (data/alice.txt, see
data/NOTICE), a vocabulary of its characters, a deterministic train / validation split, and batches
that depend only on (seed, step): every optimizer and every rank count sees the same data order."""
from __future__ import annotations

from pathlib import Path

import torch

DEFAULT_TEXT = Path(__file__).resolve().parent / "data" / "alice.txt"


class CharData:
    """The text as int64 token ids. The first (1 - val_fraction) of the characters train, the rest
    validate (a contiguous tail, so no validation sequence overlaps a training one)."""

    def __init__(self, path: Path | str = DEFAULT_TEXT, val_fraction: float = 0.1):
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"[demo] text file {path} not found; the repository ships "
                                    f"examples/train_gpt/data/alice.txt")
        if not 0.0 < val_fraction < 0.5:
            raise ValueError(f"[demo] val_fraction={val_fraction}; use a value in (0, 0.5)")
        text = path.read_text(encoding="utf-8")
        self.path = path
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        ids = torch.tensor([self.stoi[c] for c in text], dtype=torch.int64)
        split = int(len(ids) * (1.0 - val_fraction))
        self.train, self.val = ids[:split], ids[split:]

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def batch(self, split: str, step: int, global_batch: int, seq_len: int, seed: int,
              rank: int = 0, world: int = 1):
        """This rank's slice of the global batch of `step`: (x, y) int64 [global_batch / world,
        seq_len], y shifted by one. The global batch is drawn from a generator seeded by (seed,
        split, step) alone, and rank r takes rows [r·b, (r+1)·b)."""
        if global_batch % world:
            raise ValueError(f"[demo] batch size {global_batch} is not a multiple of the {world} "
                             f"ranks; pick --batch-size divisible by --ranks")
        data = self.train if split == "train" else self.val
        if len(data) <= seq_len + 1:
            raise ValueError(f"[demo] the {split} split has {len(data)} characters, fewer than "
                             f"seq_len + 2 = {seq_len + 2}; lower --seq-len")
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step * 2 + (split != "train"))
        starts = torch.randint(len(data) - seq_len - 1, (global_batch,), generator=gen)
        local = global_batch // world
        starts = starts[rank * local:(rank + 1) * local]
        offsets = torch.arange(seq_len + 1)
        window = data[starts[:, None] + offsets[None, :]]
        return window[:, :-1].contiguous(), window[:, 1:].contiguous()
