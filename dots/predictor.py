"""Attention-based adaptive difficulty predictor (DESIGN §1).

Given K reference questions whose difficulty under the current policy was just observed,
predict every other question's difficulty as an attention-weighted mean of the reference
labels, then calibrate. Queries and references go through separate adapter towers over
frozen embeddings; a small MLP reads (mean, std) of the reference labels and outputs a
temperature and a bias: d̂_cal = σ(logit(d̂)/T + b).

The towers never change during RL, so `project_pool` runs them once over the whole pool;
each round is then one K×N attention (`predict_projected`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

EPS = 1e-4


class AdapterTower(nn.Sequential):
    """LayerNorm → Linear → GELU → Dropout → Linear → GELU → Dropout → Linear → LayerNorm."""

    def __init__(self, dim: int, hidden: int, dropout: float):
        super().__init__(
            nn.LayerNorm(dim), nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(dropout),
            nn.Linear(hidden, hidden), nn.GELU(), nn.Dropout(dropout),
            nn.Linear(hidden, hidden), nn.LayerNorm(hidden),
        )


class Calibration(nn.Module):
    """(mean, std) of the reference labels → temperature T > 0 and bias b."""

    def __init__(self, hidden: int = 16):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, hidden), nn.GELU(), nn.Linear(hidden, 2))
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)  # starts as T = softplus(0)+shift = 1, b = 0

    def forward(self, ref_labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        stats = torch.stack([ref_labels.mean(), ref_labels.std(unbiased=False)])
        t_raw, b = self.net(stats)
        temperature = F.softplus(t_raw) + (1.0 - math.log(2.0))  # = 1 at init, > 0.3 always
        return temperature, b


class DifficultyPredictor(nn.Module):
    def __init__(self, dim: int, hidden: int = 128, dropout: float = 0.1):
        super().__init__()
        self.dim, self.hidden = dim, hidden
        self.query_tower = AdapterTower(dim, hidden, dropout)
        self.ref_tower = AdapterTower(dim, hidden, dropout)
        self.calibration = Calibration()

    def attend(self, q: torch.Tensor, k: torch.Tensor, ref_labels: torch.Tensor,
               exclude: torch.Tensor | None = None) -> torch.Tensor:
        """Raw d̂ = Σ_i softmax_i(z_q·z_i/√h) d_i; `exclude` (Q, K) masks a query's own reference slot."""
        scores = q @ k.T / math.sqrt(self.hidden)
        if exclude is not None:
            scores = scores.masked_fill(exclude, float("-inf"))
        return torch.softmax(scores, dim=-1) @ ref_labels

    def calibrate(self, raw: torch.Tensor, ref_labels: torch.Tensor) -> torch.Tensor:
        temperature, bias = self.calibration(ref_labels)
        raw = raw.clamp(EPS, 1 - EPS)
        return torch.sigmoid(torch.logit(raw) / temperature + bias)

    def forward(self, query_emb: torch.Tensor, ref_emb: torch.Tensor, ref_labels: torch.Tensor,
                exclude: torch.Tensor | None = None) -> torch.Tensor:
        raw = self.attend(self.query_tower(query_emb), self.ref_tower(ref_emb), ref_labels, exclude)
        return self.calibrate(raw, ref_labels)

    @torch.inference_mode()
    def project_pool(self, embeddings: torch.Tensor) -> "PoolProjections":
        """Run both towers once over the pool: all later rounds reuse these."""
        was = self.training
        self.eval()
        proj = PoolProjections(self.query_tower(embeddings).contiguous(), self.ref_tower(embeddings).contiguous())
        self.train(was)
        return proj

    @torch.inference_mode()
    def predict_projected(self, proj: "PoolProjections", ref_idx: np.ndarray, ref_labels: np.ndarray) -> np.ndarray:
        """d̂_cal for every pool question from one round's K observed references (one K×N attention)."""
        labels = torch.as_tensor(ref_labels, dtype=torch.float32)
        keys = proj.keys[torch.as_tensor(ref_idx, dtype=torch.long)]
        raw = self.attend(proj.queries, keys, labels)
        return self.calibrate(raw, labels).numpy()


    def refit_calibration(self, proj: "PoolProjections", ref_idx: np.ndarray, ref_labels: np.ndarray,
                          query_idx: np.ndarray, observed: np.ndarray, steps: int = 25, lr: float = 1e-2) -> float:
        """Online calibration: a few Adam steps on the calibration MLP only, fitting the last
        round's predictions (its references and labels) to the difficulties its selected
        questions then showed. The towers stay frozen, so the cached projections stay valid;
        what moves is the temperature and bias, which drift as the policy leaves the
        labelling policies behind. Returns the BCE after the refit."""
        labels = torch.as_tensor(ref_labels, dtype=torch.float32)
        target = torch.as_tensor(observed, dtype=torch.float32)
        with torch.no_grad():
            raw = self.attend(proj.queries[torch.as_tensor(query_idx, dtype=torch.long)],
                              proj.keys[torch.as_tensor(ref_idx, dtype=torch.long)], labels)
        opt = torch.optim.Adam(self.calibration.parameters(), lr=lr)
        loss = torch.tensor(float("nan"))
        for _ in range(steps):
            loss = F.binary_cross_entropy(self.calibrate(raw, labels).clamp(1e-6, 1 - 1e-6), target)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return float(loss.detach())


@dataclass
class PoolProjections:
    queries: torch.Tensor  # (N, h) query-tower outputs
    keys: torch.Tensor     # (N, h) reference-tower outputs


def save_predictor(path, predictor: DifficultyPredictor, metrics: dict) -> None:
    from .atomic import atomic_path  # noqa: PLC0415

    with atomic_path(path) as tmp:
        torch.save({"dim": predictor.dim, "hidden": predictor.hidden, "state": predictor.state_dict(),
                    "metrics": metrics}, tmp)


def load_predictor(path) -> DifficultyPredictor:
    from .checkpoints import load_tensors  # noqa: PLC0415

    blob = load_tensors(path, "predictor")
    model = DifficultyPredictor(blob["dim"], blob["hidden"])
    model.load_state_dict(blob["state"])
    model.eval()
    return model
