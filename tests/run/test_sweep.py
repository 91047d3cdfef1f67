"""The sweep (fi_jax/run/sweep.py, configs/sweep.py): the smoke sweep of three tiny
random-weight models (a timm ViT .safetensors and a torchvision ResNet .pth written here by
those libraries, features through configs/features.py) plus one with a truncated checkpoint,
on the digits with two OOD sets; its leaderboard against a numpy recomputation from the runs'
files; a sweep killed (SIGKILL) inside its second model and rerun, and a sweep split in two
shards, give the leaderboard of the uninterrupted sweep byte for byte."""
import json
import math
import os
import signal
import subprocess
import sys
import textwrap

import ml_collections
import numpy as np
import pytest

from configs import sweep as sweep_config
from fi_jax.report import schema, sweep_state
from fi_jax.report.compare import compare
from fi_jax.run import sweep
from tests.helpers import sweep_smoke

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LABELS = ["timm-vit-tiny", "tv-resnet-tiny", "features-proj", "broken-vit"]
BOARD = ("leaderboard.md", "leaderboard.csv", "leaderboard.json")


def _run(args, code=None, timeout=600):
  env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": ROOT}
  cmd = [sys.executable, "-c", code, *args] if code else [
      sys.executable, "-m", "fi_jax.run.sweep", *args]
  return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=timeout)


def _board(workdir):
  return {f: open(os.path.join(workdir, f), "rb").read() for f in BOARD}


# ----------------------------------------------------------------------------- fast

def test_shard_flag():
  assert sweep.parse_shard("1/3") == (1, 3)
  for bad in ("3/3", "-1/2", "1", "a/b", "0/0"):
    with pytest.raises(sweep.SweepError, match="--shard"):
      sweep.parse_shard(bad)


@pytest.mark.parametrize("preset", ["paper", "openood"])
def test_imagenet_presets_build_every_model_config(preset):
  """Every model of the paper and OpenOOD presets builds its run config (no file is read)."""
  c = sweep_config.get_config(f"{preset},ckpt_dir=CK,data_dir=DD,ood=fi_imagenet_1k+ninco")
  models = sweep.build_models(c)
  assert not [m.problems for m in models if m.problems]
  want = [t[0] for t in (sweep_config.PAPER if preset == "paper" else sweep_config.OPENOOD)]
  assert [m.label for m in models] == want
  for m in models:
    assert m.config.model_label == m.label
    assert m.config.model_init.startswith("CK" + os.sep)
    assert list(m.config.ood) == ["fi_imagenet_1k", "ninco"]
    assert m.config.id_test.data_dir == "DD" and m.config.metrics.n_bootstrap == 1000
    assert m.config.detector_preset == ("openood" if preset == "openood" else "ninco")
  if preset == "paper":
    by = {m.label: m.config for m in models}
    assert by["dinov2-b14-linear"].model_load.head == os.path.join(
        "CK", "dinov2_vitb14_linear4_head.pth")
    assert by["deit3-b16"].model_init == os.path.join(
        "CK", "deit3_base_patch16_224.fb_in1k", "model.safetensors")
    assert by["siglip2-b16"].zero_shot.tokenizer == os.path.join("CK", "gemma_tokenizer.model")


def test_model_entries_and_overrides():
  c = sweep_config.get_config("smoke,dir=D")
  base = dict(config="configs/demo.py", args="quick")
  cfg = sweep.model_config(dict(base, label="x", ckpt="w.npz",
                                overrides={"model": {"num_classes": 3}, "train.steps": 5}), c)
  assert cfg.model.to_dict() == {"num_classes": 3} and cfg.train.steps == 5
  assert cfg.model_init == "w.npz" and cfg.model_label == "x"
  assert cfg.metrics.n_bootstrap == 20 and cfg.detectors == sweep_config.SMOKE_DETECTORS
  with pytest.raises(ValueError, match="no field 'modle'.*'model'"):
    sweep.model_config(dict(base, overrides={"modle": {}}), c)
  with pytest.raises(ValueError, match="either a zoo"):
    sweep.model_config(dict(base, zoo="timm/resnet50"), c)
  cfg = sweep.model_config(dict(zoo="torchvision/resnet50", ckpt="r.pth"), c)
  assert cfg.model_label == "torchvision/resnet50.IMAGENET1K_V2"
  cfg = sweep.model_config(dict(zoo="mae/vit_base_patch16", ckpt="m.pth"), c)
  assert cfg.model_label == "mae/vit_base_patch16.finetuned_in1k" and cfg.model_name == "vit"
  with pytest.raises(ValueError, match=r"zoo name 'hub/x'.*'mae', 'timm'"):
    sweep.model_config(dict(zoo="hub/x"), c)
  # a model whose config cannot be built is that model's problem; shared folders are an error
  bad = ml_collections.ConfigDict(dict(c.to_dict(), models=(
      dict(label="a", zoo="timm/no_such_model"), dict(label="b", **base))))
  models = sweep.build_models(bad)
  assert "no_such_model" in models[0].problems[0] and not models[1].problems
  dup = ml_collections.ConfigDict(dict(c.to_dict(), models=(
      dict(label="a/b", **base), dict(label="a_b", **base))))
  with pytest.raises(sweep.SweepError, match="share the folder"):
    sweep.build_models(dup)


