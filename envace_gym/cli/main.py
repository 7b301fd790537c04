"""The ``envace`` command: ``demo``, ``train``, ``eval``, ``experiment``, ``bench``, ``checklists`` and ``domains``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn


class _HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, unless it has none or already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        unset = action.default in (None, argparse.SUPPRESS) or action.default is False
        if unset or not action.option_strings or "default" in text:
            return text
        default = " ".join(map(str, action.default)) if isinstance(action.default, list) else action.default
        return f"{text} (default: {default})"


class _Parser(argparse.ArgumentParser):
    """argparse that answers a mistake with one line saying where to look, not the usage block."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")

    def add_argument(self, *names: str, **kwargs: Any) -> argparse.Action:
        """Every long option in both spellings, ``--num_tasks`` and ``--num-tasks``, as TRL's parser takes
        ``envace train``'s and ``envace experiment``'s: one flag style across the commands."""
        return super().add_argument(*names, *flag_aliases(names), **kwargs)


def flag_aliases(names: Sequence[str]) -> list[str]:
    """The other spellings of long options ``names``: underscores for dashes and dashes for underscores."""
    aliases: list[str] = []
    for name in names:
        if name.startswith("--"):
            for other in ("--" + name[2:].replace("-", "_"), "--" + name[2:].replace("_", "-")):
                if other not in names and other not in aliases:
                    aliases.append(other)
    return aliases


def _parse_settings(cls: type, prog: str, argv: Sequence[str]) -> Any:
    """A settings dataclass from flags and an optional ``--config`` YAML (TRL's parser: flags win); a mistake
    (unknown flag, bad value, unreadable YAML) exits with one line before anything is loaded."""
    import yaml
    from trl import TrlParser

    class Parser(TrlParser):
        error = _Parser.error

    parser = Parser(cls, prog=prog, formatter_class=_HelpFormatter)
    # TrlParser reads --config itself before parsing; declared here too so that --help lists it.
    parser.add_argument(
        "--config", metavar="YAML", default=argparse.SUPPRESS,
        help="a YAML file of these settings; flags given as well win",
    )  # fmt: skip
    argv = [part for a in argv for part in (a.split("=", 1) if a.startswith("--config=") else [a])]
    if argv.count("--config") > 1 or (argv and argv[-1] == "--config"):  # TRL's reader takes one, with a path
        parser.error("--config takes one YAML file: --config PATH")
    try:
        config, from_yaml, from_flags = parser.parse_args_and_config(
            argv, return_remaining_strings=True, separate_remaining_strings=True
        )
    except yaml.YAMLError as exc:
        parser.error(f"the --config file is not valid YAML: {' '.join(str(exc).split())}")
    except (ValueError, OSError) as exc:  # a value a settings class refuses, or an unreadable file
        parser.error(" ".join(str(exc).split()) or type(exc).__name__)
    if from_flags:
        parser.error(f"unrecognized arguments: {' '.join(from_flags)}")
    if from_yaml:
        parser.error(f"unknown settings in the --config file: {' '.join(map(str, from_yaml))}")
    return config


def _add_episode_settings(parser: argparse.ArgumentParser, skip: Sequence[str] = ()) -> None:
    """A flag per episode setting (:class:`~envace_gym.episode.EpisodeSettings`, its help), ``--max-errors`` for
    ``max_errors``; a flag not given is left out of the parsed namespace, so the setting keeps its default."""
    import typing
    from dataclasses import fields

    from ..episode.config import EpisodeSettings

    hints = typing.get_type_hints(EpisodeSettings)
    for f in fields(EpisodeSettings):
        if f.name in skip:
            continue
        kind = next(t for t in typing.get_args(hints[f.name]) or (hints[f.name],) if t is not type(None))
        parser.add_argument(
            "--" + f.name.replace("_", "-"), dest=f.name, type=kind, default=argparse.SUPPRESS,
            choices=f.metadata.get("choices"), help=f.metadata["help"],
        )  # fmt: skip


