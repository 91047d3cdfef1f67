"""Synthetic results and scores at realistic sizes (45 detectors, 1-10 models, 1-3 OOD sets,
a few failed detectors, heavy-tailed scores) and the report's figures drawn from them, to look
at the figures without running a model: tests/report/test_plots.py uses the generators, and

  python -m tests.helpers.synthetic_figures OUT

writes into OUT (then open the PNGs):
  run_1x1/plots/       one model, one OOD set: fpr95.png (bars), roc_*.png, hist_*.png
  run_1x3/plots/       one model, three OOD sets: fpr95.png (detector x set heat map), ...
  compare_45x2/        `report compare` of 2 runs: compare_fpr95_<set>.png (heat maps)
  compare_45x10/       `report compare` of 10 runs
  compare_45x1/        `report compare` of 1 run: compare_fpr95_<set>.png (bars)
  leaderboard_45x10/   the leaderboard of a sweep of 10 runs: leaderboard_fpr95_<set>.png, ...
and prints each figure's size in pixels. Nothing here is a measured number.
"""
from __future__ import annotations

import os
import sys
from typing import Mapping, Sequence

import numpy as np

# the 45 detectors of fi_jax.detectors (names only: importing the registry imports JAX)
DETECTORS = (
    "msp", "maxlogit", "energy", "tempscale", "odin", "gen", "klm", "react", "ash_p", "ash_b",
    "ash_s", "scale", "she", "dice", "mds", "rmds", "residual", "vim", "knn", "nnguide", "fdbd",
    "nci", "gradnorm", "cosine", "relative_cosine", "mcm", "weiper_kld", "weiper", "optfs",
    "bats", "line", "mds_pp", "rmds_pp", "ssd", "neco", "relation", "openmax", "vra",
    "adascale_a", "adascale_l", "combood", "rankfeat", "iodin", "mdsens", "gram")
MODELS = (
    "vit-B/16 (B_16-augreg)", "clip-B/16 (ckpt/open_clip_model)",
    "torchvision/resnet50.IMAGENET1K_V1", "convnext_base.fb_in22k_ft_in1k", "deit-S/16",
    "swin-B (in22k-ft)", "vit-L/16 (augreg)", "eva02-B/14", "regnety_160.deit", "dinov2-B/14")
SETS = ("fi_imagenet_1k", "ninco", "ssb_hard")
# (model index, detector) -> reason: two distinct reasons, one repeated
FAILED = {(0, "gram"): "LinAlgError: Singular matrix in the class covariance (768 x 768)",
          (1, "mcm"): "ValueError: mcm needs a vision-language model's text embeddings; "
                      "torchvision/resnet50 has none",
          (1, "gram"): "LinAlgError: Singular matrix in the class covariance (768 x 768)"}


def synthetic_results(model: str, model_index: int, detectors: Sequence[str] = DETECTORS,
                      sets: Sequence[str] = SETS, failed: Mapping = FAILED, seed: int = 0,
                      nan_rows: Sequence[tuple[str, str]] = ()) -> dict:
  """A run's results (fi_jax.report.schema) with rows of plausible FPR@95 / AUROC values and
  bootstrap CIs for every detector and set, but `failed` detectors of this model (in
  `failed`, listed with their reason) and `nan_rows` (detector, set) with a null FPR@95."""
  rng = np.random.default_rng([seed, model_index])
  fails = {d: r for (m, d), r in failed.items() if m == model_index}
  rows = []
  base = rng.uniform(0.15, 0.95, len(detectors))
  for k, s in enumerate(sets):
    for d, b in zip(detectors, base):
      if d in fails:
        continue
      f = float(np.clip(b + 0.1 * k + rng.normal(0, 0.05), 0.01, 1.0))
      half = 0.01 + 0.02 * rng.random()
      row = {"model": model, "detector": d, "id_set": "imagenet2012", "ood_set": s,
             "fpr95": f, "fpr95_ci_low": max(0.0, f - half), "fpr95_ci_high": min(1.0, f + half),
             "auroc": float(np.clip(1.05 - 0.5 * f, 0.5, 1.0)), "n_id": 50000, "n_ood": 5000,
             "n_bootstrap": 200, "tpr": 0.95, "ci_level": 0.95}
      if (d, s) in nan_rows:
        row.update(fpr95=None, fpr95_ci_low=None, fpr95_ci_high=None)
      rows.append(row)
  config = {"detectors": list(detectors), "id_name": "imagenet2012", "model_label": model,
            "metrics": {"tpr": 0.95, "n_bootstrap": 200},
            "ood": {s: {"name": s} for s in sets}, "id_test": {"name": "imagenet2012"}}
  return {"schema": 1, "meta": {"config": config, "ood_sets": list(sets), "model_label": model,
                                "run_id": f"synthetic{model_index}"},
          "id_accuracy": 0.8, "rows": rows,
          "failed": [{"detector": d, "failed": r} for d, r in fails.items()]}


