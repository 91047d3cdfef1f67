"""A fit set the detectors cannot fit on is never a plausible AUROC of 50.00: with one row every
detector that fits on it, and with a single class every detector that fits per-class
statistics, is marked failed with the reason after one warning; the others are scored as usual.
A set without examples, or whose every example is dropped as non-finite, is a named error
(issue 34, items 7-8)."""
import json
import os

import numpy as np
import pytest

from configs import features as features_config
from fi_jax import detectors, pipeline
from fi_jax.run import benchmark as run

C, D = 3, 8
RNG = np.random.default_rng(0)
W = RNG.normal(size=(D, C)).astype(np.float32)


def _set(n, shift=0.0, labels=None):
  f = (RNG.normal(size=(n, D)) + shift).astype(np.float32)
  return {"features": f, "logits": f @ W,
          "label": np.asarray(RNG.integers(0, C, n) if labels is None else labels, np.int64)}


def _sets(fit_labels):
  return {"id_fit": _set(len(fit_labels), labels=fit_labels), "id_test": _set(40),
          "ood/far": _set(40, 1.0, np.full(40, -1))}


def _score(sets, names, **kw):
  dets = {n: detectors.build(n) for n in names}
  logs = []
  scores, errors = pipeline.score_sets(dets, sets, detectors.Head(W, np.zeros(C, np.float32)),
                                       log=logs.append, **kw)
  return scores, errors, "\n".join(logs)


def test_one_row_fit_set_fails_the_detectors_that_fit_on_it():
  scores, errors, log = _score(_sets([0]), ["mds", "ssd", "msp", "energy"], keep_going=True)
  assert sorted(errors) == ["mds", "ssd"] and sorted(scores) == ["energy", "msp"]
  assert errors["mds"] == ("ValueError: the fit set (id_fit) has 1 row; mds fits statistics on "
                           "it and needs at least 2 (a one-row fit is degenerate).")
  assert "WARNING: the fit set (id_fit) has 1 row: the 2 detector(s) that need more (mds, " \
         "ssd) are marked failed" in log


def test_single_class_fit_set_fails_the_class_conditional_detectors():
  scores, errors, log = _score(_sets(np.zeros(60, int)), ["relative_cosine", "mds", "ssd", "msp"],
                               keep_going=True)
  assert sorted(errors) == ["mds", "relative_cosine"] and sorted(scores) == ["msp", "ssd"]
  assert "labels hold a single class (0); relative_cosine fits per-class statistics and needs " \
         "at least 2 classes" in errors["relative_cosine"]
  assert "WARNING: the fit set's (id_fit) labels hold a single class (0)" in log


def test_unlabelled_rows_are_not_a_class():
  labels = np.r_[np.zeros(30, int), np.full(30, -1)]     # one class among the labelled rows
  _, errors, _ = _score(_sets(labels), ["mds"], keep_going=True)
  assert "single class (0)" in errors["mds"]
  scores, errors, _ = _score(_sets(np.arange(60) % C), ["mds", "relative_cosine"])
  assert not errors and sorted(scores) == ["mds", "relative_cosine"]


def test_without_keep_going_it_is_an_error():
  with pytest.raises(ValueError, match=r"mds: the fit set \(id_fit\) has 1 row"):
    _score(_sets([2]), ["mds"])


def test_every_row_nonfinite_is_an_error_not_an_empty_set():
  sets = _sets(np.arange(20) % C)
  sets["ood/far"]["features"][:] = np.nan
  with pytest.raises(ValueError, match=r"set 'ood/far': .* for all 40 examples, so "
                     r"--config.nonfinite=drop leaves nothing to score"):
    pipeline.drop_nonfinite(sets, "drop")


def test_empty_set_is_named_not_a_reshape_error():
  sets = _sets(np.arange(20) % C)
  sets["ood/far"] = {k: v[:0] for k, v in sets["ood/far"].items()}
  for mode in ("error", "drop"):
    with pytest.raises(ValueError, match=r"set 'ood/far' has no examples: its spec selects "
                       r"none \(split, classes, per_class\) or its files hold no rows"):
      pipeline.drop_nonfinite(sets, mode)


def test_features_run_marks_the_rows_failed(tmp_path):
  feats = tmp_path / "feats"
  feats.mkdir()
  for name, arrays in _sets(np.zeros(60, int)).items():
    np.savez(feats / f"{name.replace('ood/', '')}.npz", **arrays)
  c = features_config.get_config(f"dir={feats}")
  c.detectors = ("msp", "relative_cosine")
  c.report.plots = False
  c.compilation_cache_dir = ""
  logs = []
  run.run(c, str(tmp_path / "w"), log=logs.append)
  results = json.load(open(os.path.join(tmp_path, "w", "results.json")))
  assert [r["detector"] for r in results["rows"]] == ["msp"]
  (failed,) = results["failed"]
  assert failed["detector"] == "relative_cosine" and "single class (0)" in failed["failed"]
  assert any(line.startswith("WARNING: the fit set's (id_fit) labels hold a single class")
             for line in logs)
  table = open(os.path.join(tmp_path, "w", "results.md")).read()
  assert "relative_cosine" in table and "single class" in table
