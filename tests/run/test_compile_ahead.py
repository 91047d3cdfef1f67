"""Compile ahead (fi_jax/run/compile_ahead.py): while the demo model trains, the forwards, detectors and
metrics compile for the sets' shapes, so that nothing compiles after training, and the
results are bit-identical to a run without it. Also the HistWriter (histograms drawn while the
next detectors run)."""
from __future__ import annotations

import collections
import json
import os
import shutil
import threading
import time

import jax
import numpy as np
import pytest

from configs import demo
from fi_jax import detectors, pipeline, report
from fi_jax.run import benchmark as run
from fi_jax.run import compile_ahead as ahead
from fi_jax.run import model as run_model
from fi_jax.run import train

DETECTORS = ("msp", "energy", "odin", "mds", "knn", "react", "mdsens", "gram", "adascale_a")


def _config(compile_ahead: bool):
  c = demo.get_config("quick")
  c.detectors = DETECTORS
  c.detector_hparams = demo.get_config().detector_hparams
  c.compilation_cache_dir = ""   # count real compilations; nothing written to the home folder
  c.metrics.n_bootstrap = 20
  c.compile_ahead = compile_ahead
  return c


class _Synchronous(ahead.CompileAhead):
  """compile_ahead in the caller (before training starts), so that it always completes."""

  def start(self, *args, hold=False, **kwargs):
    del hold
    self.ran = ahead.compile_ahead(*args, stop=self._stop, **kwargs)


@pytest.mark.slow
def test_nothing_compiles_after_training_and_results_are_bit_identical(tmp_path, monkeypatch):
  monkeypatch.setattr(run.ahead_lib, "CompileAhead", _Synchronous)
  after_training: collections.Counter = collections.Counter()
  trained = threading.Event()

  def listener(event, duration, **kw):
    del duration
    if event == "/jax/core/compile/backend_compile_duration" and trained.is_set():
      after_training[kw.get("fun_name", "?")] += 1
  train_classifier = train.train_classifier

  def training(*args, **kwargs):
    out = train_classifier(*args, **kwargs)
    trained.set()
    return out
  monkeypatch.setattr(train, "train_classifier", training)
  ahead_dir, plain_dir = str(tmp_path / "ahead"), str(tmp_path / "plain")
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    with_ahead = run.run(_config(True), ahead_dir, log=lambda s: None)
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert trained.is_set()
  # extraction, every detector's fit and score, the metrics: all compiled while training
  assert not after_training, after_training

  # the same trained parameters (copied, so that this run does not train) without it
  c = _config(False)
  params = os.path.join("cache", run_model.model_key(c), "params")
  shutil.copytree(os.path.join(ahead_dir, params), os.path.join(plain_dir, params))
  plain = run.run(c, plain_dir, log=lambda s: None)
  assert "trained_params_from_cache" in plain["meta"]
  assert not with_ahead["failed"] and len(with_ahead["rows"]) == len(DETECTORS)
  strip = lambda rows: json.loads(json.dumps(rows, default=str))
  assert strip(with_ahead["rows"]) == strip(plain["rows"])
  assert with_ahead["id_accuracy"] == plain["id_accuracy"]
  for path in ["id_test.npz", "ood/digits_6-9.npz"]:
    a = np.load(os.path.join(ahead_dir, "scores", path))
    b = np.load(os.path.join(plain_dir, "scores", path))
    assert sorted(a.files) == sorted(b.files)
    for k in set(a.files) - {"run_id"}:   # each run has its own run id
      np.testing.assert_array_equal(a[k], b[k], err_msg=f"{path}: {k}")


