"""meshmuon.torch.migrate: translations of other Muon optimizers' param groups into meshmuon.torch.Muon's
keyword arguments, so a training script moves to meshmuon by changing the line that builds the
optimizer and nothing else (docs/migration.md):

    opt = meshmuon.torch.Muon(**meshmuon.torch.from_nanochat(param_groups))

Every hyperparameter the other optimizer reads is mapped (or the translation raises, naming it);
the groups keep the script's own keys (`kind`, `use_muon`, `mu`, ...) as foreign keys."""
from .dion import from_dion
from .emerging import from_emerging_optimizers
from .motif import from_motif
from .nanochat import from_nanochat
from .torch_muon import from_torch_muon

__all__ = ["from_dion", "from_emerging_optimizers", "from_motif", "from_nanochat", "from_torch_muon"]
