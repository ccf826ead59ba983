"""Where this process sits among the training ranks, and the few collectives the loop needs.

Rank 0 (the *leader*) is the job's only stream consumer: it reads the trajectory stream,
assembles GRPO groups, computes the samples and their advantages, acknowledges entries after
checkpoints, writes exports, posts weights and writes ``steps.jsonl``. Every step it broadcasts
the step's samples to all ranks; each data-parallel rank then trains on its share (split by
token count, :mod:`trainer_client.packing`) and tensor-parallel peers share a data-parallel
rank's share. One consumer keeps acks and checkpoints exactly-once without coordination between
consumers, and a GRPO group needs all its members in one place for its advantages anyway; reading
and decoding a step's trajectories costs milliseconds next to the step itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1
    dp_rank: int = 0
    dp_size: int = 1
    tp_rank: int = 0
    tp_size: int = 1

    @property
    def leader(self) -> bool:
        return self.rank == 0

    @classmethod
    def current(cls) -> Ranks:
        """Read from torch.distributed and Megatron's parallel state (after ``init_parallel``)."""
        from megatron.core import parallel_state as ps

        if not dist.is_initialized():
            return cls()
        return cls(
            rank=dist.get_rank(),
            world=dist.get_world_size(),
            dp_rank=ps.get_data_parallel_rank(),
            dp_size=ps.get_data_parallel_world_size(),
            tp_rank=ps.get_tensor_model_parallel_rank(),
            tp_size=ps.get_tensor_model_parallel_world_size(),
        )

    def broadcast(self, obj: Any) -> Any:
        """The leader's ``obj`` on every rank (pickled; other ranks pass anything)."""
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def dp_sum(self, values: list[float]) -> list[float]:
        """Element-wise sum over the data-parallel group (identical on every rank of it)."""
        if self.dp_size == 1:
            return values
        from megatron.core import parallel_state as ps

        tensor = torch.tensor(values, dtype=torch.float64, device=_device())
        dist.all_reduce(tensor, group=ps.get_data_parallel_group())
        return [float(v) for v in tensor.tolist()]

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
