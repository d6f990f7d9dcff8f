"""Fully sharded data parallelism (PyTorch FSDP2, `torch.distributed.fsdp.fully_shard`) for policies
too large to replicate.

Why: `dots.distributed` keeps the whole policy, its gradients and its AdamW states on every rank.
A 7B-class model in bf16 is ~15 GB of weights, but AdamW adds two fp32 states per parameter
(~56 GB) and an fp32 master copy / fp32 gradients more still: over 100 GB on one GPU before any
activation. FSDP2 keeps each rank's 1/world slice of every parameter (a DTensor sharded on dim 0),
so gradients (reduce-scattered) and AdamW states (built on the local slices) are 1/world too; each
transformer block's full weights exist only while that block runs (all-gathered in its forward and
again in its backward, freed after).

- `shard_model(model)`: `fully_shard` on every transformer block, then on the root (the embeddings,
  the final norm and the lm_head: a tied lm_head shares the embedding's one parameter in the root's
  group, so tying survives). Gradients are *summed* over ranks, the `dots.distributed` convention
  (each rank's loss is scaled so that the sum over ranks is the single-process loss); FSDP2's own
  default is the mean.
- `full_state_dict(model)`: the unsharded weights on every rank (checkpoints, loading an
  inference engine); `load_full_state_dict(model, state)` is its inverse (resuming).
- `gathered(model)`: a context in which every parameter stays all-gathered, so forwards run without
  any collective. Needed for generation: each forward of a sharded model all-gathers, so ranks with
  different numbers of prompts, or whose responses stop at different steps, would otherwise hang
  (or pair one rank's all-gather with another collective); inside `gathered` each rank may call
  forward any number of times.

`shard_model`, `full_state_dict`, `load_full_state_dict`, entering and leaving `gathered`, and every
forward, backward and `clip_grad_norm_` of a sharded model outside `gathered` are collective: all
ranks run them, the same number of times, in the same order (so in training every rank must run
the same number of micro-batches, even an empty share).
Backend: gloo on CPU, nccl on CUDA (`tests/test_sharding.py` runs 2 gloo processes).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as tdist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor


def transformer_blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The model's list of transformer blocks: `model.model.layers` (Llama / Qwen2 / Mistral style
    causal LMs) or `model.transformer.h` (GPT-2)."""
    for path in (("model", "layers"), ("transformer", "h")):
        obj = model
        for name in path:
            obj = getattr(obj, name, None)
        if isinstance(obj, torch.nn.ModuleList) and len(obj) > 0:
            return obj
    raise ValueError(f"shard_model: cannot find the transformer blocks of {type(model).__name__}; "
                     "expected model.model.layers (Llama/Qwen2-style) or model.transformer.h (GPT-2)")


def fsdp_modules(model: torch.nn.Module) -> list[FSDPModule]:
    """Every module of `model` that `fully_shard` was applied to, root first."""
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def shard_model(model: torch.nn.Module, *, mesh=None, mp_policy=None, sum_gradients: bool = True) -> torch.nn.Module:
    """Shard `model` in place with FSDP2 and return it (its class becomes FSDP<Class>; it is still
    the same object, with DTensor parameters).

    Call after `torch.distributed.init_process_group` and before building the optimizer (which must
    see the sharded parameters). The mesh (`mesh`, by default every rank of the process group) is
    on the device type of the model's parameters: put the model on its device first (cuda:LOCAL_RANK
    after `torch.cuda.set_device`), or pass a cuda mesh to shard a CPU-built model onto the GPUs
    (FSDP2 then moves each rank's shards there). FSDP2's own default, a cuda mesh wherever CUDA is
    available, would send a CPU/gloo run on a one-GPU machine to cuda:RANK ("invalid device
    ordinal"). All parameters of one group must share one dtype (FSDP2 asserts
    "uniform original parameter dtype"); for bf16 compute with fp32 master weights pass
    `mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)` on an
    fp32 model. `sum_gradients=False` keeps FSDP2's mean over ranks.
    """
    if mesh is None:
        device = next(model.parameters()).device
        mesh = init_device_mesh(device.type, (tdist.get_world_size(),))
    kwargs = {"mesh": mesh}
    if mp_policy is not None:
        kwargs["mp_policy"] = mp_policy
    for block in transformer_blocks(model):
        fully_shard(block, reshard_after_forward=True, **kwargs)
    # the root (embeddings, final norm, lm_head) stays gathered from its forward to its backward:
    # FSDP2's own choice for a root, made explicit so that `gathered` can restore it
    fully_shard(model, reshard_after_forward=False, **kwargs)
    if sum_gradients:
        for m in fsdp_modules(model):
            m.set_gradient_divide_factor(1.0)
            # a plain SUM reduce-scatter: for fp32/bf16 gradients FSDP2 would otherwise use
            # ReduceOp.PREMUL_SUM(1.0), which gloo refuses ("Cannot use ReduceOp.PREMUL_SUM with Gloo")
            m.set_force_sum_reduction_for_comms(True)
    return model


