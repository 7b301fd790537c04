"""KV reuse across turns gives the same generations as encoding every prompt from scratch."""

from __future__ import annotations

from envace_gym import SamplingParams
from envace_gym.policy import GenerationSession


def close(a, b, tol=1e-4):
    return (
        a.completion_ids == b.completion_ids
        and max((abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)), default=0) < tol
    )


def test_continued_conversations_match_uncached_generation(tiny):
    tok = tiny.tokenizer
    session = tiny.session()
    assert isinstance(session, GenerationSession) and session.supported
    prompts = [tok.encode("hello world " * (4 + 3 * i)) for i in range(3)]
    greedy = SamplingParams(max_new_tokens=6, temperature=0)
    for turn in range(3):
        got = session.generate([0, 1, 2], prompts, greedy)
        want = [tiny.generate([p], greedy)[0] for p in prompts]
        assert all(close(g, w) for g, w in zip(got, want, strict=True)), turn
        prompts = [
            p + list(g.completion_ids) + tok.encode(" more" * (i + 1))
            for i, (p, g) in enumerate(zip(prompts, got, strict=True))
        ]
    assert session.reused_tokens > session.computed_tokens  # later turns were mostly served from the cache


def test_subsets_new_keys_and_restarts(tiny):
    tok = tiny.tokenizer
    session = tiny.session()
    sampled = SamplingParams(max_new_tokens=5, temperature=1.0, seed=11)
    a, b = tok.encode("first conversation"), tok.encode("second one, longer than the first")
    first = session.generate(["a", "b"], [a, b], sampled)
    a2 = a + list(first[0].completion_ids) + tok.encode(" next")
    c = tok.encode("a third, new conversation")
    got = session.generate(["a", "c"], [a2, c], sampled)  # a continues, c is new, b sits this one out
    assert all(close(g, w) for g, w in zip(got, tiny.generate([a2, c], sampled), strict=True))
    not_a_continuation = tok.encode("something else entirely")
    reused = session.reused_tokens
    (restart,) = session.generate(["b"], [not_a_continuation], sampled)
    assert session.reused_tokens == reused  # nothing reused: b started over
    assert close(restart, tiny.generate([not_a_continuation], sampled)[0])
    session.forget(["a", "b", "c"])
    assert not session._conversations


def test_fresh_prompts_share_their_common_prefix(tiny):
    tok = tiny.tokenizer
    session = tiny.session()
    header = tok.encode("You are a precise tool simulator. Candidate tools: ... " * 3)
    prompts = [header + tok.encode(f" call number {i}" * (i + 1)) for i in range(3)]
    for params in (
        SamplingParams(max_new_tokens=6, temperature=0),
        SamplingParams(max_new_tokens=6, temperature=1.0, seed=2),
    ):
        got = session.generate_fresh(prompts, params)
        assert all(close(g, w) for g, w in zip(got, tiny.generate(prompts, params), strict=True))
    computed = session.computed_tokens
    alone = [header + tok.encode(" one more call")]
    (got,) = session.generate_fresh(alone, SamplingParams(max_new_tokens=6, temperature=0))
    assert close(got, tiny.generate(alone, SamplingParams(max_new_tokens=6, temperature=0))[0])
    assert session.computed_tokens - computed < len(alone[0]) // 2  # the header came from the prefix cache
    short = [tok.encode("hi"), tok.encode("ho")]  # nothing worth sharing: plain generation
    assert [
        g.completion_ids for g in session.generate_fresh(short, SamplingParams(max_new_tokens=3, temperature=0))
    ] == [g.completion_ids for g in tiny.generate(short, SamplingParams(max_new_tokens=3, temperature=0))]


def test_a_policy_session_without_prefix_sharing_falls_back_to_plain_generation(tiny):
    """Third-party policies may offer ``session()`` with only ``generate``; fresh prompts then go to the policy."""
    import numpy as np

    from envace_gym.episode import generate_batched

    class ContinuationsOnly:
        def generate(self, keys, prompts, params):
            raise AssertionError("fresh prompts are not conversations")

    prompts = [tiny.tokenizer.encode("hello world " * 3)]
    greedy = SamplingParams(max_new_tokens=4, temperature=0)
    got = generate_batched(tiny, prompts, greedy, np.random.default_rng(0), session=ContinuationsOnly())
    assert got[0].completion_ids == tiny.generate(prompts, greedy)[0].completion_ids
