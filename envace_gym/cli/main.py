"""The ``envace`` command: ``demo``, ``train``, ``eval``, ``experiment``, ``bench``, ``checklists`` and ``domains``.

Every command's flags are the fields of one settings dataclass (:func:`settings_class`), parsed one way
(:func:`parse_command`: TRL's parser, so every command takes ``--config YAML`` and both flag spellings,
``--num_tasks`` and ``--num-tasks``), and its handler gets that object."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn


class _HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, unless it has none or already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        unset = action.default in (None, argparse.SUPPRESS) or action.default is False
        if unset or not action.option_strings or "default" in text or text == argparse.SUPPRESS:
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


@dataclass
class BenchConfig:
    """``envace bench``'s settings: a size left unset keeps the recipe's own default."""

    model: str | None = field(
        default=None,
        metadata={"help": "model path or hub id; default: the embedded SmolLM2-135M; 'tiny' for a quick look"},
    )
    domain: str = field(default="bank", metadata={"help": "domain of the rollout measures"})
    backend: str = field(
        default="transformers",
        metadata={
            "help": "vllm: rollout tokens/s of a vLLM engine against transformers on the same episodes, instead",
            "choices": ["transformers", "vllm"],
        },
    )
    episodes: int | None = field(
        default=None,
        metadata={"help": "episodes of the Act-turn workload (default: 16; the rehearsal workload uses 8)"},
    )
    max_new_tokens: int | None = field(
        default=None, metadata={"help": "token budget of Act turns and rehearsals (default: 48)"}
    )
    turns: int | None = field(
        default=None, metadata={"help": "turns of the long episodes in the turn-cost measure (default: 8)"}
    )
    train: bool = field(
        default=False,
        metadata={
            "help": "measure training instead: the shared-prefix forward against the plain per-row forward (SFT, GRPO)"
        },
    )
    work_dir: str | None = field(
        default=None, metadata={"help": "--train: keep rollouts and results here, so a rerun resumes (default: none)"}
    )
    quick: bool = field(default=False, metadata={"help": "small sizes, for a smoke run"})
    seed: int = field(default=0, metadata={"help": "seed of the task draw and of generation"})
    out: str | None = field(default=None, metadata={"help": "also write the table (markdown) to this file"})


@dataclass
class ChecklistsConfig:
    """``envace checklists``'s settings."""

    domain: str = field(metadata={"help": "a dataset file or folder, or any domain name"})
    out: str = field(metadata={"help": "the JSONL file to write (EnvACE-format rows)"})
    model: str | None = field(
        default=None,
        metadata={
            "help": "judge model folder or hub id, in process; default: the embedded SmolLM2-135M; 'tiny' for a test"
        },
    )
    base_url: str | None = field(
        default=None, metadata={"help": "an OpenAI-compatible endpoint instead, e.g. http://localhost:30000/v1"}
    )
    judge_model: str | None = field(default=None, metadata={"help": "the endpoint's model name (with --base-url)"})
    split: list[str] = field(
        default_factory=lambda: ["train", "test"],
        metadata={"help": "which tasks to write", "choices": ["train", "test"]},
    )


@dataclass
class DomainsConfig:
    """``envace domains``'s settings."""

    names: list[str] = field(
        default_factory=list,
        metadata={
            "help": "domains to build and describe in detail (any --domain value: bfcl:parallel, tau2:airline, a "
            "folder)",
            "positional": True,
            "metavar": "NAME",
        },
    )
    details: bool = field(
        default=False,
        metadata={"help": "build every registered domain and print its tool and task counts", "flag": True},
    )
    check: bool = field(
        default=False,
        metadata={"help": "check the named domains (all registered ones, without names) in full", "flag": True},
    )
    rewards: int = field(
        default=20, metadata={"help": "with --check: tasks per split whose reference solution is scored"}
    )


COMMANDS = {  # name: what `envace --help` says of it
    "demo": "watch the policy rehearse a domain's tools next to the real ones",
    "bench": "measure rollout speed against raw generation, or (--train) training speed (ratios, side by side)",
    "eval": "success rate with the real executor, and rehearsal fidelity",
    "train": "train: sft, rehearsal (EnvACE) or real-tools (baseline)",
    "experiment": "the learning comparison behind docs/results.md",
    "checklists": "derive checklists (calls to make, facts to tell) from a dataset's references, for review",
    "domains": "list the registered domains",
}
DESCRIPTIONS = {
    "domains": "List the registered domains, one line each: the factory's `description`, else its docstring's "
    "first sentence. Nothing is built, and a 'module:attr' factory (the built-in domains, entry points) is read "
    "from its module's source rather than imported, so the list is instant even for benchmark families whose "
    "data takes seconds to load. --details, or naming domains, builds them and counts their tools and tasks (a "
    "generator's tasks are built to be counted). --check runs the domain check on every task: tool schemas "
    "(misspelt keywords, required names no property defines), reference calls against their schemas and "
    "whitelist, recorded results against the real executor, and the reward of the reference solution on a "
    "sample; it exits with 1 when there is an error.",
}


