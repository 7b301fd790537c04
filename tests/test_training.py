"""Training with world rehearsal: advantage math, gradients from both roles, TRL paths, SFT, evaluation."""

from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import replace
from typing import Any

import pytest
import torch

import envace_gym  # noqa: F401
from envace_gym import make_domain
from envace_gym.episode import Role, Row
from envace_gym.errors import TrainingConfigError
from envace_gym.evaluation import evaluate
from envace_gym.integrations import trl as envace_trl
from envace_gym.integrations.trl import envace_grpo_trainer, refusals, trainer_policy
from envace_gym.integrations.trl import rollout_func as rollout_module
from envace_gym.rollout import EpisodeResult, RolloutBatch, RolloutStats
from envace_gym.testing import ScriptedPolicy, tiny_policy
from envace_gym.training import TrainerConfig, grpo_loss, rolewise_advantages, sft_rows
from envace_gym.training.trainer import train

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
CPU = dict(use_cpu=True, bf16=False, report_to="none", gradient_checkpointing=False, save_strategy="no", seed=0)


def one_step_grpo_args(output_dir, batch_size: int):
    """TRL's GRPOConfig for one tiny step on CPU: groups of 2, 8 completion tokens."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(output_dir), per_device_train_batch_size=batch_size, num_generations=2,
        max_completion_length=8, max_steps=1, logging_steps=1, **CPU,
    )  # fmt: skip


# -- the math --------------------------------------------------------------------------------------------
def test_rolewise_advantages_on_a_hand_made_batch():
    groups = ["t1", "t1", "t1", "t1", "t1", "t2", "t2", "t2"]
    roles = ["act", "act", "act", "rehearse", "rehearse", "act", "act", "episode"]
    rewards = [1.0, 0.0, 1.0, 1.0, 0.0, 0.5, None, 0.25]
    got = rolewise_advantages(groups, roles, rewards)
    # t1/act mean 2/3, t1/rehearse mean 1/2, t2/act mean 0.5 (None excluded), t2/episode alone
    assert got == pytest.approx([1 / 3, -2 / 3, 1 / 3, 0.5, -0.5, 0.0, 0.0, 0.0])
    with pytest.raises(ValueError):
        rolewise_advantages([0], ["act", "act"], [1.0])


def hand_made_rows(policy, n_per_role=2):
    """Rows of both roles whose recorded log-probs are the model's own (an on-policy batch)."""
    gen = torch.Generator().manual_seed(0)
    rows = []
    for role in ("act", "rehearse"):
        for k in range(n_per_role):
            prompt = torch.randint(5, len(policy.tokenizer), (12 + k,), generator=gen).tolist()
            completion = torch.randint(5, len(policy.tokenizer), (6,), generator=gen).tolist()
            with torch.no_grad():
                logits = policy.model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
            logp = torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None]).squeeze(1).tolist()
            rows.append(
                Row(Role(role), tuple(prompt), tuple(completion), tuple(logp), (1,) * 6, 0, len(rows), float(k % 2))
            )
    return rows


def test_custom_trainer_loss_gives_gradients_from_both_roles():
    policy = tiny_policy(seed=3)
    rows = hand_made_rows(policy)
    advantages = rolewise_advantages([r.group for r in rows], [r.role for r in rows], [r.reward for r in rows])
    assert sorted(set(advantages)) == [-0.5, 0.5]
    config = TrainerConfig()
    norms = {}
    for role in ("act", "rehearse"):
        policy.model.zero_grad()
        picked = [(r, a) for r, a in zip(rows, advantages, strict=True) if r.role == role]
        loss, stats = grpo_loss(policy.model, [r for r, _ in picked], [a for _, a in picked], config, total_tokens=24)
        loss.backward()
        norms[role] = sum(p.grad.norm().item() ** 2 for p in policy.model.parameters() if p.grad is not None) ** 0.5
        assert stats["clipped"] == 0  # on-policy: every ratio is 1
    assert norms["act"] > 0 and norms["rehearse"] > 0


def test_dual_clip_bounds_negative_advantages():
    policy = tiny_policy(seed=3)
    row = hand_made_rows(policy, 1)[0]
    stale = replace(row, episode=0, logprobs=tuple(x - 5.0 for x in row.logprobs), reward=0.0)
    config = TrainerConfig(delta=3.0)
    loss, _ = grpo_loss(policy.model, [stale], [-1.0], config, total_tokens=6)
    # ratio = e^5 >> c: each token's loss is capped at c * |A| = 3
    assert loss.item() == pytest.approx(3.0, rel=1e-4)
    loss, _ = grpo_loss(policy.model, [stale], [-1.0], TrainerConfig(delta=None), total_tokens=6)
    assert loss.item() > 100


def test_trainer_config_new_names_warn_nothing():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = TrainerConfig(epsilon=0.3, delta=None, beta=0.1, shared_prefix=False, pack_tokens=512)
    assert (config.epsilon, config.delta, config.beta, config.shared_prefix, config.pack_tokens) == (
        0.3, None, 0.1, False, 512,
    )  # fmt: skip
    with pytest.raises(TypeError, match="unexpected keyword argument 'clip_epsilon'"):
        TrainerConfig(clip_epsilon=0.3)


def test_every_training_setting_has_a_help():
    from dataclasses import fields

    from envace_gym.recipes.experiment import ExperimentConfig
    from envace_gym.recipes.train import TrainConfig

    trl_classes = (envace_trl.PackedGRPOConfig, envace_trl.EnvACEGRPOConfig)
    declared_here = {name for cls in trl_classes for name in vars(cls)["__annotations__"]}  # not TRL's own fields
    for cls in (TrainerConfig, TrainConfig, ExperimentConfig, *trl_classes):
        for f in fields(cls):
            if cls not in trl_classes or f.name in declared_here:
                assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help"
    shared = {f.name for f in fields(TrainerConfig)} & {f.name for f in fields(envace_trl.EnvACEGRPOConfig)}
    assert {"epsilon", "delta", "beta", "executor", "shared_prefix", "pack_tokens"} <= shared
    assert "group_size" not in shared  # EnvACEGRPOConfig keeps TRL's num_generations


