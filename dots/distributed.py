"""Multi-process data-parallel training with torch.distributed (torchrun or accelerate launch).

    torchrun --nproc-per-node 8 -m dots.cli train -p configs/qwen2.5-math-1.5b-deepscaler.yaml

Every rank holds the whole policy, optimizer, replay buffer and DOTS round state, and they
stay identical step after step:

- **decisions on rank 0, broadcast**: the uniform draw, the reference set, the round's
  predictions and Gumbel-top-k selection and the replay sample are made by rank 0 (with the
  one numpy generator a single process would use) and sent to the others (`decide`);
- **rollouts sharded**: each rank generates and scores a contiguous shard of the step's
  questions, with its own torch generator (seeded from the shared one plus its rank, so a
  resumed run draws exactly what an uninterrupted one would), and the groups are then
  all-gathered in question order (`gather`), so every rank holds the same groups;
- **data-parallel update**: each rank takes a contiguous shard of the step's used groups,
  its loss scaled so that the *sum* over ranks is the single-process loss, and the gradients
  are all-reduced by sum (`all_reduce_grads`) before the identical clip and optimizer step;
- **writes on rank 0**: checkpoints, run files, MLflow logging and progress lines.

With `train.fsdp` the policy is sharded instead of replicated (`dots.sharding`, PyTorch FSDP2):
weights, gradients and AdamW states are split over the ranks, gradients are reduce-scattered in
the backward pass (no `all_reduce_grads`), every rank runs the same number of micro-batches
(padding ones with zero loss), rollouts and evaluations run on the whole policy gathered on each
rank (`dots.sharding.gathered`), and checkpoints hold the full (gathered) model and optimizer state.

`train.batch_size` stays the global batch B; each rank generates about B/world groups.
Backend: gloo on CPU, nccl on CUDA (device cuda:LOCAL_RANK). Without WORLD_SIZE > 1 in the
environment everything here is a no-op and training is the single-process loop.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as tdist

T = TypeVar("T")
_BUCKET = 32 * 2**20  # gradient elements per all-reduce (one flat buffer per bucket)


def launched_world_size() -> int:
    """Processes the launcher started (WORLD_SIZE, set by torchrun / accelerate); 1 otherwise."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def launched_main() -> bool:
    """True unless the launcher made this process a rank other than 0 (RANK)."""
    return os.environ.get("RANK", "0") == "0"


@dataclass(frozen=True)
class Dist:
    """This process's place in the group; `Dist()` is the single process."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def shard(self, n: int) -> slice:
        """This rank's contiguous share of n items (sizes differ by at most one, lower ranks first)."""
        base, extra = divmod(n, self.world)
        start = self.rank * base + min(self.rank, extra)
        return slice(start, start + base + (1 if self.rank < extra else 0))

    def decide(self, choose: Callable[[], T]) -> T:
        """`choose()` run on rank 0 only; every rank returns rank 0's result."""
        if not self.enabled:
            return choose()
        box = [choose() if self.main else None]
        tdist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, part: list[T]) -> list[T]:
        """Every rank's list, concatenated in rank order, on every rank."""
        if not self.enabled:
            return part
        parts: list[Any] = [None] * self.world
        tdist.all_gather_object(parts, part)
        return [x for p in parts for x in p]

    def all_reduce_grads(self, model: torch.nn.Module) -> None:
        """Sum every parameter's gradient over ranks (a rank without a gradient adds zeros)."""
        if not self.enabled:
            return
        params = [p for p in model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        bucket: list[torch.Tensor] = []
        size = 0
        for p in params:
            bucket.append(p.grad)
            size += p.grad.numel()
            if size >= _BUCKET:
                _all_reduce_flat(bucket)
                bucket, size = [], 0
        if bucket:
            _all_reduce_flat(bucket)

    def barrier(self) -> None:
        if self.enabled:
            tdist.barrier()

    def assert_in_sync(self, model: torch.nn.Module) -> None:
        """Raise if any rank's weights differ from rank 0's (they never should)."""
        if not self.enabled:
            return
        if fsdp_sharded(model):
            # FSDP2 (train.fsdp): each rank holds a different 1/world slice of every weight by design, and
            # each element of the weights, of its gradient (reduce-scattered) and of its AdamW states lives
            # on exactly one rank: there is no replica that could drift, so nothing to compare
            return
        with torch.no_grad():
            mine = [float(p.detach().double().sum()) for p in model.parameters()]
        sums = self.gather([mine])
        bad = [r for r, s in enumerate(sums) if s != sums[0]]
        if bad:
            raise RuntimeError(f"distributed: the weights of rank(s) {bad} differ from rank 0's")


def fsdp_sharded(model: torch.nn.Module) -> bool:
    """True when `model` was sharded with FSDP2 (`dots.sharding.shard_model`, `train.fsdp`)."""
    if not tdist.is_available():
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _all_reduce_flat(grads: list[torch.Tensor]) -> None:
    flat = torch.cat([g.reshape(-1) for g in grads])
    tdist.all_reduce(flat, op=tdist.ReduceOp.SUM)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


SINGLE = Dist()


def setup(device: torch.device) -> tuple[Dist, torch.device]:
    """Join the launcher's process group (once) and return this rank's Dist and device:
    nccl on cuda:LOCAL_RANK, gloo on CPU. A plain `python` run gets (SINGLE, device)."""
    if launched_world_size() <= 1:
        return SINGLE, device
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    if not tdist.is_initialized():
        tdist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(tdist.get_rank(), tdist.get_world_size(), local), device


def rank_generator(shared: torch.Generator, dist: Dist) -> torch.Generator:
    """A sampling generator for this rank: one draw from the shared generator (which advances
    alike on every rank, so checkpoints stay rank-independent) plus the rank."""
    seed = int(torch.randint(0, 2**62, (1,), generator=shared))
    return torch.Generator().manual_seed(seed + dist.rank)
