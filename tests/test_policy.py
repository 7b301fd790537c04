from __future__ import annotations

import copy

import pytest
import torch

from envace_gym import PolicyError, SamplingParams, TransformersPolicy, make_policy
from envace_gym.policy import Policy
from envace_gym.testing import ScriptedPolicy, tiny_model


def prompts(tokenizer):
    chats = [
        [{"role": "system", "content": "s"}, {"role": "user", "content": "Move 5 USD to savings."}],
        [{"role": "system", "content": "s"}, {"role": "user", "content": "Hi"}],
    ]
    return [
        tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=True, return_dict=False) for c in chats
    ]


def test_generate_shapes_and_seeded_reproducibility(tiny):
    ps = prompts(tiny.tokenizer)
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=7)
    first = tiny.generate(ps, params)
    assert [g.prompt_ids for g in first] == [tuple(p) for p in ps]
    for g in first:
        assert len(g.completion_ids) == len(g.logprobs) and 1 <= len(g.completion_ids) <= 12
        assert all(lp <= 0 for lp in g.logprobs)
        assert g.finish_reason in ("stop", "length")
    assert tiny.generate(ps, params) == first
    assert tiny.generate(ps, params.with_seed(8)) != first


def test_logprobs_match_a_fresh_forward_pass(tiny):
    for temperature in (1.0, 0.7, 0.0):
        params = SamplingParams(max_new_tokens=10, temperature=temperature, seed=3)
        for g in tiny.generate(prompts(tiny.tokenizer), params):
            ids = torch.tensor([list(g.prompt_ids) + list(g.completion_ids)])
            with torch.no_grad():
                logits = tiny.model(ids).logits[0, len(g.prompt_ids) - 1 : -1].float()
            scale = temperature if temperature > 0 else 1.0
            expected = (
                torch.log_softmax(logits / scale, -1).gather(1, torch.tensor(g.completion_ids)[:, None]).squeeze(1)
            )
            assert torch.allclose(expected, torch.tensor(g.logprobs), atol=1e-4), temperature


def test_the_models_generation_config_does_not_leak_into_sampling_or_logprobs(tiny):
    """A checkpoint's own sampling defaults (Qwen2.5-Instruct ships top_k/top_p/repetition_penalty) must not
    change what is sampled nor the recorded log-probs: sampling is exactly what SamplingParams says."""
    own = tiny.model.generation_config
    hostile = copy.deepcopy(own)
    hostile.update(top_k=1, top_p=0.1, min_p=0.9, typical_p=0.2, repetition_penalty=3.0, no_repeat_ngram_size=1,
                   temperature=0.1, do_sample=False)  # fmt: skip
    tiny.model.generation_config = hostile
    try:
        params = SamplingParams(max_new_tokens=16, temperature=1.0, seed=3)
        gens = tiny.generate(prompts(tiny.tokenizer), params)
        for g in gens:
            ids = torch.tensor([list(g.prompt_ids) + list(g.completion_ids)])
            with torch.no_grad():
                logits = tiny.model(ids).logits[0, len(g.prompt_ids) - 1 : -1].float()
            expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(g.completion_ids)[:, None]).squeeze(1)
            assert torch.allclose(expected, torch.tensor(g.logprobs), atol=1e-4)
            ranks = (logits > logits.gather(1, torch.tensor(g.completion_ids)[:, None])).sum(1)
            assert (ranks > 0).any()  # some sampled token was not the argmax: top_k=1 did not leak in
        assert tiny.generate(prompts(tiny.tokenizer), params.with_seed(4)) != gens  # nor did greedy decoding
        assert tiny.model.generation_config is hostile  # the model's own config is back after generating
    finally:
        tiny.model.generation_config = own


def test_batched_greedy_equals_one_by_one(tiny):
    ps = prompts(tiny.tokenizer)
    params = SamplingParams(max_new_tokens=10, temperature=0)
    batched = tiny.generate(ps, params)
    single = [tiny.generate([p], params)[0] for p in ps]
    for b, s in zip(batched, single, strict=True):
        assert b.completion_ids == s.completion_ids
        assert max(abs(x - y) for x, y in zip(b.logprobs, s.logprobs, strict=True)) < 1e-4


def test_stop_strings_end_the_completion_at_their_first_occurrence(tiny):
    tok = tiny.tokenizer
    gens = tiny.generate(prompts(tok), SamplingParams(max_new_tokens=40, temperature=1.0, seed=0, stop=("e",)))
    stopped = [g for g in gens if g.finish_reason == "stop" and "e" in g.text]
    assert stopped, "the random tiny model should write an 'e' within 40 tokens"
    for g in stopped:
        assert "e" not in tok.decode(list(g.completion_ids[:-1]))
        assert len(g.logprobs) == len(g.completion_ids)


def test_bounds_are_checked(tiny):
    with pytest.raises(PolicyError, match="exceeds the context"):
        tiny.generate([[1] * 10], SamplingParams(max_new_tokens=tiny.max_context))
    with pytest.raises(PolicyError, match="at least 1"):
        tiny.generate([[1]], SamplingParams(max_new_tokens=0))
    with pytest.raises(PolicyError, match="empty prompt"):
        tiny.generate([[]], SamplingParams(max_new_tokens=2))


