"""The trained policy as the product: a standard model folder a user loads, serves or shares.

`train@<method>` writes the final policy to `runs/<method>/model` (`save_pretrained`:
config.json, model.safetensors, tokenizer files), a DVC output, so `dvc push`/`pull` move it
and `AutoModelForCausalLM.from_pretrained` or vLLM load it as is. The folder carries a
`dots.json` (method, steps, final accuracy, weights digest): the digest lets the MLflow
registry tell a retried upload of the same weights from a newly trained model.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from .atomic import disk_full, out_of_space
from .models import save_policy

INFO = "dots.json"


def weights_digest(folder: str | Path) -> str:
    """sha256 of the folder's weight files (safetensors), in name order."""
    h = hashlib.sha256()
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no safetensors weights")
    for f in files:
        h.update(f.name.encode())
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def write_model_folder(model, tokenizer, path: str | Path, state_dict: dict | None = None,
                       info: dict | None = None) -> Path:
    """save_pretrained of model and tokenizer into `path`, swapped in whole (a temporary sibling
    folder first): a kill mid-write leaves the previous folder, never a torn one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        save_policy(model, tokenizer, tmp, state_dict)
        meta = {**(info or {}), "weights_sha256": weights_digest(tmp)}
        (tmp / INFO).write_text(json.dumps(meta, indent=1) + "\n")
    except Exception as exc:  # safetensors' own error type is neither OSError nor RuntimeError
        full = out_of_space(exc, path.parent)
        written = sum(f.stat().st_size for f in tmp.rglob("*") if f.is_file()) if tmp.exists() else 0
        shutil.rmtree(tmp, ignore_errors=True)  # a torn model folder is never left to be read
        if not full:
            raise
        kept = f"the previous {path.name} folder is kept" if path.exists() else "none is left in its place"
        raise disk_full(path, "the model was saved", written, kept, left=" once that was removed",
                        then=" (training resumes from its last checkpoint)") from exc
    old = path.with_name(f".{path.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        path.rename(old)
    tmp.rename(path)
    shutil.rmtree(old, ignore_errors=True)
    return path


def read_info(path: str | Path) -> dict:
    f = Path(path) / INFO
    if not f.exists():
        raise FileNotFoundError(f"{path}: not an exported dots model (no {INFO}); run `dots train` first")
    return json.loads(f.read_text())
