"""``EnvACEGRPOConfig``: the settings of :class:`~envace_gym.integrations.trl.EnvACEGRPOTrainer`, the paper's
defaults, and the settings it refuses, checked when the config is built."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...episode.config import EpisodeSettings
from ...errors import TrainingConfigError
from .colocated_vllm import refuse_vllm_settings
from .packed_grpo_config import PackedGRPOConfig
from .refusals import UNUSED_BY_ENVACE_TRAINER, refuse_sharded, refuse_unused


@dataclass
class EnvACEGRPOConfig(PackedGRPOConfig, EpisodeSettings):
    """``GRPOConfig`` with the EnvACE settings: the domain and how its episodes are played (the fields of
    :class:`~envace_gym.episode.EpisodeSettings`, flat, as TRL's users expect); defaults follow the paper
    (docs/method.md).

    ``scale_rewards="none"`` (A = R - mean, no std), ``delta=3.0`` (TRL's two-sided clipping caps the ratio of
    negative-advantage tokens: the paper's dual-clip c = 3), ``loss_type="dapo"`` (token-mean over the batch),
    ``use_bias_correction_kl=False`` (the paper's low-variance KL estimate, k3, when ``beta > 0``).
    TRL's names stay TRL's: ``num_generations`` is G (``group_size`` in the package's own settings) and
    ``max_completion_length`` the budget of each generation (``max_new_tokens``).
    ``per_device_train_batch_size`` counts episodes (tasks x ``num_generations``); the number of training rows
    each batch yields varies with the episodes.
    """

    # Parameters that control the rollouts (and the episode settings EpisodeSettings declares)
    domain: str = field(default="bank", metadata={"help": "Domain to train on (name or folder)."})

    # Parameters that control the vLLM servers (vllm_mode="server"; TRL's own vllm_server_* fields name one server)
    vllm_server_base_urls: list[str] | None = field(
        default=None,
        metadata={
            "help": "Base URLs of several vLLM servers serving the model (e.g. http://host:8000), each request sent "
            "to the one with the fewest in flight; overrides vllm_server_base_url/host/port."
        },
    )
    vllm_server_weights_dir: str | None = field(
        default=None,
        metadata={
            "help": "Folder the trainer writes its weights to once per optimizer step for the servers to reload "
            "(without NCCL: on a CPU, or with several servers); every server must read it at this same path. "
            "Default: a temporary folder on this machine."
        },
    )

    # Parameters whose default values are overridden from GRPOConfig (the paper's objective)
    scale_rewards: str = field(default="none", metadata={"help": "No std normalization, as in the paper."})
    delta: float | None = field(default=3.0, metadata={"help": "Dual-clip bound for negative advantages."})
    loss_type: str = field(default="dapo", metadata={"help": "Token-mean over the batch."})
    use_bias_correction_kl: bool = field(
        default=False,
        metadata={
            "help": "The paper's low-variance KL (k3), as envace_gym.training.trainer has it; TRL's default (True) multiplies "
            "it by the importance ratio, which changes the KL gradient even on-policy."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        # Checked here, as GRPOConfig checks its own settings: a run fails before any model or engine loads.
        try:
            self.check_episode_settings()  # (TrainingArguments' __post_init__ does not chain to EpisodeSettings')
        except ValueError as exc:
            raise TrainingConfigError(str(exc)) from None
        refuse_vllm_settings(self, "EnvACEGRPOTrainer")
        refuse_unused(self, UNUSED_BY_ENVACE_TRAINER, "EnvACEGRPOTrainer")
        refuse_sharded(self, "EnvACEGRPOTrainer")


# The paper's objective where it differs from GRPOConfig's defaults: EnvACEGRPOConfig's defaults, declared above
PAPER_OBJECTIVE = ("scale_rewards", "delta", "loss_type", "use_bias_correction_kl")


def paper_objective() -> dict[str, Any]:
    """The paper's objective as GRPOConfig settings (:data:`PAPER_OBJECTIVE`, their defaults in
    :class:`EnvACEGRPOConfig`): for another GRPO config that trains with the same loss (``envace train``'s
    real-tools baseline, a ``PackedGRPOConfig``)."""
    return {name: EnvACEGRPOConfig.__dataclass_fields__[name].default for name in PAPER_OBJECTIVE}