def settings_class(command: str) -> type:
    """The dataclass whose fields are ``envace <command>``'s flags (imported on demand: only the command run)."""
    if command == "demo":
        from ..recipes.demo import DemoConfig

        return DemoConfig
    if command == "eval":
        from ..recipes.eval import EvalConfig

        return EvalConfig
    if command == "train":
        from ..recipes.train import TrainConfig

        return TrainConfig
    if command == "experiment":
        from ..recipes.experiment import ExperimentConfig

        return ExperimentConfig
    return {"bench": BenchConfig, "checklists": ChecklistsConfig, "domains": DomainsConfig}[command]


def _add_field(parser: argparse.ArgumentParser, f: Any) -> None:
    """One settings field as ``parser``'s option, as TRL's parser declares it (``--name`` and ``--name-with-dashes``,
    ``--no_flag`` for a flag that is on by default, a list as ``nargs="+"``), or a positional one where its metadata
    says ``positional``, or a flag that takes no value where it says ``flag`` (TRL's ``--flag [true|false]`` would
    take a positional that follows it for its value)."""
    from trl import TrlParser

    if f.metadata.get("positional"):
        parser.add_argument(
            f.name, nargs="*", metavar=f.metadata.get("metavar"), default=f.default_factory(), help=f.metadata["help"]
        )
    elif f.metadata.get("flag"):
        names = [f"--{f.name}", *([f"--{f.name.replace('_', '-')}"] if "_" in f.name else [])]
        parser.add_argument(*names, action="store_true", default=f.default, help=f.metadata["help"])
    else:
        TrlParser._parse_dataclass_field(parser, f)


def _add_settings(parser: argparse.ArgumentParser, cls: type) -> None:
    """Every field of ``cls`` as an option of ``parser``, and ``--config``."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.init:
            f.type = hints[f.name]  # resolved, as TRL's parser resolves it
            _add_field(parser, f)
    # TrlParser reads --config itself before parsing; declared here too so that --help lists it.
    parser.add_argument(
        "--config", metavar="YAML", default=argparse.SUPPRESS,
        help="a YAML file of these settings; flags given as well win",
    )  # fmt: skip


def _parse_settings(cls: type, prog: str, argv: Sequence[str], description: str | None = None) -> Any:
    """A settings dataclass from flags and an optional ``--config`` YAML (TRL's parser: flags win); a mistake
    (unknown flag, bad value, a value the settings class refuses, unreadable YAML) exits with one line before
    anything is loaded."""
    import yaml
    from trl import TrlParser

    class Parser(TrlParser):
        error = _Parser.error

        def _add_dataclass_arguments(self, dtype: Any) -> None:
            _add_settings(self, dtype)

    parser = Parser(cls, prog=prog, description=description, formatter_class=_HelpFormatter)
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


def parse_command(argv: Sequence[str]) -> tuple[str, Any]:
    """``envace <command> ...``: the command and its settings object (a dataclass of :func:`settings_class`)."""
    command = argv[0]
    return command, _parse_settings(settings_class(command), f"envace {command}", argv[1:], DESCRIPTIONS.get(command))


def _demo(args: Any) -> int:
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


def _bench(args: Any) -> int:
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


def _bench_train(args: Any) -> int:
    from ..recipes.bench import format_table, machine_line
    from ..recipes.bench_train import run_train_bench

    # one SFT batch size: each measure is a fresh process (its peak memory its own), the quick look's main cost
    quick = dict(sft_tasks=2, sft_steps=2, sft_batch_sizes=(4,), plain_rows=2, group_size=2, max_new_tokens=16)
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


def _eval(config: Any) -> int:
    from ..recipes.eval import run_eval

    run_eval(config)
    return 0


def _train(config: Any) -> int:
    from ..recipes.train import train
    from ..training.distributed import end_distributed

    from accelerate import PartialState

    summary = train(config)
    if PartialState().is_main_process:  # under `accelerate launch`: once, by the process that wrote them
        curves = summary["plot"] or "not drawn (matplotlib is not installed, or no step logged a curve's value)"
        print(f"final model: {summary['final_model']}\nmetrics: {summary['metrics']}\ncurves: {curves}")
    # under `accelerate launch`: no process exits while gloo's threads still run (that aborts it at exit)
    end_distributed()
    return 0


def _experiment(config: Any) -> int:
    from ..recipes.experiment import run_experiment

    run_experiment(config)
    return 0


def _checklists(args: Any) -> int:
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


def _domains(args: Any) -> int:
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
    """``envace``'s parser: a subcommand per :data:`COMMANDS`, its options its settings class's fields (what
    :func:`main` parses them with, :func:`parse_command`, builds the same options)."""
    parser = _Parser(prog="envace", description="World rehearsal (EnvACE) for tool-using LLM agents.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command, help in COMMANDS.items():
        command_parser = sub.add_parser(command, help=help, description=DESCRIPTIONS.get(command))
        _add_settings(command_parser, settings_class(command))
    return parser


RUN = {"demo": _demo, "bench": _bench, "eval": _eval, "train": _train, "experiment": _experiment,
       "checklists": _checklists, "domains": _domains}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    from ..errors import EnvACEError

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if not argv or argv[0] not in COMMANDS:  # no command, --help, or a mistyped one: the parser says so
            build_parser().parse_args(argv)
            return 2
        command, config = parse_command(argv)
        return RUN[command](config)
    except EnvACEError as exc:
        print(f"envace: error: {exc}", file=sys.stderr)
        return 2
