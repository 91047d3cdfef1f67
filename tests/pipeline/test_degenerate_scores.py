"""Degenerate cases are named, not hidden (issue 31): a detector whose scores on a set take a
single value (or fewer than a handful) is reported as `degenerate` with the reason, never as
AUROC 50.00 [50.0, 50.0]; a detector that raises is one console line (its traceback in the
workdir's tracebacks.log, on the console only with `verbose`); each warning is printed once
per run."""
import json
import logging
import os

import numpy as np
import pytest

from fi_jax import pipeline
from fi_jax.report import schema
from fi_jax.run import benchmark
from tests.helpers import feature_runs


def test_the_rule_counts_distinct_values():
  rng = np.random.default_rng(0)
  why = pipeline.degenerate_scores("x", {"id_test": np.full(7, 0.25), "ood/a": rng.normal(size=7)})
  assert why.startswith("x: its scores take a single value on 'id_test' (7 examples)")
  few = np.repeat(np.arange(4.0), 5)   # 4 distinct values of 20
  assert "4 distinct values on 'ood/a' (20 examples)" in pipeline.degenerate_scores(
      "x", {"ood/a": few})
  assert pipeline.degenerate_scores("x", {"ood/a": np.repeat(np.arange(5.0), 4)}) is None
  assert pipeline.degenerate_scores("x", {"ood/a": np.array([1.0, 1.0, 2.0, 2.0])}) is None
  assert pipeline.degenerate_scores("x", {"ood/a": np.array([3.0])}) is None   # one example
  # a constant that differs in the last bits (another summation order) is still a constant,
  # in the scores' own precision; differences above rounding are distinct values
  assert pipeline.distinct_values(1.0 + 2e-16 * rng.integers(-1, 2, size=50)) == 1
  assert pipeline.distinct_values(np.float32(1) + 1.2e-7 * rng.integers(-1, 2, size=50).astype(
      np.float32)) == 1
  assert pipeline.distinct_values(1.0 + 1e-12 * np.arange(50)) == 50
  assert pipeline.distinct_values(np.zeros(9)) == 1


@pytest.fixture(scope="module")
def zero_head_sets(tmp_path_factory):
  """A features folder of a model at initialisation with a zero-initialised head (big_vision's
  head_zeroinit): random features, logits exactly 0, so every logit score is a constant."""
  folder = feature_runs.write_sets(str(tmp_path_factory.mktemp("zero_head")))
  for name in ("id_fit", "id_test", "far"):
    path = os.path.join(folder, f"{name}.npz")
    z = dict(np.load(path))
    z["logits"] = np.zeros_like(z["logits"])
    np.savez(path, **z)
  h = dict(np.load(os.path.join(folder, "head.npz")))
  np.savez(os.path.join(folder, "head.npz"), w=np.zeros_like(h["w"]), b=h["b"])
  return folder


def _run(folder, workdir, **kw):
  logs = []
  c = feature_runs.config(folder, "vit-B16-random-init", detectors=("msp", "energy", "knn", "vim"))
  c.detector_hparams = {"knn": {"k": 500}, "vim": {"dim": 50}}   # k > the 120 fit rows; dim > D
  results = benchmark.run(c, str(workdir), log=logs.append, **kw)
  return results, logs


def test_constant_scores_are_degenerate_and_failures_are_one_line(zero_head_sets, tmp_path,
                                                                   caplog):
  caplog.set_level(logging.WARNING)
  results, logs = _run(zero_head_sets, tmp_path)
  text = "\n".join(logs)
  assert [r["detector"] for r in results["rows"]] == ["knn"]
  failed = {f["detector"]: f for f in results["failed"]}
  for det in ("msp", "energy"):
    assert failed[det]["status"] == "degenerate" and schema.is_degenerate(failed[det])
    assert failed[det]["failed"].startswith(f"degenerate: {det}: its scores take a single value "
                                            f"on 'id_test' ({feature_runs.N_TEST} examples)")
    (line,) = [s for s in logs if s.startswith(f"  {det}: ")]
    assert line.startswith(f"  {det}: DEGENERATE (") and "\n" not in line
  with open(os.path.join(tmp_path, "results.json")) as f:
    saved = json.load(f)
  assert {f["detector"]: f["status"] for f in saved["failed"]} == {
      "msp": "degenerate", "energy": "degenerate", "vim": "failed"}
  with open(os.path.join(tmp_path, "results.md")) as f:
    md = f.read()
  assert "| vit-B16-random-init | msp | id | far | degenerate | degenerate |" in md
  assert "- detector msp is degenerate: msp: its scores take a single value on 'id_test'" in md
  assert "- detector vim failed: ValueError:" in md
  assert "50.00" not in md.split("| knn |")[0]   # no tie passed off as a result
  # the detector that raised: one console line, its traceback in the workdir's file
  (line,) = [s for s in logs if s.startswith("  vim")]
  assert line.startswith("  vim: FAILED (ValueError: ") and "\n" not in line
  assert "Traceback" not in text
  with open(os.path.join(tmp_path, benchmark.TRACEBACKS_FILE)) as f:
    tb = f.read()
  assert f"run {results['meta']['run_id']}: vim: FAILED\nTraceback" in tb
  # knn's `k > bank size` comes from each scored set; it is printed once
  messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
  assert sum("knn: k=500 > bank size 120" in m for m in messages) == 1, messages
  assert len(messages) == len(set(messages)), messages


def test_verbose_shows_the_traceback_on_the_console(zero_head_sets, tmp_path):
  _, logs = _run(zero_head_sets, tmp_path, verbose=True)
  (tb,) = [s for s in logs if "Traceback" in s]
  assert tb.startswith("vim: FAILED\nTraceback (most recent call last):")
