"""meshmuon.torch.param_groups: split a model's parameters into Muon and AdamW groups by module type,
not by ndim alone (embeddings and the LM head are 2-D but belong to AdamW)."""
from __future__ import annotations

import re
from typing import Any, Callable, Optional

import torch
from torch import nn

_NORMS = (nn.LayerNorm, nn.GroupNorm, nn.LocalResponseNorm, nn.modules.batchnorm._NormBase,
          nn.modules.instancenorm._InstanceNorm) + ((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ())
_EMBEDDINGS = (nn.Embedding, nn.EmbeddingBag)
_CONVS = (nn.modules.conv._ConvNd,)
LM_HEAD_NAMES = ("lm_head", "output", "head", "embed_out", "classifier", "score")


def _is_norm(module: nn.Module) -> bool:
    # Custom norms (RMSNorm classes of model zoos) are recognised by class name.
    return isinstance(module, _NORMS) or "norm" in type(module).__name__.lower()


def classify(model: nn.Module, *, lm_head_names=LM_HEAD_NAMES, expert_pattern: Optional[str] = None,
             vocab_size: Optional[int] = None) -> dict[str, str]:
    """Maps each trainable parameter name (as model.named_parameters() gives it) to "muon",
    "expert" (a 3-D [E, A, B] stack for Muon) or "adamw", with the reason rules of param_groups."""
    # The vocabulary is the largest embedding's (position embeddings are smaller) unless given.
    sizes = [m.num_embeddings for m in model.modules() if isinstance(m, _EMBEDDINGS)]
    vocab = {vocab_size} if vocab_size else ({max(sizes)} if sizes else set())
    expert_re = re.compile(expert_pattern) if expert_pattern else None
    adamw_ids, kinds = set(), {}
    # pass 1: parameters owned by embeddings, norms, convolutions or an LM head go to AdamW, under
    # every name they have (a tied head shares its embedding's tensor).
    for mname, module in model.named_modules():
        last = mname.rsplit(".", 1)[-1]
        head = isinstance(module, nn.Linear) and (last in lm_head_names
                                                  or module.out_features in vocab)
        if isinstance(module, _EMBEDDINGS) or _is_norm(module) or isinstance(module, _CONVS) or head:
            adamw_ids.update(id(p) for p in module.parameters(recurse=False))
    # pass 2: everything else by shape.
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if id(p) in adamw_ids or p.ndim < 2 or p.ndim > 3:
            kinds[name] = "adamw"
        elif p.ndim == 3:
            is_expert = expert_re.search(name) is not None if expert_re else True
            kinds[name] = "expert" if is_expert else "adamw"
        else:
            kinds[name] = "muon"
    return kinds


def param_groups(model: nn.Module, *, muon: Optional[dict[str, Any]] = None,
                 adamw: Optional[dict[str, Any]] = None, experts: Optional[dict[str, Any]] = None,
                 lm_head_names=LM_HEAD_NAMES, expert_pattern: Optional[str] = None,
                 vocab_size: Optional[int] = None,
                 is_muon: Optional[Callable[[str, nn.Parameter], Optional[bool]]] = None,
                 split: Optional[dict[str, dict[str, Any]]] = None) -> list[dict[str, Any]]:
    r"""Param groups for meshmuon.torch.Muon, with parameter names (as named parameters):

    - AdamW: parameters of nn.Embedding / nn.EmbeddingBag, of norm layers (torch's norms and any
      module whose class name contains "Norm"), of convolutions, of the LM head (an nn.Linear named
      one of `lm_head_names`, or projecting to the vocabulary: out_features equal to the largest
      embedding's num_embeddings or to `vocab_size`; a head tied to the embedding is the
      embedding's tensor),
      and every parameter that is not 2-D or 3-D (biases, gains, scalars).
    - Muon: the other 2-D parameters (Linear weights, raw nn.Parameter matrices).
    - Muon expert stacks (group with expert_stacks=True): the other 3-D parameters, [E, A, B] =
      E matrices of A x B, e.g. torchtitan's `experts.w1` nn.Parameter. With `expert_pattern` (a
      regex), only 3-D parameters whose name matches are experts; the rest go to AdamW.
    - `is_muon(name, param)`, the caller's own routing rule (e.g. Motif's `use_muon`, or "every
      2-D weight but the embeddings"), decides first: True = Muon (a 3-D parameter becomes an
      expert stack), False = AdamW, None = the rules above. True for a parameter that is not 2-D or
      3-D is a ValueError naming it.
    - `split` tags attention weights for split orthogonalization: {regex: options}, each Muon
      matrix whose name matches a regex (the first that matches) goes to a Muon group of its own
      with those options, `num_heads=h` (h equal row blocks of dim 0, the output dim) or
      `split_sizes=(a, b, ...)` (row blocks of those sizes), each block orthogonalized as its own
      matrix. With head_dim hd, n_heads query heads and n_kv key/value heads:
        * separate q / k / v weights, each per head: {r"\.wq\.": dict(num_heads=n_heads),
          r"\.w[kv]\.": dict(num_heads=n_kv)};
        * a fused QKV [(n_heads + 2 n_kv) hd, d], q, k and v each per head: every head is hd rows,
          so {r"qkv": dict(num_heads=n_heads + 2 * n_kv)} (MHA: n_kv = n_heads, 3 n_heads blocks);
        * the same fused weight split into q | k | v only (Megatron's split QKV, GQA's uneven
          blocks): {r"qkv": dict(split_sizes=(n_heads * hd, n_kv * hd, n_kv * hd))}.
      A Muon parameter matching no regex stays in the plain Muon group; an AdamW one is an error.
    Frozen parameters (requires_grad=False) are left out. `muon`, `adamw`, `experts` add or
    override hyperparameters of the respective groups (experts default to `muon`'s). Empty groups
    are omitted.
    """
    kinds = classify(model, lm_head_names=lm_head_names, expert_pattern=expert_pattern,
                     vocab_size=vocab_size)
    if is_muon is not None:
        if not callable(is_muon):
            raise TypeError(f"[torch] param_groups: is_muon must be a callable (name, param) -> "
                            f"bool | None, got {type(is_muon).__name__}")
        for name, p in model.named_parameters():
            if name not in kinds:
                continue
            choice = is_muon(name, p)
            if choice is None:
                continue
            if not isinstance(choice, bool):
                raise TypeError(f"[torch] param_groups: is_muon({name!r}) returned "
                                f"{type(choice).__name__}; return True, False or None")
            if choice and p.ndim not in (2, 3):
                raise ValueError(f"[torch] param_groups: is_muon({name!r}) is True but the parameter "
                                 f"is {p.ndim}-D {tuple(p.shape)}; Muon takes 2-D matrices and 3-D "
                                 f"expert stacks: return False (AdamW) for it")
            kinds[name] = ("muon" if p.ndim == 2 else "expert") if choice else "adamw"
    patterns = [(re.compile(k), k) for k in (split or {})]
    buckets: dict[str, list] = {"muon": [], "expert": [], "adamw": []}
    split_buckets: dict[str, list] = {k: [] for _, k in patterns}
    for name, p in model.named_parameters():
        if name not in kinds:
            continue
        key = next((k for r, k in patterns if r.search(name)), None)
        if key is not None and kinds[name] == "adamw":
            raise ValueError(f"[torch] param_groups: split pattern {key!r} matches {name!r}, an AdamW "
                             f"parameter {tuple(p.shape)}; split orthogonalization is for Muon "
                             f"matrices: narrow the pattern")
        if key is not None and kinds[name] == "muon":
            split_buckets[key].append((name, p))
        else:
            buckets[kinds[name]].append((name, p))
    groups = []
    if buckets["muon"]:
        groups.append(dict(algorithm="muon", params=buckets["muon"], **(muon or {})))
    for _, key in patterns:
        if split_buckets[key]:
            groups.append(dict(algorithm="muon", params=split_buckets[key],
                               **dict(muon or {}, **split[key])))
    if buckets["expert"]:
        groups.append(dict(algorithm="muon", expert_stacks=True, params=buckets["expert"],
                           **dict(muon or {}, **(experts or {}))))
    if buckets["adamw"]:
        groups.append(dict(algorithm="adamw", params=buckets["adamw"], **(adamw or {})))
    return groups
