"""Multi-host: the demo pipeline over 1 process x 8 CPU devices, 2 local processes x 4 devices
(jax.distributed on loopback) and 1 process x 1 device gives the same cached features, logits
and extraction-time scores, and the 2-process run the same per-example detector scores and
results rows as one process; with 2 processes each process caches only its own rows of every
set. The big_vision evaluator yields the one-process metrics on every process."""
import glob
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from fi_jax.extract import cache
from fi_jax.extract import forward as extract
from fi_jax.extract import own_features as features
from tests.helpers import subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARGS = ["--config=configs/demo.py:quick", "--config.train.steps=30", "--config.batch_size=64",
        "--config.detectors=('msp','energy','odin','mds')", "--config.compilation_cache_dir="]


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _env(devices):
  """`devices` CPU devices and one fixed XLA:CPU thread-pool size (PJRT_NPROC, see
  docs/usage.md: XLA sizes the pool max(cores, devices) and the last bits follow it)."""
  return {**os.environ, "JAX_NUM_CPU_DEVICES": str(devices), "XLA_FLAGS": "",
          "PJRT_NPROC": "8", "PYTHONUNBUFFERED": "1"}


def _run(workdir, processes, devices):
  """main.py with `processes` local processes of `devices` CPU devices each."""
  if processes == 1:
    res = subprocess.run([sys.executable, "main.py", *ARGS, f"--workdir={workdir}"], cwd=ROOT,
                         env=_env(devices), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return
  port = _free_port()
  procs = [subprocess.Popen(
      [sys.executable, "main.py", *ARGS, f"--workdir={workdir}",
       f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={processes}",
       f"--process_id={i}"],
      cwd=ROOT, env=_env(devices), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
      for i in range(processes)]
  try:
    outs = [p.communicate(timeout=600)[0] for p in procs]
  finally:
    for p in procs:
      p.kill()
  assert [p.returncode for p in procs] == [0] * processes, "\n".join(o[-3000:] for o in outs)


def _cached_sets(workdir):
  """{set entry name: arrays in set order} of every cached set, the per-process entries of a
  multi-process run put together (and checked to hold each process's own rows only)."""
  out = {}
  for entry in sorted(glob.glob(os.path.join(workdir, "cache", "*", "*"))):
    name = os.path.basename(entry)
    if name in ("params", "head"):
      continue
    assert ".shards-" not in name, "shards are removed once a set is complete"
    parts = sorted(glob.glob(os.path.join(entry, "process-*-of-*")))
    if not parts:
      out[name] = cache.load(entry, log=pytest.fail)
      continue
    arrays = [cache.load(p, log=pytest.fail) for p in parts]
    ids = [a["_id"] for a in arrays]
    assert all(len(i) for i in ids) and all(   # contiguous, disjoint parts in process order
        ids[k][-1] + 1 == ids[k + 1][0] for k in range(len(ids) - 1)), [i[[0, -1]] for i in ids]
    out[name] = extract.in_set_order(arrays)
  return out


def _scores(workdir):
  out = {}
  for f in sorted(glob.glob(os.path.join(workdir, "scores", "**", "*.npz"), recursive=True)):
    with np.load(f, allow_pickle=False) as z:
      # each run has its own run id; everything else must be bit-identical
      out[os.path.relpath(f, workdir)] = {k: z[k] for k in z.files if k != "run_id"}
  return out


def _results(workdir):
  with open(os.path.join(workdir, "results.json")) as f:
    return json.load(f)


@pytest.mark.slow
def test_one_and_two_processes_and_one_device_are_identical(tmp_path):
  """Features, logits, ODIN's scores, detector scores and results rows are bit-identical with
  1 process x 8 devices and 2 processes x 4 devices, the demo's training included, given one
  XLA:CPU thread-pool size (see _env). (1 device against 8: tests/metrics/test_metrics.py and
  tests/detectors/test_references.py's sharded tests.)"""
  ref = str(tmp_path / "8dev")
  _run(ref, 1, 8)
  runs = {"2proc": (2, 4)}
  for name, (processes, devices) in runs.items():
    _run(str(tmp_path / name), processes, devices)
  assert _results(str(tmp_path / "2proc"))["meta"]["process_count"] == 2
  parts = glob.glob(os.path.join(tmp_path, "2proc", "cache", "*", "*", "process-0000[01]-of-00002"))
  assert len(parts) == 2 * 3   # every set: one entry per process

  want_params = cache.load(glob.glob(os.path.join(ref, "cache", "*", "params"))[0], log=pytest.fail)
  for name in runs:   # every run trained the demo model itself: the same bits
    (got,) = glob.glob(os.path.join(tmp_path, name, "cache", "*", "params"))
    got = cache.load(got, log=pytest.fail)
    assert sorted(got) == sorted(want_params) and all(
        np.array_equal(got[k], want_params[k]) for k in got), name

  want_sets = _cached_sets(ref)
  assert sorted(want_sets) and any("score/odin" in a for a in want_sets.values())
  for name in runs:
    got_sets = _cached_sets(str(tmp_path / name))
    assert sorted(got_sets) == sorted(want_sets)
    for entry, arrays in got_sets.items():
      assert sorted(arrays) == sorted(want_sets[entry]), entry
      for k, v in arrays.items():
        w = want_sets[entry][k]
        assert v.dtype == w.dtype and np.array_equal(v, w), (name, entry, k)

  want_scores, want_results = _scores(ref), _results(ref)
  assert want_scores and want_results["rows"]
  for name in runs:
    got = _scores(str(tmp_path / name))
    assert sorted(got) == sorted(want_scores)
    for f, cols in got.items():
      for k, v in cols.items():
        assert np.array_equal(v, want_scores[f][k]), (name, f, k)
    res = _results(str(tmp_path / name))
    assert res["meta"]["set_sizes"] == want_results["meta"]["set_sizes"]
    assert res["id_accuracy"] == want_results["id_accuracy"], name
    assert res["rows"] == want_results["rows"], name


_EVALUATOR = """
import json, os, sys
import jax
nproc, pid = int(os.environ["FI_NPROC"]), int(os.environ["FI_PID"])
if nproc > 1:
  jax.distributed.initialize(coordinator_address=os.environ["ADDR"], num_processes=nproc,
                             process_id=pid, coordinator_bind_address=os.environ["ADDR"],
                             initialization_timeout=120)
import jax.numpy as jnp
from fi_jax.evaluators import ood
from fi_jax.models import vit
ID = (0, 1, 2)
model = vit.Model(len(ID), patch_size=(2, 2), width=32, depth=1, mlp_dim=64, num_heads=2,
                  head_zeroinit=False)   # a zero head: constant MSP and ODIN (degenerate)
params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 8, 8, 1)))["params"]
ev = ood.Evaluator(
    lambda ts, batch: model.apply({"params": ts["params"]}, batch["image"]), batch_size=32,
    devices=jax.devices(), pp_fn="value_range(-1, 1, 0, 16)", input_std=(0.5,),
    id_fit=dict(source="digits", split="train", classes=ID),
    id_test=dict(source="digits", split="test", classes=ID),
    ood={"rest": dict(source="digits", split="test", classes=(7, 8, 9), id_classes=ID)},
    detectors=("msp", "odin", "mds", "knn"), detector_hparams={"knn": {"k": 5}})
with jax.transfer_guard("disallow"):
  got = [dict(ev.run({"params": params})) for _ in range(2)]
print("METRICS " + json.dumps(got), flush=True)
"""


@pytest.mark.slow
def test_evaluator_every_process_gets_the_one_process_metrics():
  """big_vision calls run() on every process: with 2 processes x 2 devices each process yields
  exactly the metrics of 1 process x 2 devices (every process holds every set there; the same
  local device count, see above)."""
  def launch(nproc, devices):
    port = _free_port()
    env = lambda i: {**_env(devices), "FI_NPROC": str(nproc), "FI_PID": str(i),
                     "ADDR": f"127.0.0.1:{port}", "PYTHONPATH": ROOT,
                     "XLA_FLAGS": subprocess_env.xla_flags()}   # the CLI's, set by hand
    procs = [subprocess.Popen([sys.executable, "-c", _EVALUATOR], cwd=ROOT, env=env(i),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(nproc)]
    try:
      outs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
      for p in procs:
        p.kill()
    assert [p.returncode for p in procs] == [0] * nproc, "\n".join(o[-3000:] for o in outs)
    return [json.loads([l for l in o.splitlines() if l.startswith("METRICS ")][-1][8:])
            for o in outs]
  (want,) = launch(1, 2)
  assert want[0] == want[1] and "rest/mds/auroc" in want[0] and "rest/odin/auroc" in want[0]
  assert launch(2, 2) == [want, want]


def test_per_process_entries_load_in_set_order(tmp_path):
  """A multi-process set entry (one part per process, rows with `_id`) loads as the whole set in
  set order, also as a features folder; a missing part makes it absent."""
  entry = str(tmp_path / "id_test")
  feats = np.arange(10 * 3, dtype=np.float32).reshape(10, 3)
  for i, ids in enumerate([np.arange(0, 6), np.arange(6, 10)]):
    cache.save(cache.part(entry, i, 2), {"features": feats[ids], "logits": feats[ids, :2],
                                         "_id": ids})
  assert cache.part(entry, 0, 1) == entry
  assert cache.parts(entry) == [cache.part(entry, i, 2) for i in range(2)]
  got = cache.load_parts(entry, log=pytest.fail)
  assert sorted(got) == ["features", "logits"] and np.array_equal(got["features"], feats)
  assert np.array_equal(features._read(entry, ("features", "logits"))["logits"], feats[:, :2])
  cache.remove(cache.part(entry, 1, 2))
  assert cache.load_parts(entry, log=pytest.fail) is None