def synthetic_scores(detectors: Sequence[str], sets: Sequence[str], seed: int = 0,
                     n_id: int = 2000, n_ood: int = 800) -> dict:
  """{detector: {"id_test": scores, "ood/<set>": scores}}: ID shifted above OOD by a
  detector-dependent margin; every third detector heavy-tailed (Student t, 1.5 dof)."""
  rng = np.random.default_rng(seed)
  out = {}
  for k, d in enumerate(detectors):
    draw = ((lambda n: rng.standard_t(1.5, n)) if k % 3 == 0 else rng.standard_normal)
    gap = 0.3 + 2.5 * rng.random()
    out[d] = {"id_test": gap + draw(n_id)}
    for j, s in enumerate(sets):
      out[d][f"ood/{s}"] = 0.3 * j + draw(n_ood)
  return out


def write_runs(root: str, n_models: int, sets: Sequence[str] = SETS) -> list[str]:
  """`n_models` synthetic runs' results.json (report.write) under `root`; their workdirs."""
  from fi_jax import report
  workdirs = []
  for m in range(n_models):
    wd = os.path.join(root, f"model{m}")
    report.write(synthetic_results(MODELS[m % len(MODELS)], m, sets=sets,
                                   nan_rows=[("she", sets[-1])] if m == 2 else ()), wd)
    workdirs.append(wd)
  return workdirs


def pixel_size(path: str) -> tuple[int, int]:
  """(width, height) of a PNG file from its header."""
  with open(path, "rb") as f:
    head = f.read(24)
  return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def write_sweep(root: str, n_models: int, sets: Sequence[str] = SETS) -> None:
  """A sweep folder (fi_jax.report.sweep_state) of `n_models` synthetic finished runs."""
  from fi_jax.report import sweep_state
  write_runs(root, n_models, sets)
  sweep_state.write_json(os.path.join(root, sweep_state.SWEEP_FILE), {
      "name": "synthetic", "models": [{"label": MODELS[m % len(MODELS)], "dir": f"model{m}"}
                                      for m in range(n_models)]})


def main(out: str) -> None:
  from fi_jax import report
  from fi_jax.report import leaderboard
  made = []
  for name, sets in (("run_1x1", SETS[:1]), ("run_1x3", SETS)):
    wd = os.path.join(out, name)
    res = synthetic_results(MODELS[1], 1, sets=sets)
    made += report.write_plots(wd, res, synthetic_scores(DETECTORS, sets), top=5)
  for n in (2, 10, 1):
    root = os.path.join(out, f"compare_45x{n}")
    made += [os.path.join(root, f) for f in sorted(os.listdir(root))
             if f.endswith(".png")] if report.compare(
        write_runs(os.path.join(root, "runs"), n), root, log=lambda s: None) else []
  root = os.path.join(out, "leaderboard_45x10")
  write_sweep(root, 10)
  board = leaderboard.write(root, log=lambda s: None, n_bootstrap=0)
  made += [os.path.join(root, f) for f in board["figures"]]
  for path in made:
    if not os.path.basename(path).startswith("hist_") or path.endswith(("hist_msp.png",
                                                                        "hist_vim.png")):
      w, h = pixel_size(path)
      print(f"{w:5d} x {h:5d} px  {os.path.relpath(path, out)}")


if __name__ == "__main__":
  if len(sys.argv) != 2:
    sys.exit(__doc__)
  main(sys.argv[1])