def _demo(args: argparse.Namespace) -> int:
    from ..domains.registry import make_domain
    from ..policy.factory import make_policy
    from ..policy.transformers import check_model_source
    from ..recipes.demo import run_demo

    check_model_source(args.model)
    run_demo(
        domain=make_domain(args.domain),  # a broken domain fails before any engine starts
        episodes=args.episodes,
        act=args.act,
        policy=args.model if args.backend == "transformers" else make_policy(args.model, backend=args.backend),
        seed=args.seed,
        on_invalid=args.on_invalid,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        rehearsal_mode=args.rehearsal_mode,
    )
    return 0


def _bench(args: argparse.Namespace) -> int:
    from ..policy.transformers import check_model_source
    from ..recipes.bench import format_table, machine_line, run_backend_bench, run_bench

    check_model_source(args.model)
    if args.train:
        return _bench_train(args)
    sizes = (
        dict(episodes=4, rehearsal_episodes=2, max_new_tokens=16, act_turns=2, turns=4, turn_episodes=4, act_tokens=16)
        if args.quick
        else {}
    )
    for name in ("episodes", "max_new_tokens", "turns"):
        if getattr(args, name) is not None:
            sizes[name] = getattr(args, name)
    if args.backend != "transformers":
        sizes = {
            k: v for k, v in sizes.items() if k in ("episodes", "rehearsal_episodes", "max_new_tokens", "act_turns")
        }
        measures = run_backend_bench(
            model=args.model, backend=args.backend, domain=args.domain, seed=args.seed,
            log=lambda m: print(m, flush=True), **sizes,
        )  # fmt: skip
    else:
        measures = run_bench(
            model=args.model, domain=args.domain, seed=args.seed, log=lambda m: print(m, flush=True), **sizes
        )
    return _report(
        format_table(measures, f"Machine: {machine_line()}; model: {args.model or 'default (SmolLM2-135M)'}"), args.out
    )


def _bench_train(args: argparse.Namespace) -> int:
    from ..recipes.bench import format_table, machine_line
    from ..recipes.bench_train import run_train_bench

    quick = dict(sft_tasks=2, sft_steps=2, sft_batch_sizes=(2, 4), plain_rows=2, group_size=2, max_new_tokens=16)
    sizes = quick if args.quick else {}
    if args.max_new_tokens is not None:
        sizes["max_new_tokens"] = args.max_new_tokens
    measures = run_train_bench(
        model=args.model, domain=args.domain, seed=args.seed, work_dir=args.work_dir,
        log=lambda m: print(m, flush=True), **sizes,
    )  # fmt: skip
    header = f"Machine: {machine_line()}; model: {args.model or 'default (SmolLM2-135M)'}; training, float32"
    return _report(format_table(measures, header), args.out)


def _report(table: str, out: str | None) -> int:
    """Print a benchmark's table, and write it to ``out`` when given."""
    print("\n" + table)
    if out:
        with open(out, "w", encoding="utf-8") as f:
            f.write(table + "\n")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from ..recipes.eval import run_eval

    settings = {k: v for k, v in vars(args).items() if k not in ("func", "command", "no_fidelity")}
    run_eval(**settings, fidelity=not args.no_fidelity)
    return 0


def _train(argv: Sequence[str]) -> int:
    from ..recipes.train import TrainConfig, train
    from ..training.distributed import end_distributed

    from accelerate import PartialState

    summary = train(_parse_settings(TrainConfig, "envace train", argv))
    if PartialState().is_main_process:  # under `accelerate launch`: once, by the process that wrote them
        curves = summary["plot"] or "not drawn (matplotlib is not installed, or no step logged a curve's value)"
        print(f"final model: {summary['final_model']}\nmetrics: {summary['metrics']}\ncurves: {curves}")
    # under `accelerate launch`: no process exits while gloo's threads still run (that aborts it at exit)
    end_distributed()
    return 0


def _experiment(argv: Sequence[str]) -> int:
    from ..recipes.experiment import ExperimentConfig, run_experiment

    run_experiment(_parse_settings(ExperimentConfig, "envace experiment", argv))
    return 0


