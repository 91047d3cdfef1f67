"""fi_jax entry point: `python main.py [--config=configs/x.py[:arg]] [--config.field=value] --workdir=DIR`.

Without --config it runs the embedded demo (configs/demo.py). The logic is fi_jax/run/cli.py (also
the `fi-jax` console script of `pip install .`). See README.md.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # this checkout's fi_jax, configs

if __name__ == "__main__":
  from fi_jax.run import cli
  cli.entry()
