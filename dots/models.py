"""The tiny policy of the embedded default: a GPT-2 architecture from transformers, random
init, with a character tokenizer built locally (no hub download, saved with
`save_pretrained` so every later stage loads it like any hub model).
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

from .config import ModelConfig
from .hub import is_hub_name, require_cached

transformers.utils.logging.disable_progress_bar()

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
ALPHABET = list("0123456789+=")


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer: one token per digit or sign, <bos> prepended."""
    vocab = {tok: i for i, tok in enumerate([PAD, BOS, EOS, *ALPHABET])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, vocab[BOS])])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   unk_token=PAD)
    fast.padding_side = "left"
    return fast


def build_model(cfg: ModelConfig, tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> GPT2LMHeadModel:
    """Random-init GPT-2 sized by `cfg`. Dropout is off: RL ratios need a deterministic policy."""
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=cfg.n_positions, n_embd=cfg.n_embd, n_layer=cfg.n_layer,
        n_head=cfg.n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # the warm-up's loss; silences transformers' "loss_type=None" notice
    return model


def save_policy(model, tokenizer, path: str | Path, state_dict: dict | None = None) -> None:
    """save_pretrained of model (safetensors; `state_dict`: weights gathered elsewhere, e.g. under
    FSDP) and tokenizer into `path`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, state_dict=state_dict, safe_serialization=True)
    tokenizer.save_pretrained(path)


def load_policy(path: str | Path, dtype: torch.dtype = torch.float32, key: str = "model"):
    """Load a policy and tokenizer: a folder we saved, any local causal LM folder, or a hub
    name (`model.pretrained`, online or from the local HF cache). `key` names the params key a
    hub name missing from the cache came from (offline: one line, not a traceback)."""
    local = Path(path)
    if local.exists() and not (local / "config.json").exists():
        raise FileNotFoundError(f"{local}: no saved model; run `dots warmup` first")
    if not local.exists() and not is_hub_name(path):
        raise FileNotFoundError(f"{path}: no saved model here (and not a hub name); run `dots warmup` first")
    require_cached({key: path})
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token  # many hub causal LMs ship without a pad token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    disable_dropout(model)
    return model, tokenizer


def disable_dropout(model: torch.nn.Module) -> None:
    """Dropout off in every layer of a loaded policy, as `build_model` makes ours: RL ratios need a
    deterministic policy. Rollouts score their tokens in inference mode and the update in training
    mode, so a hub or local model with dropout (a config's `attention_dropout` 0.1, GPT-2's
    `*_pdrop`) drew ratios of up to 1.05 on fresh, on-policy groups (measured on a Qwen2 layout)
    and clipped them. Dropout layers get p = 0 and the attention modules' own rate (Qwen2, Llama:
    a float `attention_dropout`) 0; the config is left as it was, so an exported policy keeps it."""
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            module.p = 0.0
        for name in ("attention_dropout", "dropout"):
            if isinstance(getattr(module, name, None), float):
                setattr(module, name, 0.0)


def set_training(model: torch.nn.Module, mode: bool) -> None:
    """Switch `model` (and its dropout) between training and inference around a rollout.

    Why not `model.train(mode)`: transformers 5 re-kernelizes a model on every switch of mode
    (its `kernels` hub-kernel hooks, on by default), about 1.2 ms each on the embedded model:
    two a rollout, a twentieth of a `dots_rr` step. The kernels chosen when the trainer first
    put the model in training mode serve inference too, so a rollout switches torch's flag alone.
    """
    torch.nn.Module.train(model, mode)


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' is cuda when a GPU is visible, else cpu."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device: 'cuda' asked for but no GPU is visible")  # the CLI: one line
    return torch.device(name)


def enable_activation_checkpointing(model) -> None:
    """Recompute each block's activations in the backward pass (train.gradient_checkpointing).
    transformers >= 5.2x calls it `activation_checkpointing_enable`; older releases (4.x, the
    GPU image's 5.17) only have `gradient_checkpointing_enable`, the same switch."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable({"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
