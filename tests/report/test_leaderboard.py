"""The leaderboard's numbers on synthetic runs (results.json + per-example scores written here),
each recomputed independently with numpy / scipy: the per-set minimum FPR@95, best pairs and
the count within the CI, the mean ranks, Friedman statistic and Nemenyi CD, the chosen
detectors and the hardness ratio with its paired bootstrap CI; failed and missing models."""
import json
import math
import os

import numpy as np
import pytest
from scipy import stats

from fi_jax.report import leaderboard, schema, sweep_state

DETS = ("msp", "energy", "knn", "vim", "mds")
SETS = ("hard", "easy")
N_OOD = {"hard": 70, "easy": 90}
N_ID = 120


def _fpr(id_s, ood_s, tpr=0.95):
  """FPR@95, written out: threshold = the K-th largest ID score, K the least k with
  k / n >= tpr; the share of OOD scores at or above it."""
  n = len(id_s)
  k = int(math.ceil(tpr * n - 1e-9))
  while k / n < tpr:
    k += 1
  t = np.sort(id_s)[::-1][k - 1]
  return float(np.mean(ood_s >= t))


def _auroc(id_s, ood_s):
  return float(stats.mannwhitneyu(id_s, ood_s).statistic / (len(id_s) * len(ood_s)))


def _write_run(folder, label, shift, rng, drop=()):
  """A finished run: scores of every detector (ID ~ N(shift_d, 1), OOD ~ N(0, 1), the hard
  set closer), its results.json rows with made-up CIs (FPR@95 +- 0.04)."""
  os.makedirs(os.path.join(folder, "scores", "ood"))
  ids = {"id_test": np.arange(N_ID)}
  ids.update({f"ood/{s}": np.arange(N_OOD[s]) for s in SETS})
  cols = {k: {"id": v} for k, v in ids.items()}
  rows = []
  for j, d in enumerate(DETS):
    if d in drop:
      continue
    base = rng.normal(0, 1, N_ID) + shift + 0.3 * j
    cols["id_test"][d] = base
    for s in SETS:
      ood = rng.normal(0.6 if s == "hard" else 0.0, 1, N_OOD[s])
      cols[f"ood/{s}"][d] = ood
      f = _fpr(base, ood)
      rows.append({"model": label, "detector": d, "id_set": "id", "ood_set": s,
                   "fpr95": f, "fpr95_ci_low": max(0.0, f - 0.04),
                   "fpr95_ci_high": min(1.0, f + 0.04), "auroc": _auroc(base, ood),
                   "n_id": N_ID, "n_ood": N_OOD[s], "n_bootstrap": 10})
  for k, c in cols.items():
    np.savez(os.path.join(folder, "scores", k + ".npz"), **c)
  res = schema.make({"model_label": label, "ood_sets": list(SETS),
                     "config": {"detectors": list(DETS), "metrics": {"tpr": 0.95}}},
                    0.5 + shift / 10, rows,
                    [{"detector": d, "failed": "ValueError: synthetic"} for d in drop])
  with open(os.path.join(folder, "results.json"), "w") as f:
    json.dump(schema.jsonable(res), f)
  return res


@pytest.fixture
def sweep(tmp_path):
  rng = np.random.default_rng(0)
  labels = ["m-a", "m/b", "m-c", "m-failed", "m-missing"]
  runs = {}
  for i, label in enumerate(labels[:3]):
    runs[label] = _write_run(str(tmp_path / sweep_state.folder_name(label)), label, 1.0 + i / 2,
                             rng, drop=("mds",) if label == "m-c" else ())
  sweep_state.write_json(str(tmp_path / "m-failed" / sweep_state.FAILED_FILE),
                         {"label": "m-failed", "reason": "CheckpointError: truncated"})
  sweep_state.write_json(str(tmp_path / sweep_state.SWEEP_FILE), {
      "name": "synthetic",
      "models": [{"label": m, "dir": sweep_state.folder_name(m)} for m in labels],
      "leaderboard": {"hardness": ["hard", "easy"], "n_bootstrap": 60, "seed": 7}})
  return str(tmp_path), runs


