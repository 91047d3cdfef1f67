"""The full-spectrum part of a run's results: config.csid -> set specs, FS rows next to the
standard rows, pooled and per-set accuracy, results.json / .csv / .md, read back by
`schema.load`."""
import csv
import os

import ml_collections
import numpy as np
import pytest

from configs import common, vit
from fi_jax import report
from fi_jax.report import schema
from fi_jax.run import benchmark


def _arrays(rng, n, shift, labelled=True, classes=5):
  logits = rng.normal(size=(n, classes))
  labels = rng.integers(0, classes, n) if labelled else -np.ones(n, np.int64)
  return {"logits": logits, "label": labels}


def test_results_carry_full_spectrum_rows_and_accuracies(tmp_path):
  config = common.base_config()
  config.model_label = "m"
  config.id_name = "val"
  config.csid = ml_collections.ConfigDict({
      "shift_b": dict(source="tfds", name="x"),
      "shift_a": dict(source="tfds", name="y", class_subset=[1, 3])})
  config.csid_order = ("shift_b", "shift_a")
  config.ood = ml_collections.ConfigDict({"far": dict(source="tfds", name="z")})
  specs = benchmark.config_specs(config)
  assert list(specs)[-2:] == ["csid/shift_b", "csid/shift_a"]   # csid_order kept
  rng = np.random.default_rng(0)
  sets = {"id_test": _arrays(rng, 60, 0), "csid/shift_b": _arrays(rng, 40, 0),
          "csid/shift_a": {"logits": rng.normal(size=(30, 5)),
                           "label": rng.choice([1, 3], 30)},
          "ood/far": _arrays(rng, 50, 0, labelled=False)}
  scores = {"msp": {"id_test": rng.normal(1, 1, 60), "csid/shift_b": rng.normal(0.5, 1, 40),
                    "csid/shift_a": rng.normal(0.2, 1, 30), "ood/far": rng.normal(0, 1, 50)}}
  fs = benchmark.full_spectrum(config, specs, sets, scores)
  assert fs["id_set"] == "val + shift_b + shift_a"
  assert fs["csid_sets"] == ["shift_b", "shift_a"]
  a = sets["csid/shift_a"]
  sub = np.array([1, 3])
  assert fs["csid_accuracy"]["shift_a"] == pytest.approx(
      np.mean(sub[a["logits"][:, sub].argmax(1)] == a["label"]))
  pooled = [sets[s] for s in ("id_test", "csid/shift_b", "csid/shift_a")]
  assert fs["accuracy"] == pytest.approx(
      sum((p["logits"].argmax(1) == p["label"]).sum() for p in pooled) / 130)
  (row,) = fs["rows"]
  assert row["n_id"] == 130 and row["ood_set"] == "far" and row["id_set"] == fs["id_set"]

  standard = [{"model": "m", "detector": "msp", "id_set": "val", "ood_set": "far",
               "auroc": 0.7, "fpr95": 0.6, "n_id": 60, "n_ood": 50}]
  results = schema.make({"config": {}}, 0.5, standard, [], fs)
  report.write(results, str(tmp_path))
  back = schema.load(str(tmp_path))
  assert back["rows"][0]["id_set"] == "val"
  assert back["full_spectrum"]["rows"][0]["n_id"] == 130
  with open(os.path.join(tmp_path, "results.csv")) as f:
    assert [r["id_set"] for r in csv.DictReader(f)] == ["val", "val + shift_b + shift_a"]
  md = open(os.path.join(tmp_path, "results.md")).read()
  assert "Full spectrum (OpenOOD v1.5 FS): ID = val + shift_b + shift_a" in md
  assert "shift_a " in md and "| val + shift_b + shift_a | far |" in md


