"""meshmuon.integrations: meshmuon.torch.Muon where users train. Each module maps one framework's
naming of optimizers, parameter groups, schedulers and checkpoints onto meshmuon.torch, and
nothing else; importing this package imports no framework (each module imports its own):
- `meshmuon.integrations.hf`: Hugging Face Trainer (over Accelerate, FSDP2 included): MuonTrainer,
  MuonFactory, param_groups_for;
- `meshmuon.integrations.lightning`: PyTorch Lightning (ModelParallelStrategy): configure_muon;
- `meshmuon.integrations.torchtitan`: torchtitan: optimizer_name="MeshMuon" in its ParamGroupConfig.
See docs/integrations.md."""
