"""Package discovery. Everything else is in pyproject.toml.

The built-in domains live in the top-level ``envs/`` folder and install as ``envace_gym.envs``, a mapping that
``[tool.setuptools.packages.find]`` cannot express; so the packages are found here, under both roots, and a new
subpackage of either is in the wheel without anyone listing it.
"""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["envace_gym", "envace_gym.*"])
    + ["envace_gym.envs"]
    + [f"envace_gym.envs.{name}" for name in find_packages("envs")],
)
