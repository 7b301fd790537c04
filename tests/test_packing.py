"""The shared-prefix forward: the same log-probabilities, loss and gradients as the plain per-row forward, with
fewer tokens encoded; its use in the trainers; the compute dtype."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from envace_gym.policy import precision
from envace_gym.testing import tiny_model, tiny_policy, tiny_tokenizer
from envace_gym.training import completion_logprobs, completion_scores, packing, packing_support, plan_packs
from envace_gym.training.packing import build_tree, plain_scores, tree_size

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def ragged_rows(vocab: int, seed: int = 0):
    """Rows of every kind a batch holds: G completions of one prompt (diverging at their first token), two
    sharing a first token, a prompt that shares only part of another, a turn-2 row extending a turn-1 row,
    a duplicate, rows sharing nothing, left/right ragged lengths, a one-token prompt."""
    rng = np.random.default_rng(seed)

    def r(n):
        return [int(x) for x in rng.integers(3, vocab, n)]

    base = r(40)
    prompts = [base[:30], base[:30], base[:30], base[:22] + r(9), r(12), r(3), [7]]
    completions = [r(8), r(3), [], r(6), r(9), r(14), r(5)]
    completions[2] = completions[1][:1] + r(4)  # shares its first completion token with row 1
    prompts.append(prompts[0] + completions[0] + r(4))  # turn 2 of row 0's episode
    completions.append(r(5))
    prompts.append(list(prompts[3]))  # a duplicate row
    completions.append(list(completions[3]))
    return prompts, completions


def loss_and_grads(model, fn):
    """A loss that weights every row and token differently, its value, per-token log-probs and gradients."""
    model.zero_grad(set_to_none=True)
    logps = fn()
    loss = sum((lp * torch.linspace(0.5, 1.5, len(lp)) * (i + 1)).sum() for i, lp in enumerate(logps))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return [lp.detach() for lp in logps], float(loss), grads


def assert_same(reference, other, atol=2e-5):
    (ref_lp, ref_loss, ref_grads), (lp, loss, grads) = reference, other
    assert len(lp) == len(ref_lp)
    for a, b in zip(ref_lp, lp, strict=True):
        torch.testing.assert_close(b, a, atol=atol, rtol=1e-5)
    assert loss == pytest.approx(ref_loss, rel=1e-5, abs=atol)
    assert grads.keys() == ref_grads.keys()
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, atol=atol * max(1.0, float(g.abs().max())), rtol=1e-4, msg=name)


# -- the layout ------------------------------------------------------------------------------------------
def test_tree_encodes_each_shared_prefix_once_and_attends_to_ancestors_only():
    rows = [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 6], [9, 8]]
    tree = build_tree(rows, [3, 3, 2, 1])
    # 1 2 3 4 | 3' 5 (copy of node "3": rows 0 and 1 score different tokens after it) | 6 | 9 8
    assert tree.tokens.tolist() == [1, 2, 3, 4, 3, 5, 6, 9, 8]
    assert tree.depth.tolist() == [0, 1, 2, 3, 2, 3, 2, 0, 1]
    visible = tree.visible()
    ancestors = {0: [0], 1: [0, 1], 2: [0, 1, 2], 3: [0, 1, 2, 3], 4: [0, 1, 4], 5: [0, 1, 4, 5], 6: [0, 1, 6],
                 7: [7], 8: [7, 8]}  # fmt: skip
    for i, seen in ancestors.items():
        assert torch.nonzero(visible[i]).flatten().tolist() == seen
    # Every scored position predicts one token, and each row finds its own targets.
    for row, start, scores in zip(rows, [3, 3, 2, 1], tree.row_scores, strict=True):
        assert tree.targets[scores].tolist() == row[start:]
    assert tree_size(rows) == 8  # the copied branch node is the ninth
    with pytest.raises(ValueError, match="context token"):
        build_tree([[1, 2]], [0])


def test_plan_packs_keeps_sharing_rows_together_within_the_budget():
    rows = [[1] * 50 + [2, i] for i in range(6)] + [[7] * 30 + [i] for i in range(4)]
    packs = plan_packs(rows, budget=70)
    assert sorted(i for p in packs for i in p) == list(range(10))
    assert all(tree_size([rows[i] for i in p]) <= 70 for p in packs)
    assert {frozenset(p) for p in packs} == {frozenset(range(6)), frozenset(range(6, 10))}
    assert plan_packs([[1] * 100], budget=10) == [[0]]  # a row longer than the budget is a pack of its own


def test_tree_mask_runs_sdpa_run_by_run_and_is_dense_to_anything_else(monkeypatch):
    rows = [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 6], [9, 8]]
    tree = build_tree(rows, [3, 3, 2, 1])
    mask = packing.TreeMask(tree, torch.float32, torch.device("cpu"))
    assert mask.shape == (1, 1, 9, 9) and mask.dtype is torch.float32
    dense = packing._dense_mask(tree, torch.float32, torch.device("cpu"))
    assert torch.equal(mask + 0, dense) and torch.equal(mask[..., :4, :4], dense[..., :4, :4])
    assert [(a, b, anc.tolist()) for a, b, anc in tree.segments] == [
        (0, 4, []),
        (4, 6, [0, 1]),
        (6, 7, [0, 1]),
        (7, 9, []),
    ]
    q, k, v = (torch.randn(1, 2, 9, 4) for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    torch.testing.assert_close(sdpa(q, k, v, attn_mask=mask), sdpa(q, k, v, attn_mask=dense))
    model = tiny_model(tiny_tokenizer(), seed=11)
    assert packing_support(model) is None
    calls, run_by_run = [], packing._tree_attention
    monkeypatch.setattr(packing, "_tree_attention", lambda *a, **kw: calls.append(1) or run_by_run(*a, **kw))
    with torch.no_grad():
        completion_logprobs(model, [[5, 6, 7], [5, 6]], [[8, 9], [10]])
    assert len(calls) == model.config.num_hidden_layers  # every layer's SDPA call took the run-by-run path


# -- equality with the plain forward ------------------------------------------------------------------------
@pytest.mark.parametrize("budget", [100_000, 60], ids=["one-pack", "several-packs-recomputed"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_packed_logprobs_loss_and_gradients_equal_the_plain_forward(budget, temperature):
    model = tiny_model(tiny_tokenizer(), seed=4)
    prompts, completions = ragged_rows(model.config.vocab_size)
    keep = [i for i, c in enumerate(completions) if c]
    plain = loss_and_grads(
        model, lambda: plain_scores(model, [prompts[i] for i in keep], [completions[i] for i in keep], temperature).logprobs
    )  # fmt: skip
    packed = loss_and_grads(
        model,
        lambda: [lp for lp in completion_logprobs(model, prompts, completions, temperature, budget=budget) if len(lp)],
    )
    packs = plan_packs([p + c for p, c in zip(prompts, completions, strict=True) if c], budget)
    assert (len(packs) > 1) == (budget == 60)
    assert_same(plain, packed)


def test_entropies_and_top1_equal_the_plain_forward():
    model = tiny_model(tiny_tokenizer(), seed=5)
    prompts, completions = ragged_rows(model.config.vocab_size, seed=1)
    keep = [i for i, c in enumerate(completions) if c]
    prompts, completions = [prompts[i] for i in keep], [completions[i] for i in keep]
    with torch.no_grad():
        plain = plain_scores(model, prompts, completions, 0.8)
        packed = completion_scores(model, prompts, completions, 0.8)
    for a, b in zip(plain.entropies, packed.entropies, strict=True):
        torch.testing.assert_close(b, a, atol=2e-5, rtol=1e-5)
    assert [t.tolist() for t in plain.top1] == [t.tolist() for t in packed.top1]


def test_eager_attention_and_another_family_take_the_mask():
    from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

    tok = tiny_tokenizer()
    eager = tiny_model(tok, seed=6)
    eager.config._attn_implementation = "eager"
    torch.manual_seed(0)
    qwen = Qwen2ForCausalLM(
        Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    )  # fmt: skip
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=4, n_positions=1024,
                                      resid_pdrop=0, embd_pdrop=0, attn_pdrop=0))  # fmt: skip
    for model in (eager, qwen, gpt2):  # GPT-2: absolute position embeddings, so left padding must not shift them
        assert packing_support(model) is None
        prompts, completions = ragged_rows(model.config.vocab_size, seed=2)
        keep = [i for i, c in enumerate(completions) if c]
        prompts, completions = [prompts[i] for i in keep], [completions[i] for i in keep]
        plain = loss_and_grads(model, lambda m=model, p=prompts, c=completions: plain_scores(m, p, c).logprobs)
        packed = loss_and_grads(model, lambda m=model, p=prompts, c=completions: completion_logprobs(m, p, c))
        assert_same(plain, packed)


def test_models_that_cannot_take_the_mask_fall_back_with_a_logged_reason(caplog):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = tiny_tokenizer()
    windowed = Qwen2ForCausalLM(
        Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True, sliding_window=16,
                    max_window_layers=0)
    )  # fmt: skip

    class IgnoresPositions(torch.nn.Module):  # a model whose forward drops the position ids
        def __init__(self, inner):
            super().__init__()
            self.inner, self.config = inner, inner.config

        def forward(self, position_ids=None, **kwargs):
            return self.inner(**kwargs)

    blind = IgnoresPositions(tiny_model(tok, seed=7))
    for model, reason in ((windowed, "sliding"), (blind, "differ")):
        with caplog.at_level(logging.WARNING, logger="envace_gym.training.packing"):
            assert reason in packing_support(model)
        assert "shared-prefix packing is off" in caplog.text and reason in caplog.text
        caplog.clear()
        prompts, completions = [[5, 6, 7, 8], [5, 6, 7]], [[9, 10], [11]]
        with torch.no_grad():
            got = completion_logprobs(model, prompts, completions)
            want = plain_scores(model, prompts, completions).logprobs
        for a, b in zip(want, got, strict=True):
            torch.testing.assert_close(b, a)
        assert packing_support(model) is not None and not caplog.text  # decided once, logged once


# -- the trainers use it --------------------------------------------------------------------------------
def test_trl_trainer_logprobs_and_gradients_equal_trls_own_forward(tiny_path, tmp_path):
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from envace_gym.integrations import trl as envace_trl

    args = envace_trl.EnvACEGRPOConfig(
        output_dir=str(tmp_path), domain="units", per_device_train_batch_size=2, num_generations=2,
        max_completion_length=8, max_steps=1, use_cpu=True, bf16=False, report_to="none", save_strategy="no",
    )  # fmt: skip
    trainer = envace_trl.EnvACEGRPOTrainer(
        model=tiny_path, args=args, processing_class=AutoTokenizer.from_pretrained(tiny_path)
    )
    prompts, completions = ragged_rows(trainer.model.config.vocab_size, seed=3)
    width_p, width_c = max(map(len, prompts)), max(map(len, completions))
    ids = torch.zeros((len(prompts), width_p + width_c), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):  # TRL's layout
        ids[i, width_p - len(p) : width_p], mask[i, width_p - len(p) : width_p] = torch.tensor(p), 1
        ids[i, width_p : width_p + len(c)], mask[i, width_p : width_p + len(c)] = torch.tensor(c, dtype=torch.long), 1

    def run(fn):
        model = trainer.model
        model.zero_grad(set_to_none=True)
        logps, entropies, _ = fn(model, ids, mask, width_c, compute_entropy=True)
        (logps * mask[:, width_p:]).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return logps.detach() * mask[:, width_p:], entropies.detach() * mask[:, width_p:], grads

    theirs = run(lambda *a, **k: GRPOTrainer._get_per_token_logps_and_entropies(trainer, *a, **k))
    ours = run(trainer._get_per_token_logps_and_entropies)
    torch.testing.assert_close(ours[0], theirs[0], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(ours[1], theirs[1], atol=2e-5, rtol=1e-5)
    for name, g in theirs[2].items():
        torch.testing.assert_close(ours[2][name], g, atol=2e-5 * max(1.0, float(g.abs().max())), rtol=1e-4, msg=name)
    # The real-tools baseline's trainer computes its log-probs the same way.
    mixin = envace_trl.SharedPrefixMixin._get_per_token_logps_and_entropies
    assert envace_trl.PackedGRPOTrainer._get_per_token_logps_and_entropies is mixin


@pytest.mark.slow
def test_sft_trainer_loss_and_gradients_equal_trls_own(tmp_path):
    from trl import SFTConfig, SFTTrainer

    from envace_gym.integrations.trl import PackedSFTTrainer
    from envace_gym.training import sft_dataset

    policy = tiny_policy(seed=8)
    dataset = sft_dataset("bank", policy.tokenizer, "train", 2)
    args = SFTConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=4, completion_only_loss=True, max_length=None,
        use_cpu=True, report_to="none", save_strategy="no",
    )  # fmt: skip
    trainer = PackedSFTTrainer(
        model=policy.model, args=args, train_dataset=dataset.remove_columns(["role", "task_id"]),
        processing_class=policy.tokenizer, row_groups=dataset["task_id"],
    )  # fmt: skip
    batch = next(iter(trainer.get_train_dataloader()))
    num_items = (batch["labels"] != -100).sum()

    def run(compute):
        trainer.model.zero_grad(set_to_none=True)
        loss = compute(trainer.model, dict(batch), num_items_in_batch=num_items)
        loss.backward()
        return float(loss), {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}

    theirs = run(lambda *a, **k: SFTTrainer.compute_loss(trainer, *a, **k))
    ours = run(trainer.compute_loss)
    assert ours[0] == pytest.approx(theirs[0], rel=1e-5)
    for name, g in theirs[1].items():
        torch.testing.assert_close(ours[1][name], g, atol=2e-6, rtol=1e-4, msg=name)
    assert trainer._metrics["train"]["mean_token_accuracy"][0] == pytest.approx(
        trainer._metrics["train"]["mean_token_accuracy"][1]
    )


def test_task_grouped_sampler_keeps_each_tasks_rows_together_and_reshuffles_by_epoch():
    from envace_gym.integrations.trl import TaskGroupedSampler

    groups = ["a", "a", "b", "c", "c", "c", "b"]
    sampler = TaskGroupedSampler(groups, seed=0)
    orders = []
    for epoch in range(6):
        sampler.set_epoch(epoch)
        order = list(sampler)
        assert sorted(order) == list(range(len(groups)))
        runs = [groups[i] for k, i in enumerate(order) if k == 0 or groups[order[k - 1]] != groups[i]]
        assert sorted(runs) == ["a", "b", "c"]  # each task's rows in one run
        orders.append(order)
    assert len({tuple(o) for o in orders}) > 1
    sampler.set_epoch(2)
    assert list(sampler) == orders[2]


@pytest.mark.slow
def test_custom_trainer_packed_and_plain_steps_agree():
    from envace_gym.training.trainer import TrainerConfig, train

    results = {}
    for packing_on in (True, False):
        policy = tiny_policy(seed=1)
        config = TrainerConfig(
            domain="units", steps=1, tasks_per_step=2, group_size=2, max_new_tokens=12, shared_prefix=packing_on
        )
        history = train(policy, config)
        results[packing_on] = (history[0], [p.detach().clone() for p in policy.model.parameters()])
    (h_packed, w_packed), (h_plain, w_plain) = results[True], results[False]
    assert h_packed["tokens/trained"] == h_plain["tokens/trained"] > 0
    assert h_packed["loss"] == pytest.approx(h_plain["loss"], abs=1e-5)
    for a, b in zip(w_packed, w_plain, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


# -- the compute dtype -----------------------------------------------------------------------------------
def test_auto_dtype_follows_native_bf16(monkeypatch):
    assert precision.resolve_dtype("float32") is torch.float32
    assert precision.resolve_dtype("bfloat16") is torch.bfloat16
    monkeypatch.setattr(precision, "native_bf16", lambda device_type="cpu": False)
    assert precision.resolve_dtype("auto") is torch.float32
    monkeypatch.setattr(precision, "native_bf16", lambda device_type="cpu": True)
    assert precision.resolve_dtype("auto") is torch.bfloat16 and precision.resolve_dtype(None) is torch.bfloat16
    assert precision.dtype_name(torch.bfloat16) == "bfloat16"
    with pytest.raises(ValueError, match="dtype must be one of"):
        precision.resolve_dtype("fp8")


@pytest.mark.skipif(not Path("/proc/cpuinfo").is_file(), reason="reads the CPU's flags from /proc/cpuinfo")
def test_native_bf16_is_the_cpus_bf16_flag():
    flags = set().union(*(line.split(":")[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")))
    assert precision.native_bf16("cpu") == bool({"avx512_bf16", "amx_bf16"} & flags)


@pytest.mark.slow
def test_auto_dtype_is_the_same_in_every_fresh_process():
    code = "from envace_gym.policy.precision import resolve_dtype; print(resolve_dtype('auto'))"
    seen = [
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()
        for _ in range(10)
    ]
    assert len(set(seen)) == 1 and seen[0] in ("torch.float32", "torch.bfloat16"), seen


BF16_TOLERANCE = 0.1  # nats: bfloat16's 8-bit mantissa, incremental decoding vs one forward (stated in docs)


def test_bf16_rollout_logprobs_agree_with_the_bf16_training_forward():
    from envace_gym.policy import SamplingParams

    policy = tiny_policy(seed=9).with_compute_dtype(torch.bfloat16)
    prompts = [list(range(5, 25)), list(range(5, 18)) + [40, 41]]
    gens = policy.generate(prompts, SamplingParams(max_new_tokens=12, temperature=1.0, seed=0))
    with torch.no_grad(), precision.autocast(torch.bfloat16):
        fresh = completion_logprobs(policy.model, prompts, [g.completion_ids for g in gens])
    for g, lp in zip(gens, fresh, strict=True):
        assert len(g.logprobs) == len(lp) > 0
        assert float((torch.tensor(g.logprobs) - lp).abs().max()) <= BF16_TOLERANCE
    fp32 = tiny_policy(seed=9)
    assert fp32.with_compute_dtype(None) is fp32 and fp32.compute_dtype is None


def test_unwrap_finds_the_model_inside_distributed_wrappers():
    model = tiny_model(tiny_tokenizer(), seed=10)

    class Wrapper(torch.nn.Module):  # what DDP, FSDP and DeepSpeed look like from outside
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, **kwargs):
            return self.module(**kwargs)

    wrapped = Wrapper(Wrapper(model))
    assert packing.unwrap(wrapped) is model
    with torch.no_grad():
        got = completion_logprobs(wrapped, [[5, 6, 7]], [[8, 9]])
        want = plain_scores(model, [[5, 6, 7]], [[8, 9]]).logprobs
    torch.testing.assert_close(got[0], want[0], atol=2e-5, rtol=1e-5)


def _ddp_worker(rank: int, world: int, store: str, queue) -> None:
    import faulthandler
    from datetime import timedelta

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from envace_gym.training.distributed import end_distributed

    stacks = open(f"{store}.rank{rank}.stacks", "w")  # noqa: SIM115  (open until the process ends)
    faulthandler.dump_traceback_later(60, file=stacks)  # where a hung rank waits, for the failure message

    torch.set_num_threads(1)  # two ranks on two cores: more threads each oversubscribe them (the test stalled so)
    # A file rendezvous: no port to race for (a free port picked here can be taken before both ranks bind it, and
    # the ranks then wait for each other until gloo's 30-minute default), and a short timeout if one rank is lost.
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))  # fmt: skip
    prompts, completions = ragged_rows(len(tiny_tokenizer()), seed=rank)
    keep = [i for i, c in enumerate(completions) if c]
    prompts, completions = [prompts[i] for i in keep], [completions[i] for i in keep]
    grads = {}
    for budget in (100_000, 60):  # one pack, then several packs recomputed in the backward pass
        model = DistributedDataParallel(tiny_model(tiny_tokenizer(), seed=0))
        logps = completion_logprobs(model, prompts, completions, budget=budget)
        sum(lp.sum() * (i + 1) for i, lp in enumerate(logps)).backward()
        grads[budget] = {n: p.grad.clone() for n, p in model.module.named_parameters()}
    worst = max(float((grads[100_000][n] - grads[60][n]).abs().max()) for n in grads[60])
    scale = max(float(g.abs().max()) for g in grads[60].values())
    queue.put((rank, worst, scale))
    del model  # the DDP model goes before the process group (envace_gym.training.distributed says why)
    end_distributed()
    faulthandler.cancel_dump_traceback_later()


@pytest.mark.slow
def test_recomputed_packs_under_ddp_give_the_same_synchronized_gradients(tmp_path):
    import time

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue, store = ctx.SimpleQueue(), tmp_path / "store"
    workers = mp.start_processes(_ddp_worker, args=(2, str(store), queue), nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + 150  # a run takes ~10 s; a hung rank fails the test instead of stalling the suite
    while not workers.join(timeout=2) and time.monotonic() < deadline:
        pass
    if any(process.is_alive() for process in workers.processes):
        for process in workers.processes:
            process.kill()
        where = [p.read_text()[-1500:] for p in sorted(tmp_path.glob("store.rank*.stacks"))]
        pytest.fail("the two DDP ranks did not finish within 150 s; where they waited:\n" + "\n".join(where))
    results = [queue.get() for _ in range(2)]
    for _rank, worst, scale in results:
        assert scale > 0 and worst <= 1e-5 * max(1.0, scale)
