"""`pip install .` (not only editable) gives a package whose env id and built-in domains work anywhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CHECK = """
import gymnasium as gym, envace_gym
from envace_gym import make_domain
env = gym.make("envace_gym:EnvACE-Rehearsal-v0")
print(envace_gym.__file__)
for name in ("units", "bank", "travel"):
    d = make_domain(name)
    print(name, len(d.tools), d.tasks("train")[0].id)
"""


@pytest.mark.slow
def test_wheel_install_works_from_another_directory(tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(ROOT)],
        check=True,
        cwd=tmp_path,
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run(
        [sys.executable, "-c", CHECK], check=True, cwd=tmp_path, env=env, capture_output=True, text=True
    ).stdout
    lines = out.splitlines()
    assert lines[0].startswith(str(target))  # the installed copy, not the source tree
    assert lines[1:] == ["units 3 units/train/000", "bank 4 bank/train/000", "travel 4 travel/train/000"]
