"""What every translation shares: reading the other optimizer's groups (or the optimizer itself) and
building one meshmuon group per source group, key by key, so that every key is accounted for:
mapped to a meshmuon key, kept as a foreign key (docs/migration.md), or refused with a ValueError that
names it. The result is the keyword arguments of meshmuon.torch.Muon: `Muon(**from_xxx(...))`."""
from __future__ import annotations

import math
from typing import Any, Iterable

import torch

from .._foreign import KEY as FOREIGN_KEY
from .._options import ADAMW_DEFAULTS, GENERIC_KEYS, MUON_DEFAULTS

# Keys meshmuon.torch.Muon acts on: a source key of that name that the other optimizer does not read
# cannot be kept (meshmuon would act on it), so it is refused.
MESHMUON_KEYS = set(MUON_DEFAULTS) | set(ADAMW_DEFAULTS) | {"algorithm"}
# Keys kept as they are: torch's own (initial_lr from LR schedulers, param_names) and a label.
KEPT_KEYS = GENERIC_KEYS - {"params", "algorithm"}


def has_key(key: str) -> bool:
    """Whether this meshmuon build accepts Muon group key `key` (e.g. `muon_eq`, added in issue 31)."""
    return key in MUON_DEFAULTS


def source_groups(params: Any, peer: str) -> list[dict]:
    """The source's param groups as a list of dicts (not modified): from an optimizer of the other
    kind (its `param_groups`; it must not have stepped: its state is not translated), a list of
    group dicts, or an iterable of tensors / (name, tensor) pairs (one group)."""
    if isinstance(params, torch.optim.Optimizer):
        stepped = sum(1 for state in params.state.values() if state)
        if stepped:
            raise ValueError(f"[migrate] the {peer} optimizer has state for {stepped} parameters "
                             f"(it has stepped); its state is not translated: translate its groups "
                             f"before the first step, or start from a meshmuon checkpoint")
        params = params.param_groups
    if isinstance(params, torch.Tensor):
        params = [params]
    if isinstance(params, dict):
        raise TypeError(f"[migrate] {peer}: give a list of param group dicts, not one dict")
    items = list(params)
    if not items:
        raise ValueError(f"[migrate] {peer}: no parameters or groups given")
    if all(isinstance(g, dict) for g in items):
        for i, g in enumerate(items):
            if "params" not in g:
                raise ValueError(f"[migrate] {peer} param group {i} has no 'params'")
        return items
    if any(isinstance(g, dict) for g in items):
        raise TypeError(f"[migrate] {peer}: mix of group dicts and tensors; give one or the other")
    return [{"params": items}]


def tensors(group: dict) -> list[torch.Tensor]:
    """The group's parameters (named pairs unwrapped)."""
    raw = group["params"]
    raw = [raw] if isinstance(raw, torch.Tensor) else list(raw)
    return [p[1] if isinstance(p, tuple) and len(p) == 2 else p for p in raw]


class GroupTranslation:
    """One source group → one meshmuon group. `get` reads a key the source optimizer reads (the group's
    value, else the source optimizer's default); `alias` keeps a source key as a live alias of a
    meshmuon key; `fix` keeps a key translated once (a change raises at the next step); `ignore` marks
    keys the source optimizer ignores for this group; `finish` keeps the rest as foreign keys,
    refusing those that name a meshmuon key."""

    def __init__(self, peer: str, index: int, group: dict, defaults: dict):
        self.peer, self.index, self.source, self.defaults = peer, index, group, defaults
        if FOREIGN_KEY in group:
            raise self.fail(f"has {FOREIGN_KEY!r}: it is a meshmuon group already; give the {peer} "
                            f"groups, not translated ones")
        params = group["params"]
        self.out: dict[str, Any] = {"params": params if isinstance(params, torch.Tensor)
                                    else list(params)}
        self.foreign: dict[str, Any] = {}
        self.read = {"params"}

    def where(self) -> str:
        return f"[migrate] {self.peer} param group {self.index}"

    def fail(self, message: str) -> ValueError:
        return ValueError(f"{self.where()}: {message}")

    def get(self, key: str) -> Any:
        self.read.add(key)
        if key in self.source:
            return self.source[key]
        if key in self.defaults:
            return self.defaults[key]
        raise self.fail(f"has no {key!r} (and {self.peer} has no default for it); {self.peer} "
                        f"needs it in every such group")

    def set(self, **values: Any) -> None:
        self.out.update(values)

    def alias(self, key: str, target: str) -> Any:
        """Keeps `key` (the group's value, or the source default) in the group as an alias of meshmuon
        key `target` ("betas[0]" for one element): meshmuon reads it before every step."""
        value = self.get(key)
        self.out[key] = value
        self.foreign[key] = target
        return value

    def fix(self, key: str) -> Any:
        """Keeps `key` (read by the source optimizer, translated once) in the group; meshmuon raises
        before a step if the script changes it."""
        value = self.get(key)
        self.out[key] = value
        self.foreign[key] = {"fixed": value}
        return value

    def ignore(self, *keys: str) -> None:
        """Keys the source optimizer knows but does not read for this group: kept as foreign keys
        when present, dropped when they are meshmuon keys (meshmuon would act on them)."""
        for key in keys:
            self.read.add(key)
            if key in self.source and key not in MESHMUON_KEYS:
                self.out[key] = self.source[key]
                self.foreign[key] = None

    def finish(self) -> dict:
        for key, value in self.source.items():
            if key in self.read:
                continue
            if key in KEPT_KEYS:
                self.out[key] = value
            elif key in MESHMUON_KEYS:
                raise self.fail(f"key {key!r} is not read by {self.peer} but is a meshmuon key (meshmuon "
                                f"would act on it); remove it, or set it on the meshmuon group after "
                                f"translating if you mean meshmuon's {key!r}")
            else:
                self.out[key] = value
                self.foreign[key] = None  # the source ignores it too: kept for the script
        if self.foreign:
            self.out[FOREIGN_KEY] = dict(self.foreign)
        return self.out


