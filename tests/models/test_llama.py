"""LLaMA model: components against independent float64 references (complex-number RoPE, dense masked
softmax attention, explicit RMSNorm/SwiGLU), causality, loss, presets and argument errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from spectrakit.models.llama import (
    PRESETS,
    Llama,
    LlamaConfig,
    RMSNorm,
    apply_rope,
    preset_config,
    rope_tables,
)


def _reference_forward(model: Llama, idx: torch.Tensor) -> torch.Tensor:
    """Independent float64 forward: RoPE as complex multiplication, attention as dense masked softmax."""
    cfg = model.cfg
    sd = {k: v.double() for k, v in model.state_dict().items()}
    B, T = idx.shape
    hd = cfg.dim // cfg.n_heads
    freqs = cfg.rope_theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    rot = torch.polar(
        torch.ones(T, hd // 2, dtype=torch.float64), torch.arange(T, dtype=torch.float64)[:, None] * freqs
    )

    def rms(x, w):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + cfg.norm_eps) * w

    def rope(x):  # (B, H, T, hd)
        xc = torch.view_as_complex(x.reshape(*x.shape[:-1], hd // 2, 2).contiguous())
        return torch.view_as_real(xc * rot).reshape(x.shape)

    x = sd["embed.weight"][idx]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg.n_layers):
        p = lambda n, i=i: sd[f"blocks.{i}.{n}"]
        h = rms(x, p("attn_norm.weight"))
        q, k, v = (
            (h @ p(f"attn.{n}_proj.weight").T).view(B, T, cfg.n_heads, hd).transpose(1, 2) for n in "qkv"
        )
        q, k = rope(q), rope(k)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, cfg.dim)
        x = x + y @ p("attn.o_proj.weight").T
        h = rms(x, p("mlp_norm.weight"))
        g = h @ p("mlp.gate_proj.weight").T
        x = x + ((g * torch.sigmoid(g)) * (h @ p("mlp.up_proj.weight").T)) @ p("mlp.down_proj.weight").T
    head = sd["embed.weight"] if cfg.tie_embeddings else sd["head.weight"]
    return rms(x, sd["norm.weight"]) @ head.T


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("n_heads,dim,T", [(2, 16, 7), (4, 32, 12)])
def test_forward_matches_float64_reference(tie, n_heads, dim, T):
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=37, dim=dim, n_layers=2, n_heads=n_heads, max_seq_len=16, tie_embeddings=tie)
    model = Llama(cfg)
    with torch.no_grad():  # non-trivial norm gains so that they are tested too
        for p in model.parameters():
            if p.ndim == 1:
                p.uniform_(0.5, 1.5)
    idx = torch.randint(0, 37, (3, T))
    logits, _ = model.double()(idx)
    ref = _reference_forward(model, idx)
    torch.testing.assert_close(logits, ref, rtol=1e-9, atol=1e-10)


def test_rope_matches_complex_rotation_and_preserves_norm():
    cos, sin = rope_tables(8, 10, 10000.0)
    x = torch.randn(2, 3, 10, 8, dtype=torch.float64)
    out = apply_rope(x, cos.double(), sin.double())
    ang = torch.arange(10, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(0, 8, 2) / 8)
    ref = torch.view_as_real(
        torch.view_as_complex(x.reshape(2, 3, 10, 4, 2)) * torch.polar(torch.ones_like(ang), ang)
    ).reshape(x.shape)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)  # tables are stored in float32
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), rtol=1e-6, atol=1e-6)
    # relative position property: <R_s q, R_t k> depends on t - s only
    q, k = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    Q = apply_rope(q.expand(1, 1, 10, 8), cos.double(), sin.double())[0, 0]
    K = apply_rope(k.expand(1, 1, 10, 8), cos.double(), sin.double())[0, 0]
    torch.testing.assert_close(Q[2] @ K[5], Q[4] @ K[7], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_formula_and_dtype(dtype):
    norm = RMSNorm(6, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 2, 6))
    x = (torch.randn(4, 6) * 1e3).to(dtype)  # huge values: computed in float32 inside
    y = norm(x)
    assert y.dtype == dtype
    xd = x.double()
    ref = xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight.double()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol)


def test_causality_and_loss():
    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=50, dim=32, n_layers=2, n_heads=4, max_seq_len=16))
    idx = torch.randint(0, 50, (2, 12))
    logits, loss = model(idx[:, :-1], idx[:, 1:])
    changed = idx.clone()
    changed[:, 8:] = (changed[:, 8:] + 7) % 50  # future tokens must not influence earlier logits
    logits2, _ = model(changed[:, :-1])
    torch.testing.assert_close(logits[:, :8], logits2[:, :8])
    assert not torch.allclose(logits[:, 8:], logits2[:, 8:])
    ref = -torch.log_softmax(logits.double(), -1).gather(-1, idx[:, 1:, None]).mean()
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-6)
    # at init the loss is close to log(vocab) (small init std)
    assert abs(loss.item() - math.log(50)) < 0.1


def test_backward_and_bf16_and_noncontiguous_input():
    model = Llama(LlamaConfig(vocab_size=40, dim=16, n_layers=1, n_heads=2, max_seq_len=8))
    idx = torch.randint(0, 40, (8, 4)).T  # non-contiguous (4, 8)
    _, loss = model(idx, idx)
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss_bf = model(idx, idx)
    assert logits.dtype == torch.bfloat16 and torch.isfinite(loss_bf)
    assert abs(loss_bf.item() - loss.item()) < 0.05


def test_tied_embeddings_share_storage_and_count_once():
    m = Llama(LlamaConfig(vocab_size=30, dim=16, n_layers=1, n_heads=2, tie_embeddings=True))
    assert m.head.weight is m.embed.weight
    n_untied = Llama(LlamaConfig(vocab_size=30, dim=16, n_layers=1, n_heads=2)).num_parameters()
    assert n_untied - m.num_parameters() == 30 * 16


@pytest.mark.parametrize("name,vocab,expected_m", [("124m", 50304, 124), ("160m", 50304, 163)])
def test_presets_match_paper_sizes(name, vocab, expected_m):
    cfg = preset_config(name, vocab)
    d, L, h = cfg.dim, cfg.n_layers, cfg.mlp_hidden
    count = vocab * d * (1 if cfg.tie_embeddings else 2) + L * (4 * d * d + 3 * d * h + 2 * d) + d
    with torch.device("meta"):
        model = Llama(cfg)
    assert model.num_parameters() == count
    assert abs(count / 1e6 - expected_m) < 3
    assert set(PRESETS) >= {"tiny", "124m", "160m"}


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(dim=30, n_heads=4), "divisible"),
        (dict(dim=12, n_heads=4), "even head"),
        (dict(vocab_size=70000), "vocab_size"),
        (dict(n_layers=0), "n_layers"),
        (dict(norm_eps=0.0), "norm_eps"),
    ],
)
def test_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LlamaConfig(**kwargs)


def test_forward_errors():
    m = Llama(LlamaConfig(vocab_size=10, dim=8, n_layers=1, n_heads=2, max_seq_len=4))
    with pytest.raises(ValueError, match="max_seq_len"):
        m(torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="idx"):
        m(torch.zeros(5))
    with pytest.raises(ValueError, match="preset"):
        preset_config("huge", 10)
    assert F.silu is not None
