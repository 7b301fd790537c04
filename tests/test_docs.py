"""Every code block in README.md and docs/*.md does what it says, as written.

* ``python`` blocks run, each in a fresh namespace, on the tiny model: the embedded default model is
  swapped for it, so a block that leaves ``policy=`` at its default still runs in CI's time. A block about
  the default model itself is marked ``<!-- doctest: default-model -->`` on the line above its fence and
  runs on the real one (few: they are slow). ``<!-- doctest: needs-benchmarks -->`` marks a block that
  needs ``make benchmarks``; ``<!-- doctest: slow -->`` one that takes more than ~5 s (``make test-fast`` skips it).
* ``bash`` blocks: every ``envace ...`` command parses with the CLI's own parser (flags and values exist;
  the commands themselves train for minutes to hours), every ``make`` target exists in the Makefile and
  every script they run is in the repository.
* ``json`` blocks parse.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from envace_gym.cli import build_parser
from envace_gym.cli.main import COMMANDS, parse_command
from envace_gym.policy import default_model as models

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(?:<!-- doctest: (?P<mark>[\w-]+) -->\n)?^```(?P<lang>\w*)\n(?P<code>.*?)^```$", re.M | re.S)


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    mark: str | None
    code: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(lang: str) -> list[Block]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            if m.group("lang") == lang:
                line = text[: m.start("code")].count("\n")
                found.append(Block(page.relative_to(ROOT).as_posix(), line, lang, m.group("mark"), m.group("code")))
    return found


PYTHON = blocks("python")
BASH = blocks("bash")


def test_the_pages_have_blocks_to_check():
    assert len(PYTHON) >= 8 and len(BASH) >= 8 and blocks("json")
    assert {b.mark for b in PYTHON} <= {None, "default-model", "needs-benchmarks", "slow"}


@pytest.fixture
def default_is_tiny(tiny, monkeypatch):
    """The embedded default model, as far as the package can tell, is the tiny one."""
    monkeypatch.setattr(models, "load_default_policy", lambda: tiny)
    monkeypatch.setattr(models, "load_default_tokenizer", lambda: (tiny.tokenizer, tiny.max_context))


def run_block(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    if block.mark == "needs-benchmarks":
        pytest.importorskip("bfcl_eval", reason="BFCL data not installed: make benchmarks")
        pytest.importorskip("tau2", reason="τ²-Bench not installed: make benchmarks")
    monkeypatch.chdir(tmp_path)  # whatever a block writes stays out of the repository
    namespace: dict = {"__name__": "__doc_block__"}
    exec(compile(block.code, str(block), "exec"), namespace)  # our own documentation, not model text
    return namespace


@pytest.mark.parametrize(
    "block",  # a block marked slow (over ~5 s on the tiny model) runs in make test, not make test-fast
    [pytest.param(b, marks=pytest.mark.slow) if b.mark == "slow" else b for b in PYTHON if b.mark != "default-model"],
    ids=str,
)
def test_python_blocks_run_on_the_tiny_model(block, default_is_tiny, tmp_path, monkeypatch):
    run_block(block, tmp_path, monkeypatch)


@pytest.mark.default_model
@pytest.mark.parametrize("block", [b for b in PYTHON if b.mark == "default-model"], ids=str)
def test_python_blocks_about_the_default_model_run_on_it(block, tmp_path, monkeypatch):
    namespace = run_block(block, tmp_path, monkeypatch)
    if block == PYTHON[0]:  # the README's first snippet: the default model's rehearsal is well formed
        call = namespace["call"]
        assert call["route"] == "rehearsal" and call["error"] is None, call


def test_the_readme_opens_with_the_default_model():
    first = PYTHON[0]
    assert first.page == "README.md" and first.mark == "default-model"


def commands(block: Block) -> list[list[str]]:
    """The block's commands, continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n\s*", " ", block.code)
    return [shlex.split(line, comments=True) for line in text.splitlines() if shlex.split(line, comments=True)]


def check_envace(argv: list[str]) -> None:
    if argv[0] in COMMANDS:  # every command's settings object built, as `envace` builds it
        parse_command(argv)
    else:
        build_parser().parse_args(argv)  # --help, or a mistake