def test_full_spectrum_rows_pass_the_schema_check():
  bad = {"id_set": "x", "csid_sets": [], "rows": [{"model": "m", "detector": "d",
                                                   "id_set": "x", "ood_set": "o", "nope": 1}]}
  with pytest.raises(ValueError, match="nope"):
    schema.make({}, None, [], [], bad)
  restricted = {"id_set": "x", "csid_sets": [], "rows": [],
                "restricted": [{"id_set": "x [2 classes]", "rows": bad["rows"]}]}
  with pytest.raises(ValueError, match="nope"):   # the class-subset rows are checked too
    schema.make({}, None, [], [], restricted)


def test_a_malformed_restricted_block_is_named_by_load(tmp_path):
  import json
  res = schema.jsonable(_fs_results("a", 0.9))
  res["full_spectrum"]["restricted"] = [{"id_set": 3}]
  (tmp_path / "results.json").write_text(json.dumps(res))
  with pytest.raises(schema.ResultsError, match="'full_spectrum.restricted' is not a list of "
                                                "objects with an 'id_set' and a 'rows' list"):
    schema.load(str(tmp_path))


def test_imagenet_configs_take_csid_sets():
  c = vit.get_config("csid=imagenet_v2+imagenet_r+imagenet_c_fog_3,data_dir=/d")
  assert c.csid_order == ("imagenet_v2", "imagenet_r", "imagenet_c_fog_3")
  assert c.csid.imagenet_v2.name == "imagenet_v2/matched-frequency"
  assert c.csid.imagenet_r.class_subset == "imagenet_r"
  assert c.csid.imagenet_c_fog_3.name == "imagenet2012_corrupted/fog_3"
  assert c.csid.imagenet_c_fog_3.split == "validation"
  assert c.csid.imagenet_r.data_dir == "/d"
  assert not vit.get_config().csid   # none by default: no FS rows
  with pytest.raises(ValueError, match="Unknown covariate-shifted ID set 'imagenet_x'"):
    vit.get_config("csid=imagenet_x")


def test_a_run_on_feature_files_writes_standard_and_full_spectrum_rows(tmp_path):
  """configs/features.py with csid=shift: one benchmark run, both kinds of rows, the FS rows
  equal to pipeline.full_spectrum_rows on the run's own scores files."""
  from configs import features
  from fi_jax import pipeline
  rng = np.random.default_rng(0)
  feats = tmp_path / "feats"
  feats.mkdir()
  for name, n, shift, labelled in (("id_fit", 80, 1.0, True), ("id_test", 60, 1.0, True),
                                   ("shift", 40, 0.4, True), ("far", 50, -0.5, False)):
    x = rng.normal(shift, 1.0, (n, 6))
    np.savez(feats / f"{name}.npz", features=x, logits=x[:, :4] * 2,
             label=(rng.choice([0, 2], n) if name == "shift" else rng.integers(0, 4, n))
             if labelled else -np.ones(n, np.int64))
  c = features.get_config(f"dir={feats},csid=shift,id_name=val")
  c.detectors = ("msp", "energy")
  c.report.plots = False
  c.compilation_cache_dir = ""
  assert list(c.ood) == ["far"] and list(c.csid) == ["shift"]
  c.csid.shift.class_subset = [0, 2]   # restrict_logits by default: a restricted FS block too
  res = benchmark.run(c, str(tmp_path / "wd"), log=lambda m: None)
  (block,) = res["full_spectrum"]["restricted"]
  assert block["detectors"] == ["msp", "energy"] and block["rows"][0]["id_set"] == (
      "val + shift [2 classes of class_subset of shift]")
  assert [(r["detector"], r["id_set"]) for r in res["rows"]] == [("msp", "val"), ("energy", "val")]
  fs = res["full_spectrum"]
  assert [r["id_set"] for r in fs["rows"]] == ["val + shift"] * 2
  assert fs["csid_sets"] == ["shift"] and set(fs["csid_accuracy"]) == {"shift"}
  scores = {s: report.load_scores(str(tmp_path / "wd"), s) for s in ("id_test", "csid/shift", "ood/far")}
  det_scores = {d: {s: scores[s][d] for s in scores} for d in ("msp", "energy")}
  expect = pipeline.full_spectrum_rows(det_scores, {"ood/far": {}}, ["csid/shift"],
                                       id_set="val + shift", model=fs["rows"][0]["model"])
  for got, want in zip(fs["rows"], expect):
    assert got["auroc"] == pytest.approx(want["auroc"], abs=1e-12)
    assert got["fpr95_ood_positive"] == pytest.approx(want["fpr95_ood_positive"], abs=1e-12)
  assert schema.load(str(tmp_path / "wd"))["full_spectrum"]["id_set"] == "val + shift"