def test_rollout_sampling_gives_both_roles_the_same_budget_and_temperature():
    from envace_gym.policy import SamplingParams
    from envace_gym.rehearsal import RehearsalConfig, rollout_sampling

    act, rehearse = rollout_sampling(32, 0.7, top_p=0.9)
    assert act == SamplingParams(max_new_tokens=32, temperature=0.7, top_p=0.9)
    assert rehearse == RehearsalConfig(max_new_tokens=32, temperature=0.7, top_p=0.9)
    assert rollout_sampling(8, 1.0) == (
        SamplingParams(max_new_tokens=8),
        RehearsalConfig(max_new_tokens=8, temperature=1.0),
    )


def test_lora_config_is_rank_r_with_alpha_2r():
    from envace_gym.training.options import lora_config

    pytest.importorskip("peft")
    config = lora_config(8)
    assert (config.r, config.lora_alpha, config.target_modules, config.task_type) == (8, 16, "all-linear", "CAUSAL_LM")
    with pytest.raises(ValueError, match="LoRA rank must be at least 1, got 0"):
        lora_config(0)


@pytest.mark.parametrize("mode", ["separate", pytest.param("inline", marks=pytest.mark.slow)])
def test_custom_trainer_runs_on_the_tiny_model(mode):
    policy = tiny_policy(seed=1)
    history = train(
        policy,
        TrainerConfig(domain="units", rehearsal_mode=mode, steps=2, tasks_per_step=2, group_size=2, max_new_tokens=12),
    )
    assert [h["step"] for h in history] == [1, 2]
    assert all(h["tokens/trained"] > 0 and h["step_time"] > 0 for h in history)


def test_custom_trainer_steps_through_a_batch_whose_every_reward_is_masked():
    """A verifier down for a whole step: every episode masked (reward None), nothing trained, the weights as they
    were, and the step's metrics say so instead of crashing."""
    from envace_gym.domains.registry import register_domain

    class VerifierDown(type(make_domain("units"))):
        name = "units-verifier-down"

        def score(self, task, trajectory):
            raise RuntimeError("the verifier is down")

    register_domain("units-verifier-down", VerifierDown, overwrite=True)
    policy = tiny_policy(seed=1)
    before = [p.detach().clone() for p in policy.model.parameters()]
    (step,) = train(policy, TrainerConfig(domain="units-verifier-down", steps=1, tasks_per_step=2, group_size=2,
                                          max_new_tokens=8))  # fmt: skip
    assert step["episode/masked"] == 4 and step["tokens/trained"] == 0 and math.isnan(step["reward"])
    assert all(torch.equal(a, b) for a, b in zip(before, policy.model.parameters(), strict=True))


# -- TRL: role-wise GRPO subclass ----------------------------------------------------------------------------
def crafted_batch(policy, task_ids):
    """A rollout batch with Act and Rehearse rows and rewards that differ within each group."""
    rows = hand_made_rows(policy, n_per_role=len(task_ids))
    episodes = []
    for i, task_id in enumerate(task_ids):
        mine = [r for r in rows if r.episode in (i, i + len(task_ids))]
        reward = float(i % 2)
        as_rows = [replace(r, group=-1, episode=-1, reward=None) for r in mine]  # unlabelled, as an episode makes them
        episodes.append(
            EpisodeResult(i, i, task_id, reward, bool(reward), True, False, 1, {}, [], [], as_rows, as_rows[0])
        )
    return RolloutBatch(episodes, RolloutStats(success_rate=0.5))


def test_trl_role_wise_trainer_trains_both_roles(tiny_path, monkeypatch):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    args = envace_trl.EnvACEGRPOConfig(
        output_dir=os.path.join(os.path.dirname(tiny_path), "out"), domain="units", per_device_train_batch_size=4,
        num_generations=2, max_completion_length=8, max_steps=1, logging_steps=1, learning_rate=1e-2, weight_decay=0.0,
        log_completions=True, **CPU,
    )  # fmt: skip
    trainer = envace_trl.EnvACEGRPOTrainer(model=tiny_path, args=args, processing_class=tokenizer)
    policy = trainer_policy.trainer_policy(trainer)
    monkeypatch.setattr(envace_grpo_trainer, "collect_rollouts", lambda _p, _d, ids, *a, **k: crafted_batch(policy, ids))
    inputs = [
        {"prompt": "units/train/000"},
        {"prompt": "units/train/000"},
        {"prompt": "units/train/001"},
        {"prompt": "units/train/001"},
    ]
    out = trainer._generate_and_score_completions(inputs)
    batch = crafted_batch(policy, [x["prompt"] for x in inputs])
    samples = batch.samples()
    expected = rolewise_advantages(
        [batch.episodes[s.episode].task_id for s in samples], [s.role for s in samples], [s.reward for s in samples]
    )
    assert out["advantages"].tolist() == pytest.approx(expected)
    assert out["tool_mask"].sum().item() == sum(sum(s.mask) for s in samples)
    for role in ("act", "rehearse"):  # TRL's own loss backpropagates from each role's rows
        keep = torch.tensor([s.role == role for s in samples])
        part = {k: (v[keep] if isinstance(v, torch.Tensor) and v.dim() > 0 else v) for k, v in out.items()}
        trainer.model.zero_grad()
        trainer.compute_loss(trainer.model, part).backward()
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in trainer.model.parameters()), role
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert any((p - b).abs().sum() > 0 for p, b in zip(trainer.model.parameters(), before, strict=True))
    assert trainer.state.log_history[0]["rows/rehearse"] > 0
    assert "completions/mean_length" in trainer.state.log_history[0]  # TRL's metrics, and its table, kept


