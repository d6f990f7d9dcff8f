"""Hub models on an offline machine. dots runs with HF_HUB_OFFLINE=1 unless told otherwise (the
CLI and every DVC stage set it), so a hub name (`model.pretrained`, `embed.backbone: hf:<name>`,
`dots evaluate --policy`) must already be in the local Hugging Face cache. A missing one was
transformers' forty-line traceback from inside the stage ("We couldn't connect to
'https://huggingface.co'..."); it is now one line naming the key, the model and the command that
fetches it, checked before the stage's work.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

TRUE = ("1", "ON", "YES", "TRUE")


def offline(*flags: str) -> bool:
    """True when any of `flags` (default HF_HUB_OFFLINE) is set to a true value, as the hub client
    reads it (`datasets` adds HF_DATASETS_OFFLINE)."""
    return any(os.environ.get(f, "").strip().upper() in TRUE for f in flags or ("HF_HUB_OFFLINE",))


def is_hub_name(ref: str | Path) -> bool:
    """`org/name`, not a local path (what `dots.models.load_policy` loads from the hub)."""
    text = str(ref)
    return not Path(text).exists() and not text.startswith((".", "/")) and text.count("/") == 1


WEIGHTS = ("model.safetensors", "pytorch_model.bin")  # one file of weights
INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")  # or shards an index lists
# AutoTokenizer builds a tokenizer from any one of these; every hub model dots loads is tokenized
TOKENIZERS = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
              "sentencepiece.bpe.model")


def _cached_file(name: str, filename: str) -> str | None:
    from huggingface_hub import try_to_load_from_cache  # noqa: PLC0415

    path = try_to_load_from_cache(name, filename)
    return path if isinstance(path, str) else None


def missing_files(name: str) -> list[str] | None:
    """What `name`'s cached snapshot lacks to load: None when it is not in the cache at all, [] when
    its config, every file of its weights and a tokenizer are there. A download cut short leaves a
    snapshot with its config and only some weights (the hub client links a file into the snapshot
    once it is whole), which passed a config-only check and failed inside `from_pretrained`; a download
    of chosen files (`hf download NAME config.json model.safetensors`) has no tokenizer, which failed
    in `AutoTokenizer`, as late."""
    if _cached_file(name, "config.json") is None:
        return None
    lacks = _missing_weights(name)
    if not any(_cached_file(name, t) for t in TOKENIZERS):
        lacks.append("tokenizer files")
    return lacks


def _missing_weights(name: str) -> list[str]:
    if any(_cached_file(name, w) for w in WEIGHTS):
        return []
    for index in INDEXES:
        path = _cached_file(name, index)
        if path is not None:
            shards = sorted(set(json.loads(Path(path).read_text()).get("weight_map", {}).values()))
            return [s for s in shards if _cached_file(name, s) is None]
    return [WEIGHTS[0]]


def require_cached(refs: dict[str, str | Path | None]) -> None:
    """Refuse, offline, every hub model of `refs` ({key: name or path}) the cache lacks or holds in
    part, naming each key; online (HF_HUB_OFFLINE=0) transformers downloads them, so nothing is
    checked."""
    if not offline():
        return
    hub = [(key, str(ref)) for key, ref in refs.items() if ref and is_hub_name(ref)]
    lacks = {ref: missing_files(ref) for _, ref in hub}
    missing = [(key, ref) for key, ref in hub if lacks[ref] is None]
    partial = [(key, ref) for key, ref in hub if lacks[ref]]
    if not missing and not partial:
        return
    from huggingface_hub import constants  # noqa: PLC0415

    said = []
    if missing:
        said.append("; ".join(f"{key}: {ref}" for key, ref in missing)
                    + f": not in the Hugging Face cache ({constants.HF_HUB_CACHE})")
    for key, ref in partial:
        files = lacks[ref]
        said.append(f"{key}: {ref}: in the Hugging Face cache without {', '.join(files[:3])}"
                    + (f" and {len(files) - 3} more" if len(files) > 3 else "") + " (a download cut short?)")
    fetch = " && ".join(f"hf download {ref}" for _, ref in missing + partial)
    raise FileNotFoundError(f"{'; '.join(said)}, and dots runs offline (HF_HUB_OFFLINE=1): fetch it first "
                            f"(`{fetch}`), or run with HF_HUB_OFFLINE=0 to let transformers download it")