def _scores(workdir, label, s):
  with np.load(os.path.join(workdir, sweep_state.folder_name(label), "scores", s + ".npz")) as z:
    return {k: z[k] for k in z.files}


def test_leaderboard_numbers_equal_an_independent_recomputation(sweep):
  workdir, runs = sweep
  board = leaderboard.write(workdir, log=lambda s: None)
  done = ["m-a", "m/b", "m-c"]
  assert [(e["model"], e["status"]) for e in board["models"]] == [
      ("m-a", "done"), ("m/b", "done"), ("m-c", "done"), ("m-failed", "failed"),
      ("m-missing", "missing")]
  assert board["models"][3]["reason"] == "CheckpointError: truncated"
  rows = [r for m in done for r in runs[m]["rows"]]

  # per set: minimum FPR@95, the best pairs, pairs within the best pair's CI
  for s in SETS:
    rs = [r for r in rows if r["ood_set"] == s]
    best = min(rs, key=lambda r: (r["fpr95"], -r["auroc"]))
    got = board["per_set"][s]
    assert got["min_fpr95"] == best["fpr95"] == min(r["fpr95"] for r in rs)
    assert (got["best_fpr95"]["model"], got["best_fpr95"]["detector"]) == (
        best["model"], best["detector"])
    top = max(rs, key=lambda r: (r["auroc"], -r["fpr95"]))
    assert (got["best_auroc"]["model"], got["best_auroc"]["detector"]) == (
        top["model"], top["detector"])
    assert got["n_pairs"] == len(rs) == 14
    assert got["n_within_ci"] == sum(r["fpr95"] <= best["fpr95_ci_high"] for r in rs)

  # ranks: mds failed on m-c, so four detectors over three models
  ranked = [d for d in DETS if d != "mds"]
  assert board["ranking"]["not_ranked"] == {"mds": ["m-c"]}
  by = {(r["model"], r["detector"], r["ood_set"]): r["fpr95"] for r in rows}
  values = np.array([[np.mean([by[(m, d, s)] for s in SETS]) for d in ranked] for m in done])
  ranks = stats.rankdata(values, axis=1)
  mean_rank = dict(zip(ranked, ranks.mean(axis=0)))
  got = {d["detector"]: d["mean_rank"] for d in board["ranking"]["detectors"]}
  assert got == pytest.approx(mean_rank, abs=1e-12)
  fr = board["ranking"]["friedman"]
  ref = stats.friedmanchisquare(*values.T)
  assert fr["chi2"] == pytest.approx(ref.statistic, rel=1e-12)
  assert fr["p"] == pytest.approx(ref.pvalue, rel=1e-9)
  # Demšar's table: q_0.05 = 2.569 for k = 4
  assert fr["q_alpha"] == pytest.approx(2.569, abs=1e-3)
  assert fr["cd"] == pytest.approx(fr["q_alpha"] * math.sqrt(4 * 5 / (6 * 3)), rel=1e-12)

  # hardness: the best third (2 of 4) by mean rank, ratio from the rows, CI from the scores
  chosen = sorted(ranked, key=lambda d: mean_rank[d])[:2]
  h = board["hardness"]
  assert h["detectors"] == chosen
  pairs = [(m, d) for m in done for d in chosen]
  ratio = (np.mean([by[(m, d, "hard")] for m, d in pairs])
           / np.mean([by[(m, d, "easy")] for m, d in pairs]))
  assert h["overall"]["ratio"] == pytest.approx(ratio, rel=1e-12)
  sc = {(m, s): _scores(workdir, m, s) for m in done
        for s in ("id_test", "ood/hard", "ood/easy")}
  rng = np.random.default_rng(7)
  draws = {"overall": [], **{m: [] for m in done}}
  for _ in range(60):
    i = rng.integers(0, N_ID, N_ID)
    a = rng.integers(0, N_OOD["hard"], N_OOD["hard"])
    o = rng.integers(0, N_OOD["easy"], N_OOD["easy"])
    fa = {(m, d): _fpr(sc[(m, "id_test")][d][i], sc[(m, "ood/hard")][d][a]) for m, d in pairs}
    fb = {(m, d): _fpr(sc[(m, "id_test")][d][i], sc[(m, "ood/easy")][d][o]) for m, d in pairs}
    draws["overall"].append(np.mean(list(fa.values())) / np.mean(list(fb.values())))
    for m in done:
      draws[m].append(np.mean([fa[(m, d)] for d in chosen]) / np.mean([fb[(m, d)] for d in chosen]))
  assert [h["overall"]["ci_low"], h["overall"]["ci_high"]] == pytest.approx(
      np.quantile(draws["overall"], [0.025, 0.975]), rel=1e-12)
  for p in h["models"]:
    m = p["model"]
    assert p["ratio"] == pytest.approx(np.mean([by[(m, d, "hard")] for d in chosen])
                                       / np.mean([by[(m, d, "easy")] for d in chosen]))
    assert [p["ci_low"], p["ci_high"]] == pytest.approx(np.quantile(draws[m], [0.025, 0.975]),
                                                        rel=1e-12)

  # per model: the best detector on the primary set (the numerator)
  assert board["primary_set"] == "hard"
  for e in board["models"][:3]:
    rs = [r for r in runs[e["model"]]["rows"] if r["ood_set"] == "hard"]
    best = min(rs, key=lambda r: r["fpr95"])
    assert (e["best_detector"], e["best_fpr95"]) == (best["detector"], best["fpr95"])
  assert board["models"][2]["failed_detectors"] == ["mds"]

  # the files
  for f in leaderboard.FILES:
    assert os.path.exists(os.path.join(workdir, f))
  assert len(board["figures"]) == 4 and all(os.path.exists(os.path.join(workdir, f))
                                            for f in board["figures"])
  with open(os.path.join(workdir, "leaderboard.json")) as f:
    assert json.load(f)["hardness"]["overall"]["ratio"] == pytest.approx(ratio)
  md = open(os.path.join(workdir, "leaderboard.md")).read()
  assert "m-failed — failed: CheckpointError: truncated" in md and "m-missing — missing" in md
  csv_lines = open(os.path.join(workdir, "leaderboard.csv")).read().splitlines()
  assert len(csv_lines) == 1 + 28