def envace_trainer(model_path, output_dir, reward_funcs=None, **settings):
    """An EnvACEGRPOTrainer on the tiny model: batches of 4 episodes (groups of 2), 8 tokens per generation."""
    from transformers import AutoTokenizer

    args = envace_trl.EnvACEGRPOConfig(
        **{"output_dir": str(output_dir), "domain": "units", "per_device_train_batch_size": 4, "num_generations": 2,
           "max_completion_length": 8, "max_steps": 1, **CPU, **settings}
    )  # fmt: skip
    extra = {} if reward_funcs is None else {"reward_funcs": reward_funcs}
    return envace_trl.EnvACEGRPOTrainer(
        model=model_path, args=args, processing_class=AutoTokenizer.from_pretrained(model_path), **extra
    )


def test_trl_masked_episode_leaves_the_loss_its_denominator_and_the_kl(tiny_path, tmp_path, monkeypatch):
    trainer = envace_trainer(tiny_path, tmp_path, beta=0.1)
    policy = trainer_policy.trainer_policy(trainer)
    ids = ["units/train/000", "units/train/000", "units/train/001", "units/train/001"]
    batch = crafted_batch(policy, ids)
    batch.episodes[1].reward = None  # its verifier could not judge
    monkeypatch.setattr(envace_grpo_trainer, "collect_rollouts", lambda *a, **k: batch)
    out = trainer._generate_and_score_completions([{"prompt": i} for i in ids])
    masked = torch.tensor([batch.episodes[s.episode].reward is None for s in batch.samples()])
    assert masked.any() and out["tool_mask"][masked].sum() == 0 and out["advantages"][masked].abs().sum() == 0
    others = {k: (v[~masked] if isinstance(v, torch.Tensor) and v.dim() > 0 else v) for k, v in out.items()}
    with torch.no_grad():  # the same loss with or without the masked rows: nothing of them counts
        assert trainer.compute_loss(trainer.model, out).item() == pytest.approx(
            trainer.compute_loss(trainer.model, others).item(), rel=1e-5
        )


def test_trl_and_pure_torch_trainers_agree_on_a_batch_with_a_masked_episode(tiny_path, tmp_path, monkeypatch):
    """The same on-policy batch (one episode masked, the policy moved away from its reference so the KL term
    counts) gives EnvACEGRPOTrainer's TRL loss and envace_gym.training.trainer's loss the same value and gradients."""
    trainer = envace_trainer(tiny_path, tmp_path, beta=0.1)
    torch.manual_seed(0)
    with torch.no_grad():  # the policy has moved since the reference copy was taken
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ids = ["units/train/000", "units/train/000", "units/train/001", "units/train/001"]
    batch = crafted_batch(trainer_policy.trainer_policy(trainer), ids)  # log-probs of the moved policy: on-policy
    batch.episodes[2].reward = None
    monkeypatch.setattr(envace_grpo_trainer, "collect_rollouts", lambda *a, **k: batch)
    out = trainer._generate_and_score_completions([{"prompt": i} for i in ids])
    params = [p for p in trainer.model.parameters() if p.requires_grad]

    trainer.model.zero_grad()
    trl_loss = trainer.compute_loss(trainer.model, out)
    trl_loss.backward()
    trl_grads = [p.grad.detach().clone() for p in params]

    samples = batch.samples()
    advantages = rolewise_advantages(
        [batch.episodes[s.episode].task_id for s in samples], [s.role for s in samples], [s.reward for s in samples]
    )
    kept = [(s, a) for s, a in zip(samples, advantages, strict=True) if s.reward is not None]
    trainer.model.zero_grad()
    loss, _ = grpo_loss(
        trainer.model, [s for s, _ in kept], [a for _, a in kept], TrainerConfig(beta=0.1, dtype="float32"),
        sum(sum(s.mask) for s, _ in kept), reference=trainer.ref_model,
    )  # fmt: skip
    loss.backward()
    assert trl_loss.item() == pytest.approx(loss.item(), rel=1e-5, abs=1e-7)
    for mine, theirs in zip([p.grad for p in params], trl_grads, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-7)
    assert any(g.abs().sum() > 0 for g in trl_grads)


def test_rollout_func_masks_the_tokens_of_a_masked_episode(tmp_path, monkeypatch):
    from types import SimpleNamespace

    policy = tiny_policy()
    ids = ["units/train/000", "units/train/001"]
    batch = crafted_batch(policy, ids)
    batch.episodes[0].reward = None
    monkeypatch.setattr(rollout_module, "collect_rollouts", lambda *a, **k: batch)
    monkeypatch.setattr(rollout_module, "rollout_weights", lambda trainer: contextlib.nullcontext(policy))
    out = envace_trl.make_rollout_func("units")(ids, SimpleNamespace(args=one_step_grpo_args(tmp_path, batch_size=2)))
    assert out["episode_reward"] == [None, 1.0]
    row = batch.episodes[1].episode_row
    assert not any(out["env_mask"][0]) and out["env_mask"][1] == [*row.mask, 0]
    # the episodes ended on their own, their rows not on an end token: one is appended, untrained, so that TRL
    # does not count them as truncated (completions/clipped_ratio, mask_truncated_completions)
    assert out["completion_ids"][1] == [*row.completion_ids, policy.stop_ids[0]] and out["logprobs"][1][-1] == 0.0
    batch.episodes[1].truncated = True  # an episode stopped by a limit stays as it is: truncated for TRL too
    out = envace_trl.make_rollout_func("units")(ids, SimpleNamespace(args=one_step_grpo_args(tmp_path, batch_size=2)))
    assert out["completion_ids"][1] == list(row.completion_ids)


