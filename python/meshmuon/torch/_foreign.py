"""Foreign group keys: keys another optimizer's training script keeps in its param groups (nanochat's
`kind`, Motif's `use_muon`, Dion's `mu`), declared by the group key `foreign_keys` so that
meshmuon.torch.Muon keeps them instead of refusing them (docs/migration.md).

`group["foreign_keys"]` is a dict {key: target}:
  - target None: the key is kept untouched and ignored by meshmuon (the loop may read and write it);
  - target "momentum" (a meshmuon key) or "betas[1]" (one element of a meshmuon tuple key): an alias. The
    foreign key is the source of truth: before every step (and at construction) its value is copied
    into the meshmuon key, so a schedule written for the other optimizer (`group["mu"] = ...`) takes
    effect. The meshmuon key is overwritten each step; set the foreign key instead;
  - target {"fixed": value}: a key the other optimizer reads that was translated once (Dion's
    `adjust_lr`, nanochat's `kind`): kept for the script, and a ValueError before the step if the
    script changes it (the translation would no longer hold).
A declared key must not be a meshmuon key (it would be ambiguous which one meshmuon reads). The migration
functions (meshmuon.torch.migrate) write this declaration; it can also be written by hand.
Kept free of imports from _options (which calls into this module) to avoid an import cycle."""
from __future__ import annotations

import re
from typing import Any

KEY = "foreign_keys"
_ELEMENT = re.compile(r"^([a-z_0-9]+)\[(\d+)\]$")


def _target(target: str) -> tuple[str, int | None]:
    match = _ELEMENT.match(target)
    return (match.group(1), int(match.group(2))) if match else (target, None)


def declared(group: dict, index: int, known: set[str]) -> set[str]:
    """The keys group `index` declares foreign (plus `foreign_keys` itself), validated against
    meshmuon's keys `known`; an empty set when the group declares none. ValueError naming the key."""
    spec = group.get(KEY)
    if spec is None:
        return set()
    where = f"[torch] param group {index}: {KEY}"
    if not isinstance(spec, dict):
        raise ValueError(f"{where} must be a dict {{key: None or meshmuon key}}, got "
                         f"{type(spec).__name__}")
    for key, target in spec.items():
        if not isinstance(key, str):
            raise ValueError(f"{where}: key {key!r} is not a string")
        if key in known or key == KEY:
            raise ValueError(f"{where}: {key!r} is a meshmuon key; a foreign key must not be one "
                             f"(remove it from {KEY}, or rename the key in your script)")
        if key not in group:
            raise ValueError(f"{where}: declares {key!r}, which the group does not have; add the "
                             f"key to the group or remove it from {KEY}")
        if target is None:
            continue
        if isinstance(target, dict):
            if set(target) != {"fixed"}:
                raise ValueError(f"{where}: target of {key!r} must be None, a meshmuon key or "
                                 f"{{'fixed': value}}, got {target!r}")
            continue
        if not isinstance(target, str):
            raise ValueError(f"{where}: target of {key!r} must be None or a meshmuon key, got "
                             f"{target!r}")
        name, _ = _target(target)
        if name not in known or name in ("params", "algorithm"):
            raise ValueError(f"{where}: {key!r} aliases {target!r}, which is not a meshmuon "
                             f"hyperparameter key")
    return set(spec) | {KEY}


def sync(group: dict) -> None:
    """Copies every aliased foreign key's value into its meshmuon key and checks the fixed ones (called
    before each step and at construction)."""
    spec = group.get(KEY)
    if not spec:
        return
    for key, target in spec.items():
        if target is None:
            continue
        if isinstance(target, dict):
            if group[key] != target["fixed"]:
                raise ValueError(f"[torch] param group key {key!r} was {target['fixed']!r} when the "
                                 f"group was translated for meshmuon and is now {group[key]!r}; it "
                                 f"cannot change after translation (docs/migration.md): translate "
                                 f"again, or set meshmuon's keys")
            continue
        name, element = _target(target)
        value: Any = group[key]
        if element is not None:
            items = list(group[name])
            if element >= len(items):
                raise ValueError(f"[torch] {KEY}: {key!r} aliases {target!r}, but {name!r} has "
                                 f"{len(items)} elements")
            items[element] = value
            value = tuple(items)
        group[name] = value