def test_validate_names_a_bad_class_subset(tmp_path):
  from fi_jax.run import validate
  c = vit.get_config("csid=imagenet_r")
  c.csid.imagenet_r.class_subset = "imagenet_z"
  with pytest.raises(ValueError, match=r"config.csid.imagenet_r.class_subset 'imagenet_z' is "
                                       r"unknown; known: \['imagenet_a', 'imagenet_r'\]"):
    validate.validate_config(c, str(tmp_path))
  c.csid.imagenet_r = ml_collections.ConfigDict(dict(c.csid.imagenet_r, class_subset=[3, 3]))
  with pytest.raises(ValueError, match="config.csid.imagenet_r.class_subset: class_subset must "
                                       "be distinct"):
    validate.validate_config(c, str(tmp_path))


def test_a_class_subset_adds_restricted_full_spectrum_rows_to_every_report_file(tmp_path):
  """A shifted set with `class_subset` (restrict_logits on by default) gets a second FS block:
  the logit-only detectors on the subset's logits (pipeline.restricted_full_spectrum), carried
  into results.json, .csv and .md and read back; `restrict_logits=False` leaves it out."""
  from fi_jax import detectors, pipeline
  config = common.base_config()
  config.model_label = "m"
  config.id_name = "val"
  config.csid = ml_collections.ConfigDict({
      "shift_b": dict(source="tfds", name="x"),
      "shift_a": dict(source="tfds", name="y", class_subset=[1, 3])})
  config.csid_order = ("shift_b", "shift_a")
  config.ood = ml_collections.ConfigDict({"far": dict(source="tfds", name="z")})
  specs = benchmark.config_specs(config)
  rng = np.random.default_rng(0)
  sets = {"id_fit": {**_arrays(rng, 40, 0), "features": rng.normal(size=(40, 3))},
          "id_test": _arrays(rng, 60, 0), "csid/shift_b": _arrays(rng, 40, 0),
          "csid/shift_a": {"logits": rng.normal(size=(30, 5)), "label": rng.choice([1, 3], 30)},
          "ood/far": _arrays(rng, 50, 0, labelled=False)}
  for s in sets:
    sets[s].setdefault("features", rng.normal(size=(len(sets[s]["logits"]), 3)))
  dets = {"msp": detectors.build("msp"), "knn": detectors.build("knn", k=2)}
  scores = {"msp": {s: rng.normal(size=len(a["logits"])) for s, a in sets.items() if s != "id_fit"}}
  fs = benchmark.full_spectrum(config, specs, sets, scores, dets, None, log=lambda m: None)
  (block,) = fs["restricted"]
  assert block["class_subset"] == "class_subset of shift_a" and block["n_classes"] == 2
  assert block["id_set"] == "val + shift_a [2 classes of class_subset of shift_a]"
  assert block["detectors"] == ["msp"]   # knn reads the features: not in this block
  want = pipeline.restricted_full_spectrum(dets, sets, None, ["csid/shift_a"], np.array([1, 3]),
                                           id_set=block["id_set"], model="m",
                                           **benchmark.metric_kwargs(config))
  assert [r["auroc"] for r in block["rows"]] == [r["auroc"] for r in want["rows"]]
  assert block["rows"][0]["n_id"] == int(np.isin(sets["id_test"]["label"], [1, 3]).sum()) + 30

  results = schema.make({"config": {"detectors": ["msp", "knn"]}}, 0.5, [], [], fs)
  report.write(results, str(tmp_path))
  back = schema.load(str(tmp_path))
  assert back["full_spectrum"]["restricted"][0]["rows"][0]["id_set"] == block["id_set"]
  assert [r["id_set"] for r in schema.full_spectrum_rows(back)] == [fs["id_set"], block["id_set"]]
  with open(os.path.join(tmp_path, "results.csv")) as f:
    assert [r["id_set"] for r in csv.DictReader(f)] == [fs["id_set"], block["id_set"]]
  md = open(os.path.join(tmp_path, "results.md")).read()
  assert ("### Full spectrum in the label space of 2 classes (class_subset of shift_a): ID = "
          + block["id_set"]) in md
  assert f"| {block['id_set']} | far |" in md

  config.csid.shift_a.restrict_logits = False
  specs = benchmark.config_specs(config)
  assert "restricted" not in benchmark.full_spectrum(config, specs, sets, scores, dets, None)