@pytest.mark.slow
def test_trl_rollout_func_path(tiny_path, tmp_path):
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    args = one_step_grpo_args(tmp_path, batch_size=4)
    trainer = GRPOTrainer(
        model=tiny_path, reward_funcs=[envace_trl.envace_reward], args=args, train_dataset=envace_trl.task_dataset("units"),
        processing_class=AutoTokenizer.from_pretrained(tiny_path), rollout_func=envace_trl.make_rollout_func("units"),
    )  # fmt: skip
    out = envace_trl.make_rollout_func("units", rehearsal_mode="inline")(
        ["units/train/000", "units/train/001"], trainer
    )
    assert len(out["prompt_ids"]) == len(out["completion_ids"]) == len(out["env_mask"]) == 2
    assert all(
        len(c) == len(m) == len(lp) > 0
        for c, m, lp in zip(out["completion_ids"], out["env_mask"], out["logprobs"], strict=True)
    )
    assert envace_trl.envace_reward(episode_reward=[1.0, None]) == [1.0, None]
    trainer.train()
    assert "rewards/envace_reward/mean" in trainer.state.log_history[0]


def test_vllm_settings_rollouts_cannot_honour_are_refused_by_name_before_any_engine_or_rollout(tiny_path, tmp_path):
    """Server mode builds (tests/test_vllm_training.py trains with it); what still cannot work is refused, by name,
    before any client connects or any rollout is played: a sharded engine, sleep mode, an unknown mode."""
    from types import SimpleNamespace

    args = envace_trl.EnvACEGRPOConfig(
        output_dir=str(tmp_path), domain="units", use_vllm=True, vllm_mode="server",
        vllm_server_base_urls=["http://127.0.0.1:1", "http://127.0.0.1:2/"], **CPU,
    )  # fmt: skip
    from envace_gym.integrations.trl.server_vllm import server_urls

    assert server_urls(args) == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    rollout_func = envace_trl.make_rollout_func("units")
    with pytest.raises(ValueError, match="make_rollout_func's rollouts cannot shard.*--tensor-parallel-size"):
        rollout_func(
            ["units/train/000"],
            SimpleNamespace(args=SimpleNamespace(use_vllm=True, vllm_mode="server", vllm_tensor_parallel_size=2)),
        )
    with pytest.raises(ValueError, match="vllm_mode must be 'colocate' or 'server', got 'remote'"):
        rollout_func(["units/train/000"], SimpleNamespace(args=SimpleNamespace(use_vllm=True, vllm_mode="remote")))
    for mode in ("colocate", "server"):
        with pytest.raises(ValueError, match="cannot shard a colocated engine"):
            envace_trl.EnvACEGRPOConfig(
                output_dir=str(tmp_path), domain="units", use_vllm=True, vllm_mode=mode, vllm_tensor_parallel_size=2,
                **CPU,
            )  # fmt: skip
    with pytest.raises(ValueError, match="sleep mode is a colocated engine's.*--enable-sleep-mode"):
        envace_trl.EnvACEGRPOConfig(
            output_dir=str(tmp_path), domain="units", use_vllm=True, vllm_mode="server", vllm_enable_sleep_mode=True,
            **CPU,
        )  # fmt: skip


def test_vllm_server_mode_without_a_server_fails_at_start_naming_its_url(tiny_path, tmp_path):
    """vllm_mode='server' with no server at the URL: one ServerError naming it, when the trainer starts (no vLLM
    needed in this process: the package's client speaks HTTP)."""
    import socket

    from transformers import AutoTokenizer

    from envace_gym import ServerError

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    args = envace_trl.EnvACEGRPOConfig(
        output_dir=str(tmp_path), domain="units", use_vllm=True, vllm_mode="server", vllm_server_base_url=url,
        vllm_server_timeout=1, per_device_train_batch_size=2, num_generations=2, **CPU,
    )  # fmt: skip
    with pytest.raises(ServerError, match=f"no vLLM server answered at {url}/health within 1 s") as raised:
        envace_trl.EnvACEGRPOTrainer(
            model=tiny_path, args=args, processing_class=AutoTokenizer.from_pretrained(tiny_path)
        )
    assert raised.value.url == url


@pytest.mark.parametrize(
    "setting",
    [
        {"top_k": 5}, {"min_p": 0.1}, {"repetition_penalty": 1.3}, {"generation_kwargs": {"typical_p": 0.5}},
        {"scale_rewards": "group"}, {"mask_truncated_completions": True}, {"pad_to_multiple_of": 8},
        {"chat_template_kwargs": {"enable_thinking": False}}, {"cache_implementation": "static"},
        {"max_tool_calling_iterations": 3}, {"vllm_structured_outputs_regex": "a+"}, {"use_transformers_paged": True},
        {"use_transformers_continuous_batching": True}, {"multi_objective_aggregation": "normalize_then_sum"},
    ],
    ids=lambda d: next(iter(d)),
)  # fmt: skip
def test_grpo_settings_the_rollouts_would_ignore_are_refused_by_name(tiny_path, tmp_path, setting):
    from types import SimpleNamespace

    from trl import GRPOConfig

    name = next(iter(setting))
    with pytest.raises(ValueError, match=f"does not apply {name}="):  # when the config is built, as TRL checks its own
        envace_trl.EnvACEGRPOConfig(output_dir=str(tmp_path), domain="units", **setting, **CPU)
    if name in refusals.UNUSED_BY_ROLLOUTS:  # GRPOTrainer applies the others itself on the rollout_func path
        args = GRPOConfig(output_dir=str(tmp_path), **setting, **CPU)
        with pytest.raises(ValueError, match=f"does not apply {name}="):
            envace_trl.make_rollout_func("units")(["units/train/000"], SimpleNamespace(args=args))