def test_preflight_lists_every_problem_and_stops_without_keep_going(tmp_path):
  """No files in `dir`: with --keep_going=false every model's problems are listed at once,
  exit 2, nothing computed (through `main.py sweep`, the fi-jax script's form)."""
  env = {**os.environ, "PYTHONPATH": ROOT}
  r = subprocess.run([sys.executable, "main.py", "sweep",
                      f"--config=configs/sweep.py:smoke,dir={tmp_path / 'none'}",
                      f"--workdir={tmp_path / 'w'}", "--keep_going=false"], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 2, r.stderr[-2000:]
  # the two checkpoints; the features model's folder has no OOD set file (a config error,
  # found by validation before its id_fit / id_test files are looked for)
  assert "preflight found 3 problem(s); nothing was computed" in r.stderr
  for name in ("model timm-vit-tiny: checkpoint", "timm_vit_tiny.safetensors",
               "model tv-resnet-tiny: checkpoint", "torchvision_resnet_tiny.pth",
               "model features-proj: ValueError: config.ood names no OOD set"):
    assert name in r.stderr
  assert not any(os.path.exists(tmp_path / "w" / m / "results.json") for m in LABELS)


def test_resume_failures_and_shards_in_process(tmp_path):
  """The sweep's control flow with a stand-in for the benchmark run: a model that raises is
  recorded and the others run; a rerun skips finished models and retries the failed one; a
  changed config reruns a model; shards split the models by index."""
  files = tmp_path / "files"
  sweep_smoke._features(str(files / "features"), 0)   # numpy only; checkpoints: any bytes
  for name in ("vit", "resnet", "broken"):
    (files / sweep_config.SMOKE_FILES[name]).write_bytes(b"not read by the stand-in")
  c = sweep_config.get_config(f"smoke,dir={files},broken=True")
  calls = []

  def fake_run(config, workdir, log):
    calls.append(config.model_label)
    if config.model_label == "broken-vit":
      raise ValueError("a damaged checkpoint")
    res = schema.make({"config": sweep.fingerprint(config), "model_label": config.model_label,
                       "set_sizes": {"id_test": 10}}, 0.5, [], [])
    sweep_state.write_json(os.path.join(workdir, "results.json"), res)
    return res

  w = str(tmp_path / "w")
  run = lambda **kw: sweep.run_sweep(c, w, log=lambda s: None, run_fn=fake_run,
                                     write_leaderboard=False, **kw)
  out = run()
  assert out.models == dict(zip(LABELS, ["done", "done", "done", "failed"])) and not out.ok
  assert calls == LABELS
  failed = json.load(open(os.path.join(w, "broken-vit", sweep_state.FAILED_FILE)))
  assert failed["reason"] == "ValueError: a damaged checkpoint" and failed["stage"] == "run"
  assert sweep_state.status(os.path.join(w, "broken-vit"))[0] == "failed"
  assert "a damaged checkpoint" in open(os.path.join(w, "broken-vit", "run.log")).read()
  record = json.load(open(os.path.join(w, sweep_state.SWEEP_FILE)))
  assert [m["label"] for m in record["models"]] == LABELS
  calls.clear()
  run()
  assert calls == ["broken-vit"]   # finished models skipped, the failed one retried
  c.shared.metrics.n_bootstrap = 7   # a changed config reruns every model
  calls.clear()
  run(shard=(1, 2))
  assert calls == ["tv-resnet-tiny", "broken-vit"]
  calls.clear()
  out = run(shard=(0, 2))
  assert calls == ["timm-vit-tiny", "features-proj"]
  assert out.models["tv-resnet-tiny"] == "other shard"


# ----------------------------------------------------------------------------- the smoke sweep

@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
  """The files (written once) and the uninterrupted reference sweep."""
  files = sweep_smoke.write(str(tmp_path_factory.mktemp("smoke_files")), broken=True)
  ref = str(tmp_path_factory.mktemp("sweep_ref"))
  r = _run([f"--config=configs/sweep.py:smoke,dir={files},broken=True", f"--workdir={ref}"])
  return files, ref, r


def _fpr(id_s, ood_s, tpr=0.95):
  n = len(id_s)
  k = next(k for k in range(1, n + 1) if k / n >= tpr)
  return float(np.mean(ood_s >= np.sort(id_s)[::-1][k - 1]))


@pytest.mark.slow   # ~20 s: three tiny models and the leaderboard, in a subprocess
def test_smoke_sweep_and_its_leaderboard(smoke):
  files, ref, r = smoke
  assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]   # 1: a model failed
  out = r.stdout
  for i, label in enumerate(LABELS[:3]):
    assert f"[{i + 1}/4] {label}: done in" in out and "images/s" in out
  assert "[4/4] broken-vit: FAILED" in out and "CheckpointError" in out
  # per-run files exactly as a single run's; compare works on them
  runs = {}
  for label in LABELS[:3]:
    folder = os.path.join(ref, label)
    runs[label] = schema.load(folder)
    assert {r_["model"] for r_ in runs[label]["rows"]} == {label}
    assert os.path.exists(os.path.join(folder, "scores", "ood", "digits_8-9.npz"))
    assert not os.path.exists(os.path.join(folder, sweep_state.RUNNING_FILE))
  compare([os.path.join(ref, m) for m in LABELS[:2]], os.path.join(ref, "cmp"),
          log=lambda s: None)
  failed = json.load(open(os.path.join(ref, "broken-vit", sweep_state.FAILED_FILE)))
  assert failed["reason"].startswith("CheckpointError:") and "truncated" in failed["reason"]

  board = json.load(open(os.path.join(ref, "leaderboard.json")))
  assert [(e["model"], e["status"]) for e in board["models"]] == list(zip(
      LABELS, ["done", "done", "done", "failed"]))
  assert board["models"][3]["reason"] == failed["reason"]
  assert "broken-vit — failed: CheckpointError" in open(os.path.join(ref, "leaderboard.md")).read()
  rows = [r_ for m in LABELS[:3] for r_ in runs[m]["rows"]]
  # minimum FPR@95 and the best pair per set, from the results.json rows
  for s in sweep_config.SMOKE_OOD:
    rs = [r_ for r_ in rows if r_["ood_set"] == s]
    best = min(rs, key=lambda r_: (r_["fpr95"], -r_["auroc"]))
    got = board["per_set"][s]
    assert got["min_fpr95"] == min(r_["fpr95"] for r_ in rs)
    assert (got["best_fpr95"]["model"], got["best_fpr95"]["detector"]) == (
        best["model"], best["detector"])
    assert got["n_within_ci"] == sum(r_["fpr95"] <= best["fpr95_ci_high"] for r_ in rs)
  # hardness ratio of the two stand-in sets over the chosen detectors, and its CI (seed 0,
  # 50 resamples) recomputed from the per-example score files
  num, den = sweep_config.SMOKE_OOD
  h = board["hardness"]
  chosen = h["detectors"]
  assert len(chosen) == math.ceil(len(sweep_config.SMOKE_DETECTORS) / 3)
  by = {(r_["model"], r_["detector"], r_["ood_set"]): r_["fpr95"] for r_ in rows}
  pairs = [(m, d) for m in LABELS[:3] for d in chosen]
  assert h["overall"]["ratio"] == pytest.approx(
      np.mean([by[(m, d, num)] for m, d in pairs]) / np.mean([by[(m, d, den)] for m, d in pairs]),
      rel=1e-12)
  sc = {}
  for m in LABELS[:3]:
    for s in ("id_test", f"ood/{num}", f"ood/{den}"):
      with np.load(os.path.join(ref, m, "scores", s + ".npz")) as z:
        sc[(m, s)] = {k: z[k] for k in z.files}
  # the point values from the scores equal the rows'
  for m, d in pairs:
    assert _fpr(sc[(m, "id_test")][d], sc[(m, f"ood/{num}")][d]) == by[(m, d, num)]
  n_id = len(sc[(LABELS[0], "id_test")]["id"])
  n_a, n_b = (len(sc[(LABELS[0], f"ood/{s}")]["id"]) for s in (num, den))
  rng = np.random.default_rng(0)
  ratios = []
  for _ in range(50):
    i, a, o = rng.integers(0, n_id, n_id), rng.integers(0, n_a, n_a), rng.integers(0, n_b, n_b)
    fa = [_fpr(sc[(m, "id_test")][d][i], sc[(m, f"ood/{num}")][d][a]) for m, d in pairs]
    fb = [_fpr(sc[(m, "id_test")][d][i], sc[(m, f"ood/{den}")][d][o]) for m, d in pairs]
    ratios.append(np.mean(fa) / np.mean(fb))
  assert [h["overall"]["ci_low"], h["overall"]["ci_high"]] == pytest.approx(
      np.quantile(ratios, [0.025, 0.975]), rel=1e-12)
  assert len(board["figures"]) == 4


