"""The learning test: EnvACE training, with no real tool executed, raises held-out success measured with the
real tools (:mod:`envace_gym.recipes.learning`; about four minutes on one CPU core).

Thresholds, from ``benchmarks/learning_check.py --seeds 0 1 2 3 4`` on the held-out tasks (docs/results.md):
the gain was +0.609, +0.328, +0.562, +0.719, +0.828 (mean 0.61, standard deviation 0.19) and success after
training 1.000 on every seed. The test asks for a gain of at least 0.2 (about the mean less two standard
deviations) and a success of at least 0.9 after training, on seed 0. A learner with its advantages negated
ends at 0 and fails it (``--broken flip-advantage``, same page).
"""

from __future__ import annotations

import pytest
import torch

from envace_gym.recipes.learning import learning_check

MARGIN = 0.2  # held-out success must rise by at least this much
FLOOR = 0.9  # and end at least this high


@pytest.mark.slow  # minutes: make test runs it, make test-fast does not
def test_envace_training_raises_held_out_success(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the benchmark measured it (and a 0.4M-parameter model runs no slower)
    try:
        got = learning_check(seed=0, workdir=tmp_path)
    finally:
        torch.set_num_threads(threads)
    assert got["real_tool_calls"] == 0  # trained in rehearsal only
    assert got["rows_rehearse"] > 0  # the policy played the tools, and those rows were trained
    assert got["after"] >= got["before"] + MARGIN, got
    assert got["after"] >= FLOOR, got