def test_user_reward_funcs_add_to_the_domain_reward_with_their_weights(tiny_path, tmp_path, monkeypatch):
    seen = []

    def brevity(prompts, completions, task_id, episode_reward, **fields):
        seen.append({"task_id": list(task_id), "episode_reward": list(episode_reward), "n": len(completions), **fields})
        fields["log_metric"]("brevity/episodes", len(prompts))
        return [None if k == 3 else 0.5 for k in range(len(prompts))]  # episode 3: this judge failed

    trainer = envace_trainer(tiny_path, tmp_path, reward_funcs=[brevity], reward_weights=[1.0, 2.0])
    ids = ["units/train/000", "units/train/000", "units/train/001", "units/train/001"]
    batch = crafted_batch(trainer_policy.trainer_policy(trainer), ids)  # domain rewards 0, 1, 0, 1
    monkeypatch.setattr(envace_grpo_trainer, "collect_rollouts", lambda *a, **k: batch)
    out = trainer._generate_and_score_completions([{"prompt": i} for i in ids])

    (call,) = seen  # called once, with every episode's fields
    assert call["task_id"] == ids and call["episode_reward"] == [0.0, 1.0, 0.0, 1.0]
    assert call["n"] == 4 and {"messages", "success", "reward_checks", "trainer_state"} <= set(call)
    combined = [0.0 + 2 * 0.5, 1.0 + 2 * 0.5, 0.0 + 2 * 0.5, None]  # None from any function masks the episode
    samples = batch.samples()
    expected = rolewise_advantages(
        [batch.episodes[s.episode].task_id for s in samples], [s.role for s in samples],
        [combined[s.episode] for s in samples],
    )  # fmt: skip
    assert out["advantages"].tolist() == pytest.approx(expected)
    masked = torch.tensor([s.episode == 3 for s in samples])
    assert out["tool_mask"][masked].sum() == 0 and out["tool_mask"][~masked].sum() > 0
    metrics = trainer._metrics["eval"]  # the model is not in training mode outside train()
    assert metrics["rewards/envace_reward/mean"] == [0.5] and metrics["rewards/brevity/mean"] == [0.5]
    assert metrics["reward"] == [pytest.approx(4 / 3)] and metrics["episode/masked"] == [1.0]
    assert metrics["brevity/episodes"] == [4.0]


def test_reward_funcs_and_weights_the_envace_trainer_cannot_apply_are_refused(tiny_path, tmp_path):
    args = envace_trl.EnvACEGRPOConfig(output_dir=str(tmp_path), domain="units", reward_weights=[1.0], **CPU)
    with pytest.raises(ValueError, match="reward_weights needs 2 weights"):
        envace_trl.EnvACEGRPOTrainer(model=tiny_path, args=args, reward_funcs=[lambda **kw: [1.0]])
    args = envace_trl.EnvACEGRPOConfig(output_dir=str(tmp_path), domain="units", **CPU)
    with pytest.raises(ValueError, match="must be plain functions"):
        envace_trl.EnvACEGRPOTrainer(model=tiny_path, args=args, reward_funcs=["some/reward-model"])

    def mine(**fields):
        return [0.0]

    # a list that places the domain's reward itself keeps its order, so the weights stay with their functions
    funcs = envace_grpo_trainer._with_domain_reward([mine, envace_trl.envace_reward], [0.5, 1.0])
    assert funcs == [mine, envace_trl.envace_reward]
    assert envace_grpo_trainer._with_domain_reward([mine], None) == [envace_trl.envace_reward, mine]


def test_real_tools_baseline_builds_dataset_environment_and_reward_from_one_domain():
    kwargs = envace_trl.RealToolsBaseline("bank", reward="reference", size=3).trainer_kwargs()
    assert sorted(kwargs) == ["environment_factory", "reward_funcs", "train_dataset"]
    rows = list(kwargs["train_dataset"])
    assert len(rows) == 3 and rows[0]["prompt"][1]["role"] == "user" and rows[0]["task_id"].startswith("bank/")
    assert kwargs["environment_factory"].__name__ == "BankRealTools" and kwargs["reward_funcs"][0].__name__ == "bank_reward"


def test_envace_settings_are_checked_when_the_config_is_built(tiny_path, tmp_path):
    for name, value in (("rehearsal_mode", "parallel"), ("on_invalid", "ignore"), ("reward", "judge")):
        with pytest.raises(TrainingConfigError, match=f"{name} must be one of"):
            envace_trl.EnvACEGRPOConfig(output_dir=str(tmp_path), domain="units", **{name: value}, **CPU)
    with pytest.raises(TrainingConfigError, match="needs an EnvACEGRPOConfig.*got GRPOConfig"):
        envace_trl.EnvACEGRPOTrainer(model=tiny_path, args=one_step_grpo_args(tmp_path, batch_size=2))


@pytest.mark.slow
def test_real_tools_environment_runs_the_domain_tools(tiny_path, tmp_path):
    from transformers.utils import get_json_schema

    domain = make_domain("bank")
    cls = envace_trl.real_tools_environment("bank")
    assert sorted(n for n in vars(cls) if not n.startswith("_") and n != "reset") == [
        "find_accounts",
        "get_balance",
        "transfer",
    ]
    assert get_json_schema(cls.transfer)["function"]["parameters"] == dict(domain.tools["transfer"].parameters)
    task = domain.tasks("train")[0]
    env = cls()
    env.reset(task_id=task.id)
    for turn in task.reference:
        for call, result in zip(turn.calls, turn.results, strict=True):
            assert json.loads(getattr(env, call.name)(**call.arguments)) == result
    assert "error_tool_call" in json.loads(env.get_balance(account_id=3))
    reward = envace_trl.real_tools_reward("bank")
    final = [{"role": "assistant", "content": task.reference[-1].content}]
    assert reward(completions=[final], environments=[env]) == [1.0]
    # the trajectory's `said` holds every assistant text, a call turn's prose too (what τ²'s COMMUNICATE reads)
    seen, recording = [], make_domain("bank")
    recording.score = lambda task, trajectory: seen.append((trajectory.answers, trajectory.said)) or 1.0
    call = {"id": "c0", "type": "function", "function": {"name": "get_balance", "arguments": "{}"}}
    talk = [{"role": "assistant", "content": "Let me look.", "tool_calls": [call]},
            {"role": "tool", "content": "{}"}, {"role": "assistant", "content": "Done."}]  # fmt: skip
    envace_trl.real_tools_reward(recording)(completions=[talk], environments=[env])
    assert seen == [(("Done.",), ("Let me look.", "Done."))]

    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    args = one_step_grpo_args(tmp_path, batch_size=2)
    trainer = GRPOTrainer(
        model=tiny_path, reward_funcs=[reward], args=args, train_dataset=envace_trl.task_dataset("bank", conversational=True),
        processing_class=AutoTokenizer.from_pretrained(tiny_path), environment_factory=cls,
    )  # fmt: skip
    trainer.train()
    assert "rewards/bank_reward/mean" in trainer.state.log_history[0]