@torch.no_grad()
def full_state_dict(model: torch.nn.Module, *, cpu: bool = False) -> dict[str, torch.Tensor]:
    """The model's state dict with every sharded parameter all-gathered (`DTensor.full_tensor()`),
    on every rank; plain-model keys, so `load_state_dict` of an unsharded model accepts it.

    Tied parameters (lm_head / embeddings) are gathered once and appear under both keys as one
    tensor. `cpu=True` moves each tensor to the CPU as soon as it is gathered (a checkpoint of a
    large model: only one full tensor at a time on the accelerator). Collective; call it outside
    `gathered`.
    """
    out, seen = {}, {}
    for key, value in model.state_dict(keep_vars=True).items():
        if id(value) not in seen:
            full = value.full_tensor() if isinstance(value, DTensor) else value
            full = full.detach()
            seen[id(value)] = full.cpu() if cpu else full
        out[key] = seen[id(value)]
    return out


@torch.no_grad()
def load_full_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy full (unsharded) tensors, e.g. `full_state_dict`'s or a plain checkpoint's, into a sharded
    model. Every rank must hold the whole `state`; each takes its own slice (no communication).
    Strict: missing or unexpected keys raise KeyError. Call it outside `gathered` (there the
    parameters are the gathered copies, which the reshard on leaving discards)."""
    current = model.state_dict(keep_vars=True)
    missing, unexpected = sorted(set(current) - set(state)), sorted(set(state) - set(current))
    if missing or unexpected:
        raise KeyError(f"load_full_state_dict: missing {missing}, unexpected {unexpected}")
    for key, target in current.items():
        src = state[key]
        if isinstance(target, DTensor):
            src = src.to(device=target.device, dtype=target.dtype)
            part = distribute_tensor(src, target.device_mesh, target.placements, src_data_rank=None)
            target.to_local().copy_(part.to_local())
        else:
            target.copy_(src)


@contextmanager
def gathered(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """All-gather every parameter of a `shard_model` model once, keep them gathered across any number
    of forwards (no collective runs in them, so ranks may call forward different numbers of times:
    generation with different prompt counts or stopping steps), then reshard on exit.

    Entering and leaving are collective (all ranks, same order); inside, the whole model is held on
    each rank (about the weights' size in memory; gradients and optimizer states stay sharded). The
    all-gather runs with inference mode off even inside `torch.inference_mode()`: FSDP2 allocates its
    gathered-parameter buffers on the first all-gather and reuses them, and buffers made as inference
    tensors break every later training forward ("Inplace update to inference tensor outside
    InferenceMode"). Do not run backward inside. On exit the reshard policy is `shard_model`'s
    (blocks reshard after forward, the root does not).
    """
    modules = fsdp_modules(model)
    if not modules:
        raise ValueError("gathered: the model is not sharded (no fully_shard module)")
    root = modules[0]
    try:
        with torch.inference_mode(False):
            for m in modules:
                m.unshard()
        root.set_reshard_after_forward(False)  # recursive: post-forward no longer frees anything
        yield model
    finally:
        root.set_reshard_after_forward(True)
        root.set_reshard_after_forward(False, recurse=False)
        for m in modules:
            m.reshard()
