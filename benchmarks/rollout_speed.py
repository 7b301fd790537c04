"""Rollout speed benchmark: the same as `envace bench`, runnable as a script.

python benchmarks/rollout_speed.py                 # the embedded default model (minutes on a CPU)
python benchmarks/rollout_speed.py --model tiny    # a quick look with the random test model
"""

import sys

from envace_gym.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
