"""GPU check: 2 EnvACE steps of a real architecture on one GPU, with and without accelerate's FSDP2.

On a randomly initialised model of Qwen3-0.6B's architecture (its config is written below; nothing is
downloaded) and a tokenizer built in-process (the package's tiny byte-level tokenizer with Qwen3's special tokens
and TRL's Qwen3 chat template), for each variant:

* ``plain``: the model on the GPU, no sharding;
* ``fsdp2``: the model prepared by ``accelerate`` with ``FullyShardedDataParallelPlugin(fsdp_version=2)`` in one
  process (a world of one: what changes is the code path, fully_shard's DTensor parameters and hooks);

it prints the on-policy check (mean importance ratio of step 1: the trainer's log-probabilities of sampled tokens
against those recorded while sampling, before any update; 1.0 up to the compute dtype's rounding), the time of
each of 2 EnvACE steps (the pure-torch trainer, ``executor="rehearsal"``, transformers generation, dtype ``auto``)
and the peak GPU memory (``torch.cuda.max_memory_allocated``). Each variant runs in a fresh subprocess, so a
failure in one leaves the other's figures and the peaks are each its own. The whole run is meant to fit one
10-minute command on an H100.

    python benchmarks/gpu_check.py                 # both variants
    python benchmarks/gpu_check.py --dry-run       # parse, build every config, no GPU, no training

The GPU machine has torch, transformers, accelerate and peft and no network. Bring the rest as wheels, made
beforehand on a machine with a registry, for the GPU machine's Python (here 3.11) and platform:

    pip wheel --no-deps -w wheels .   # envace-gym itself, from this repository
    pip download -d wheels --no-deps --only-binary=:all: --python-version 3.11 \\
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \\
        "trl>=1.16,<1.17" gymnasium cloudpickle farama-notifications jsonschema jsonschema-specifications \\
        referencing rpds-py attrs google-re2 platformdirs

then on the GPU machine ``python benchmarks/gpu_check.py --wheels wheels`` installs them first (``pip install
--no-index --find-links wheels --no-deps``: nothing is fetched; trl is needed only for its chat templates). This
script downloads nothing itself.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

VARIANTS = ("plain", "fsdp2")
RESULT = "GPU_CHECK_RESULT "  # the line a variant's subprocess reports on


def qwen3_0_6b_config(**overrides: Any) -> Any:
    """Qwen3-0.6B's architecture (its published config.json), as a transformers config: nothing downloaded."""
    from transformers import Qwen3Config

    settings = dict(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, hidden_act="silu", max_position_embeddings=40960, rms_norm_eps=1e-6,
        rope_theta=1000000.0, tie_word_embeddings=True, attention_bias=False, attention_dropout=0.0,
        bos_token_id=151643, eos_token_id=151645, attn_implementation="sdpa",
    )  # fmt: skip
    settings.update(overrides)
    return Qwen3Config(**settings)


def build_tokenizer() -> Any:
    """A tokenizer with Qwen3's special tokens and TRL's Qwen3 (training) chat template, built in-process."""
    from envace_gym.policy.tiny import tiny_tokenizer

    return tiny_tokenizer(vocab_size=2000, family="qwen3")


def trainer_config(args: argparse.Namespace) -> Any:
    from envace_gym.training.trainer import TrainerConfig

    return TrainerConfig(
        domain=args.domain, executor="rehearsal", tasks_per_step=args.tasks_per_step, group_size=args.group_size,
        max_new_tokens=args.max_new_tokens, steps=args.steps, learning_rate=1e-6, seed=0, dtype=args.dtype,
    )  # fmt: skip


def fsdp2_plugin_settings() -> dict[str, Any]:
    """accelerate's FSDP2 plugin: each decoder layer its own unit, parameters resharded after forward."""
    return {
        "fsdp_version": 2,
        "reshard_after_forward": True,
        "auto_wrap_policy": "transformer_based_wrap",
        "transformer_cls_names_to_wrap": ["Qwen3DecoderLayer"],
        "state_dict_type": "SHARDED_STATE_DICT",
    }