def test_imagenet_r_and_a_restrict_logits_by_default_and_validate_checks_it(tmp_path):
  from fi_jax.run import validate
  c = vit.get_config("csid=imagenet_v2+imagenet_r+imagenet_a")
  assert c.csid.imagenet_r.restrict_logits and c.csid.imagenet_a.restrict_logits
  assert "restrict_logits" not in c.csid.imagenet_v2
  spec = dict(c.csid.imagenet_r)   # the option changes no cached extraction
  assert (benchmark.set_path(c, "/w", "csid/imagenet_r", spec, [])
          == benchmark.set_path(c, "/w", "csid/imagenet_r", {**spec, "restrict_logits": False}, []))
  c.csid.imagenet_r = ml_collections.ConfigDict(dict(spec, restrict_logits="yes"))
  with pytest.raises(ValueError, match="config.csid.imagenet_r.restrict_logits must be True or "
                                       "False, got 'yes'"):
    validate.validate_config(c, str(tmp_path))
  c.csid.imagenet_r = ml_collections.ConfigDict(spec)
  c.csid.imagenet_v2 = ml_collections.ConfigDict(dict(c.csid.imagenet_v2, restrict_logits=True))
  with pytest.raises(ValueError, match="config.csid.imagenet_v2.restrict_logits is True but the "
                                       "set names no class_subset"):
    validate.validate_config(c, str(tmp_path))


def _fs_results(label, auroc, restricted=True):
  """A run's results with one standard row, one FS row and (optionally) one class-subset row."""
  row = lambda id_set, a, n_id: {"model": label, "detector": "msp", "id_set": id_set,   # noqa: E731
                                 "ood_set": "far", "auroc": a, "fpr95": 1 - a, "n_id": n_id,
                                 "n_ood": 50}
  fs = {"id_set": "val + r", "csid_sets": ["r"], "accuracy": 0.7, "csid_accuracy": {"r": 0.4},
        "rows": [row("val + r", auroc - 0.1, 90)]}
  if restricted:
    fs["restricted"] = [{"class_subset": "imagenet_r", "id_set": "val + r [200 classes of "
                         "imagenet_r]", "n_classes": 200, "csid_sets": ["r"], "n_id_test": 20,
                         "accuracy": 0.8, "detectors": ["msp"], "failed": {},
                         "rows": [row("val + r [200 classes of imagenet_r]", auroc - 0.05, 50)]}]
  return schema.make({"model_label": label, "ood_sets": ["far"], "config": {}}, 0.75,
                     [row("val", auroc, 60)], [], fs)