# -- SFT and evaluation ---------------------------------------------------------------------------------------
def test_sft_rows_hold_both_roles_exactly(tokenizer):
    domain = make_domain("bank")
    task = domain.tasks("train")[0]
    rows = sft_rows(domain, tokenizer, [task])
    acts = [r for r in rows if r["role"] == "act"]
    rehearsals = [r for r in rows if r["role"] == "rehearse"]
    assert len(acts) == len(task.reference) and len(rehearsals) == len(task.reference_pairs())

    def completion(r):
        return tokenizer.decode([t for t, m in zip(r["input_ids"], r["completion_mask"], strict=True) if m])

    assert [completion(r) for r in acts] == [t.text + "<|im_end|>" for t in task.reference]
    for r, (_, result) in zip(rehearsals, task.reference_pairs(), strict=True):
        assert completion(r) == json.dumps(result) + "\n</execution_result><|im_end|>"
        prompt = tokenizer.decode([t for t, m in zip(r["input_ids"], r["completion_mask"], strict=True) if not m])
        assert "precise tool simulator" in prompt and prompt.endswith("<execution_result>\n")


@pytest.mark.slow
def test_sft_learns_the_reference(tmp_path):
    from datasets import Dataset

    from envace_gym.integrations.trl import run_sft

    policy = tiny_policy(seed=4)
    rows = sft_rows("units", policy.tokenizer, ["units/train/000"])
    dataset = Dataset.from_list(rows * 8)
    trainer = run_sft(
        policy.model,
        policy.tokenizer,
        dataset,
        str(tmp_path),
        epochs=6,
        learning_rate=1e-2,
        batch_size=4,
        logging_steps=1,
    )
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses[-1] < 0.6 * losses[0]


def test_evaluate_reports_success_and_fidelity(capsys):
    domain = make_domain("bank")
    tasks = domain.tasks("test")[:2]
    executors = {t.prompt: domain.make_executor(t) for t in tasks}

    def respond(prompt: str) -> str:
        if "precise tool simulator" not in prompt:
            return "Sorry, I cannot do that."  # acts: a final answer, no call
        task_prompt = next(p for p in executors if p in prompt)
        line = [x for x in prompt.splitlines() if x.startswith("call: ")][-1]
        call, _ = json.JSONDecoder().raw_decode(line[len("call: ") :])
        result = executors[task_prompt].execute(envace_gym.ToolCall(call["name"], call["arguments"]))
        return json.dumps(result) + "\n</execution_result>"

    result = evaluate(ScriptedPolicy(respond), domain, "test", num_tasks=2, progress=True)
    assert result.episodes == 2 and result.success_rate == 0.0
    bars = capsys.readouterr().err  # the two passes are told apart on the terminal
    assert "episodes (real execution)" in bars and "rehearsal fidelity (reference acts)" in bars
    assert result.rehearsals == sum(len(t.reference_pairs()) for t in tasks)
    assert result.parsed == result.schema_ok == result.equal_to_real == 1.0


def test_evaluate_keeps_its_success_pass_when_a_tool_raises_in_fidelity_and_leaves_masked_episodes_out(monkeypatch):
    domain = make_domain("bank")

    class Broken:  # the real tool has a bug: fidelity cannot compare with it, and says so
        def __init__(self, inner):
            self.inner = inner

        def execute(self, call):
            raise RuntimeError("tool bug")

        def __getattr__(self, name):
            return getattr(self.inner, name)

    real_executor = domain.make_executor
    monkeypatch.setattr(domain, "make_executor", lambda task: Broken(real_executor(task)))
    result = evaluate(ScriptedPolicy(lambda p: "Sorry, I cannot do that."), domain, "test", num_tasks=2)
    assert result.episodes == 2 and result.rehearsals == 0  # nothing to compare with, nothing lost

    scores = iter([None, 1.0])  # the first episode's verifier fails: neither a success nor a failure
    monkeypatch.setattr(domain, "make_executor", real_executor)
    monkeypatch.setattr(domain, "score", lambda task, trajectory: next(scores))
    result = evaluate(ScriptedPolicy(lambda p: "Done."), domain, "test", num_tasks=2, fidelity=False)
    assert (result.masked_episodes, result.success_rate, result.mean_reward) == (1, 1.0, 1.0)
    with pytest.raises(ValueError, match="num_tasks and trials must be at least 1"):
        evaluate(ScriptedPolicy([]), domain, "test", num_tasks=0)