def single_process_env() -> dict[str, str]:
    """A world of one for torch.distributed (what ``accelerate launch --num_processes 1`` would set)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="build every config and exit (no GPU, no training)")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--wheels", metavar="DIR", help="install the wheels in DIR first (pip --no-index)")
    parser.add_argument("--domain", default="units")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--tasks-per-step", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"))
    parser.add_argument("--timeout", type=int, default=270, help="seconds per variant (its subprocess)")
    parser.add_argument("--run-variant", choices=VARIANTS, help=argparse.SUPPRESS)  # inside a variant's subprocess
    return parser.parse_args(argv)


def install_wheels(folder: str) -> None:
    wheels = sorted(str(p) for p in Path(folder).glob("*.whl"))
    if not wheels:
        raise SystemExit(f"gpu_check: no wheels in {folder}")
    command = [sys.executable, "-m", "pip", "install", "--no-index", "--find-links", folder, "--no-deps", *wheels]
    print("gpu_check:", " ".join(command[:8]), f"... ({len(wheels)} wheels)", flush=True)
    subprocess.run(command, check=True)


def dry_run(args: argparse.Namespace) -> dict[str, Any]:
    """Every config the run would use, built without a GPU and without a model."""
    config = qwen3_0_6b_config()
    tokenizer = build_tokenizer()
    if len(tokenizer) > config.vocab_size:
        raise SystemExit(f"gpu_check: the tokenizer ({len(tokenizer)} ids) does not fit the model's vocabulary")
    trainer = trainer_config(args)
    from accelerate import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(**fsdp2_plugin_settings())
    return {
        "model_config": {k: getattr(config, k) for k in ("model_type", "vocab_size", "hidden_size",
                                                         "num_hidden_layers", "num_attention_heads",
                                                         "num_key_value_heads", "head_dim")},  # fmt: skip
        "tokenizer": {"ids": len(tokenizer), "eos": tokenizer.eos_token, "chat_template": bool(tokenizer.chat_template)},
        "trainer": {k: getattr(trainer, k) for k in ("domain", "executor", "tasks_per_step", "group_size",
                                                     "max_new_tokens", "steps", "dtype")},  # fmt: skip
        "fsdp2_plugin": {"fsdp_version": plugin.fsdp_version, **fsdp2_plugin_settings()},
        "single_process_env": sorted(single_process_env()),
        "variants": args.variants,
    }


# -- one variant, in its own process ------------------------------------------------------------------------
def on_policy_ratio(policy: Any, args: argparse.Namespace) -> float:
    """Step 1's mean importance ratio: over the trained tokens of one rollout batch (EnvACE episodes, both
    roles), exp(trainer log-prob - sampling log-prob), before any update."""
    import torch

    from envace_gym.domains.registry import make_domain
    from envace_gym.policy.precision import autocast, resolve_dtype
    from envace_gym.rehearsal.prompt import rollout_sampling
    from envace_gym.rollout.collector import collect_rollouts
    from envace_gym.training.packing import completion_logprobs

    domain = make_domain(args.domain)
    act, rehearsal = rollout_sampling(args.max_new_tokens, temperature=1.0)
    batch = collect_rollouts(
        policy, domain, domain.tasks("train")[: args.tasks_per_step], args.group_size, executor="rehearsal",
        act_sampling=act, rehearsal=rehearsal, seed=0,
    )  # fmt: skip
    rows = [r for r in batch.samples() if r.completion_ids]
    device = policy.device
    with torch.no_grad(), autocast(resolve_dtype(args.dtype, device), device):
        trained = completion_logprobs(policy.model, [r.prompt_ids for r in rows], [r.completion_ids for r in rows])
    diffs = [
        (t.float().cpu() - torch.tensor(r.logprobs))[torch.tensor(r.mask, dtype=torch.bool)]
        for t, r in zip(trained, rows, strict=True)
    ]
    return float(torch.cat(diffs).exp().mean())


def run_variant(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from envace_gym.policy.transformers import TransformersPolicy
    from envace_gym.training import metrics
    from envace_gym.training.memory import peak_gpu_memory, reset_peak_gpu_memory
    from envace_gym.training.trainer import train

    if not torch.cuda.is_available():
        raise SystemExit("gpu_check: torch sees no CUDA device (use --dry-run to check the configs without one)")
    torch.manual_seed(0)
    with torch.device("cuda"):  # initialised on the GPU: no 2.4 GB float32 copy on the host first
        model = AutoModelForCausalLM.from_config(qwen3_0_6b_config())
    if variant == "fsdp2":
        os.environ.update(single_process_env())
        from accelerate import Accelerator, FullyShardedDataParallelPlugin

        accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(**fsdp2_plugin_settings()))
        model = accelerator.prepare_model(model)
    policy = TransformersPolicy(model, build_tokenizer(), max_context=4096)
    reset_peak_gpu_memory()
    started = time.perf_counter()
    ratio = on_policy_ratio(policy, args)
    steps: list[dict[str, Any]] = []
    train(policy, trainer_config(args), steps.append)
    return {
        "variant": variant,
        "device": torch.cuda.get_device_name(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "step1_mean_importance_ratio": ratio,
        "step_seconds": [round(s[metrics.STEP_TIME], 2) for s in steps],
        "trained_tokens": [s.get(metrics.TRAINED_TOKENS) for s in steps],
        "peak_gpu_gib": peak_gpu_memory(2**30),
        "seconds": round(time.perf_counter() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.wheels:
        install_wheels(args.wheels)
    if args.dry_run:
        print(json.dumps({"dry_run": dry_run(args)}, indent=2))
        print("gpu_check: dry run: every config built; nothing trained")
        return 0
    if args.run_variant:
        print(RESULT + json.dumps(run_variant(args.run_variant, args)), flush=True)
        return 0
    forwarded = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--wheels" and a != args.wheels]
    failed = 0
    for variant in args.variants:
        print(f"gpu_check: {variant} ...", flush=True)
        try:
            done = subprocess.run(
                [sys.executable, __file__, *forwarded, "--run-variant", variant],
                capture_output=True, text=True, timeout=args.timeout,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            print(f"gpu_check: {variant}: no result within {args.timeout} s", flush=True)
            failed += 1
            continue
        lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
        if done.returncode or not lines:
            print(f"gpu_check: {variant} failed (exit {done.returncode}):\n{done.stderr[-4000:]}", flush=True)
            failed += 1
            continue
        result = json.loads(lines[-1][len(RESULT) :])
        print(f"gpu_check: {variant}: step-1 mean importance ratio {result['step1_mean_importance_ratio']:.4f}, "
              f"step times {result['step_seconds']} s, peak GPU memory {result['peak_gpu_gib']} GiB", flush=True)
        print(json.dumps(result), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
