"""One decision for every process of a multi-process training stage.

Under `accelerate launch` (tasks/core/launch.py) each process holds its own share of a step's completions, and may
measure the probe on its own copy (or shard) of the model. A decision read from such local figures can differ
between processes, and one that ends training or chooses weights must not: a process that stops while another
trains on waits forever in the next collective (DDP's gradient all-reduce, a sharded model's all-gather). So the
callbacks that decide (the probe's bar, patience and kept step; the health watch's alarms, fail_fast and
saturation stop) take their figures from `gather` (every process's share, in process order) or from `agree`
(process 0's value), and decide only from those. In a single process both return the value itself, and no
collective is run.
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def world_size() -> int:
    """The number of processes in torch.distributed's default group (1 when it is not initialized)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def agree(value: T, src: int = 0) -> T:
    """Process `src`'s `value`, on every process (a pickled broadcast; every process must call it at the same point)."""
    if world_size() == 1:
        return value
    import torch.distributed as dist

    box = [value if dist.get_rank() == src else None]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def gather(value: T) -> list[T]:
    """Every process's `value`, in process order, on every process ([value] in a single process)."""
    n = world_size()
    if n == 1:
        return [value]
    import torch.distributed as dist

    out: list[T] = [None] * n  # type: ignore[list-item]
    dist.all_gather_object(out, value)
    return out
