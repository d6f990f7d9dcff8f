"""Train and evaluate the difficulty predictor on labelled questions.

Labels are observed difficulties d = 1 − mean reward under G samples, gathered with
several warm-up policies (the paper labels with several models), so the predictor learns
"difficulty relative to the references, under whatever policy labelled them". Each batch
picks one policy and one random reference set shared by the batch's queries; a query
never attends to itself. Held-out questions (never used as queries or references in
training) give the Pearson and MAE we report.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F

from .config import PredictorConfig, holdout_size
from .predictor import DifficultyPredictor


def split_labelled(n: int, holdout_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) positions into the labelled set."""
    perm = np.random.default_rng(seed).permutation(n)
    n_hold = holdout_size(n, holdout_fraction)
    return perm[n_hold:], perm[:n_hold]


def fit_predictor(embeddings: torch.Tensor, labels: dict[str, np.ndarray], cfg: PredictorConfig,
                  ref_size: int, seed: int = 0, progress=None) -> tuple[DifficultyPredictor, dict]:
    """`embeddings` (M, D) of the labelled questions; `labels[policy]` (M,) difficulties."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    m = embeddings.shape[0]
    train, hold = split_labelled(m, cfg.holdout_fraction, seed)
    k = min(ref_size, len(train) - 1)
    batch = min(cfg.batch_size, len(train))
    policies = sorted(labels)
    tensors = {p: torch.as_tensor(labels[p], dtype=torch.float32) for p in policies}
    model = DifficultyPredictor(embeddings.shape[1], cfg.hidden, cfg.dropout)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    model.train()
    for step in range(cfg.steps):
        d = tensors[policies[rng.integers(len(policies))]]
        refs = rng.choice(train, size=k, replace=False)
        queries = rng.choice(train, size=batch, replace=False)
        exclude = torch.as_tensor(queries[:, None] == refs[None, :])
        pred = model(embeddings[queries], embeddings[refs], d[refs], exclude)
        loss = F.binary_cross_entropy(pred.clamp(1e-6, 1 - 1e-6), d[queries])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if progress is not None:
            progress(step, loss.item())
    model.eval()
    metrics = evaluate_predictor(model, embeddings, labels, train, hold, k, seed)
    metrics["train_questions"], metrics["holdout_questions"], metrics["ref_size"] = len(train), len(hold), k
    return model, metrics


@torch.inference_mode()
def evaluate_predictor(model: DifficultyPredictor, embeddings: torch.Tensor, labels: dict[str, np.ndarray],
                       train: np.ndarray, hold: np.ndarray, ref_size: int, seed: int = 0,
                       draws: int = 8) -> dict:
    """Pearson and MAE of held-out predictions, per policy and averaged, over several reference draws."""
    rng = np.random.default_rng(seed + 1)
    proj = model.project_pool(embeddings)
    out: dict = {"per_policy": {}}
    for name in sorted(labels):
        d = np.asarray(labels[name], dtype=np.float64)
        pearsons, maes = [], []
        for _ in range(draws):
            refs = rng.choice(train, size=ref_size, replace=False)
            pred = model.predict_projected(proj, refs, d[refs])[hold]
            pearsons.append(pearson(pred, d[hold]))
            maes.append(float(np.abs(pred - d[hold]).mean()))
        out["per_policy"][name] = {"pearson": _mean_defined(pearsons), "mae": float(np.mean(maes))}
    out["pearson"] = _mean_defined([v["pearson"] for v in out["per_policy"].values()])
    out["mae"] = float(np.mean([v["mae"] for v in out["per_policy"].values()]))
    return out


def _mean_defined(values: list[float]) -> float:
    """Mean of the defined values; NaN (no warning) when none is defined."""
    vals = [v for v in values if np.isfinite(v)]
    return float(np.mean(vals)) if vals else float("nan")


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson r, NaN when either side is constant (no signal to correlate).

    numpy's `corrcoef` rather than `scipy.stats.pearsonr` (the same r to ~1e-16): the trainer
    logs `dots/pearson` inside every DOTS step's clock, and pearsonr's checks cost 0.6 ms of it, a
    hundredth of a `dots_rr` step; no p-value is used."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(a) < 2 or a.std() == 0 or b.std() == 0:
        return float("nan")
    return float(np.clip(np.corrcoef(a, b)[0, 1], -1.0, 1.0))


def pearson_ceiling(rewards: list[np.ndarray]) -> float:
    """The Pearson r a predictor that knew every question's true pass rate could expect against
    pass rates *observed* from a few samples each: the goal's yardstick for `dots/pearson`.

    An observed rate is the true one plus sampling noise, so r(true, observed) = sd(true) /
    sd(observed) = sqrt(1 − noise variance / observed variance) (the attenuation bound of
    classical test theory). Each rate's noise variance is estimated without bias as s² / G, s²
    being its G rewards' sample variance (d(1 − d) / (G − 1) for 0/1 rewards). The narrower the
    spread of the true rates (questions picked near 50%), the larger the noise's share and the
    lower the ceiling. NaN when fewer than two rates or they do not vary."""
    rows = [np.asarray(r, dtype=np.float64) for r in rewards]
    if len(rows) < 2 or any(len(r) < 2 for r in rows):
        return float("nan")
    if len({len(r) for r in rows}) == 1:  # G samples each (every step's groups): one array operation
        table = np.stack(rows)
        observed, noise_each = table.mean(axis=1), table.var(axis=1, ddof=1) / table.shape[1]
    else:
        observed = np.array([r.mean() for r in rows])
        noise_each = np.array([r.var(ddof=1) / len(r) for r in rows])
    total = observed.var(ddof=1)
    if total == 0:
        return float("nan")
    noise = float(noise_each.mean())
    return float(np.sqrt(max(0.0, 1.0 - noise / total)))