def _checklists(args: argparse.Namespace) -> int:
    from ..domains.checklists import write_checklists
    from ..domains.judge import TransformersJudge
    from ..domains.registry import make_domain
    from ..endpoint import ChatEndpoint
    from ..errors import EnvACEError
    from ..policy.transformers import check_model_source

    if bool(args.base_url) != bool(args.judge_model):
        raise EnvACEError("--base-url and --judge-model go together (an OpenAI-compatible endpoint and its model)")
    if not args.base_url:
        check_model_source(args.model)
    domain = make_domain(args.domain)  # a bad dataset fails before the judge model loads
    backend = (
        ChatEndpoint(args.base_url, args.judge_model) if args.base_url else TransformersJudge(args.model or "default")
    )
    report = write_checklists(domain, backend, args.out, splits=args.split)
    print(
        f"wrote {report.tasks} tasks to {args.out}: {report.call_items} call items, {report.fact_items} fact items; "
        f"{len(report.fallbacks)} turn(s) where the judge's fact list was unreadable got one 'agrees with the "
        "reference answer' item instead" + (f" (first: {report.fallbacks[0]})" if report.fallbacks else "")
    )
    return 0


def _domains(args: argparse.Namespace) -> int:
    from ..domains.registry import describe_domain, list_domains

    if args.check:
        names = args.names or list_domains()
        return 1 if sum(_print_domain_check(name, args.rewards, named=bool(args.names)) for name in names) else 0
    if not args.names and not args.details:  # the listing builds nothing: benchmark families load no data
        for name in list_domains():
            print(f"{name:10s} {describe_domain(name)}".rstrip())
        return 0
    for name in args.names or list_domains():
        _print_domain_details(name, named=bool(args.names))
    return 0


def _print_domain_details(name: str, *, named: bool) -> None:
    """Build ``name`` and print its tool and task counts (a generator's tasks all built, so one that cannot produce
    what it declares says so; data-backed tasks are counted as they are); a domain the user named must build (its
    error is the command's), one met while listing every domain is shown as not available (benchmark data not
    installed)."""
    from ..domains.domain import GeneratedDomain
    from ..domains.registry import make_domain
    from ..errors import EnvACEError

    try:
        domain = make_domain(name)
        count = (lambda tasks: sum(1 for _ in tasks)) if isinstance(domain, GeneratedDomain) else len
        sizes = ", ".join(f"{count(domain.tasks(s))} {s}" for s in ("train", "test"))
        print(f"{domain.id:10s} {len(domain.tool_names()):3d} tools, {sizes} tasks  {domain.description}")
    except EnvACEError as exc:
        if named:
            raise
        print(f"{name:10s} not available: {exc}")


