"""The main job end to end: main.py on the demo config, overrides, errors, cache reuse."""
import json
import os
import subprocess
import sys

import pytest

from fi_jax.run import huge_pages

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _main(*args, timeout=600):
  env = {**os.environ, "PYTHONUNBUFFERED": "1"}
  return subprocess.run([sys.executable, os.path.join(ROOT, "main.py"), *args], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
  """One quick demo run shared by the tests below (the override test needs its own)."""
  workdir = str(tmp_path_factory.mktemp("demo"))
  res = _main("--config=configs/demo.py:quick", "--config.train.steps=150",
              "--config.metrics.n_bootstrap=50", f"--workdir={workdir}")
  assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
  return workdir, res


@pytest.mark.slow
def test_demo_writes_all_reports(quick_run):
  workdir, res = quick_run
  with open(os.path.join(workdir, "results.json")) as f:
    results = json.load(f)
  assert set(results) == {"schema", "meta", "id_accuracy", "rows", "failed"} and results["failed"] == []
  assert results["id_accuracy"] > 0.6      # 150 steps; the full demo reaches > 0.9
  detectors = {r["detector"] for r in results["rows"]}
  assert {"msp", "maxlogit", "energy"} <= detectors
  for r in results["rows"]:
    assert r["model"] == "vit-mu-digits" and r["id_set"] == "digits_0-5"
    assert r["ood_set"] == "digits_6-9"
    assert 0.0 <= r["auroc"] <= 1.0 and 0.0 <= r["fpr95"] <= 1.0
    assert r["n_id"] == results["meta"]["set_sizes"]["id_test"]
    assert r["n_ood"] == results["meta"]["set_sizes"]["ood/digits_6-9"]
    assert r["auroc_ci_low"] <= r["auroc"] <= r["auroc_ci_high"]
    assert "auroc_macro" in r         # the OOD digits are the groups
  assert max(r["auroc"] for r in results["rows"]) > 0.6   # a weak model still beats chance
  meta = results["meta"]
  assert meta["config"]["train"]["steps"] == 150 and "jax" in meta["versions"]
  assert set(meta["timings_s"]) >= {"extract", "detectors", "metrics", "total"}
  assert "--xla_backend_optimization_level=1" in meta["xla_flags"]   # fi_jax.run.xla_flags on CPU
  # main.py restarted itself with huge pages for malloc where the host allows (run/huge_pages.py)
  if huge_pages.on_this_host({}) and not {"FI_JAX_HUGE_PAGES", "GLIBC_TUNABLES"} & set(os.environ):
    assert meta["glibc_tunables"] == "glibc.malloc.hugetlb=1"
  with open(os.path.join(workdir, "results.csv")) as f:
    lines = f.read().splitlines()
  assert lines[0].startswith("model,detector,id_set,ood_set,") and len(lines) == 1 + len(results["rows"])
  with open(os.path.join(workdir, "results.md")) as f:
    md = f.read()
  assert "| model | detector | ID | OOD | AUROC |" in md and "ID accuracy" in md
  assert "| vit-mu-digits | energy | digits_0-5 | digits_6-9 |" in res.stdout   # table printed
  with open(os.path.join(workdir, "per_class", "digits_6-9", "energy.csv")) as f:
    per_class = f.read().splitlines()
  assert per_class[0].startswith("group,class,predicted_as,predicted_share,n_ood,")
  assert len(per_class) == 1 + 4   # digits 6-9
  assert "img/s" in res.stderr and "id_fit: 100%" in res.stderr   # the extraction's progress bar
  for d in results["meta"]["config"]["detectors"]:                # every configured detector
    assert f"| vit-mu-digits | {d} | digits_0-5 |" in md


@pytest.mark.slow
def test_rerun_reuses_the_feature_cache(quick_run):
  workdir, _ = quick_run
  res = _main("--config=configs/demo.py:quick", "--config.train.steps=150",
              "--config.metrics.n_bootstrap=50", "--config.detectors=('msp',)",
              f"--workdir={workdir}")
  assert res.returncode == 0, res.stderr[-3000:]
  assert res.stdout.count("from cache") == 3   # id_fit, id_test, ood
  assert "Training" not in res.stdout          # nothing to extract: the model is not even built


@pytest.mark.slow
def test_dotted_override_reaches_the_pipeline(tmp_path):
  res = _main("--config=configs/demo.py:quick", "--config.train.steps=20",
              "--config.batch_size=32", "--config.detectors=('energy',)",
              "--config.metrics.tpr=0.9", f"--workdir={tmp_path}")
  assert res.returncode == 0, res.stderr[-3000:]
  with open(os.path.join(tmp_path, "results.json")) as f:
    results = json.load(f)
  assert [r["detector"] for r in results["rows"]] == ["energy"]
  assert results["rows"][0]["tpr"] == pytest.approx(0.9)
  assert results["meta"]["config"]["batch_size"] == 32
  assert "train step 20/20" in res.stdout


@pytest.mark.parametrize("args,msg", [
    (["--config=configs/nope.py"], "no such file 'configs/nope.py'"),
    (["--config.nope=1"], "unknown config field --config.nope"),
    (["--config.batch_size=abc"], "batch_size"),
    (["--config=configs/demo.py:bogus"], "Unknown config argument 'bogus'"),
])
def test_bad_config_is_one_clear_line(args, msg, tmp_path):
  res = _main(*args, f"--workdir={tmp_path}", timeout=120)
  assert res.returncode == 2
  lines = res.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("main.py: error:") and msg in lines[0], res.stderr


def test_unknown_detector_fails_before_any_work(tmp_path):
  res = _main("--config=configs/demo.py:quick", "--config.detectors=('nope',)",
              f"--workdir={tmp_path}", timeout=120)
  assert res.returncode != 0
  assert "nope" in res.stderr and not os.path.exists(os.path.join(tmp_path, "cache"))