def test_pass_hat_k_is_the_chance_that_k_trials_drawn_from_a_tasks_all_succeed():
    from itertools import combinations

    from envace_gym.evaluation.evaluate import pass_hat_k

    tasks = [[True, True, False, False], [True, True, True], [False, True], [True]]
    for k in (1, 2, 3, 4):  # against every draw of k trials, counted
        draws = [[all(c) for c in combinations(t, k)] for t in tasks if len(t) >= k]
        assert pass_hat_k(tasks, k) == pytest.approx(sum(sum(d) / len(d) for d in draws) / len(draws))
    assert pass_hat_k(tasks, 2) == pytest.approx((1 / 6 + 1 + 0) / 3)
    assert pass_hat_k(tasks, 5) != pass_hat_k(tasks, 5)  # no task has 5 trials: NaN, not 0
    with pytest.raises(ValueError, match="k must be at least 1"):
        pass_hat_k(tasks, 0)


def test_evaluate_runs_trials_per_task_and_reports_pass_k(monkeypatch):
    domain = make_domain("bank")
    first, second = (t.id for t in domain.tasks("test")[:2])
    scores = {first: iter([1.0, 1.0, 0.0]), second: iter([1.0, None, 1.0])}  # None: the verifier failed (masked)
    monkeypatch.setattr(domain, "score", lambda task, trajectory: next(scores[task.id]))
    result = evaluate(ScriptedPolicy(lambda p: "Done."), domain, "test", num_tasks=2, fidelity=False, trials=3)
    assert result.episodes == 6 and result.trials == 3 and result.masked_episodes == 1
    # first task: 2 of 3; second: 2 of its 2 scored trials (too few for pass^3)
    assert result.pass_k == pytest.approx({1: (2 / 3 + 1) / 2, 2: (1 / 3 + 1) / 2, 3: 0.0})
    assert sorted(r["task_id"] for r in result.per_task) == sorted([first] * 3 + [second] * 3)
    with pytest.raises(ValueError, match="trials must be at least 1"):
        evaluate(ScriptedPolicy([]), domain, "test", num_tasks=1, trials=0)


@pytest.mark.parametrize("sharding", ["zero3", "fsdp"])
def test_sharded_parameters_are_refused_only_where_rollouts_would_gather_per_forward(sharding, tmp_path, monkeypatch):
    """Accelerate sets up neither ZeRO-3 nor FSDP on a CPU: the rule is checked on settings that ask for them.
    With vLLM (TRL gathers the shards once per step into the engine) both are taken; without it, ZeRO-3 is taken
    with ds3_gather_for_generation (gathered once per rollout batch) and FSDP is refused, with what to use."""
    from types import SimpleNamespace

    args = one_step_grpo_args(tmp_path, batch_size=2)
    monkeypatch.setattr(args, "deepspeed_plugin", SimpleNamespace(zero_stage=3) if sharding == "zero3" else None)
    if sharding == "fsdp":
        monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # what accelerate launch --use_fsdp sets
    assert refusals.sharding(args) == ("DeepSpeed ZeRO-3" if sharding == "zero3" else "FSDP")
    monkeypatch.setattr(args, "use_vllm", True)
    refusals.refuse_sharded(args, "EnvACEGRPOTrainer")  # the engine generates: never the sharded model
    monkeypatch.setattr(args, "use_vllm", False)
    if sharding == "zero3":
        refusals.refuse_sharded(args, "EnvACEGRPOTrainer")  # gathered once for the batch
        monkeypatch.setattr(args, "ds3_gather_for_generation", False)
    refused = "FSDP" if sharding == "fsdp" else "DeepSpeed ZeRO-3 with ds3_gather_for_generation=False"
    with pytest.raises(TrainingConfigError, match=f"sharded parameters \\({refused}\\) without vLLM.*use_vllm=True"):
        envace_trl.make_rollout_func("units")(["units/train/000"], SimpleNamespace(args=args))
    with pytest.raises(TrainingConfigError, match="ds3_gather_for_generation=True"):
        refusals.refuse_sharded(args, "EnvACEGRPOTrainer")
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    monkeypatch.setattr(args, "deepspeed_plugin", SimpleNamespace(zero_stage=2))
    refusals.refuse_sharded(args, "EnvACEGRPOTrainer")  # ZeRO-2 keeps whole parameters on every rank


def test_rollouts_gather_once_without_vllm_and_wake_a_sleeping_engine_once_with_it(monkeypatch):
    """One batch of rollouts (every generation of a step) runs inside one gather (TRL's
    unwrap_model_for_generation, with ZeRO-3's gathering on) or, with a sleeping colocated engine, between one
    wake and one sleep, the weights loaded first when the engine slept with them discarded (as TRL does)."""
    import contextlib
    from types import SimpleNamespace

    import trl.models

    from envace_gym.integrations.trl import trainer_policy as tp

    calls: list[Any] = []
    monkeypatch.setattr(tp, "trainer_policy", lambda trainer: calls.append("policy") or "the policy")

    @contextlib.contextmanager
    def unwrap(model, accelerator, gather_deepspeed3_params=True, **kwargs):
        calls.append(("gather", model, gather_deepspeed3_params))
        yield model
        calls.append("release")

    monkeypatch.setattr(trl.models, "unwrap_model_for_generation", unwrap)
    args = SimpleNamespace(use_vllm=False, ds3_gather_for_generation=True)
    trainer = SimpleNamespace(args=args, model_wrapped="m", accelerator=None)
    with tp.rollout_weights(trainer) as policy:
        calls.append(f"rollouts with {policy}")
    assert calls == [("gather", "m", True), "policy", "rollouts with the policy", "release"]

    calls.clear()
    llm = SimpleNamespace(wake_up=lambda tags: calls.append(("wake", tuple(tags))),
                          sleep=lambda level: calls.append(("sleep", level)))  # fmt: skip
    generation = SimpleNamespace(llm=llm, _llm_weights_sleeping=True, sync_weights=lambda: calls.append("load"))
    args = SimpleNamespace(use_vllm=True, vllm_mode="colocate", vllm_enable_sleep_mode=True)
    trainer = SimpleNamespace(args=args, vllm_generation=generation)
    with pytest.raises(RuntimeError, match="a rollout failed"), tp.rollout_weights(trainer):
        calls.append("rollouts")
        raise RuntimeError("a rollout failed")  # the engine still goes back to sleep
    assert calls == ["load", ("wake", ("kv_cache",)), "policy", "rollouts", ("sleep", 2)]
    assert generation._llm_weights_sleeping
    calls.clear()
    generation._llm_weights_sleeping = False  # loaded this step already (the step's sync_weights)
    with tp.rollout_weights(trainer):
        calls.append("rollouts")
    assert calls == [("wake", ("kv_cache",)), "policy", "rollouts", ("sleep", 2)]
    calls.clear()
    args.vllm_enable_sleep_mode = False
    with tp.rollout_weights(trainer):
        calls.append("rollouts")
    assert calls == ["policy", "rollouts"]


