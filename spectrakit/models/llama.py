"""LLaMA-style decoder-only language model (Jiang, Semenov and Stich 2026 §6.2, App. F.3 / Table F.1).

Architecture: token embedding -> ``n_layers`` pre-norm blocks -> RMSNorm -> linear head, where a block is
``x + Attn(RMSNorm(x))`` then ``x + SwiGLU(RMSNorm(x))``; attention uses rotary position embeddings (RoPE)
and causal scaled-dot-product attention. Embeddings are untied by default (the paper's setting); weight tying
is optional. Sizes come from named presets (:data:`PRESETS`), from a CPU demo to ~124M/160M for one GPU.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from spectrakit._checks import check_choice, check_int, check_scalar


@dataclasses.dataclass
class LlamaConfig:
    """Model hyper-parameters.

    Args:
        vocab_size: tokens in the vocabulary, in [2, 2**16] (token files are uint16).
        dim: embedding width, >= 8 and divisible by ``n_heads``; ``dim // n_heads`` must be even (RoPE).
        n_layers: transformer blocks, >= 1.
        n_heads: attention heads, >= 1.
        mlp_hidden: SwiGLU hidden width; ``None`` -> ``8/3 * dim`` rounded up to a multiple of 64.
        max_seq_len: longest context the RoPE tables cover, >= 1.
        rope_theta: RoPE base, > 0.
        norm_eps: RMSNorm epsilon, > 0 (paper: 1e-5).
        tie_embeddings: share the embedding matrix with the output head.
        init_std: std of the normal initialisation, > 0; residual output projections use
            ``init_std / sqrt(2 n_layers)``.
    """

    vocab_size: int = 256
    dim: int = 128
    n_layers: int = 4
    n_heads: int = 4
    mlp_hidden: int | None = None
    max_seq_len: int = 256
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    init_std: float = 0.02

    def __post_init__(self) -> None:
        check_int(self.vocab_size, "vocab_size", low=2, high=2**16)
        check_int(self.dim, "dim", low=8)
        check_int(self.n_layers, "n_layers", low=1)
        check_int(self.n_heads, "n_heads", low=1)
        check_int(self.max_seq_len, "max_seq_len", low=1)
        if self.dim % self.n_heads or (self.dim // self.n_heads) % 2:
            raise ValueError(
                f"dim must be divisible by n_heads with an even head size (RoPE), "
                f"got dim={self.dim}, n_heads={self.n_heads}"
            )
        if self.mlp_hidden is None:
            self.mlp_hidden = 64 * math.ceil(8 * self.dim / 3 / 64)
        check_int(self.mlp_hidden, "mlp_hidden", low=1)
        check_scalar(self.rope_theta, "rope_theta", low=0, low_inclusive=False, allow_tensor=False)
        check_scalar(self.norm_eps, "norm_eps", low=0, low_inclusive=False, allow_tensor=False)
        check_scalar(self.init_std, "init_std", low=0, low_inclusive=False, allow_tensor=False)


# name -> (dim, n_layers, n_heads, max_seq_len, tie_embeddings). 124m/160m follow Table F.1 of Jiang, Semenov and Stich
# 2026
# (124M: tied embeddings, 160M: untied; exact counts depend on the vocabulary of the tokenizer).
PRESETS: dict[str, dict] = {
    "nano": dict(dim=32, n_layers=1, n_heads=2, max_seq_len=128),  # smoke tests: a command in a fraction of a second
    "tiny": dict(dim=128, n_layers=4, n_heads=4, max_seq_len=128),
    "mini": dict(dim=256, n_layers=6, n_heads=8, max_seq_len=256),
    "small": dict(dim=512, n_layers=8, n_heads=8, max_seq_len=512),
    "124m": dict(dim=768, n_layers=12, n_heads=12, max_seq_len=1024, tie_embeddings=True),
    "160m": dict(dim=768, n_layers=12, n_heads=12, max_seq_len=1024, tie_embeddings=False),
}


def preset_config(name: str, vocab_size: int, **overrides) -> LlamaConfig:
    """The :class:`LlamaConfig` of preset ``name`` (one of :data:`PRESETS`) for ``vocab_size`` tokens.

    Keyword ``overrides`` replace preset fields (e.g. ``max_seq_len=64``). Raises ``ValueError`` for an
    unknown name or an invalid field value, ``TypeError`` for an unknown field.
    """
    check_choice(name, "preset", PRESETS)
    return LlamaConfig(vocab_size=vocab_size, **{**PRESETS[name], **overrides})


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """float16/bfloat16 -> float32 (the precision of norms and rotations); other dtypes unchanged."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