_KILL_IN_SECOND_MODEL = textwrap.dedent("""
  import os, signal, sys
  from fi_jax.extract import cache
  save = cache.save
  def kill_at(path, arrays, meta=None):   # SIGKILL when tv-resnet-tiny's first OOD set is
    if "tv-resnet-tiny" in path and (meta or {}).get("set") == "ood/digits_6-7":   # saved
      os.kill(os.getpid(), signal.SIGKILL)
    return save(path, arrays, meta)
  cache.save = kill_at
  from fi_jax.run import sweep
  sweep.main(["python -m fi_jax.run.sweep"] + sys.argv[1:])
""")


@pytest.mark.slow   # ~35 s: a sweep killed in its second model, then rerun
def test_killed_sweep_resumes_to_the_same_leaderboard(smoke, tmp_path):
  files, ref, _ = smoke
  args = [f"--config=configs/sweep.py:smoke,dir={files},broken=True", f"--workdir={tmp_path}"]
  killed = _run(args, code=_KILL_IN_SECOND_MODEL)
  assert killed.returncode == -signal.SIGKILL, killed.stdout[-3000:] + killed.stderr[-3000:]
  assert "[1/4] timm-vit-tiny: done" in killed.stdout
  assert "[2/4] tv-resnet-tiny: running" in killed.stdout
  assert "[2/4] tv-resnet-tiny: done" not in killed.stdout
  # the leaderboard of what has finished, with the others listed
  from fi_jax.report.__main__ import main as report_main
  assert report_main(["leaderboard", str(tmp_path), "--out", str(tmp_path / "partial")]) == 0
  partial = json.load(open(tmp_path / "partial" / "leaderboard.json"))
  assert [e["status"] for e in partial["models"]] == ["done", "running", "missing", "missing"]
  rerun = _run(args)
  assert rerun.returncode == 1, rerun.stdout[-3000:] + rerun.stderr[-3000:]
  assert "[1/4] timm-vit-tiny: done (finished earlier)" in rerun.stdout
  assert "[2/4] tv-resnet-tiny: running (resuming an interrupted run)" in rerun.stdout
  log = open(tmp_path / "tv-resnet-tiny" / "run.log").read()
  assert "id_fit: 758 examples from cache" in log   # the killed run's sets were kept
  assert _board(str(tmp_path)) == _board(ref)


