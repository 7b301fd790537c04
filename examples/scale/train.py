"""EnvACE past one device: ``EnvACEGRPOTrainer`` under ``accelerate launch`` (FSDP2 or DeepSpeed ZeRO-3, one
config file each beside this script), generating with vLLM (colocated, or servers). docs/training.md, "Past
one device", says what each GPU holds and what was tested where.

    accelerate launch --config_file examples/scale/fsdp2.yaml examples/scale/train.py \
        --config examples/scale/envace_8b.yaml
    python examples/scale/train.py --config examples/scale/envace_8b.yaml --dry_run   # check it, on any machine

Every setting of the YAML file is an ``EnvACEGRPOConfig`` field (plus ``model``); flags after ``--config``
override it (``--max_steps 10``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import yaml
from transformers import HfArgumentParser

from envace_gym.integrations.trl import EnvACEGRPOConfig, EnvACEGRPOTrainer


@dataclass
class Script:
    model: str = field(default="Qwen/Qwen3-8B", metadata={"help": "Hub id or folder of the model to train."})
    config: str | None = field(default=None, metadata={"help": "YAML file of settings (flags override it)."})
    dry_run: bool = field(
        default=False,
        metadata={"help": "Check the settings: build the config (device settings off, so it builds here) and stop."},
    )


def settings(argv: list[str]) -> tuple[Script, EnvACEGRPOConfig]:
    """The script's settings and the trainer's config: the YAML file's, then the flags (the later wins). On
    ``--dry_run`` the settings that need an accelerator (bf16, vLLM, sleep mode) are turned off so it builds here."""
    first, _ = HfArgumentParser(Script).parse_args_into_dataclasses(argv, return_remaining_strings=True)
    given = yaml.safe_load(open(first.config)) if first.config else {}
    flags = [x for k, v in given.items() for x in ([f"--{k}", *map(str, v)] if isinstance(v, list) else [f"--{k}={v}"])]
    flags += argv
    if first.dry_run:
        flags += [f"--{k}={v}" for k, v in DEVICE_SETTINGS_OFF.items()]
    return HfArgumentParser((Script, EnvACEGRPOConfig)).parse_args_into_dataclasses(flags)


DEVICE_SETTINGS_OFF = {"bf16": False, "use_vllm": False, "vllm_enable_sleep_mode": False, "use_cpu": True}


def main(argv: list[str]) -> None:
    script, config = settings(argv)
    if script.dry_run:
        print(f"model {script.model}, domain {config.domain}, {config.max_steps} steps, G={config.num_generations}, "
              f"vllm_mode {config.vllm_mode} {config.vllm_server_base_urls or ''}: the config builds "
              f"(for the check: {DEVICE_SETTINGS_OFF})")  # fmt: skip
        return
    EnvACEGRPOTrainer(model=script.model, args=config).train()


if __name__ == "__main__":
    main(sys.argv[1:])
