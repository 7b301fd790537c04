"""The package as users install it: the wheel and the sdist hold every module of the source tree, and the
unpacked wheel (not the editable checkout) imports, makes every built-in domain's env and runs the CLI."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Every module and every package, imported from the unpacked wheel; every built-in domain made through
# gym.make (the benchmark families where their data is installed); the console script's entry point run.
CHECK = """
import importlib, importlib.metadata, pkgutil, sys
import gymnasium as gym
import envace_gym
from envace_gym.testing import tiny_policy

print(envace_gym.__file__)
modules = [m.name for m in pkgutil.walk_packages(envace_gym.__path__, "envace_gym.")]
for name in modules:
    if not name.endswith(".__main__"):  # runs the CLI: the console script below stands for it
        importlib.import_module(name)
print(len(modules), "modules")
policy = tiny_policy(seed=0)
for domain in sys.argv[1:]:
    env = gym.make("envace_gym:EnvACE-Rehearsal-v0", domain=domain, policy=policy)
    if ":" in domain:  # a benchmark's tasks are longer than the tiny policy's context: built, not played
        print(domain, env.unwrapped.domain.name)
        continue
    obs, info = env.reset(seed=0)
    print(domain, info["task"]["domain"], type(obs).__name__)
(script,) = [e for e in importlib.metadata.distribution("envace-gym").entry_points if e.group == "console_scripts"]
print(script.name, script.value)
raise SystemExit(script.load()(["domains"]))
"""


def _sources() -> set[str]:
    """Every file the package installs, as its path inside the wheel (``envs/`` installs as ``envace_gym/envs``)."""
    files = {p.relative_to(ROOT).as_posix() for p in (ROOT / "envace_gym").rglob("*") if p.suffix in (".py", ".typed")}
    files |= {"envace_gym/envs/" + p.relative_to(ROOT / "envs").as_posix() for p in (ROOT / "envs").rglob("*.py")}
    return files


# A copy of the tree without what earlier builds and runs left: setuptools would reuse a stale build/lib.
LEFTOVERS = shutil.ignore_patterns(
    ".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis", "runs", "outputs"
)


def _build(kind: str, tree: Path, out: Path) -> Path:
    """Build a wheel or an sdist with setuptools' PEP 517 hooks (what ``pip wheel`` / ``python -m build`` call)."""
    code = f"from setuptools import build_meta; print(build_meta.build_{kind}({str(out)!r}))"
    name = subprocess.run(
        [sys.executable, "-c", code], cwd=tree, check=True, capture_output=True, text=True
    ).stdout.splitlines()[-1]
    return out / name


def _domains() -> list[str]:
    names = ["units", "bank", "travel", "lights"]
    if importlib.util.find_spec("bfcl_eval"):
        names.append("bfcl:simple_python")
    if importlib.util.find_spec("tau2"):
        names.append("tau2:retail")
    return names


@pytest.mark.slow
def test_the_wheel_and_sdist_hold_every_module_and_the_unpacked_wheel_works(tmp_path):
    tree = Path(shutil.copytree(ROOT, tmp_path / "tree", ignore=LEFTOVERS))
    wheel = _build("wheel", tree, tmp_path)
    sdist = _build("sdist", tree, tmp_path)
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    assert _sources() <= in_wheel, f"not in the wheel: {sorted(_sources() - in_wheel)}"
    prefix = sdist.name.removesuffix(".tar.gz") + "/"
    in_sdist = {n.removeprefix(prefix) for n in tarfile.open(sdist).getnames()}
    in_tree = {p.replace("envace_gym/envs/", "envs/", 1) for p in _sources()}
    assert in_tree <= in_sdist, f"not in the sdist: {sorted(in_tree - in_sdist)}"

    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    domains = _domains()
    env = {**os.environ, "PYTHONPATH": str(site)}
    run = subprocess.run(
        [sys.executable, "-c", CHECK, *domains], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert lines[0].startswith(str(site))  # the unpacked wheel's copy, not the source tree
    assert lines[1] == f"{len([p for p in _sources() if p.endswith('.py')]) - 1} modules"  # all but the root
    assert lines[2 : 2 + len(domains)] == [f"{d} {d}" + ("" if ":" in d else " str") for d in domains]
    assert lines[2 + len(domains)] == "envace envace_gym.cli:main"
    assert all(d.split(":")[0] in run.stdout for d in ("units", "bank", "travel", "lights", "tau2"))