class RMSNorm(nn.Module):
    """``y = x / sqrt(mean(x^2) + eps) * g`` over the last dim, computed in at least float32, returned in
    x's dtype."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = _upcast(x)
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.to(xf.dtype)).to(x.dtype)


def rope_tables(head_dim: int, seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables (seq_len, head_dim/2) with angle ``t * theta^(-2i/head_dim)`` (Su et al., RoPE)."""
    inv = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    ang = torch.arange(seq_len, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos().float(), ang.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate consecutive pairs ``(x[2i], x[2i+1])`` of the last dim by the angles of ``cos``/``sin``.

    ``x``: (B, H, T, hd); ``cos``/``sin``: (T, hd/2). Each pair is multiplied by the rotation matrix
    ``[[cos, -sin], [sin, cos]]``; computed in at least float32 and cast back.
    """
    xf = _upcast(x).unflatten(-1, (-1, 2))
    cos, sin = cos.to(xf.dtype), sin.to(xf.dtype)
    x0, x1 = xf[..., 0], xf[..., 1]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.flatten(-2).to(x.dtype)


class Attention(nn.Module):
    """Causal multi-head self-attention with RoPE on queries and keys; no biases."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.q_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.k_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.v_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.o_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        shape = (B, T, self.n_heads, D // self.n_heads)
        q = apply_rope(self.q_proj(x).view(shape).transpose(1, 2), cos, sin)
        k = apply_rope(self.k_proj(x).view(shape).transpose(1, 2), cos, sin)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, D))


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))`` (Shazeer 2020); no biases."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """Pre-norm residual block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.dim, cfg.mlp_hidden)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    """LLaMA-style causal LM. ``forward(idx, targets=None) -> (logits, loss)``.

    ``idx``/``targets``: int64 (B, T) with T <= ``max_seq_len``; ``loss`` is the mean next-token cross
    entropy in nats (float32), ``None`` without targets. Logits are (B, T, vocab).
    """

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight
        cos, sin = rope_tables(cfg.dim // cfg.n_heads, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal(0, init_std) for matrices, ``init_std/sqrt(2 n_layers)`` for residual outputs, ones for
        norms."""
        std = self.cfg.init_std
        for name, p in self.named_parameters():
            if p.ndim == 1:
                nn.init.ones_(p)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * self.cfg.n_layers))
            else:
                nn.init.normal_(p, 0.0, std)

    def num_parameters(self, non_embedding: bool = False) -> int:
        """Number of distinct parameters (the tied matrix counted once); optionally without the embedding."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.embed.weight.numel() if non_embedding else n

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        if idx.ndim != 2 or idx.dtype not in (torch.int64, torch.int32):
            raise ValueError(
                f"idx must be an int64 tensor of shape (B, T), got {idx.dtype} {tuple(idx.shape)}"
            )
        T = idx.shape[1]
        if T > self.cfg.max_seq_len:
            raise ValueError(f"sequence length must be in [1, max_seq_len={self.cfg.max_seq_len}], got {T}")
        x = self.embed(idx)
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        for block in self.blocks:
            x = block(x, cos, sin)
        logits = self.head(self.norm(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten().long())
        return logits, loss
