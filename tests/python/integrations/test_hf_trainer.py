"""Hugging Face Trainer (transformers 5.23 over accelerate 1.15, FSDP2) with
meshmuon.integrations.hf.MuonTrainer (hf_cases.py, torchrun, 2 CPU ranks, gloo, a tiny Llama from a
LlamaConfig, no hub): the loss falls; parameters and state bitwise meshmuon.torch.Muon built by hand
on the same FSDP2 model fed the Trainer's gradients and lrs; a checkpoint saved and resumed
through the Trainer bitwise the uninterrupted run.
Run: python -m pytest tests/python/integrations/test_hf_trainer.py -q   (about 50 s)."""
from __future__ import annotations

import pytest
from launch import HERE, ok, torchrun

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
CASES = ["trainer", "resume"]


def test_trainer_cases(tmp_path):
    proc = torchrun(2, HERE / "hf_cases.py", ["--cases", ",".join(CASES), "--out", str(tmp_path)],
                    tmp_path, timeout=240)
    ok(proc, "torchrun --nproc-per-node 2 hf_cases.py", CASES)