def test_synthetic_set_has_the_step_shapes_every_class_and_the_groups():
  shapes = {"features": jax.ShapeDtypeStruct((8, 5), np.float32),
            "layer/gram/block00": jax.ShapeDtypeStruct((8, 3, 5), np.float32),
            "score/odin": jax.ShapeDtypeStruct((8,), np.float64),
            "label": jax.ShapeDtypeStruct((8,), np.int64),
            "group": jax.ShapeDtypeStruct((8,), np.int64),
            "_id": jax.ShapeDtypeStruct((8,), np.int64),
            "_mask": jax.ShapeDtypeStruct((8,), bool)}
  first = {"label": np.array([2, 0, 1, 2, 0, 0, 0, 0]), "group": np.array([7, 9, 7, 8, 0, 0, 0, 0]),
           "_mask": np.array([1, 1, 1, 1, 0, 0, 0, 0], bool)}
  fake = ahead.synthetic_set(shapes, first, 11, num_classes=4)
  assert sorted(fake) == ["features", "group", "label", "layer/gram/block00", "score/odin"]
  assert fake["features"].shape == (11, 5) and fake["features"].dtype == np.float32
  assert fake["layer/gram/block00"].shape == (11, 3, 5)
  assert fake["score/odin"].dtype == np.float64 and np.isfinite(fake["score/odin"]).all()
  assert set(fake["label"]) == {0, 1, 2, 3} and fake["label"].dtype == np.int64
  assert list(fake["group"][:5]) == [7, 9, 7, 8, 7]   # the first batch's real rows, repeated
  no_labels = dict(first, label=np.full(8, -1))
  assert (ahead.synthetic_set(shapes, no_labels, 3, num_classes=4)["label"] == -1).all()


def _started(monkeypatch, fake_compile_ahead, job=None, hold=False):
  """`job` (a new CompileAhead by default) started with `fake_compile_ahead` as its work;
  (job, the function `start` returns)."""
  monkeypatch.setattr(ahead, "compile_ahead", fake_compile_ahead)
  monkeypatch.setattr(pipeline, "plan_forwards", lambda *a, **k: {})
  job = job or ahead.CompileAhead()
  go = job.start({}, {}, None, None, None, {}, hold=hold, mesh=None, input_std=(0.5,))
  return job if not hold else (job, go)


def test_a_held_thread_waits_for_the_go(monkeypatch):
  """start(hold=True): the thread imports TensorFlow, then runs nothing until the returned
  function is called; finish() before that ends it without running anything."""
  ran = threading.Event()

  def fake_compile_ahead(*args, **kwargs):
    ran.set()
    return ["x"]
  job, go = _started(monkeypatch, fake_compile_ahead, hold=True)
  assert not ran.wait(0.5)
  go()
  assert ran.wait(60)
  job.finish()
  assert job.ran == ["x"]
  ran.clear()
  job, go = _started(monkeypatch, fake_compile_ahead, hold=True)
  job.finish()
  assert not ran.is_set() and job.ran == [] and job.error is None


def test_finish_stops_after_the_detector_in_progress(monkeypatch):
  started, release = threading.Event(), threading.Event()
  seen = []

  def fake_compile_ahead(*args, stop, **kwargs):
    for name in ("a", "b", "c"):
      if stop.is_set():
        break
      seen.append(name)
      started.set()
      release.wait(60)
    return list(seen)
  job = _started(monkeypatch, fake_compile_ahead)
  assert started.wait(60)
  threading.Timer(0.2, release.set).start()
  job.finish()
  assert seen == ["a"] and job.ran == ["a"] and job.error is None


def test_the_thread_and_the_stage_share_the_detectors(monkeypatch):
  """The thread takes detectors from the back, the stage claims them from the front: each
  detector is run by one of them only, the thread stops where they meet, and the stage waits
  for a detector the thread is on instead of running it at the same time."""
  names = [f"d{i}" for i in range(8)]
  thread_ran, log = [], []
  in_thread = threading.Event()

  def fake_compile_ahead(*args, stop, take, **kwargs):
    for name in reversed(names):
      if stop.is_set():
        break
      if not take(name):
        continue
      log.append(("thread starts", name))
      in_thread.set()
      threading.Event().wait(0.05)
      thread_ran.append(name)
      log.append(("thread ends", name))
    return list(thread_ran)
  job = _started(monkeypatch, fake_compile_ahead)
  assert in_thread.wait(60)
  stage_ran = []
  for name in names:
    if name in thread_ran:
      continue   # (the real stage runs it again, from the compilation caches)
    assert job.claim(name)
    log.append(("stage runs", name))
    if name not in thread_ran:
      stage_ran.append(name)
  job.finish()
  assert sorted(stage_ran + thread_ran) == sorted(names)
  assert thread_ran[0] == "d7" and stage_ran[0] == "d0" and job.ran == thread_ran
  for name in thread_ran:   # the stage never ran one the thread was still on
    if ("stage runs", name) in log:
      assert log.index(("thread ends", name)) < log.index(("stage runs", name))