def test_duplicate_task_rows_make_separate_groups_and_trl_metrics_are_kept(tiny_path, tmp_path, monkeypatch):
    trainer = envace_trainer(tiny_path, tmp_path)
    ids = ["units/train/000"] * 4  # the dataset held the task twice: two groups of G = 2, not one of 4
    batch = crafted_batch(trainer_policy.trainer_policy(trainer), ids)
    for episode, reward in zip(batch.episodes, [0.0, 0.0, 1.0, 1.0], strict=True):
        episode.reward = reward
    batch.episodes[3].truncated = True
    monkeypatch.setattr(envace_grpo_trainer, "collect_rollouts", lambda *a, **k: batch)
    out = trainer._generate_and_score_completions([{"prompt": i} for i in ids])
    assert out["advantages"].abs().sum() == 0  # each group's rewards are equal; one group of 4 would give ±0.5

    metrics = trainer._metrics["eval"]
    assert metrics["rows/act"] == [4.0] and metrics["rows/rehearse"] == [4.0] and metrics["rows/episode"] == [0.0]
    # the names and meanings the pure-torch trainer logs too (envace_gym.training.metrics)
    assert metrics["rollouts/groups"] == [2.0] and metrics["frac_reward_zero_std"] == [1.0]
    assert metrics["episodes"] == [4.0] and metrics["rollouts/real_tool_calls"] == [0.0]
    assert metrics["tokens/trained"] == [float(sum(sum(s.mask) for s in batch.samples()))]
    assert metrics["completions/mean_length"] == [12.0] and metrics["completions/clipped_ratio"] == [0.25]
    assert metrics["completions/mean_terminated_length"] == [12.0]
    assert list(trainer._logs["prompt"]) == ids and list(trainer._logs["advantages"]) == [0.0] * 4
    assert list(trainer._logs["rewards"]["reward"]) == [0.0, 0.0, 1.0, 1.0]
    # TRL's token count: every trained row's prompt and completion, counted in training only
    assert metrics["num_tokens"] == [0]
    trainer.model.train()
    trainer._generate_and_score_completions([{"prompt": i} for i in ids])
    rows = [s for s in batch.samples() if s.completion_ids and any(s.mask)]
    seen = sum(len(s.prompt_ids) + len(s.completion_ids) for s in rows)
    assert seen > 0 and trainer.state.num_input_tokens_seen == seen and trainer._metrics["train"]["num_tokens"] == [seen]


def test_eval_groups_follow_num_generations_eval(tiny_path, tmp_path, monkeypatch):
    trainer = envace_trainer(tiny_path, tmp_path, num_generations_eval=4, per_device_eval_batch_size=4)
    ids = ["units/train/000"] * 4  # in eval mode TRL repeats each prompt num_generations_eval times: one group
    batch = crafted_batch(trainer_policy.trainer_policy(trainer), ids)
    for episode, reward in zip(batch.episodes, [0.0, 0.0, 1.0, 1.0], strict=True):
        episode.reward = reward
    monkeypatch.setattr(envace_grpo_trainer, "collect_rollouts", lambda *a, **k: batch)
    assert not trainer.model.training
    out = trainer._generate_and_score_completions([{"prompt": i} for i in ids])
    assert sorted(set(out["advantages"].tolist())) == [-0.5, 0.5]  # one group of 4, not two of 2


def test_step_metrics_are_one_definition_of_what_a_step_played():
    """Both trainers log a step's rollout figures through step_metrics: groups, spread, rows per role, masks."""
    from envace_gym.training import metrics

    # two groups with a spread between them, one without (its scored episodes alike), one all masked
    groups = [0, 0, 1, 1, 2, 2]
    rewards = [1.0, 0.0, 0.5, 0.5, None, None]
    assert metrics.group_counts(groups, rewards) == (3, 1)
    tallies = [metrics.EpisodeTally(r, r == 1.0, 2, 1) for r in rewards]
    rows = [Row(Role.ACT, (1,), (2,), (0.0,), (1,))] * 3 + [Row(Role.REHEARSE, (1,), (2,), (0.0,), (1,))]
    logged = metrics.step_metrics(
        tallies, metrics.role_counts(rows), trained_tokens=4, groups=3, zero_std_groups=1, skipped_tasks=2
    )
    assert logged[metrics.REWARD] == pytest.approx(0.5) and logged[metrics.SUCCESS] == pytest.approx(1 / 6)
    assert (logged[metrics.GROUPS], logged[metrics.ZERO_STD], logged[metrics.MASKED]) == (3, pytest.approx(1 / 3), 2)
    assert (logged["rows/act"], logged["rows/rehearse"], logged["rows/episode"], logged["rows/user"]) == (3, 1, 0, 0)
    assert (logged[metrics.REAL_TOOL_CALLS], logged[metrics.EPISODES], logged[metrics.TURNS]) == (6, 6, 2.0)
    assert set(logged) <= set(metrics.STEP_METRICS)
