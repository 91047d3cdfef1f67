"""Quick real runs for the report tests: synthetic sets written as a features folder
(configs/features.py) and run through the whole pipeline in-process, no model and no TFDS.

One folder path serves several runs (rewritten between them), so that their configs name the
same sets and `compare --pair` accepts them as runs on the same images."""
from __future__ import annotations

import json
import os
import shutil
from typing import Optional, Sequence

import numpy as np

from configs import features as features_config
from fi_jax.run import benchmark

N_FIT, N_TEST, N_OOD, DIM, CLASSES = 120, 60, 40, 6, 3


def write_sets(folder: str, seed: int = 0, noise: float = 0.0,
               nan_rows: Optional[dict[str, Sequence[int]]] = None) -> str:
  """id_fit / id_test / ood `far` (two OOD classes) and the head into `folder`, drawn from
  `seed`. `noise` > 0 perturbs the test sets' features (another model on the same images);
  `nan_rows` {set: rows} puts NaN into those rows' features (their logits stay finite)."""
  rng = np.random.default_rng(seed)
  w, b = rng.normal(size=(DIM, CLASSES)), np.zeros(CLASSES)
  os.makedirs(folder, exist_ok=True)
  wobble = np.random.default_rng(1000 + seed)
  for name, n, ood in (("id_fit", N_FIT, False), ("id_test", N_TEST, False),
                       ("far", N_OOD, True)):
    feats = rng.normal(size=(n, DIM)) + (0.0 if ood else 1.0)
    if noise and name != "id_fit":
      feats = feats + noise * wobble.normal(size=feats.shape)
    logits = feats @ w + b
    for r in (nan_rows or {}).get(name, ()):
      feats[r, 0] = np.nan
    label = -np.ones(n, np.int64) if ood else rng.integers(0, CLASSES, n)
    group = rng.integers(0, 2, n) if ood else -np.ones(n, np.int64)
    np.savez(os.path.join(folder, f"{name}.npz"), features=feats, logits=logits, label=label,
             group=group)
  np.savez(os.path.join(folder, "head.npz"), w=w, b=b)
  return folder


def config(folder: str, label: str, detectors=("msp", "energy", "knn"), plots: bool = False,
           **over):
  """configs/features.py on `folder` with a few quick detectors (no bootstrap)."""
  c = features_config.get_config(f"dir={folder},label={label}")
  c.detectors = tuple(detectors)
  c.detector_hparams = {"knn": {"k": 5}}
  c.report.plots = plots
  for k, v in over.items():
    c[k] = v
  return c


def run(folder: str, workdir: str, label: str, log=lambda s: None, **kw) -> dict:
  return benchmark.run(config(folder, label, **kw), str(workdir), log=log)


def copy_workdir(src: str, dst: str) -> str:
  """A copy of a workdir with its links kept as links (they are relative)."""
  shutil.copytree(src, dst, symlinks=True)
  return dst


def snapshot(workdir: str) -> dict[str, bytes]:
  """{path relative to the workdir: bytes} of every report file reached through the workdir's
  top-level names (results.*, scores/, per_class/, plots/)."""
  out = {}
  for name in ("results.json", "results.csv", "results.md", "scores", "per_class", "plots"):
    top = os.path.join(workdir, name)
    if os.path.isfile(top):
      with open(top, "rb") as f:
        out[name] = f.read()
    for root, _, files in os.walk(top):
      for f in files:
        p = os.path.join(root, f)
        with open(p, "rb") as fh:
          out[os.path.relpath(p, workdir)] = fh.read()
  return out


def run_id(workdir: str) -> str:
  with open(os.path.join(workdir, "results.json")) as f:
    return json.load(f)["meta"]["run_id"]
