"""bench/extract.py (what bench/device.sh runs on an accelerator) still runs: a tiny smoke run."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_bench_extract_runs_and_compiles_the_forward_once():
  out = subprocess.run(
      [sys.executable, os.path.join(ROOT, "bench", "extract.py"), "--model", "vit_ti16",
       "--size", "32", "--batch", "8", "--images", "16", "--repeats", "1"],
      capture_output=True, text=True, timeout=600, check=False)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
  for line in ("input only   a =", "model only   b =", "end to end   c =", "c / min(a, b)"):
    assert line in out.stdout, out.stdout
  assert "(forward step: 1)" in out.stdout, out.stdout
