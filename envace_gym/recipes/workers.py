"""Worker processes of ``envace experiment --workers N``: each with its torch threads, each ended with the process
that started it."""

from __future__ import annotations

import sys

PR_SET_PDEATHSIG = 1  # prctl's option number (linux/prctl.h)


def worker_init(threads: int) -> None:
    import torch

    end_with_parent()
    torch.set_num_threads(threads)


def end_with_parent() -> None:
    """Linux: this process is sent SIGTERM when the one that started it ends, so that a stopped experiment
    (SIGTERM or SIGKILL to ``envace experiment``) leaves no worker training on, writing into its stage."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    except (OSError, AttributeError):  # not glibc
        pass


def print_now(message: str) -> None:
    print(message, flush=True)  # a worker's lines reach the terminal as they are written