@pytest.mark.slow   # ~30 s: the sweep in two shards into one workdir
def test_shards_give_the_same_leaderboard(smoke, tmp_path):
  files, ref, _ = smoke
  args = [f"--config=configs/sweep.py:smoke,dir={files},broken=True", f"--workdir={tmp_path}"]
  first = _run(args + ["--shard=0/2"])
  assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
  assert "[1/4] timm-vit-tiny: done in" in first.stdout
  assert "[3/4] features-proj: done in" in first.stdout and "tv-resnet" not in first.stdout
  board = json.load(open(tmp_path / "leaderboard.json"))
  assert [e["status"] for e in board["models"]] == ["done", "missing", "done", "missing"]
  second = _run(args + ["--shard=1/2"])
  assert second.returncode == 1, second.stdout[-3000:] + second.stderr[-3000:]
  assert "[2/4] tv-resnet-tiny: done in" in second.stdout and "timm-vit" not in second.stdout
  assert _board(str(tmp_path)) == _board(ref)


def test_sweep_help_prints_the_usage_and_exits_0():
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  r = subprocess.run([sys.executable, os.path.join(root, "main.py"), "sweep", "--help"],
                     capture_output=True, text=True, timeout=120, cwd=root)
  assert r.returncode == 0 and r.stdout.startswith("usage: main.py sweep --config=")
  assert "--shard=i/n" in r.stdout and "leaderboard" in r.stdout