def test_compare_carries_full_spectrum_rows_and_accuracies(tmp_path):
  import importlib
  compare = importlib.import_module("fi_jax.report.compare")   # the package exports the function
  for name, auroc, restricted in (("a", 0.9, True), ("b", 0.8, False)):
    report.write(_fs_results(name, auroc, restricted), str(tmp_path / name))
  out = compare.compare([str(tmp_path / "a"), str(tmp_path / "b")], str(tmp_path / "cmp"),
                        log=lambda s: None)
  assert [(r["model"], r["id_set"]) for r in out["rows"]] == [("a", "val"), ("b", "val")]
  fs = out["full_spectrum"]
  assert [(r["model"], r["id_set"], r["auroc"]) for r in fs["rows"]] == [
      ("a", "val + r", pytest.approx(0.8)), ("b", "val + r", pytest.approx(0.7)),
      ("a", "val + r [200 classes of imagenet_r]", pytest.approx(0.85))]
  assert fs["accuracy"]["a"] == {"id_set": "val + r", "accuracy": 0.7, "csid_accuracy": {"r": 0.4},
                                 "restricted": {"val + r [200 classes of imagenet_r]": 0.8}}
  assert fs["accuracy"]["b"]["restricted"] == {}
  with open(tmp_path / "cmp" / "compare.csv") as f:
    assert [r["id_set"] for r in csv.DictReader(f)] == ["val", "val", "val + r", "val + r",
                                                         "val + r [200 classes of imagenet_r]"]
  md = (tmp_path / "cmp" / "compare.md").read_text()
  assert "## Full spectrum (OpenOOD v1.5 FS)" in md
  assert "| a | msp | val + r | 80.00 | 20.00 |" in md
  assert "| a | val + r | 70.00 | r 40.00 |" in md


def test_leaderboard_carries_full_spectrum_pairs_and_accuracies(tmp_path):
  from fi_jax.report import leaderboard
  for name, auroc, restricted in (("a", 0.9, True), ("b", 0.8, False)):
    report.write(_fs_results(name, auroc, restricted), str(tmp_path / name))
  board = leaderboard.build(str(tmp_path), hardness=("far", "far"), n_bootstrap=0)
  fs = board["full_spectrum"]
  assert list(fs) == ["val + r", "val + r [200 classes of imagenet_r]"]
  best = fs["val + r"]["per_set"]["far"]
  assert best["n_pairs"] == 2 and best["best_fpr95"]["model"] == "a"
  assert best["min_fpr95"] == pytest.approx(0.2)   # 1 - (0.9 - 0.1)
  assert fs["val + r [200 classes of imagenet_r]"]["per_set"]["far"]["n_pairs"] == 1
  (a,) = [e for e in board["models"] if e["model"] == "a"]
  assert a["full_spectrum"] == {"id_set": "val + r", "accuracy": 0.7, "csid_accuracy": {"r": 0.4},
                                "restricted": {"val + r [200 classes of imagenet_r]": 0.8}}
  md = leaderboard.markdown(board)
  assert "## Full spectrum: ID = val + r [200 classes of imagenet_r]" in md
  assert "| a | val + r | 70.00 | r 40.00 |" in md
  lines = leaderboard.csv_text(board).splitlines()
  assert lines[0].endswith(",id_set") and len(lines) == 1 + 2 + 2 + 1
  assert lines[-1].startswith("far,1,a,msp,") and lines[-1].endswith(
      ",val + r [200 classes of imagenet_r]")


def test_a_sweep_passes_csid_to_every_model_config():
  from configs import sweep
  from fi_jax.run import sweep as sweep_run
  c = sweep.get_config("paper,random_init=True,csid=imagenet_v2+imagenet_r")
  assert "csid" not in sweep.get_config("paper,random_init=True").args   # unchanged without
  for entry in c.models[:2]:   # a zoo entry and a config-file entry
    run = sweep_run.model_config(entry, c)
    assert run.csid_order == ("imagenet_v2", "imagenet_r") and run.csid.imagenet_r.restrict_logits
