"""What a run computes, pinned: one recorded batch of each trainer (and the SFT rows) replayed and compared.

A refactor may rename and move anything, but the same seeds must give the same episodes, rows, rewards and
losses. Each case below plays one seeded step on the tiny model and compares it with its record in
``tests/data/replay.json``: token ids and rewards exactly, losses and log-probabilities to 1e-4. A change that
is *meant* to change what runs compute re-records them, on purpose and in its own commit:

    ENVACE_RECORD_REPLAY=1 .venv/bin/python -m pytest tests/test_replay.py
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

import envace_gym  # noqa: F401  (registers the ids)
from envace_gym import make_domain
from envace_gym.integrations.trl import envace_grpo_trainer
from envace_gym.rollout import RolloutBatch, collect_rollouts
from envace_gym.testing import tiny_policy
from envace_gym.training import TrainerConfig, grpo_loss, rolewise_advantages, sft_rows
from envace_gym.training import trainer as trainer_module

RECORD = Path(__file__).parent / "data" / "replay.json"
RECORDING = os.environ.get("ENVACE_RECORD_REPLAY") == "1"
TOLERANCE = 1e-4


def digest(ids: Any) -> str:
    return hashlib.sha256(json.dumps(list(ids)).encode()).hexdigest()[:16]


def batch_record(batch: RolloutBatch) -> dict[str, Any]:
    """Every episode (task, reward, turns, how it ended) and every row (role, group, token ids, mask, the sampling
    log-probabilities summed)."""
    return {
        "episodes": [[e.task_id, e.reward, e.turns, e.terminated, e.truncated] for e in batch.episodes],
        "rows": [
            [s.role, s.group, s.episode, digest(s.prompt_ids), digest(s.completion_ids), sum(s.mask),
             round(sum(s.logprobs), 6)]
            for s in batch.samples()
        ],  # fmt: skip
    }


def recording(module: Any, monkeypatch: pytest.MonkeyPatch) -> list[RolloutBatch]:
    """``module.collect_rollouts`` as it is, its batches kept."""
    batches: list[RolloutBatch] = []
    collect = module.collect_rollouts

    def kept(*args: Any, **kwargs: Any) -> RolloutBatch:
        batches.append(collect(*args, **kwargs))
        return batches[-1]

    monkeypatch.setattr(module, "collect_rollouts", kept)
    return batches


def compare(case: str, measured: dict[str, Any]) -> None:
    records = json.loads(RECORD.read_text()) if RECORD.is_file() else {}
    if RECORDING:  # opt-in: the record is rewritten from this run (then read back like any other)
        records[case] = measured
        RECORD.parent.mkdir(parents=True, exist_ok=True)
        RECORD.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
        records = json.loads(RECORD.read_text())
    assert case in records, f"no record of {case}: record it (see this module's docstring)"
    assert _rounded(measured) == _rounded(records[case])


def _rounded(value: Any) -> Any:
    """Floats to TOLERANCE (as relative as the record's size allows), everything else exactly."""
    if isinstance(value, float):
        return pytest.approx(value, rel=TOLERANCE, abs=TOLERANCE)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    return value


@pytest.mark.parametrize("mode", ["separate", "inline"])
def test_the_pure_torch_trainer_replays_its_recorded_step(mode, monkeypatch):
    batches = recording(trainer_module, monkeypatch)
    config = TrainerConfig(domain="units-v0", rehearsal_mode=mode, steps=1, tasks_per_step=2, group_size=2,
                           max_new_tokens=12, seed=3)  # fmt: skip
    (step,) = trainer_module.train(tiny_policy(seed=1), config)
    metrics = {k: step[k] for k in ("loss", "reward", "rows/act", "rows/rehearse", "tokens/trained")}
    compare(f"pure-torch/{mode}", {**batch_record(batches[0]), "metrics": metrics})


@pytest.mark.slow
def test_the_trl_trainer_replays_its_recorded_step(tiny_path, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from envace_gym.integrations import trl as envace_trl

    batches = recording(envace_grpo_trainer, monkeypatch)
    args = envace_trl.EnvACEGRPOConfig(
        output_dir=str(tmp_path), domain="units-v0", per_device_train_batch_size=4, num_generations=2,
        max_completion_length=8, max_steps=1, logging_steps=1, use_cpu=True, bf16=False, report_to="none",
        gradient_checkpointing=False, save_strategy="no", seed=0,
    )  # fmt: skip
    trainer = envace_trl.EnvACEGRPOTrainer(
        model=tiny_path, args=args, processing_class=AutoTokenizer.from_pretrained(tiny_path)
    )
    trainer.train()
    logged = trainer.state.log_history[0]
    metrics = {k: logged[k] for k in ("loss", "reward", "rows/act", "rows/rehearse")}
    compare("trl", {**batch_record(batches[0]), "metrics": metrics})


@pytest.mark.parametrize(("domain", "mode"), [("bank-v0", "separate"), ("travel-v0", "inline")])
def test_rehearsals_of_reference_episodes_replay_their_record(domain, mode):
    """The Rehearse role on every call of the reference solutions (multi-step and stateful; scripted user turns),
    on the tiny model: rehearsal prompts, results, errors fed back, rows."""
    batch = collect_rollouts(tiny_policy(seed=1), domain, make_domain(domain).tasks("train")[:2], 2, act="reference",
                             rehearsal_mode=mode, rehearsal={"max_new_tokens": 12}, on_invalid="feedback", seed=5)  # fmt: skip
    compare(f"rehearsals/{domain}/{mode}", batch_record(batch))


def test_the_loss_of_a_batch_with_a_reward_spread_replays_its_record():
    """The pure-torch GRPO loss and its gradient on the rehearsal batch above, its episodes' rewards alternating
    0 and 1 within each group (so every role's advantages are non-zero)."""
    policy = tiny_policy(seed=1)
    batch = collect_rollouts(policy, "bank-v0", make_domain("bank-v0").tasks("train")[:2], 2, act="reference",
                             rehearsal={"max_new_tokens": 12}, on_invalid="feedback", seed=5)  # fmt: skip
    for episode in batch.episodes:
        episode.reward = float(episode.index % 2)
    samples = batch.samples()
    advantages = rolewise_advantages([batch.episodes[s.episode].task_id for s in samples], [s.role for s in samples],
                                     [s.reward for s in samples])  # fmt: skip
    config = TrainerConfig(beta=0.0, dtype="float32")
    loss, _ = grpo_loss(policy.model, samples, advantages, config, sum(sum(s.mask) for s in samples))
    loss.backward()
    grad = sum(float(p.grad.norm()) ** 2 for p in policy.model.parameters() if p.grad is not None) ** 0.5
    compare("loss", {"advantages": [round(a, 6) for a in advantages], "loss": float(loss), "grad_norm": grad})


def test_the_sft_rows_replay_their_record(tokenizer):
    domain = make_domain("bank-v0")
    rows = sft_rows(domain, tokenizer, domain.tasks("train")[:3])
    compare("sft", {"rows": [[r["role"], r["task_id"], digest(r["input_ids"]), digest(r["completion_mask"])] for r in rows]})
