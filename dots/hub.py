"""Hub models on an offline machine. dots runs with HF_HUB_OFFLINE=1 unless told otherwise (the
CLI and every DVC stage set it), so a hub name (`model.pretrained`, `embed.backbone: hf:<name>`,
`dots evaluate --policy`) must already be in the local Hugging Face cache. A missing one was
transformers' forty-line traceback from inside the stage ("We couldn't connect to
'https://huggingface.co'..."); it is now one line naming the key, the model and the command that
fetches it, checked before the stage's work.
"""

from __future__ import annotations

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


def cached(name: str) -> bool:
    """Whether the local Hugging Face cache holds `name`'s config (its snapshot is downloaded)."""
    from huggingface_hub import try_to_load_from_cache  # noqa: PLC0415

    return isinstance(try_to_load_from_cache(name, "config.json"), str)


def require_cached(refs: dict[str, str | Path | None]) -> None:
    """Refuse, offline, every hub model of `refs` ({key: name or path}) the cache lacks, naming
    each key; online (HF_HUB_OFFLINE=0) transformers downloads them, so nothing is checked."""
    if not offline():
        return
    missing = [(key, str(ref)) for key, ref in refs.items()
               if ref and is_hub_name(ref) and not cached(str(ref))]
    if missing:
        from huggingface_hub import constants  # noqa: PLC0415

        named = "; ".join(f"{key}: {ref}" for key, ref in missing)
        fetch = " && ".join(f"hf download {ref}" for _, ref in missing)
        raise FileNotFoundError(f"{named}: not in the Hugging Face cache ({constants.HF_HUB_CACHE}), "
                                f"and dots runs offline (HF_HUB_OFFLINE=1): fetch it first (`{fetch}`), "
                                "or run with HF_HUB_OFFLINE=0 to let transformers download it")
