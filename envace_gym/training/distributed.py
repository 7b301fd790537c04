"""Ending a distributed run (``accelerate launch``, DDP over gloo) without a hang.

A DDP model's reducer holds the process group. Freed last from there, ``ProcessGroupGloo``'s destructor runs with
the GIL held and waits for the group's worker threads; a worker still releasing a finished gradient all-reduce
may need the GIL for it (the work keeps the Python thread-local state of the backward that launched it), and
the two wait for each other forever. Caught under load, one rank in a few dozen runs of a two-rank test:

    main thread:  Reducer dealloc -> ~ProcessGroupGloo -> mutex (held by the worker)
    gloo worker:  runLoop -> ~AsyncAllreduceWork -> ~ThreadLocalState -> decref -> waits for the GIL

The models are freed first, while the group is still registered (its last reference then goes with
``destroy_process_group``, whose binding releases the GIL before destroying it).
"""

from __future__ import annotations

import gc


def end_distributed() -> None:
    """Let every process arrive, free what is no longer referenced (a finished run's DDP model and its reducer),
    then close the process group. A no-op outside a distributed run. Drop your own references to DDP-wrapped
    models before calling it."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    dist.barrier()
    gc.collect()  # a trainer lives in reference cycles: its DDP model goes now, not at interpreter exit
    dist.destroy_process_group()


__all__ = ["end_distributed"]
