"""The sweep's overhead: the smoke sweep (configs/sweep.py:smoke, three tiny random-weight
models on the digits) as one `python -m fi_jax.run.sweep` against its models run one by one
with `python main.py`, each into a fresh workdir.

    .venv/bin/python bench/sweep.py [--repeats 3]

The smoke files are written first (tests/helpers/sweep_smoke.py: timm and torch write the
checkpoints). One untimed sweep warms the persistent compilation cache, so that neither side
pays for compiling; then `--repeats` rounds alternate the two sides (sweep first in even
rounds, one-by-one first in odd ones). Each main.py run reads the exact config the sweep
builds for that model (a config file calling `fi_jax.run.sweep.build_models`). Printed: the
wall time of each side per round, their medians, the ratio sweep / one-by-one (overhead =
ratio - 1; target < 5%), the time the sweep's leaderboard takes on its own (included in the
sweep's time; the one-by-one side writes none), and whether every model's results.json rows
are the same on both sides.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

_MODEL_CONFIG = '''
import sys
sys.path.insert(0, {root!r})
from configs import sweep as sweep_config
from fi_jax.run import sweep


def get_config(arg):
  return sweep.build_models(sweep_config.get_config({spec!r}))[int(arg)].config
'''


def _run(cmd: list[str]) -> float:
  env = {**os.environ, "PYTHONPATH": ROOT}
  t = time.time()
  r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
  seconds = time.time() - t
  if r.returncode != 0:
    raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n"
                       f"{r.stderr[-2000:]}")
  return seconds


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--keep", default="", help="a folder to work in (default: a temporary one)")
  args = p.parse_args()
  root = args.keep or tempfile.mkdtemp(prefix="fi_jax_bench_sweep_")
  os.makedirs(root, exist_ok=True)

  from fi_jax.models import torchvision_shim
  torchvision_shim.install()
  from configs import sweep as sweep_config
  from fi_jax.report import leaderboard, schema
  from fi_jax.run import sweep
  from tests.helpers import sweep_smoke
  files = sweep_smoke.write(os.path.join(root, "files"))
  spec = f"smoke,dir={files}"
  models = sweep.build_models(sweep_config.get_config(spec))
  cfg_file = os.path.join(root, "model_config.py")
  with open(cfg_file, "w") as f:
    f.write(_MODEL_CONFIG.format(root=ROOT, spec=spec))

  def the_sweep(workdir):
    return _run([sys.executable, "-m", "fi_jax.run.sweep",
                 f"--config=configs/sweep.py:{spec}", f"--workdir={workdir}"])

  def one_by_one(workdir):
    return sum(_run([sys.executable, "main.py", f"--config={cfg_file}:{m.index}",
                     f"--workdir={os.path.join(workdir, m.dir)}"]) for m in models)

  print(f"bench/sweep.py: {len(models)} models ({', '.join(m.label for m in models)}), "
        f"{args.repeats} rounds, in {root}", flush=True)
  print(f"warm-up sweep (untimed for the ratio): {the_sweep(os.path.join(root, 'warm')):.1f} s",
        flush=True)
  times: dict[str, list[float]] = {"sweep": [], "one_by_one": []}
  last = {}
  for r in range(args.repeats):
    order = ["sweep", "one_by_one"] if r % 2 == 0 else ["one_by_one", "sweep"]
    for side in order:
      workdir = os.path.join(root, f"{side}_{r}")
      times[side].append(the_sweep(workdir) if side == "sweep" else one_by_one(workdir))
      last[side] = workdir
    print(f"round {r + 1}: sweep {times['sweep'][-1]:.1f} s, one by one "
          f"{times['one_by_one'][-1]:.1f} s", flush=True)
  t = time.time()
  leaderboard.write(last["sweep"], out=os.path.join(root, "board_only"), log=lambda s: None)
  board_s = time.time() - t
  same = all(schema.load(os.path.join(last["sweep"], m.dir))["rows"]
             == schema.load(os.path.join(last["one_by_one"], m.dir))["rows"] for m in models)
  a, b = statistics.median(times["sweep"]), statistics.median(times["one_by_one"])
  print(json.dumps({"sweep_s": times["sweep"], "one_by_one_s": times["one_by_one"]}))
  print(f"median: sweep {a:.1f} s, one by one {b:.1f} s; ratio {a / b:.3f} "
        f"(overhead {100 * (a / b - 1):+.1f}%; target < +5%)")
  print(f"the leaderboard alone (in this process, imports warm): {board_s:.2f} s; "
        f"results rows identical on both sides: {same}")


if __name__ == "__main__":
  main()
