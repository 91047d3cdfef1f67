"""The run a researcher lives in: preflight, report files (sorted table, failed detectors,
per-class names, scores, plots), the features source and the comparison of runs."""
import json
import os
import shutil
import subprocess
import sys
import time

import ml_collections
import numpy as np
import pytest
from sklearn import metrics as skm

from configs import demo, torchvision, vit
from configs import features as features_config
from fi_jax import pipeline, report
from fi_jax.metrics import paired as metrics_paired
from fi_jax.metrics import reference as metrics_reference
from fi_jax.run import benchmark as run
from fi_jax.run import model as run_model
from fi_jax.run import preflight

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _digits_config(**over) -> ml_collections.ConfigDict:
  """The demo's sets and a tiny random ViT (no training): a real pipeline in seconds. Its head
  is random too (a zero-initialised head gives constant logits: the logit detectors would be
  degenerate)."""
  c = demo.get_config("quick")
  c.train = ml_collections.ConfigDict()
  c.model.head_zeroinit = False
  c.random_init = True
  c.model_label = "vit-random"
  c.detectors = ("msp", "energy", "knn", "react", "mds")
  c.metrics.n_bootstrap = 20
  for k, v in over.items():
    c[k] = v
  return c


# ----------------------------------------------------------------------------- preflight

def test_preflight_lists_two_missing_sets_and_the_checkpoint_at_once(tmp_path):
  c = vit.get_config(f"ckpt={tmp_path}/nope.npz,data_dir={tmp_path},ood=ninco+ssb_hard")
  c.id_fit = ml_collections.ConfigDict(dict(source="digits", split="train", classes=(0, 1)))
  c.id_test = ml_collections.ConfigDict(dict(source="digits", split="test", classes=(0, 1)))
  t = time.time()
  with pytest.raises(preflight.PreflightError) as e:
    run.run(c, str(tmp_path / "wd"), log=lambda s: None)
  assert time.time() - t < 10
  assert len(e.value.problems) == 3, str(e.value)
  text = str(e.value)
  for name in ("ninco", "ssb_hard"):
    assert f"ood/{name}: {name} is not prepared in {tmp_path}" in text
  assert f"build ninco --data_dir={tmp_path}" in text     # downloads: no manual dir
  assert f"build ssb_hard --manual_dir=DIR --data_dir={tmp_path}" in text
  assert f"checkpoint {tmp_path}/nope.npz does not exist" in text
  assert len(text.splitlines()) <= 1 + 3 * 3             # a few lines per problem
  assert not os.path.exists(tmp_path / "wd" / "cache")   # nothing extracted


def test_preflight_names_the_imagenet2012_route_and_bad_splits(tmp_path):
  c = vit.get_config(f"ckpt={__file__},data_dir={tmp_path},ood=fi_imagenet_1k")
  problems = preflight.check(c)
  assert len(problems) == 3   # imagenet2012, fi_imagenet_1k (id + ood)
  assert "python -m tfds_fi_imagenet build imagenet2012" in problems[0]
  assert "ILSVRC2012_img_train.tar" in problems[0]
  bad = preflight.check_sets({"ood/x": dict(source="tfds", name="no_such_set_xyz")})
  assert len(bad) == 1 and "knows no dataset 'no_such_set_xyz'" in bad[0]
  assert len(bad[0]) < 600      # never TFDS's catalogue


def test_real_config_without_checkpoint_needs_random_init():
  problems = preflight.check_model(vit.get_config(""))
  assert len(problems) == 1 and "random_init=True" in problems[0]
  c = vit.get_config("random_init=True")
  assert preflight.check_model(c) == [] and c.random_init
  assert run_model.model_label(c) == "vit-B16-random-init"
  assert preflight.check_model(demo.get_config("quick")) == []   # trains: no checkpoint needed


