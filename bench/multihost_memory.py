"""Peak resident memory of the extraction stage with 1 process and with 2 processes.

    .venv/bin/python bench/multihost_memory.py                  # 5 sets x 1797 rows x 131k floats
    .venv/bin/python bench/multihost_memory.py --width 32768 --ood_sets 1   # smaller

Runs `fi_jax.run.extract_cached` (the benchmark's extraction stage: the lazily built model, the
jitted sharded forward, the data pipeline, per-process cache entries and shards) on sets of
sklearn's bundled digits (1797 images each, no download) through a random-weight model whose
features are `--width` floats wide, so that the extracted arrays dominate the memory:

  * 1 process x 8 CPU devices, then
  * 2 processes x 4 CPU devices (jax.distributed on loopback, coordinator on 127.0.0.1).

How memory is measured, inside each process: after the imports and the distributed setup,
the process writes "5" to /proc/self/clear_refs, which resets its peak resident set size
(VmHWM) to the current one; after the stage it reads VmHWM from /proc/self/status (the largest
resident set the process had during the stage, including what it held before: the Python,
JAX and TensorFlow runtime). Also printed: VmRSS before the stage and the bytes of the arrays
the process holds at the end. The acceptance target is a 2-process peak (per process, the
larger of the two) at most 0.6x the 1-process peak. Memory does not depend on the machine's
load; the printed times do.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import ml_collections  # noqa: E402

from configs import common  # noqa: E402
from fi_jax.common import distributed
from fi_jax.data import loader as data
from fi_jax.run import benchmark as run
from fi_jax.run import jax_cache
from fi_jax.run import model as run_model


def _status(key: str) -> int:
  """A /proc/self/status field in bytes (VmHWM, VmRSS)."""
  with open("/proc/self/status", encoding="ascii") as f:
    for line in f:
      if line.startswith(key + ":"):
        return int(line.split()[1]) * 1024
  raise KeyError(key)


def _reset_peak() -> bool:
  """Resets VmHWM to the current VmRSS (Linux >= 4.0); False where that is not allowed."""
  try:
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
      f.write("5")
    return True
  except OSError:
    return False


def worker(args) -> None:
  """One process of a run: the extraction stage, then one JSON line with its memory."""
  jax.config.update("jax_num_cpu_devices", args.devices)   # before any JAX computation
  if args.nproc > 1:
    distributed.initialize(f"127.0.0.1:{args.port}", args.nproc, args.pid, timeout_s=120)
  c = common.base_config()
  c.model_name = "bench.multihost_memory_model"
  c.model = ml_collections.ConfigDict(dict(width=args.width, num_classes=10))
  c.init_shape = (1, 8, 8, 1)
  c.pp = "value_range(-1, 1, 0, 16)"
  c.batch_size = args.batch
  c.cache_shard_size = args.shard
  c.compilation_cache_dir = ""
  digits = dict(source="digits", split="all", classes=tuple(range(10)))
  c.id_fit = ml_collections.ConfigDict(digits)
  c.id_test = ml_collections.ConfigDict(digits)
  c.ood = ml_collections.ConfigDict({f"all_{i}": dict(digits) for i in range(args.ood_sets)})
  jax_cache.use("")
  data._tf()  # TF, which reads the sets, is in the baseline
  before = _status("VmRSS")
  reset = _reset_peak()
  t = time.time()
  sets = run.extract_cached(c, run_model.LazyModel(c, lambda s: None, args.workdir), args.workdir,
                          lambda s: None, {})
  seconds = time.time() - t
  peak = _status("VmHWM")
  held = sum(v.nbytes for a in sets.values() for v in a.values())
  rows = sum(len(a["logits"]) for a in sets.values())
  distributed.sync("bench done")
  print("RESULT " + json.dumps(dict(process=args.pid, processes=args.nproc, peak=peak,
                                    rss_before=before, peak_reset=reset, held=held, rows=rows,
                                    seconds=round(seconds, 1))), flush=True)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def launch(nproc: int, devices: int, args) -> list[dict]:
  """`nproc` local worker processes of `devices` CPU devices each; their RESULT lines."""
  port = _free_port()
  workdir = tempfile.mkdtemp(prefix=f"fi_jax_mem{nproc}_")
  env = {**os.environ, "XLA_FLAGS": "", "JAX_NUM_CPU_DEVICES": str(devices),
         "PYTHONPATH": ROOT}
  flags = [f"--width={args.width}", f"--ood_sets={args.ood_sets}", f"--batch={args.batch}",
           f"--shard={args.shard}", f"--devices={devices}", f"--nproc={nproc}",
           f"--port={port}", f"--workdir={workdir}"]
  procs = [subprocess.Popen([sys.executable, __file__, "--worker", f"--pid={i}", *flags],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(nproc)]
  try:
    outs = [p.communicate(timeout=args.timeout)[0] for p in procs]
  finally:
    for p in procs:
      p.kill()
    subprocess.run(["rm", "-rf", workdir], check=False)
  results = []
  for p, out in zip(procs, outs):
    lines = [l for l in out.splitlines() if l.startswith("RESULT ")]
    if p.returncode or not lines:
      raise RuntimeError(f"worker failed (rc {p.returncode}):\n{out[-3000:]}")
    results.append(json.loads(lines[-1][len("RESULT "):]))
  return results


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--width", type=int, default=131072, help="feature width (floats)")
  ap.add_argument("--ood_sets", type=int, default=3, help="OOD sets besides id_fit, id_test")
  ap.add_argument("--batch", type=int, default=128)
  ap.add_argument("--shard", type=int, default=512, help="cache_shard_size (examples)")
  ap.add_argument("--timeout", type=int, default=1800)
  ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  ap.add_argument("--pid", type=int, default=0, help=argparse.SUPPRESS)
  ap.add_argument("--nproc", type=int, default=1, help=argparse.SUPPRESS)
  ap.add_argument("--devices", type=int, default=8, help=argparse.SUPPRESS)
  ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
  ap.add_argument("--workdir", default="", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.worker:
    worker(args)
    return
  gb = lambda b: f"{b / 2**30:.2f} GiB"
  sets = 2 + args.ood_sets
  print(f"{sets} sets x 1797 rows x ({args.width} + 10) float32 = "
        f"{gb(sets * 1797 * (args.width + 10) * 4)} of extracted arrays in all")
  peaks, growth = {}, {}
  for nproc, devices in ((1, 8), (2, 4)):
    res = launch(nproc, devices, args)
    for r in res:
      print(f"  {nproc} process(es) x {devices} devices, process {r['process']}: peak RSS "
            f"{gb(r['peak'])} (RSS before the stage {gb(r['rss_before'])}; peak reset: "
            f"{r['peak_reset']}), holds {r['rows']} rows = {gb(r['held'])}, {r['seconds']} s")
    peaks[nproc] = max(r["peak"] for r in res)
    growth[nproc] = max(r["peak"] - r["rss_before"] for r in res)
  ratio = peaks[2] / peaks[1]
  print(f"2-process peak / 1-process peak = {gb(peaks[2])} / {gb(peaks[1])} = {ratio:.3f} "
        f"(target <= 0.6: {'met' if ratio <= 0.6 else 'NOT met'})")
  print(f"growth of the resident set during the stage (peak - before): 2 processes "
        f"{gb(growth[2])} / 1 process {gb(growth[1])} = {growth[2] / growth[1]:.3f}")


if __name__ == "__main__":
  main()
