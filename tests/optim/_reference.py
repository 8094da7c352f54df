"""Hand-written float64 references of the published update rules, one parameter at a time.

Each reference keeps its own state and follows the paper's pseudo-code literally (Python scalars for
the step count, explicit bias corrections), independent of spectrakit's foreach/batched code.
"""

from __future__ import annotations

import math

import torch


class Ref:
    def __init__(self, p: torch.Tensor, lr: float, wd: float, **hp):
        self.p = p.detach().double().clone()
        self.lr, self.wd, self.hp, self.t = lr, wd, hp, 0
        self.s: dict[str, torch.Tensor] = {}

    def buf(self, name):
        if name not in self.s:
            self.s[name] = torch.zeros_like(self.p)
        return self.s[name]

    def step(self, g: torch.Tensor, post=lambda U: U, alpha: float = 1.0) -> torch.Tensor:
        self.t += 1
        U = self.direction(g.double())
        self.p = (1 - self.lr * self.wd) * self.p - self.lr * alpha * post(U)
        return self.p


class AdamWRef(Ref):
    def direction(self, g):
        b1, b2 = self.hp["betas"]
        m = self.s["m"] = b1 * self.buf("m") + (1 - b1) * g
        v = self.s["v"] = b2 * self.buf("v") + (1 - b2) * g * g
        mhat, vhat = m / (1 - b1**self.t), v / (1 - b2**self.t)
        return mhat / (vhat.sqrt() + self.hp["eps"])


class SignumRef(Ref):
    """Bernstein et al. 2018: m = b m + (1 - b) g; update sign(m) (Nesterov: sign((1 - b) g + b m))."""

    def direction(self, g):
        b = self.hp["momentum"]
        m = self.s["m"] = b * self.buf("m") + (1 - b) * g
        return torch.sign((1 - b) * g + b * m if self.hp["nesterov"] else m)


class SGDRef(Ref):
    def direction(self, g):
        b, d = self.hp["momentum"], self.hp["dampening"]
        m = self.s["m"] = b * self.buf("m") + (1 - d) * g
        return (1 - d) * g + b * m if self.hp["nesterov"] else m


class LionRef(Ref):
    """Chen et al. 2023, Alg. 2: c = b1 m + (1 - b1) g; update sign(c); m = b2 m + (1 - b2) g."""

    def direction(self, g):
        b1, b2 = self.hp["betas"]
        m = self.buf("m")
        U = torch.sign(b1 * m + (1 - b1) * g)
        self.s["m"] = b2 * m + (1 - b2) * g
        return U


class AdEMAMixRef(Ref):
    """Pagliardini et al. 2024, Alg. 1 with the alpha / beta3 schedulers of their eq. (4)-(5)."""

    def direction(self, g):
        b1, b2, b3 = self.hp["betas"]
        alpha, ta, tb, t = self.hp["alpha"], self.hp["alpha_warmup"], self.hp["beta3_warmup"], self.t
        alpha_t = min(t * alpha / ta, alpha) if ta else alpha
        if tb:
            lb1, lb3 = math.log(b1), math.log(b3)
            b3_t = min(math.exp(lb1 * lb3 / ((1 - t / tb) * lb3 + (t / tb) * lb1)), b3)
        else:
            b3_t = b3
        m1 = self.s["m1"] = b1 * self.buf("m1") + (1 - b1) * g
        m2 = self.s["m2"] = b3_t * self.buf("m2") + (1 - b3_t) * g
        v = self.s["v"] = b2 * self.buf("v") + (1 - b2) * g * g
        return (m1 / (1 - b1**t) + alpha_t * m2) / ((v / (1 - b2**t)).sqrt() + self.hp["eps"])


class MARSRef(Ref):
    """Yuan et al. 2024, MARS-AdamW (approx. variant): c = g + gamma b1/(1-b1) (g - g_prev);
    if ||c|| > 1: c = c / ||c||; AdamW moments of c."""

    def direction(self, g):
        b1, b2 = self.hp["betas"]
        c = g + self.hp["gamma"] * b1 / (1 - b1) * (g - self.buf("g_prev"))
        self.s["g_prev"] = g
        n = float(c.norm())
        if n > 1:
            c = c / n
        m = self.s["m"] = b1 * self.buf("m") + (1 - b1) * c
        v = self.s["v"] = b2 * self.buf("v") + (1 - b2) * c * c
        return (m / (1 - b1**self.t)) / ((v / (1 - b2**self.t)).sqrt() + self.hp["eps"])


REFERENCES = {
    "adamw": AdamWRef,
    "signum": SignumRef,
    "sgd": SGDRef,
    "lion": LionRef,
    "ademamix": AdEMAMixRef,
    "mars": MARSRef,
}


def newton_schulz5(G: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Keller Jordan's published quintic Newton-Schulz iteration (a, b, c) = (3.4445, -4.7750, 2.0315),
    written here from the Muon blog post, run in the input's dtype."""
    a, b, c = 3.4445, -4.7750, 2.0315
    X = G
    tall = X.size(-2) > X.size(-1)
    if tall:
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X
    return X.mT if tall else X


def polar_exact(G: torch.Tensor) -> torch.Tensor:
    P, _, Qh = torch.linalg.svd(G.double(), full_matrices=False)
    return P @ Qh


def svd_map(G: torch.Tensor, fn) -> torch.Tensor:
    P, s, Qh = torch.linalg.svd(G.double(), full_matrices=False)
    return (P * fn(s)) @ Qh