def test_preflight_refuses_a_family_only_detector_on_another_family():
  c = torchvision.get_config("name=convnext_tiny,random_init=True,odin=True")
  assert "rankfeat" not in c.detectors and preflight.check_detectors(c) == []
  c.detectors = tuple(c.detectors) + ("rankfeat",)
  problems = preflight.check_detectors(c)
  assert len(problems) == 1 and "rankfeat" in problems[0] and "'convnext'" in problems[0]
  c = torchvision.get_config("name=resnet50,random_init=True,odin=True")
  assert "rankfeat" in c.detectors and preflight.check_detectors(c) == []


def test_main_prints_every_problem_and_exits_2(tmp_path):
  res = subprocess.run(
      [sys.executable, os.path.join(ROOT, "main.py"),
       f"--config=configs/vit.py:data_dir={tmp_path},ood=ninco", f"--workdir={tmp_path}/wd"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert res.returncode == 2, res.stderr[-2000:]
  assert "preflight found 4 problem(s)" in res.stderr    # imagenet2012, fi_imagenet_1k, ninco, ckpt
  assert "random_init=True" in res.stderr and "Traceback" not in res.stderr


# ----------------------------------------------------------------------------- report

def _fake_results(failed=True):
  rows = []
  for ood in ("b_set", "a_set"):
    for det, fpr in (("msp", 0.5), ("energy", 0.3), ("knn", 0.4)):
      rows.append({"model": "m", "detector": det, "id_set": "id", "ood_set": ood,
                   "auroc": 1 - fpr, "fpr95": fpr + (0.1 if ood == "a_set" else 0.0),
                   "n_id": 10.0, "n_ood": 5.0})
  return {"meta": {"config": {"detectors": ["msp", "energy", "knn", "vim"],
                              "report": {"sort_by": "fpr95", "sort_set": ""}},
                   "ood_sets": ["b_set", "a_set"],
                   "detector_errors": {"vim": "FloatingPointError: non-finite scores"} if failed
                   else {}},
          "id_accuracy": None, "rows": rows}


def test_results_md_is_sorted_and_lists_failed_detectors(tmp_path):
  report.write(_fake_results(), str(tmp_path))
  with open(tmp_path / "results.md") as f:
    md = f.read()
  body = [l for l in md.splitlines() if l.startswith("| m |")]
  # OOD sets in configured order; detectors by FPR@95 on the first set; failed last
  assert [tuple(c.strip() for c in l.split("|")[2:5:2]) for l in body] == [
      ("energy", "b_set"), ("knn", "b_set"), ("msp", "b_set"), ("vim", "b_set"),
      ("energy", "a_set"), ("knn", "a_set"), ("msp", "a_set"), ("vim", "a_set")]
  assert "failed" in body[3] and "FloatingPointError: non-finite scores" in body[3]
  with open(tmp_path / "results.json") as f:
    saved = json.load(f)
  assert saved["failed"] == [{"detector": "vim", "failed": "FloatingPointError: non-finite scores"}]
  assert all(isinstance(r["n_id"], int) and isinstance(r["n_ood"], int) for r in saved["rows"])
  with open(tmp_path / "results.csv") as f:
    assert f.read().splitlines()[1].endswith(",10,5")    # integer columns as integers


def test_sort_key_is_configurable():
  res = _fake_results(failed=False)
  res["meta"]["config"]["report"] = {"sort_by": "auroc", "sort_set": "a_set"}
  assert report.sort_spec(res) == ("auroc", "a_set")
  assert report.ranked_detectors(res["rows"], "auroc", "a_set") == ["energy", "knn", "msp"]
  assert report.ranked_detectors(res["rows"], "fpr95", "b_set") == ["energy", "knn", "msp"]


def test_numpy_metrics_match_sklearn_and_paired_bootstrap():
  rng = np.random.default_rng(0)
  a_id, a_ood = rng.normal(1, 1, 300), rng.normal(0, 1, 200)
  b_id, b_ood = a_id + rng.normal(0, 2, 300), a_ood + rng.normal(0, 2, 200)
  y = np.r_[np.ones(300), np.zeros(200)]
  assert metrics_reference.auroc(a_id, a_ood) == pytest.approx(skm.roc_auc_score(y, np.r_[a_id, a_ood]),
                                                     abs=1e-12)
  fpr, tpr, _ = skm.roc_curve(y, np.r_[a_id, a_ood], drop_intermediate=False)
  assert metrics_reference.fpr_at_tpr(a_id, a_ood) == fpr[np.argmax(tpr >= 0.95)]
  f2, t2 = metrics_reference.roc_curve(a_id, a_ood)
  np.testing.assert_allclose(f2, fpr)
  np.testing.assert_allclose(t2, tpr)
  t = metrics_paired.paired_bootstrap((a_id, a_ood), (b_id, b_ood), n_bootstrap=200, seed=0)
  assert t["auroc_diff"] > 0 and t["auroc_diff_ci_low"] > 0 and t["auroc_p"] < 0.05
  same = metrics_paired.paired_bootstrap((a_id, a_ood), (a_id, a_ood), n_bootstrap=50)
  assert same["auroc_diff"] == 0 and same["auroc_p"] == 1.0


# ----------------------------------------------------------------------------- full runs

@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("digits"))
  c = _digits_config()
  return c, run.run(c, workdir, log=lambda s: None), workdir


def test_scores_plots_and_per_class_files(digits_run):
  c, results, workdir = digits_run
  sizes = results["meta"]["set_sizes"]
  names = set(c.detectors) - {r["detector"] for r in results["failed"]}
  for set_name in ("id_test", "ood/digits_6-9"):
    z = report.load_scores(workdir, set_name)
    assert set(z) == {"id", "label", "group", "run_id"} | names
    assert str(z.pop("run_id")) == results["meta"]["run_id"]
    assert all(v.shape == (sizes[set_name],) for v in z.values())
    np.testing.assert_array_equal(z["id"], np.arange(sizes[set_name]))
  assert (report.load_scores(workdir, "ood/digits_6-9")["label"] == -1).all()
  plots = sorted(os.listdir(os.path.join(workdir, "plots")))
  assert plots == sorted(["fpr95.png", "roc_digits_6-9.png"]
                         + [f"hist_{d}.png" for d in names])
  with open(os.path.join(workdir, "per_class", "digits_6-9", "msp.csv")) as f:
    lines = f.read().splitlines()
  assert lines[0].startswith("group,class,predicted_as,predicted_share,n_ood,")
  assert [l.split(",")[1] for l in lines[1:]] == ["6", "7", "8", "9"]
  assert all(l.split(",")[2] in "012345" for l in lines[1:])   # an ID digit
  with open(os.path.join(workdir, "results.md")) as f:
    md = f.read()
  assert "random init" in md.splitlines()[0].lower()
  for d in c.detectors:
    assert f"| vit-random | {d} |" in md
  assert "### digits_6-9: per OOD class" in md


def _features_dir(workdir, feats):
  """The run's cached sets copied into a features folder (configs/features.py's layout)."""
  cache_root = os.path.join(workdir, "cache")
  (key,) = os.listdir(cache_root)
  for entry in os.listdir(os.path.join(cache_root, key)):
    name = "digits_6-9" if entry.startswith("ood_digits_6-9") else entry.split("-")[0]
    shutil.copytree(os.path.join(cache_root, key, entry), feats / name)
  return feats


def test_features_source_reproduces_the_pipeline_rows(digits_run, tmp_path):
  c, results, workdir = digits_run
  feats = _features_dir(workdir, tmp_path / "feats")
  f = features_config.get_config(f"dir={feats},label=vit-random,id_name={c.id_name}")
  f.detectors, f.detector_hparams, f.metrics = c.detectors, c.detector_hparams, c.metrics
  got = run.run(f, str(tmp_path / "wd"), log=lambda s: None)
  assert got["meta"]["source"] == "features"
  strip = lambda rows: [{k: v for k, v in r.items() if k != "per_class"} for r in rows]
  assert strip(got["rows"]) == strip(results["rows"])
  assert got["failed"] == results["failed"]


def test_a_plot_failure_keeps_the_results(digits_run, tmp_path, monkeypatch):
  """A failing plot (matplotlib, a full disk, ...) is logged and recorded; results.json, .csv,
  .md and the scores are still written."""
  c, results, workdir = digits_run
  feats = _features_dir(workdir, tmp_path / "feats")
  f = features_config.get_config(f"dir={feats},label=vit-random,id_name={c.id_name}")
  f.detectors, f.detector_hparams = ("msp", "energy"), c.detector_hparams

  def broken(*a, **k):
    raise OSError("No space left on device")
  monkeypatch.setattr(report, "write_plots", broken)
  lines = []
  got = run.run(f, str(tmp_path / "wd"), log=lines.append)
  assert got["meta"]["plot_error"] == "OSError: No space left on device"
  assert any(l.startswith("Plots failed (OSError: No space left on device)") for l in lines)
  for name in ("results.json", "results.csv", "results.md"):
    assert os.path.getsize(tmp_path / "wd" / name) > 0
  with open(tmp_path / "wd" / "results.json") as fh:
    assert json.load(fh)["meta"]["plot_error"].startswith("OSError")
  assert set(report.load_scores(str(tmp_path / "wd"), "id_test")) >= {"msp", "energy"}


def test_scores_are_written_before_the_metrics(digits_run, tmp_path, monkeypatch):
  """The detectors' per-example scores reach the workdir before the metrics run: a metrics
  failure (e.g. out of memory in the bootstrap) does not lose them."""
  c, _, workdir = digits_run
  f = features_config.get_config(
      f"dir={_features_dir(workdir, tmp_path / 'feats')},label=vit-random,id_name={c.id_name}")
  f.detectors, f.detector_hparams = ("msp", "energy"), c.detector_hparams

  def broken(*a, **k):
    raise MemoryError("bootstrap")
  monkeypatch.setattr(pipeline, "metric_rows", broken)
  with pytest.raises(MemoryError):
    run.run(f, str(tmp_path / "wd"), log=lambda s: None)
  for name in ("id_test", "ood/digits_6-9"):
    z = report.load_scores(str(tmp_path / "wd"), name)
    assert {"msp", "energy"} <= set(z) and len(z["msp"]) == len(z["id"]) > 0


@pytest.mark.slow
def test_compare_two_demo_runs_with_a_paired_test(tmp_path):
  wds = []
  for steps, label in ((150, "vit-150"), (20, "vit-20")):
    wd = str(tmp_path / label)
    res = subprocess.run(
        [sys.executable, os.path.join(ROOT, "main.py"), "--config=configs/demo.py:quick",
         f"--config.train.steps={steps}", f"--config.model_label={label}",
         "--config.detectors=('msp', 'energy')", f"--workdir={wd}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "img/s" in res.stderr and "id_fit: 100%" in res.stderr   # the progress bar
    assert "Metrics: 2 rows" in res.stdout and "  energy: " in res.stdout
    wds.append(wd)
  out = tmp_path / "cmp"
  res = subprocess.run(
      [sys.executable, "-m", "fi_jax.report", "compare", *wds, f"--out={out}",
       "--pair", "vit-150:energy", "vit-20:energy", "--n_bootstrap=100"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert res.returncode == 0, res.stderr[-3000:]
  with open(out / "compare.json") as f:
    cmp = json.load(f)
  assert {(r["model"], r["detector"]) for r in cmp["rows"]} == {
      (m, d) for m in ("vit-150", "vit-20") for d in ("msp", "energy")}
  t = cmp["paired"]["digits_6-9"]
  assert t["n_id"] == 325 and t["n_ood"] == 214
  by = {(r["model"], r["detector"]): r for r in cmp["rows"]}
  assert t["auroc_a"] == pytest.approx(by[("vit-150", "energy")]["auroc"], abs=1e-12)
  assert t["fpr95_b"] == pytest.approx(by[("vit-20", "energy")]["fpr95"], abs=1e-12)
  assert 0 < t["auroc_p"] <= 1 and t["auroc_diff_ci_low"] <= t["auroc_diff"] <= t["auroc_diff_ci_high"]
  assert os.path.exists(out / "compare_fpr95_digits_6-9.png") and os.path.exists(out / "compare.csv")
  assert "Paired bootstrap" in res.stdout
