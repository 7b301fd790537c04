"""``envace bench``: what the environment adds to the cost of the model's own forward passes.

Every comparison runs both sides in the same process, one after the other, and prints their ratio (these
machines are noisy; absolute figures are for orientation only):

1. **collector vs ceiling**: the rollout collector's generated tokens per second, against raw batched
   ``model.generate`` replaying every generate call the collector made (same prompts, same batch shape,
   same number of steps, no environment, no cache reuse). Measured with KV reuse on (the default) and off
   (which isolates the environment's own overhead).
2. **collector vs naive loop**: the collector against stepping single :class:`~envace_gym.RehearsalEnv`
   episodes one after the other (``env.act()`` then ``env.step()``), same tasks, same sampling.
3. **turn 8 vs turn 1**: the cost of one turn (a fixed-length Act turn for every live episode, then the
   step) early and late in long episodes, with and without KV reuse.
4. **validation**: ``ToolRegistry.validate`` calls per second against ``jsonschema.validate`` per call.

``run_backend_bench`` (``envace bench --backend vllm``) instead sets one generation backend against
``TransformersPolicy`` (its KV reuse across turns and its rehearsal prefix cache on, as the collector runs it):
rollout tokens per second on the same two workloads, and the share of prompt tokens vLLM's prefix cache served.

Peak memory is the process's resident-set high-water mark during each measure (reset between measures
where Linux allows it).
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema
import numpy as np
import torch

from ..domains.domain import GeneratedDomain
from ..domains.registry import make_domain
from ..domains.task import Task
from ..env.rehearsal_env import RehearsalEnv
from ..episode.config import EpisodeConfig
from ..episode.driver import EpisodeDriver, open_session
from ..episode.start import start_episodes
from ..policy.factory import make_policy
from ..policy.protocol import Generation, SamplingParams
from ..policy.transformers import TransformersPolicy
from ..rehearsal.prompt import RehearsalConfig, rollout_sampling
from ..rollout.collector import collect_rollouts
from ..tools.executor import ToolExecutor
from ..tools.schema import ToolRegistry
from ..training.memory import peak_gpu_memory, reset_peak_gpu_memory


@dataclass
class Measure:
    name: str
    ours: str
    baseline: str
    ratio: float
    target: str
    peak_mib: float
    note: str = ""
    peak_gpu_mib: float | None = None  # torch.cuda.max_memory_allocated where CUDA is in use, else None


# -- memory ------------------------------------------------------------------------------------------
def _reset_peak_rss() -> None:
    reset_peak_gpu_memory()  # the GPU's peak is counted over the same span
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _peak_rss_mib() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- recording what the collector asked the model ------------------------------------------------------
class _Recorder:
    """Wraps a policy; records every generate call (prompts, params, completion lengths)."""

    def __init__(self, policy: TransformersPolicy) -> None:
        self.policy, self.tokenizer, self.max_context = policy, policy.tokenizer, policy.max_context
        self.calls: list[tuple[list[list[int]], SamplingParams, list[int]]] = []

    def _log(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, gens: list[Generation]
    ) -> list[Generation]:
        self.calls.append(([list(p) for p in prompts], params, [len(g.completion_ids) for g in gens]))
        return gens

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        return self._log(prompts, params, self.policy.generate(prompts, params))

    def session(self) -> Any:
        recorder, inner = self, self.policy.session()

        class _Session:
            def generate(self, keys, prompts, params):
                return recorder._log(prompts, params, inner.generate(keys, prompts, params))

            def generate_fresh(self, prompts, params):
                return recorder._log(prompts, params, inner.generate_fresh(prompts, params))

            def forget(self, keys):
                inner.forget(keys)

        return _Session()


def _replay_raw(policy: TransformersPolicy, calls: list[tuple[list[list[int]], SamplingParams, list[int]]]) -> float:
    """Time raw batched ``model.generate`` on the recorded calls: same prompts, same number of steps."""
    model, pad = policy.model, policy.pad_id
    start = time.perf_counter()
    for prompts, params, lengths in calls:
        steps = max(lengths)
        for lo in range(0, len(prompts), policy.max_batch_size):
            chunk = prompts[lo : lo + policy.max_batch_size]
            width = max(len(p) for p in chunk)
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for r, p in enumerate(chunk):
                ids[r, width - len(p) :] = torch.tensor(p)
                mask[r, width - len(p) :] = 1
            with torch.inference_mode():
                model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    max_new_tokens=steps,
                    min_new_tokens=steps,
                    do_sample=params.temperature > 0,
                    temperature=params.temperature if params.temperature > 0 else None,
                    top_p=None,
                    top_k=None,
                    pad_token_id=pad,
                )
    return time.perf_counter() - start


# -- a domain of long conversations, for turn costs -------------------------------------------------------
class _LongChat(GeneratedDomain):
    """Bank tools in the system prompt and twelve scripted user turns, so episodes last whatever the
    model writes (a final answer brings the next user turn)."""

    name = "bench-long-chat"
    max_turns = 12
    num_tasks = {"train": 64, "test": 8}

    def __init__(self) -> None:
        super().__init__()
        self.bank = make_domain("bank")  # its tools and real executor, through the registry (bank is a plugin)

    @property
    def tools(self) -> ToolRegistry:
        return self.bank.tools

    def make_executor(self, task: Task) -> ToolExecutor | None:
        return self.bank.make_executor(task)

    def sample_params(self, rng: np.random.Generator) -> dict[str, Any]:
        return {"n": int(rng.integers(1_000_000))}

    def build_task(self, params: dict[str, Any], task_id: str, split: str) -> Task:
        bank = self.bank.tasks(split)[params["n"] % 200]
        turns = tuple(
            f"Thanks. One more question, number {k}: what else should I know about my accounts?" for k in range(11)
        )
        return Task(task_id, self.name, bank.prompt, split, turns, bank.tools, bank.reference, bank.initial_state)


def _turn_costs(policy: Any, episodes: int, turns: int, act_tokens: int, reuse_kv: bool, seed: int) -> list[float]:
    domain = _LongChat()
    config = EpisodeConfig.build(on_invalid="feedback", rehearsal={"max_new_tokens": act_tokens})
    eps = start_episodes(
        domain, domain.tasks()[:episodes], config, policy.tokenizer, max_context=policy.max_context,
        rng=lambda g, k: np.random.default_rng(g), unfit="raise",
    ).episodes  # fmt: skip
    driver = EpisodeDriver(policy, np.random.default_rng(seed), open_session(policy) if reuse_kv else None)
    params = SamplingParams(max_new_tokens=act_tokens, min_new_tokens=act_tokens, temperature=1.0)
    costs = []
    for _ in range(turns):
        live = [e for e in eps if not e.done]
        if not live:
            break
        start = time.perf_counter()
        driver.play(live, driver.act(live, params))
        costs.append(time.perf_counter() - start)
    return costs


# -- validation ----------------------------------------------------------------------------------------
def _validation(valid: bool, seconds: float = 1.0) -> tuple[float, float]:
    """Calls per second of ``ToolRegistry.validate`` and of ``jsonschema.validate``, on varied transfers."""
    registry = make_domain("bank").tools
    schema = registry["transfer"].parameters
    rng = np.random.default_rng(0)
    calls = [
        {
            "name": "transfer",
            "arguments": {
                "from_account": f"ACC-{rng.integers(1000, 9999)}",
                "to_account": f"ACC-{rng.integers(1000, 9999)}",
                "amount": float(rng.integers(1, 10**6)) / 100 if valid else str(rng.integers(1, 10**6)),
            },
        }
        for _ in range(256)
    ]

    def rate(fn: Callable[[dict[str, Any]], Any]) -> float:
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for call in calls:
                fn(call)
            n += len(calls)
        return n / (time.perf_counter() - start)

    def baseline(call: dict[str, Any]) -> None:
        try:
            jsonschema.validate(call["arguments"], schema)
        except jsonschema.ValidationError:
            pass

    return rate(registry.validate), rate(baseline)


# -- the run -------------------------------------------------------------------------------------------
@dataclass
class _Workload:
    label: str
    domain: Any
    tasks: list[Task]
    kwargs: dict[str, Any]


def _workloads(domain: str, episodes: int, rehearsal_episodes: int, act_turns: int, seed: int) -> list[_Workload]:
    """Two workloads: the policy writing Act turns in multi-turn conversations (scripted user turns keep
    them going whatever it writes), and the policy rehearsing every call of the reference solutions."""
    chat, dom = _LongChat(), make_domain(domain)
    return [
        _Workload(
            f"Act turns, {act_turns}-turn conversations",
            chat,
            list(chat.tasks()[:episodes]),
            {"act": "policy", "max_turns": act_turns, "on_invalid": "feedback"},
        ),
        _Workload(
            f"rehearsals of {domain} reference calls (separate mode)",
            dom,
            [dom.sample_task(np.random.default_rng([seed, i])) for i in range(rehearsal_episodes)],
            {"act": "reference", "on_invalid": "feedback"},
        ),
    ]


def _warm_up(policy: Any, workloads: list[_Workload]) -> None:
    """A few short episodes of each workload: the first calls load kernels and templates."""
    for work in workloads:
        collect_rollouts(policy, work.domain, work.tasks[:2], act_sampling=SamplingParams(max_new_tokens=4),
                         rehearsal=RehearsalConfig(max_new_tokens=4), **{**work.kwargs, "max_turns": 1})  # fmt: skip


def _naive(
    policy: Any, work: _Workload, act: SamplingParams, rehearse: RehearsalConfig, seed: int
) -> tuple[int, float]:
    """The same episodes, one single env after the other; returns (generated tokens, seconds)."""
    env = RehearsalEnv(
        work.domain, policy=policy, act_sampling=act, rehearsal=rehearse,
        on_invalid=work.kwargs["on_invalid"], max_turns=work.kwargs.get("max_turns"),
    )  # fmt: skip
    tokens, start = 0, time.perf_counter()
    for i, task in enumerate(work.tasks):
        env.reset(seed=seed + i, options={"task": task})
        done = False
        while not done:
            action = env.act() if work.kwargs["act"] == "policy" else env.episode.reference_act()
            _, _, terminated, truncated, info = env.step(action)
            tokens += sum(len(r["completion_ids"]) for r in info["rehearsals"])
            tokens += len(info["act"]["completion_ids"]) if info["act"]["generated"] else 0
            done = terminated or truncated
    return tokens, time.perf_counter() - start


def run_bench(
    model: str | None = None,
    episodes: int = 16,
    rehearsal_episodes: int = 8,
    domain: str = "bank",
    max_new_tokens: int = 48,
    act_turns: int = 3,
    turns: int = 8,
    turn_episodes: int = 8,
    act_tokens: int = 32,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> list[Measure]:
    """Run the four measures and return them (``log`` gets progress lines)."""
    policy = make_policy(model)
    if not isinstance(policy, TransformersPolicy):
        raise TypeError("the benchmark needs a transformers policy")
    act, rehearse = rollout_sampling(max_new_tokens, temperature=1.0)
    workloads = _workloads(domain, episodes, rehearsal_episodes, act_turns, seed)
    measures: list[Measure] = []
    log("warming up (first calls load kernels and templates) ...")
    _warm_up(policy, workloads)

    for work in workloads:
        for reuse in (True, False):
            log(f"[1] collector, {len(work.tasks)} episodes: {work.label}; KV reuse {'on' if reuse else 'off'} ...")
            _reset_peak_rss()
            recorder = _Recorder(policy)
            start = time.perf_counter()
            collect_rollouts(recorder, work.domain, work.tasks, act_sampling=act, rehearsal=rehearse, seed=seed,
                             reuse_kv=reuse, **work.kwargs)  # fmt: skip
            collector_s = time.perf_counter() - start
            tokens = sum(sum(lengths) for _, _, lengths in recorder.calls)
            log(f"    {tokens} tokens in {collector_s:.1f} s, {len(recorder.calls)} generate calls; replaying raw ...")
            raw_s = _replay_raw(policy, recorder.calls)
            measures.append(
                Measure(
                    f"collector vs raw generate: {work.label} (KV reuse {'on' if reuse else 'off'})",
                    f"{tokens / collector_s:.1f} tok/s",
                    f"{tokens / raw_s:.1f} tok/s",
                    raw_s / collector_s,
                    ">= 0.85",
                    _peak_rss_mib(),
                    f"{tokens} tokens in {len(recorder.calls)} generate calls; {collector_s:.1f} s vs {raw_s:.1f} s",
                    peak_gpu_memory(),
                )
            )

    for work in workloads:
        log(f"[2] naive loop vs collector, {len(work.tasks)} episodes: {work.label} ...")
        _reset_peak_rss()
        naive_tokens, naive_s = _naive(policy, work, act, rehearse, seed)
        start = time.perf_counter()
        batch = collect_rollouts(
            policy, work.domain, work.tasks, act_sampling=act, rehearsal=rehearse, seed=seed, **work.kwargs
        )
        collector_s = time.perf_counter() - start
        tokens = batch.stats.act_tokens + batch.stats.rehearse_tokens
        measures.append(
            Measure(
                f"collector vs naive single-env loop: {work.label}",
                f"{tokens / collector_s:.1f} tok/s",
                f"{naive_tokens / naive_s:.1f} tok/s",
                (tokens / collector_s) / (naive_tokens / naive_s),
                ">= 5",
                _peak_rss_mib(),
                f"{len(work.tasks)} episodes; {collector_s:.1f} s vs {naive_s:.1f} s",
                peak_gpu_memory(),
            )
        )

    for reuse in (True, False):
        log(
            f"[3] turn costs: {turn_episodes} long episodes, {turns} turns of {act_tokens} tokens, KV reuse {'on' if reuse else 'off'} ..."
        )
        _reset_peak_rss()
        costs = _turn_costs(policy, turn_episodes, turns, act_tokens, reuse, seed)
        last = len(costs)
        measures.append(
            Measure(
                f"turn {last} cost / turn 1 cost (KV reuse {'on' if reuse else 'off'})",
                f"{costs[-1]:.2f} s",
                f"{costs[0]:.2f} s",
                costs[-1] / costs[0],
                "<= 1.5",
                _peak_rss_mib(),
                "per turn: " + " ".join(f"{c:.1f}" for c in costs),
                peak_gpu_memory(),
            )
        )

    log("[4] validation ...")
    for valid in (True, False):
        _reset_peak_rss()
        ours, baseline = _validation(valid)
        kind = "valid" if valid else "invalid (error report built)"
        measures.append(
            Measure(
                f"ToolRegistry.validate vs jsonschema.validate, {kind} calls",
                f"{ours:,.0f} calls/s",
                f"{baseline:,.0f} calls/s",
                ours / baseline,
                ">= 50",
                _peak_rss_mib(),
                "bank `transfer`, 256 varied calls",
            )
        )
    return measures


def run_backend_bench(
    model: str | None = None,
    backend: str = "vllm",
    episodes: int = 16,
    rehearsal_episodes: int = 8,
    domain: str = "bank",
    max_new_tokens: int = 48,
    act_turns: int = 3,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> list[Measure]:
    """Rollout tokens per second of ``backend`` against ``TransformersPolicy`` on the same episodes (Act turns,
    and ``separate`` rehearsals of reference calls), in this process, one backend after the other:
    transformers first, since vLLM's CPU worker binds this process's threads when its engine starts."""
    act, rehearse = rollout_sampling(max_new_tokens, temperature=1.0)
    workloads = _workloads(domain, episodes, rehearsal_episodes, act_turns, seed)
    runs: dict[str, list[tuple[float, str, float, float | None]]] = {}
    for name in ("transformers", backend):
        log(f"[{name}] loading the model (a vLLM engine compiles on its first start) ...")
        policy = make_policy(model, backend=name)
        log(f"[{name}] warming up (first calls load kernels and templates) ...")
        _warm_up(policy, workloads)
        runs[name] = []
        for work in workloads:
            log(f"[{name}] {len(work.tasks)} episodes: {work.label} ...")
            _reset_peak_rss()
            hits = _prefix_cache_counts(policy)
            start = time.perf_counter()
            batch = collect_rollouts(
                policy, work.domain, work.tasks, act_sampling=act, rehearsal=rehearse, seed=seed, **work.kwargs
            )
            seconds = time.perf_counter() - start
            tokens = int(batch.stats.act_tokens + batch.stats.rehearse_tokens)
            note = f"{name}: {tokens} tokens in {seconds:.1f} s"
            if hits is not None:
                hit, queried = (b - a for a, b in zip(hits, _prefix_cache_counts(policy) or hits, strict=True))
                note += f", its prefix cache served {hit / max(queried, 1):.0%} of {queried:,} prompt tokens"
            runs[name].append((tokens / seconds, note, _peak_rss_mib(), peak_gpu_memory()))
    return [
        Measure(
            f"{backend} vs transformers: {work.label}", f"{ours[0]:.1f} tok/s", f"{theirs[0]:.1f} tok/s",
            ours[0] / theirs[0], "", ours[2], f"{theirs[1]}; {ours[1]}", ours[3],
        )  # fmt: skip
        for work, ours, theirs in zip(workloads, runs[backend], runs["transformers"], strict=True)
    ]


def _prefix_cache_counts(policy: Any) -> tuple[int, int] | None:
    """A vLLM policy's running counts of prompt tokens its prefix cache served and of all prompt tokens."""
    if not hasattr(policy, "cached_prompt_tokens"):
        return None
    return policy.cached_prompt_tokens, policy.prompt_tokens


def format_table(measures: list[Measure], header: str = "") -> str:
    lines = [header] if header else []
    gpu = any(m.peak_gpu_mib is not None for m in measures)  # a GPU column only where CUDA was in use
    lines.append("| measure | ours | baseline | ratio | target | peak RSS (MiB) |" + (" peak GPU (MiB) |" if gpu else "")
                 + " notes |")  # fmt: skip
    lines.append("|---|---|---|---|---|---|" + ("---|" if gpu else "") + "---|")
    for m in measures:
        peak_gpu = (" - |" if m.peak_gpu_mib is None else f" {m.peak_gpu_mib:,.0f} |") if gpu else ""
        lines.append(
            f"| {m.name} | {m.ours} | {m.baseline} | {m.ratio:.2f} | {m.target} | {m.peak_mib:,.0f} |{peak_gpu} "
            f"{m.note} |"
        )
    return "\n".join(lines)


def machine_line() -> str:
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} threads)"