def _print_domain_check(name: str, rewards: int, *, named: bool) -> int:
    """The full domain check of ``name``, one line per finding; returns how many errors it found."""
    from ..domains.check import check_domain
    from ..domains.registry import resolve_domain
    from ..errors import EnvACEError

    try:
        domain = resolve_domain(name)  # not make_domain: its load-time check would stop at the first error
    except EnvACEError as exc:
        if named:
            raise
        print(f"{name}: not available: {exc}")
        return 0
    findings = check_domain(domain, rewards=rewards)
    errors = sum(f.level == "error" for f in findings)
    sizes = ", ".join(f"{len(domain.tasks(s))} {s}" for s in ("train", "test"))
    verdict = f"{errors} error(s), {len(findings) - errors} warning(s)" if findings else "no findings"
    print(f"{name}: {sizes} tasks checked (the reward on up to {rewards} per split): {verdict}")
    for finding in findings:
        print(f"  {finding}")
    return errors


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="envace", description="World rehearsal (EnvACE) for tool-using LLM agents.")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="watch the policy rehearse a domain's tools next to the real ones")
    demo.add_argument("--domain", default="bank", help="built-in domain name or domain folder")
    demo.add_argument("--episodes", type=int, default=3, help="number of episodes")
    demo.add_argument(
        "--act", choices=["reference", "policy"], default="reference",
        help="who writes the Act turns: the task's reference solution (default) or the policy",
    )  # fmt: skip
    demo.add_argument(
        "--model",
        default=None,
        help="model path or hub id; default: the embedded SmolLM2-135M; 'tiny' for a random test model",
    )
    demo.add_argument("--seed", type=int, default=0, help="seed of the first episode's task draw")
    demo.add_argument(
        "--on-invalid",
        choices=["terminate", "feedback"],
        default="feedback",
        help="what an invalid call or rehearsal does (default: feedback, so every call is shown)",
    )
    demo.add_argument("--max-new-tokens", type=int, default=96, help="token budget per generation")
    demo.add_argument("--temperature", type=float, default=0.0, help="sampling temperature; 0 is greedy")
    demo.add_argument(
        "--rehearsal-mode", choices=["separate", "inline"], default="separate",
        help="separate: a fresh simulator prompt per call (the paper's, default); inline: the policy continues its own chat",
    )  # fmt: skip
    demo.add_argument(
        "--backend", default="transformers", choices=["transformers", "vllm"],
        help="generate with transformers, or with a vLLM engine (the vllm extra)",
    )  # fmt: skip
    demo.set_defaults(func=_demo)

    bench = sub.add_parser(
        "bench", help="measure rollout speed against raw generation, or (--train) training speed (ratios, side by side)"
    )
    bench.add_argument(
        "--model",
        default=None,
        help="model path or hub id; default: the embedded SmolLM2-135M; 'tiny' for a quick look",
    )
    bench.add_argument("--domain", default="bank", help="domain of the rollout measures (default: bank)")
    bench.add_argument(
        "--backend", default="transformers", choices=["transformers", "vllm"],
        help="vllm: rollout tokens/s of a vLLM engine against transformers on the same episodes, instead",
    )  # fmt: skip
    bench.add_argument(
        "--episodes",
        type=int,
        default=None,
        help="episodes of the Act-turn workload (default: 16; the rehearsal workload uses 8)",
    )
    bench.add_argument(
        "--max-new-tokens", type=int, default=None, help="token budget of Act turns and rehearsals (default: 48)"
    )
    bench.add_argument(
        "--turns", type=int, default=None, help="turns of the long episodes in the turn-cost measure (default: 8)"
    )
    bench.add_argument(
        "--train",
        action="store_true",
        help="measure training instead: the shared-prefix forward against the plain per-row forward (SFT, GRPO)",
    )
    bench.add_argument(
        "--work-dir", default=None, help="--train: keep rollouts and results here, so a rerun resumes (default: none)"
    )
    bench.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    bench.add_argument("--seed", type=int, default=0, help="seed of the task draw and of generation")
    bench.add_argument("--out", default=None, help="also write the table (markdown) to this file")
    bench.set_defaults(func=_bench)

    evaluate = sub.add_parser("eval", help="success rate with the real executor, and rehearsal fidelity")
    evaluate.add_argument(
        "--domain", default="bank", help="domain name, folder or dataset file (envace domains lists the names)"
    )
    evaluate.add_argument(
        "--model", default=None,
        help="model folder or hub id; default: the embedded SmolLM2-135M; 'tiny' for a random test model",
    )  # fmt: skip
    evaluate.add_argument(
        "--backend", default="transformers", choices=["transformers", "vllm"],
        help="generate with transformers, or with a vLLM engine (the vllm extra; a model folder or hub id)",
    )  # fmt: skip
    evaluate.add_argument("--split", default="test", choices=["train", "test"], help="which tasks to evaluate on")
    evaluate.add_argument("--num-tasks", type=int, default=50, help="the first N tasks of the split")
    evaluate.add_argument(
        "--max-new-tokens", type=int, default=128, help="token budget of each Act turn and each rehearsal"
    )
    evaluate.add_argument(
        "--temperature", type=float, default=0.0, help="sampling temperature; 0 is greedy (the paper evaluates at 0.6)"
    )
    evaluate.add_argument("--top-p", type=float, default=1.0, help="nucleus mass when sampling (the paper: 0.95)")
    evaluate.add_argument(
        "--no-fidelity", action="store_true",
        help="skip the rehearsal-fidelity passes (reference calls with and without their own results, the "
        "policy's own calls: each rehearsed and compared with the real results)",
    )  # fmt: skip
    evaluate.add_argument("--seed", type=int, default=0, help="seed of the generation batches")
    evaluate.add_argument(
        "--trials", type=int, default=1,
        help="episodes per task (each its own seed): reports tau2-Bench's pass^1 .. pass^k; sample (--temperature) "
        "or use a sampled user, or every trial is the same",
    )  # fmt: skip
    _add_episode_settings(evaluate, skip=("executor", "p_real"))  # evaluation chooses the executor (EVALUATION_SETS)
    evaluate.add_argument(
        "--agent-prompt", choices=["envace", "tau2"], default=None,
        help="a tau2:* domain's agent system prompt: a short instruction and the policy, or tau2-Bench's own agent "
        "prompt (for figures beside tau2's) (default: envace)",
    )  # fmt: skip
    evaluate.add_argument(
        "--rehearse", nargs="+", choices=["parallel", "sequential"], default=None,
        help="rehearse privately before each committed Act turn (one or both modes)",
    )  # fmt: skip
    evaluate.add_argument(
        "--budget", nargs="+", type=int, default=[2], help="N, rehearsals per committed turn (several: a table)"
    )
    evaluate.add_argument("--horizon", type=int, default=3, help="imagined Act turns per rehearsal")
    evaluate.add_argument(
        "--commit", nargs="+", choices=["memory", "select", "outcome"], default=["memory"],
        help="how the committed turn follows the rehearsals: written with their memory before it, the first "
        "turn of the first rehearsal the policy's assessment kept (none kept: plain acting), or the first turn of "
        "the rehearsal whose imagined outcome ranks best (an answer, fewer errors, fewer turns); several: a table",
    )  # fmt: skip
    evaluate.add_argument("--out", default=None, help="also write the result(s) as JSON")
    evaluate.set_defaults(func=_eval)

    sub.add_parser("train", help="train: sft, rehearsal (EnvACE) or real-tools (baseline); see 'envace train --help'")
    sub.add_parser("experiment", help="the learning comparison behind docs/results.md; see 'envace experiment --help'")

    checklists = sub.add_parser(
        "checklists", help="derive checklists (calls to make, facts to tell) from a dataset's references, for review"
    )
    checklists.add_argument("--domain", required=True, help="a dataset file or folder, or any domain name")
    checklists.add_argument("--out", required=True, help="the JSONL file to write (EnvACE-format rows)")
    checklists.add_argument(
        "--model", default=None,
        help="judge model folder or hub id, in process; default: the embedded SmolLM2-135M; 'tiny' for a test",
    )  # fmt: skip
    checklists.add_argument(
        "--base-url", default=None, help="an OpenAI-compatible endpoint instead, e.g. http://localhost:30000/v1"
    )
    checklists.add_argument("--judge-model", default=None, help="the endpoint's model name (with --base-url)")
    checklists.add_argument(
        "--split", nargs="+", choices=["train", "test"], default=["train", "test"], help="which tasks to write"
    )
    checklists.set_defaults(func=_checklists)

    domains = sub.add_parser(
        "domains", help="list the registered domains",
        description="List the registered domains, one line each: the factory's `description`, else its docstring's "
        "first sentence. Nothing is built, and a 'module:attr' factory (the built-in domains, entry points) is read "
        "from its module's source rather than imported, so the list is instant even for benchmark families whose "
        "data takes seconds to load. --details, or naming domains, builds them and counts their tools and tasks (a "
        "generator's tasks are built to be counted). --check runs the domain check on every task: tool schemas "
        "(misspelt keywords, required names no property defines), reference calls against their schemas and "
        "whitelist, recorded results against the real executor, and the reward of the reference solution on a "
        "sample; it exits with 1 when there is an error.",
    )  # fmt: skip
    domains.add_argument(
        "names", nargs="*", metavar="NAME",
        help="domains to build and describe in detail (any --domain value: bfcl:parallel, tau2:airline, a folder)",
    )  # fmt: skip
    domains.add_argument(
        "--details", action="store_true", help="build every registered domain and print its tool and task counts"
    )
    domains.add_argument(
        "--check", action="store_true", help="check the named domains (all registered ones, without names) in full"
    )
    domains.add_argument(
        "--rewards", type=int, default=20, help="with --check: tasks per split whose reference solution is scored"
    )
    domains.set_defaults(func=_domains)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from ..errors import EnvACEError

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in ("train", "experiment"):  # dataclass-driven, with --config YAML (TRL's parser)
            return (_train if argv[0] == "train" else _experiment)(argv[1:])
        args = build_parser().parse_args(argv)
        return args.func(args)
    except EnvACEError as exc:
        print(f"envace: error: {exc}", file=sys.stderr)
        return 2
