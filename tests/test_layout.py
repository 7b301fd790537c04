"""The package's layout holds: the import-layer contract, torch-free early stages, no private access across
modules, and the names each subpackage re-exports (docs/design.md, "Layout")."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "envace_gym"


def test_import_contract_holds():
    """The pipeline's layers and no cycles, as pyproject.toml's [tool.importlinter] states them."""
    lint_imports = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint_imports)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_early_stages_import_without_torch():
    """tools, parsing, domains (and the package itself, its ids and domains) import with torch unavailable."""
    code = (
        "import sys; sys.modules['torch'] = None\n"  # `import torch` now raises ImportError
        "import gymnasium as gym\n"
        "import envace_gym, envace_gym.tools, envace_gym.parsing, envace_gym.domains\n"
        "from envace_gym import ToolRegistry, SamplingParams, make_domain\n"
        "assert 'EnvACE-Rehearsal-v0' in gym.registry\n"
        "domain = make_domain('bank')\n"
        "call = envace_gym.ToolCall('get_balance', {'account_id': 'ACC-1001'})\n"
        "assert domain.tools.validate(call).ok\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_builtin_domains_build_on_the_early_stages_only():
    """envs/ installs as envace_gym.envs, outside the contract's graph (lint-imports reads envace_gym/): its
    domains import only what any user's domain would, the stages up to domains (no torch, no episode)."""
    allowed = ("envace_gym.errors", "envace_gym.text", "envace_gym.tools", "envace_gym.parsing", "envace_gym.domains")
    found = []
    for path in sorted((ROOT / "envs").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            for name in names:
                if name.startswith("envace_gym") and not name.startswith(allowed):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert not found, found


def _imported(tree: ast.Module) -> list[tuple[int, str]]:
    """Every absolute module a module imports, at module level or inside functions, with its line."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.append((node.lineno, node.module or ""))
    return found


def test_training_is_plain_torch():
    """TRL's trainers and their configs live in integrations/trl/, where TRL's users look for them: training/
    (the pure-torch trainer, the SFT rows, the shared-prefix forward) imports no trl."""
    found = [
        f"{path}:{line} {name}"
        for path, tree in _modules().items()
        if path.startswith("envace_gym/training/")
        for line, name in _imported(tree)
        if name == "trl" or name.startswith("trl.")
    ]
    assert not found, found
    trainers = [p for p in (PACKAGE / "integrations" / "trl").glob("*_trainer.py")]
    assert {p.name.replace("_trainer", "_config") for p in trainers} <= {
        p.name for p in (PACKAGE / "integrations" / "trl").glob("*_config.py")
    }  # a config module beside each trainer module, as TRL lays them out


def _modules() -> dict[str, ast.Module]:
    return {str(p.relative_to(ROOT)): ast.parse(p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))}


def _private_attributes(tree: ast.Module) -> set[str]:
    """The private attributes a module's classes define: ``self._x = ...``, class-level ``_x``, ``def _x``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("_"):
                    names.add(item.name)
                elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                    targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                    names |= {t.id for t in targets if isinstance(t, ast.Name) and t.id.startswith("_")}
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            if isinstance(node.ctx, ast.Store) and node.attr.startswith("_"):
                names.add(node.attr)
    return {n for n in names if not (n.startswith("__") and n.endswith("__"))}


def test_no_private_attribute_access_across_modules():
    """A module reads or writes ``obj._x`` only where ``_x`` is its own: another module's private state is
    reached through public methods (the vector env steps its envs, the planner forks episodes, that way)."""
    modules = _modules()
    owned = {path: _private_attributes(tree) for path, tree in modules.items()}
    everyone = set().union(*owned.values())
    found = []
    for path, tree in modules.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if node.attr in everyone and node.attr not in owned[path]:
                found.append(f"{path}:{node.lineno} .{node.attr}")
    assert not found, "private attributes of another module's classes:\n" + "\n".join(found)


# The subpackages re-export the names users import from them (a sample per package).
KEPT = {
    "envace_gym.tools": ["ToolCall", "ToolSchema", "ToolRegistry", "ValidationResult", "call_from_json",
                         "canonical_json", "call_key"],
    "envace_gym.parsing": ["parse_act", "parse_execution_result", "Limits", "DEFAULT_LIMITS", "RESULT_CLOSE"],
    "envace_gym.domains": ["Domain", "GeneratedDomain", "FolderDomain", "Task", "ReferenceTurn", "ReferenceRecorder",
                           "Trajectory", "CallRecord", "RewardResult", "make_domain", "register_domain",
                           "list_domains", "SPLITS", "stable_hash", "score_expected"],
    "envace_gym.policy": ["Policy", "SamplingParams", "Generation", "TransformersPolicy", "make_policy",
                          "check_model_source", "stop_token_ids", "END_OF_TURN_TOKENS"],
    "envace_gym.episode": ["Episode", "EpisodeConfig", "GenerationRequest", "Role", "Row", "StepOutcome",
                           "REHEARSAL_MODES"],
    "envace_gym.env": ["RehearsalEnv", "DEFAULT_DOMAIN"],
    "envace_gym.rollout": ["collect_rollouts", "RolloutBatch", "EpisodeResult", "ACT_SOURCES"],
    "envace_gym.cli": ["main", "build_parser"],
}  # fmt: skip


@pytest.mark.parametrize("package", sorted(KEPT))
def test_subpackages_keep_the_old_modules_names(package):
    module = importlib.import_module(package)
    missing = [name for name in KEPT[package] if not hasattr(module, name)]
    assert not missing, f"{package} lost {missing}"


def test_a_name_is_exported_from_its_home_only():
    """The canonical forms are the tools' (``envace_gym.tools``); parsing does not re-export them."""
    import envace_gym.parsing

    assert not {"call_key", "canonical", "canonical_json"} & set(dir(envace_gym.parsing))