def check_choice(t: GroupTranslation, key: str, value: Any, allowed: Iterable[Any]) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise t.fail(f"{key}={value!r} is not one of {t.peer}'s values {allowed}")


def rate(t: GroupTranslation, key: str, value: Any, checked: str = "",
         range_of: str = "torch.optim.Muon's range") -> Any:
    """A hyperparameter meshmuon takes finite and >= 0 (lr, weight_decay, momentum, NorMuon's beta2,
    eps): returned as given (a 1-element tensor lr too). A ValueError naming the key otherwise:
    non-finite values make the source's first step write inf / NaN into the parameters (meshmuon
    refuses them before anything is modified), negative ones are outside meshmuon's range, which
    is torch.optim.Muon's (`range_of`). `checked`: what the source itself checks (for the message)."""
    number = value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        raise t.fail(f"{key}={value!r} is not a number")
    if not math.isfinite(number):
        raise t.fail(f"{key}={value!r}: {t.peer} would take it and its step would write inf or NaN "
                     f"into the parameters; meshmuon refuses non-finite hyperparameters: use a "
                     f"finite value")
    if number < 0:
        raise t.fail(f"{key}={value!r} is negative: {checked or t.peer + ' does not check it'}; "
                     f"meshmuon takes {key} >= 0 ({range_of}): use a value >= 0")
    return value


def unit_beta(t: GroupTranslation, key: str, value: Any) -> Any:
    """An AdamW beta: meshmuon takes [0, 1), torch.optim.AdamW's range. beta = 1 makes the bias
    correction 1 - beta^t zero (a division by zero: NaN / inf parameters in every source's AdamW);
    beta2 > 1 makes it negative under a square root (NaN); beta1 > 1 extrapolates the first moment
    with a negative correction, which no source documents: refused too, naming the key."""
    number = value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value
    if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number):
        raise t.fail(f"{key}={value!r} is not a finite number")
    if not 0.0 <= number < 1.0:
        why = ("1 - beta^t is 0 at every step: the source's AdamW divides by it (inf / NaN "
               "parameters)" if number == 1.0 else
               "its AdamW bias correction 1 - beta^t turns negative" if number > 1.0 else
               "a negative average weight")
        raise t.fail(f"{key}={value!r}: {why}; meshmuon's AdamW takes betas in [0, 1) "
                     f"(torch.optim.AdamW's range): use a value in [0, 1)")
    return value


def bool_key(t: GroupTranslation, key: str) -> bool:
    value = t.get(key)
    if not isinstance(value, bool):
        raise t.fail(f"{key}={value!r} must be True or False")
    return value


def engine_flag(t: GroupTranslation, key: str, value: bool, what: str, off_hint: str) -> None:
    """Sets a Muon group flag that older meshmuon builds lack: unset when False and absent from this
    build (meshmuon's behaviour is then 'off'); a ValueError naming it when True and absent."""
    if has_key(key):
        t.set(**{key: value})
    elif value:
        raise t.fail(f"{what} needs meshmuon's group key {key!r}, which this meshmuon build does not "
                     f"have; {off_hint}")


def plain_update(t: GroupTranslation) -> None:
    """Spells out 'no MuonEq, no Muon+, decay with the unadjusted lr' where this build has the keys
    (so that the Muon constructor's defaults cannot change a translated group)."""
    for key, value in (("muon_eq", False), ("muon_plus", False), ("decay_lr", "unadjusted")):
        if has_key(key):
            t.set(**{key: value})


def no_state_keys(t: GroupTranslation, *keys: str) -> None:
    """Keys holding the source optimizer's progress (Dion's group `step`): not translated; a
    nonzero value means the source has stepped."""
    for key in keys:
        t.read.add(key)
        value = t.source.get(key, 0)
        if value:
            raise t.fail(f"{key}={value!r}: the {t.peer} optimizer has stepped; its state is not "
                         f"translated (translate before the first step)")


def muon_kwargs(groups: list[dict], **options: Any) -> dict:
    """The keyword arguments of meshmuon.torch.Muon for the translated groups."""
    return dict(params=groups, **options)