def test_named_detectors_settings_and_no_sweep_file(sweep, tmp_path):
  workdir, runs = sweep
  os.remove(os.path.join(workdir, sweep_state.SWEEP_FILE))   # a plain folder of run folders
  board = leaderboard.build(workdir, hardness=("easy", "hard"), detectors="msp,knn",
                            n_bootstrap=0)
  # without sweep.json: every subfolder with a run or a FAILED.json, sorted by name
  assert [e["model"] for e in board["models"]] == ["m-a", "m-c", "m-failed", "m/b"]
  h = board["hardness"]
  assert h["detectors"] == ["msp", "knn"] and h["overall"]["ci_low"] is None
  by = {(r["model"], r["detector"], r["ood_set"]): r["fpr95"]
        for m in runs for r in runs[m]["rows"]}
  num = [by[(m, d, "easy")] for m in ("m-a", "m-c", "m/b") for d in ("msp", "knn")]
  den = [by[(m, d, "hard")] for m in ("m-a", "m-c", "m/b") for d in ("msp", "knn")]
  assert h["overall"]["ratio"] == pytest.approx(np.mean(num) / np.mean(den))
  with pytest.raises(ValueError, match="two OOD sets"):
    leaderboard.build(workdir, hardness=("easy",))


def test_cli_writes_the_leaderboard(sweep, tmp_path):
  from fi_jax.report.__main__ import main
  workdir, _ = sweep
  assert main(["leaderboard", workdir, "--out", str(tmp_path / "lb"), "--n_bootstrap", "5"]) == 0
  board = json.load(open(tmp_path / "lb" / "leaderboard.json"))
  assert board["settings"]["n_bootstrap"] == 5 and board["settings"]["seed"] == 7
