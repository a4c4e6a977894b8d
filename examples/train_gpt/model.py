"""A small character-level GPT for the training demo: RoPE causal self-attention that returns each
layer's per-head max pre-softmax logit (QK-clip's input), RMSNorm, a GELU MLP, optionally one MoE
layer whose experts are 3-D [E, out, in] parameters (torchtitan style)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class GPTConfig:
    vocab_size: int = 128
    seq_len: int = 128
    n_layer: int = 6
    n_head: int = 6
    d_model: int = 384
    mlp_ratio: int = 4
    tie_embeddings: bool = False
    moe_experts: int = 0      # 0: no MoE; E > 0: the middle block's MLP becomes E experts, top-1
    moe_layer: int = -1       # which block gets the MoE (-1: the middle one)

    def to_dict(self) -> dict:
        return asdict(self)


def rope_tables(seq_len: int, head_dim: int, base: float = 10000.0):
    """cos / sin tables [seq_len, head_dim / 2] for rotary embeddings (no parameters)."""
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [B, H, T, D]; rotate the pairs (x1, x2) of the two halves of the head dim.
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class CausalSelfAttention(nn.Module):
    """Separate wq / wk / wv / wo so QK-clip can tag the query and key rows (head blocks along dim 0).

    forward returns (y, max_logits[H]): the max over batch and causal positions of the scaled
    pre-softmax logits q·k/sqrt(d) of each head, taken from the score matrix that is computed anyway
    (one reduction, no extra [B, H, T, T] tensor kept for backward; detached)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        assert cfg.d_model % cfg.n_head == 0, "d_model must be a multiple of n_head"
        self.n_head, self.head_dim = cfg.n_head, cfg.d_model // cfg.n_head
        assert self.head_dim % 2 == 0, "head_dim must be even for rotary embeddings"
        self.wq = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wo = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, C = x.shape
        q = self.wq(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos[:T], sin[:T]), apply_rope(k, cos[:T], sin[:T])
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        scores = scores.masked_fill(mask[:T, :T], float("-inf"))
        with torch.no_grad():  # masked entries are -inf, so amax sees only causal logits
            max_logits = scores.detach().amax(dim=(0, 2, 3))
        att = F.softmax(scores, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return self.wo(y), max_logits


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x)))


class MoE(nn.Module):
    """Top-1 routed experts stored as 3-D parameters [E, out, in] (torchtitan's layout): w1
    [E, hidden, d], w2 [E, d, hidden], each expert as wide as the dense MLP (one expert per token,
    so a token costs what it costs in the dense MLP). The router is a small Linear [E, d]."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        E, d, h = cfg.moe_experts, cfg.d_model, cfg.mlp_ratio * cfg.d_model
        self.router = nn.Linear(d, E, bias=False)
        self.w1 = nn.Parameter(torch.empty(E, h, d))
        self.w2 = nn.Parameter(torch.empty(E, d, h))

    def forward(self, x):
        B, T, C = x.shape
        flat = x.reshape(-1, C)
        gates = F.softmax(self.router(flat), dim=-1)
        weight, expert = gates.max(dim=-1)
        out = torch.zeros_like(flat)
        for e in range(self.w1.shape[0]):  # few experts: a loop over token subsets is simplest
            idx = (expert == e).nonzero(as_tuple=True)[0]
            h = F.gelu(flat[idx] @ self.w1[e].t()) @ self.w2[e].t()
            out = out.index_add(0, idx, h * weight[idx, None])
        return out.view(B, T, C)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, moe: bool):
        super().__init__()
        self.norm1 = nn.RMSNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.norm2 = nn.RMSNorm(cfg.d_model)
        self.mlp = MoE(cfg) if moe else MLP(cfg)

    def forward(self, x, cos, sin, mask):
        a, max_logits = self.attn(self.norm1(x), cos, sin, mask)
        x = x + a
        return x + self.mlp(self.norm2(x)), max_logits


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        moe_at = (cfg.n_layer // 2 if cfg.moe_layer < 0 else cfg.moe_layer) if cfg.moe_experts else -1
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, moe=(i == moe_at)) for i in range(cfg.n_layer))
        self.norm = nn.RMSNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        cos, sin = rope_tables(cfg.seq_len, cfg.d_model // cfg.n_head)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        mask = torch.triu(torch.ones(cfg.seq_len, cfg.seq_len, dtype=torch.bool), diagonal=1)
        self.register_buffer("causal_mask", mask, persistent=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        std = 0.02
        proj_std = std / math.sqrt(2 * self.cfg.n_layer)  # GPT-2's scaled init of residual outputs
        for name, p in self.named_parameters():
            if p.ndim < 2:
                continue  # RMSNorm gains keep their ones
            residual_out = name.endswith(("wo.weight", "proj.weight", ".w2"))
            nn.init.normal_(p, mean=0.0, std=proj_std if residual_out else std)

    def num_params(self) -> int:
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())

    def forward(self, idx, targets=None):
        """idx [B, T] int64 -> (logits [B, T, V], loss or None, max_logits) with max_logits a dict
        {layer: tensor[n_head]} (this process's batch; all-reduce with MAX for the global one)."""
        x = self.embed(idx)
        max_logits = {}
        for i, block in enumerate(self.blocks):
            x, max_logits[i] = block(x, self.rope_cos, self.rope_sin, self.causal_mask)
        logits = self.lm_head(self.norm(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss, max_logits

    def qk_layout(self) -> dict:
        """QK-clip tags for meshmuon.torch.Muon(qk_layout=...): wq rows are query heads, wk rows key
        heads (MHA: as many key heads as query heads), each head a block of head_dim rows."""
        hd = self.cfg.d_model // self.cfg.n_head
        layout = {}
        for i, block in enumerate(self.blocks):
            layout[f"blocks.{i}.attn.wq.weight"] = dict(layer=i, kind="q", heads=self.cfg.n_head,
                                                        head_dim=hd)
            layout[f"blocks.{i}.attn.wk.weight"] = dict(layer=i, kind="k", heads=self.cfg.n_head,
                                                        head_dim=hd)
        return layout
