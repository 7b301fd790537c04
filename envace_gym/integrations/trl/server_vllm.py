"""Generating with vLLM servers (``use_vllm=True, vllm_mode="server"``) for world-rehearsal rollouts: every Act turn
and every rehearsal goes to the servers through :class:`~envace_gym.policy.vllm_server.VLLMServerPolicy`, and the
trainer's weights reach them once per optimizer step.

TRL's ``GRPOTrainer`` builds a ``VLLMGeneration`` that, in server mode, connects one ``VLLMClient`` and opens an
NCCL group with the server (which raises off CUDA). The package's trainers build :class:`ServerVLLMGeneration`
in its place instead (a ``VLLMGeneration`` whose start connects the policy, and whose weight sync writes a
checkpoint folder every server reloads), so TRL's loss, its sampling correction included, runs as it is:
``use_vllm`` stays ``True``. On CUDA with a single server that has a weight-transfer engine (``vllm serve
--weight-transfer-config '{"backend": "nccl"}'``), the weights move through TRL's own client and NCCL instead.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import is_peft_model
from trl.generation.vllm_generation import VLLMGeneration

from ...errors import TrainingConfigError
from ...policy.vllm_server import VLLMServerPolicy, write_checkpoint


def server_urls(args: Any) -> list[str]:
    """The servers a config names: ``vllm_server_base_urls`` (EnvACEGRPOConfig's), else TRL's
    ``vllm_server_base_url``, else ``http://{vllm_server_host}:{vllm_server_port}``."""
    one = getattr(args, "vllm_server_base_url", None)
    many = [u.rstrip("/") for u in getattr(args, "vllm_server_base_urls", None) or []]
    if many:
        if one and one.rstrip("/") not in many:
            raise TrainingConfigError(
                f"vllm_server_base_url={one!r} is not one of vllm_server_base_urls={many!r}: set the list only"
            )
        return many
    if one:
        return [one.rstrip("/")]
    return [f"http://{args.vllm_server_host}:{args.vllm_server_port}"]


def tied_weight_names(model: Any) -> dict[str, str]:
    """``{input embedding weight: output embedding weight}`` names when the two are one tensor (a tied LM head).
    The parameter walk names a tied tensor once (the embeddings); a vLLM reload rebuilds the LM head only from a
    tensor of its own name (tied or not, on vLLM's CPU backend its repacked copy stays stale otherwise: measured
    0.83 nats off on the tiny test model), so the checkpoint holds both names."""
    base = model.get_base_model() if is_peft_model(model) else model
    inputs, outputs = base.get_input_embeddings(), base.get_output_embeddings()
    if inputs is None or outputs is None or getattr(outputs, "weight", None) is not getattr(inputs, "weight", None):
        return {}
    names = {id(m): n for n, m in base.named_modules(remove_duplicate=False)}
    return {f"{names[id(inputs)]}.weight": f"{names[id(outputs)]}.weight"}


class ServerVLLMGeneration(VLLMGeneration):
    """TRL's ``VLLMGeneration`` in server mode, for trainers whose rollouts generate through a
    :class:`VLLMServerPolicy` (``self.policy``): it connects to every server instead of opening TRL's client, and
    syncs weights by writing them (gathered, LoRA merged, named as TRL's sync sends them, tied LM head included)
    to ``weights_dir`` for every server to reload. Built by :class:`~.colocated_vllm.ColocatedVLLMMixin`."""

    def __init__(self, *args: Any, base_urls: list[str], weights_dir: str | None = None, **kwargs: Any) -> None:
        self.base_urls = list(base_urls)
        self.weights_dir = weights_dir
        super().__init__(*args, **kwargs)

    def _init_vllm(self) -> None:
        self.policy = VLLMServerPolicy(self.base_urls, self.processing_class, connect_timeout=self.server_timeout)
        self.vllm_client: Any = self.policy  # TRL's trainer reads the servers' logprobs mode through it
        # NCCL (TRL's own client and sync) where it can run: CUDA, one server, a weight-transfer engine on it
        self.nccl = (
            torch.cuda.is_available()
            and len(self.base_urls) == 1
            and self.policy.get_server_info().get("weight_transfer_config") is not None
        )
        if self.nccl and self.accelerator.is_main_process:
            from trl.generation.vllm_client import VLLMClient

            self.vllm_client = VLLMClient(
                base_url=self.base_urls[0], group_port=self.group_port, connection_timeout=self.server_timeout
            )
            self.vllm_client.init_communicator(device=self.accelerator.device)
        self.accelerator.wait_for_everyone()

    def _checkpoint_folder(self) -> Path:
        if self.weights_dir is None:  # servers on this machine: a folder of this run's own, removed with it
            self.weights_dir = tempfile.mkdtemp(prefix="envace-vllm-weights-")
            weakref.finalize(self, shutil.rmtree, self.weights_dir, ignore_errors=True)
        return Path(self.weights_dir)

    def _weights_with_tied(self) -> Iterator[tuple[str, torch.Tensor]]:
        tied = tied_weight_names(self.accelerator.unwrap_model(self.model))
        for name, tensor in self._iter_named_params():
            yield name, tensor
            if name in tied:
                yield tied[name], tensor

    def sync_weights(self) -> None:
        """The trainer's current weights into every server: through TRL's NCCL sync where it runs, else written to
        a checkpoint folder each server reloads in place (then drops its prefix cache)."""
        if self.nccl:
            super().sync_weights()
            return
        if self.accelerator.is_main_process:
            model = self.accelerator.unwrap_model(self.model)
            config = (model.get_base_model() if is_peft_model(model) else model).config
            folder = write_checkpoint(self._weights_with_tied(), self._checkpoint_folder(), config)
            self.policy.reload_weights(folder)
        else:
            for _ in self._iter_named_params():  # every process walks them (TRL's rule: gathers are collective)
                pass
        self.accelerator.wait_for_everyone()

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        raise TrainingConfigError(
            "this trainer's vLLM servers generate world-rehearsal episodes (through its rollout policy) only; "
            "TRL's own generation loop is not connected to them"
        )
