"""The ``envace`` command: ``envace demo`` and ``envace domains``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    run_demo(
        domain=args.domain,
        episodes=args.episodes,
        act=args.act,
        policy=args.model,
        seed=args.seed,
        on_invalid=args.on_invalid,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        rehearsal_mode=args.rehearsal_mode,
    )
    return 0


def _domains(args: argparse.Namespace) -> int:
    from .domains import list_domains, make_domain

    for name in list_domains():
        domain = make_domain(name)
        sizes = ", ".join(f"{len(domain.tasks(s))} {s}" for s in ("train", "test"))
        print(f"{name:8s} {len(domain.tools):2d} tools, {sizes} tasks  {domain.description}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="envace", description="World rehearsal (EnvACE) for tool-using LLM agents.")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="watch the policy rehearse a domain's tools next to the real ones")
    demo.add_argument("--domain", default="bank", help="built-in domain name or domain folder (default: bank)")
    demo.add_argument("--episodes", type=int, default=3, help="number of episodes (default: 3)")
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
    demo.add_argument("--max-new-tokens", type=int, default=96, help="token budget per generation (default: 96)")
    demo.add_argument("--temperature", type=float, default=0.0, help="sampling temperature; 0 is greedy (default)")
    demo.add_argument(
        "--rehearsal-mode", choices=["separate", "inline"], default="separate",
        help="separate: a fresh simulator prompt per call (the paper's, default); inline: the policy continues its own chat",
    )  # fmt: skip
    demo.set_defaults(func=_demo)

    domains = sub.add_parser("domains", help="list the registered domains")
    domains.set_defaults(func=_domains)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .errors import EnvACEError

    try:
        return args.func(args)
    except EnvACEError as exc:
        print(f"envace: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