@pytest.mark.parametrize("block", BASH, ids=str)
def test_bash_blocks_name_real_commands_flags_and_files(block, tmp_path, monkeypatch):
    makefile = (ROOT / "Makefile").read_text()
    for argv in commands(block):
        while argv and "=" in argv[0] and not argv[0].startswith("-"):  # VAR=value prefixes
            argv = argv[1:]
        if argv[0] == "envace":
            if "--config" in argv:  # the YAML the page talks about: one with a setting of its own
                config = tmp_path / argv[argv.index("--config") + 1]
                config.write_text("seed: 1\n")
                argv[argv.index("--config") + 1] = str(config)
            check_envace(argv[1:])
        elif argv[:3] == ["accelerate", "launch", "--multi_gpu"] and "envace_gym.cli" in argv:
            check_envace(argv[argv.index("envace_gym.cli") + 1 :])
        elif argv[:2] == ["accelerate", "launch"]:  # a script with its files: every one named is in the repository
            named = [a for a in argv[2:] if a.endswith((".py", ".yaml"))]
            assert named and all((ROOT / a).is_file() for a in named), f"{block}: {argv}"
        elif argv[0] == "make":
            for target in argv[1:]:
                if "=" not in target:
                    assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"no make target {target}"
        elif argv[0] == "python":
            assert (ROOT / argv[1]).is_file(), argv
        else:
            assert (ROOT / argv[0]).is_file(), f"{block}: unknown command {argv[0]}"


@pytest.mark.parametrize("block", blocks("json"), ids=str)
def test_json_blocks_parse(block):
    json.loads(block.code)


def _table_names(page: str, heading: str) -> set[str]:
    """The backticked names in the first column of the first table after ``heading`` in ``page``."""
    text = (ROOT / page).read_text(encoding="utf-8")
    table = re.search(r"\n((?:\|.*\|\n)+)", text[text.index(heading) :]).group(1)
    return {name for row in table.splitlines()[2:] for name in re.findall(r"`([\w.]+)`", row.split("|")[1])}


def test_the_info_table_names_every_key_an_episode_reports():
    """docs/environment.md's `info` table against what reset, a step and three endings (one whose score raises, one
    whose simulated user cannot be used) actually put in info."""
    import gymnasium as gym

    from envace_gym import ToolCall, UserSimulator
    from envace_gym.testing import ScriptedPolicy

    seen: set[str] = set()
    for score_raises in (False, True):
        env = gym.make("EnvACE-Rehearsal-v0", domain="bank", policy=ScriptedPolicy([]), executor="real")
        if score_raises:
            env.unwrapped.domain.score = lambda task, trajectory: 1 / 0
        seen |= set(env.reset(seed=0, options={"task": "bank/000"})[1])
        seen |= set(env.step(ToolCall("find_accounts", {"owner": "Nobody"}).to_text())[4])
        seen |= set(env.step("Done.")[4])
    env = gym.make("EnvACE-Rehearsal-v0", domain="travel", policy=ScriptedPolicy([]), executor="real",
                   user=UserSimulator(ScriptedPolicy([""])))  # fmt: skip
    env.reset(seed=0)
    seen |= set(env.step("Which date?")[4])
    assert {"reward_error", "user_error"} <= seen <= _table_names("docs/environment.md", "## `info`"), seen


def test_the_trajectory_table_is_the_trajectory():
    """docs/domains.md documents what a reward reads: every field of Trajectory (and valid_calls), no other."""
    from dataclasses import fields

    from envace_gym.domains import Trajectory

    documented = _table_names("docs/domains.md", "What `score` reads")
    assert documented == {f.name for f in fields(Trajectory)} | {"valid_calls"}


def test_the_metric_table_is_the_one_definition():
    """docs/training.md's metric table is envace_gym.training.metrics' own, and the pure-torch trainer logs every
    name it says that trainer logs (the TRL trainer's names: tests/test_training.py)."""
    from envace_gym.testing import tiny_policy
    from envace_gym.training.trainer import TrainerConfig, train
    from envace_gym.training.metrics import STEP_METRICS, metrics_table

    text = (ROOT / "docs" / "training.md").read_text()
    block = re.search(r"<!-- metrics-table:[^>]*-->\n(.*?)\n<!-- /metrics-table -->", text, re.S)
    assert block is not None and block.group(1) == metrics_table()
    config = TrainerConfig(domain="units", steps=1, tasks_per_step=1, group_size=2, max_new_tokens=6)
    (step,) = train(tiny_policy(seed=0), config)
    assert set(step) == set(STEP_METRICS)


def test_the_episode_settings_table_is_the_one_definition():
    """docs/environment.md's table of episode settings is envace_gym.episode.config's own (their help, once)."""
    from envace_gym.episode.config import settings_table

    text = (ROOT / "docs" / "environment.md").read_text()
    block = re.search(r"<!-- settings-table:[^>]*-->\n(.*?)\n<!-- /settings-table -->", text, re.S)
    assert block is not None and block.group(1) == settings_table()
