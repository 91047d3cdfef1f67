"""Multi-host: the demo pipeline over 2 local processes x 2 CPU devices (jax.distributed on loopback)
gives the same sets, accuracy and metrics as one process."""
import json
import os
import socket
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARGS = ["--config=configs/demo.py:quick", "--config.train.steps=30", "--config.batch_size=64",
        "--config.detectors=('msp','energy')"]


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _env(devices):
  return {**os.environ, "JAX_NUM_CPU_DEVICES": str(devices), "XLA_FLAGS": "",
          "PYTHONUNBUFFERED": "1"}


@pytest.mark.slow
def test_two_processes_match_one(tmp_path):
  port = _free_port()
  multi = str(tmp_path / "multi")
  procs = [subprocess.Popen(
      [sys.executable, "main.py", *ARGS, f"--workdir={multi}",
       f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", f"--process_id={i}"],
      cwd=ROOT, env=_env(2), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
      for i in range(2)]
  try:
    outs = [p.communicate(timeout=600)[0] for p in procs]
  finally:
    for p in procs:
      p.kill()
  assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outs)
  single = str(tmp_path / "single")
  res = subprocess.run([sys.executable, "main.py", *ARGS, f"--workdir={single}"], cwd=ROOT,
                       env=_env(1), capture_output=True, text=True, timeout=600)
  assert res.returncode == 0, res.stderr[-3000:]

  def load(d):
    with open(os.path.join(d, "results.json")) as f:
      return json.load(f)
  a, b = load(multi), load(single)
  assert a["meta"]["process_count"] == 2 and len(a["meta"]["devices"]) == 4
  assert a["meta"]["set_sizes"] == b["meta"]["set_sizes"]
  assert a["id_accuracy"] == pytest.approx(b["id_accuracy"], abs=1e-6)
  for ra, rb in zip(a["rows"], b["rows"]):
    assert ra["detector"] == rb["detector"]
    for k in ("auroc", "fpr95", "aupr_in"):
      assert ra[k] == pytest.approx(rb[k], abs=1e-4), (ra["detector"], k)
