"""Training speed benchmark: the same as `envace bench --train`, runnable as a script.

python benchmarks/train_speed.py                        # the embedded default model (about an hour on 2 CPU cores)
python benchmarks/train_speed.py --model tiny --quick   # a quick look with the random test model
"""

import sys

from envace_gym.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "--train", *sys.argv[1:]]))
