"""A JAX compilation cache whose valid entries hold each other's programs (the files swapped)
stops the run with one line naming the folder and saying to delete it, not with an XLA layout
error or a traceback (issue 34, item 10; fi_jax/run/jax_cache.py)."""
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from fi_jax.run import jax_cache

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def cache_on(tmp_path, monkeypatch):
  """The persistent cache on in a fresh folder with one counted hit; restored after."""
  before = jax.config.jax_compilation_cache_dir
  jax_cache.use(str(tmp_path / "jc"))
  monkeypatch.setattr(jax_cache, "_hits", 1)
  yield str(tmp_path / "jc")
  jax_cache.use(before or "")


def test_errors_of_a_swapped_program_are_recognised(cache_on):
  swapped = [
      ValueError("safe_zip() argument 1 has length 1 but argument 0 has length 2. All lengths: "
                 "(2, 1, 1)"),
      ValueError("One of jit outputs with pytree key path result is incompatible with its "
                 "layout annotation Layout(major_to_minor=(0,)): Length of major_to_minor ..."),
      type("JaxRuntimeError", (RuntimeError,), {})(
          "INVALID_ARGUMENT: E0102: RuntimeProgramInputMismatch:\nExecutable(jit_f) expected "
          "parameter 0 of size 48 (f32[3,4]{1,0}) but got buffer with incompatible size 112 "
          "(f32[4,7]{1,0})\nSee https://openxla.org/xla/errors/error_0102 for more details."),
  ]
  try:   # JAX's count check: `assert len(omk) == num_out_avals, (len(omk), num_out_avals)`
    (lambda n, m: exec("assert n == m, (n, m)", {"n": n, "m": m}))(120, 80)
  except AssertionError as e:
    swapped.append(e)
  for e in swapped:
    assert jax_cache.points_to_cache(e), e
  msg = str(jax_cache.error(swapped[2]))
  assert "\n" not in msg and msg.startswith(
      f"the JAX compilation cache {cache_on} gave a compiled program that does not fit the "
      "call asking for it (JaxRuntimeError: INVALID_ARGUMENT: E0102: "
      "RuntimeProgramInputMismatch: Executable(jit_f) expected parameter 0 of size 48")
  assert f"rm -rf {cache_on}" in msg and "openxla" not in msg
  try:   # an error raised from wrapped code keeps its cause
    try:
      raise swapped[0]
    except ValueError as inner:
      raise RuntimeError("detector failed") from inner
  except RuntimeError as outer:
    assert jax_cache.points_to_cache(outer)


def test_other_errors_are_left_alone(cache_on, monkeypatch):
  assert not jax_cache.points_to_cache(ValueError("config.seed must be an integer >= 0"))
  try:
    assert 1 == 2, "a failing assert of our own"
  except AssertionError as e:
    assert not jax_cache.points_to_cache(e)
  monkeypatch.setattr(jax_cache, "_hits", 0)    # nothing came from the cache
  assert not jax_cache.points_to_cache(ValueError("safe_zip() argument 1 has length 1"))


def _main(*args):
  return subprocess.run([sys.executable, os.path.join(ROOT, "main.py"), *args], cwd=ROOT,
                        env={**os.environ, "PYTHONUNBUFFERED": "1"}, capture_output=True,
                        text=True, timeout=600)


@pytest.mark.slow
def test_cli_swapped_entries_name_the_folder(tmp_path):
  rng = np.random.default_rng(0)
  feats = tmp_path / "feats"
  feats.mkdir()
  w = rng.normal(size=(8, 3)).astype(np.float32)
  for name, shift in (("id_fit", 0.0), ("id_test", 0.0), ("far", 1.0)):
    f = (rng.normal(size=(40, 8)) + shift).astype(np.float32)
    np.savez(feats / f"{name}.npz", features=f, logits=f @ w, label=np.arange(40) % 3)
  jc, workdir = tmp_path / "jc", tmp_path / "w"
  args = [f"--config=configs/features.py:dir={feats}", f"--workdir={workdir}",
          f"--config.compilation_cache_dir={jc}", "--config.detectors=('msp','mds')",
          "--config.report.plots=False"]
  first = _main(*args)
  assert first.returncode == 0, first.stderr[-3000:]
  entries = sorted(f for f in os.listdir(jc) if f.endswith("-cache"))
  blobs = [open(jc / f, "rb").read() for f in entries]
  for f, blob in zip(entries, blobs[1:] + blobs[:1]):   # every key gets another's program
    open(jc / f, "wb").write(blob)
  for f in os.listdir(workdir):   # the same paths, nothing cached but the programs
    subprocess.run(["rm", "-rf", str(workdir / f)], check=True)
  second = _main(*args)
  assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr[-3000:]
  last = second.stderr.strip().splitlines()[-1]
  assert last.startswith(f"main.py: error: the JAX compilation cache {jc} gave a compiled "
                         "program that does not fit the call asking for it ("), last
  assert f"Delete that folder (rm -rf {jc}) and run again" in last