def test_make_policy_accepts_the_documented_forms(tiny):
    assert make_policy(tiny) is tiny
    pair = make_policy((tiny.model, tiny.tokenizer))
    assert isinstance(pair, TransformersPolicy) and pair.model is tiny.model
    assert isinstance(make_policy(tiny.model, tokenizer=tiny.tokenizer), TransformersPolicy)
    quick = make_policy("tiny")
    assert isinstance(quick, TransformersPolicy)
    assert quick.model.config.head_dim >= 32  # vLLM's CPU attention serves it (--model tiny --use_vllm true)
    assert isinstance(ScriptedPolicy(["x"]), Policy)
    with pytest.raises(PolicyError, match="cannot make a policy"):
        make_policy(42)
    with pytest.raises(PolicyError, match="model path '/nonexistent/model/path' does not exist"):
        make_policy("/nonexistent/model/path")


def test_tokenizer_without_chat_template_is_refused(tiny):
    import copy

    tok = copy.deepcopy(tiny.tokenizer)
    tok.chat_template = None
    with pytest.raises(PolicyError, match="chat_template"):
        TransformersPolicy(tiny_model(tok), tok)


def test_scripted_policy_cuts_at_the_token_budget(tokenizer):
    policy = ScriptedPolicy(["a rather long answer that will not fit"], tokenizer)
    (gen,) = policy.generate([[1]], SamplingParams(max_new_tokens=3))
    assert gen.finish_reason == "length" and len(gen.completion_ids) == 3
    assert gen.text == tokenizer.decode(list(gen.completion_ids))


def test_a_lora_adapter_folder_is_a_model_folder(tmp_path):
    from envace_gym.policy import check_model_source

    (tmp_path / "adapter_config.json").write_text("{}")
    check_model_source(str(tmp_path))  # a --lora checkpoint: transformers loads it through peft
    with pytest.raises(PolicyError, match="no config.json or adapter_config.json"):
        check_model_source(str(tmp_path / ".."))


def test_the_vllm_backend_is_refused_clearly_where_it_cannot_run():
    import importlib.util

    with pytest.raises(PolicyError, match="backend must be one of"):
        make_policy("tiny", backend="onnx")
    with pytest.raises(PolicyError, match="loads a model by name"):
        make_policy("tiny", backend="vllm")
    if importlib.util.find_spec("vllm") is None:  # here; tests/test_vllm.py covers the engine where it exists
        with pytest.raises(PolicyError, match=r"vLLM is not installed.*envace-gym\[vllm\]"):
            make_policy("vllm:some-org/some-model")


def test_vllm_server_policy_spreads_requests_seeds_each_and_names_a_dead_server(tokenizer):
    """VLLMServerPolicy against two stand-in servers (the routes and fields vLLM's OpenAI server answers with, no
    vLLM here): each prompt is its own request with its own seed, spread over both servers, ids and log-probs
    come back in order; a server that stops answering gives one ServerError naming it."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from envace_gym import ServerError
    from envace_gym.policy import VLLMServerPolicy
    from envace_gym.policy.vllm import request_seed

    seen: list[tuple[int, dict]] = []

    class Answer(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def _send(self, body, status=200):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                return self._send({})
            if self.path == "/v1/models":
                return self._send({"data": [{"id": "tiny", "max_model_len": 512}]})
            self._send({"detail": "Not Found"}, 404)

        def do_POST(self):
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.server.server_port, request))
            ids = [request["seed"] % 50 + 10, tokenizer.eos_token_id]  # ends on its end-of-turn id
            self._send({"choices": [{"token_ids": ids, "logprobs": {"token_logprobs": [-0.5, -0.25]},
                                     "finish_reason": "stop"}]})  # fmt: skip

    servers = [ThreadingHTTPServer(("127.0.0.1", 0), Answer) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    urls = [f"http://127.0.0.1:{s.server_port}" for s in servers]
    try:
        policy = VLLMServerPolicy(urls, tokenizer, connect_timeout=5)
        assert isinstance(policy, Policy) and policy.max_context == 512
        gens = policy.generate([[1, 2, 3]] * 6, SamplingParams(max_new_tokens=8, seed=7))
        seeds = [r["seed"] for _, r in seen]
        assert len(set(seeds)) == 6  # the same prompt six times: six seeds
        assert {port for port, _ in seen} == {s.server_port for s in servers}  # both servers served
        assert all(r["prompt"] == [1, 2, 3] and r["return_token_ids"] and r["logprobs"] == 0 for _, r in seen)
        # in order: the i-th generation is the answer to the i-th prompt's request (its seed, VLLMPolicy's derivation)
        assert [g.completion_ids[0] for g in gens] == [request_seed(7, i) % 50 + 10 for i in range(6)]
        assert all(g.logprobs == (-0.5, -0.25) and g.finish_reason == "stop" for g in gens)
        servers[1].shutdown()
        servers[1].server_close()
        with pytest.raises(ServerError, match=f"the vLLM server at {urls[1]} did not answer") as raised:
            policy.generate([[1, 2, 3]] * 4, SamplingParams(max_new_tokens=8, seed=8))
        assert raised.value.url == urls[1]
    finally:
        servers[0].shutdown()
        for server in servers:
            server.server_close()