def test_a_claimed_detector_waits_for_the_thread(monkeypatch):
  started, release = threading.Event(), threading.Event()

  def fake_compile_ahead(*args, stop, take, **kwargs):
    assert take("d1")
    started.set()
    release.wait(60)
    return ["d1", "d0"] if take("d0") else ["d1"]
  job = ahead.CompileAhead()
  assert job.claim("d0")   # the stage reached d0 before the thread: the thread skips it
  _started(monkeypatch, fake_compile_ahead, job)
  assert started.wait(60)
  timer = threading.Timer(0.3, release.set)
  timer.start()
  t0 = time.time()
  assert job.claim("d1")   # the thread is on d1: wait for it
  assert time.time() - t0 > 0.2 and release.is_set()
  job.finish()
  assert job.ran == ["d1"]


def test_score_sets_take_and_on_scores():
  rng = np.random.default_rng(0)
  sets = {s: {"features": rng.normal(size=(n, 4)).astype(np.float32),
              "logits": rng.normal(size=(n, 3)).astype(np.float32),
              "label": np.arange(n) % 3} for s, n in [("id_fit", 30), ("id_test", 9),
                                                       ("ood/x", 7)]}
  dets = detectors.build_suite(["msp", "energy"])
  got = []
  scores, errors = pipeline.score_sets(dets, sets, None, on_scores=lambda n, s: got.append(n))
  assert got == ["msp", "energy"] and not errors
  assert pipeline.score_sets(dets, sets, None, take=lambda n: False) == ({}, {})
  scores, _ = pipeline.score_sets(dets, sets, None, take=lambda n: n == "energy")
  assert list(scores) == ["energy"]


def test_hist_writer_draws_what_write_plots_draws_and_reports_failures(tmp_path, monkeypatch):
  rng = np.random.default_rng(0)
  scores = {d: {"id_test": rng.normal(size=20), "ood/x": rng.normal(size=10)}
            for d in ("msp", "energy")}
  scores["bad"] = {"id_test": np.full(20, np.nan), "ood/x": rng.normal(size=10)}
  rows = [{"model": "m", "detector": d, "id_set": "i", "ood_set": "x", "fpr95": 0.5,
           "auroc": 0.5} for d in scores]
  results = {"meta": {"ood_sets": ["x"]}, "rows": rows}
  plain = report.write_plots(str(tmp_path / "a"), results, scores)
  writer = report.HistWriter(str(tmp_path / "b"), ["x"])
  for det, per_set in scores.items():
    writer.submit(det, per_set)
  drawn = report.write_plots(str(tmp_path / "b"), results, scores, hists=writer)
  rel = lambda paths, root: [os.path.relpath(p, root) for p in paths]
  assert rel(drawn, tmp_path / "b") == rel(plain, tmp_path / "a")
  assert "plots/hist_bad.png" not in rel(drawn, tmp_path / "b")   # no finite ID score

  def broken(*args, **kwargs):
    raise OSError("disk full")
  monkeypatch.setattr(report.plots, "write_hist", broken)
  writer = report.HistWriter(str(tmp_path / "c"), ["x"])
  writer.submit("msp", scores["msp"])
  with pytest.raises(OSError, match="disk full"):
    report.write_plots(str(tmp_path / "c"), results, scores, hists=writer)
