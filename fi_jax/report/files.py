"""A run's report files: results.json / .csv / .md, per_class/<ood set>/<detector>.csv and the
per-example scores (scores/id_test.npz, scores/ood/<set>.npz).

  results.json   everything (fi_jax.report.schema): meta, id_accuracy, `rows` (one per model,
                 detector, ID set, OOD set, in configured order) and `failed` (one
                 {"detector", "failed": reason} per detector that raised or gave non-finite
                 scores; such a detector has no rows)
  results.csv    every field of every row
  results.md     the table, sorted by `config.report.sort_by` on `config.report.sort_set`
                 (default: FPR@95 on fi_imagenet_1k, else the first OOD set), every configured
                 detector listed (failed ones with their reason), then per-class tables
  per_class/<ood set>/<detector>.csv   metrics of every OOD class against all ID images
  scores/id_test.npz, scores/ood/<set>.npz   per-example scores: `id` (the example's index in
                 its set, the dataset's own numbering even where rows were dropped), `label`,
                 `group`, and one float array per detector (higher = more ID)
"""
from __future__ import annotations

import csv
import importlib.metadata
import json
import math
import os
from typing import Mapping, Optional, Sequence

import numpy as np

from fi_jax.common import columns
from fi_jax.report import schema, tables
from fi_jax.report.schema import failures, lower_is_better


def versions() -> dict[str, str]:
  out = {}
  for pkg in ("jax", "jaxlib", "flax", "optax", "numpy", "scikit-learn", "tensorflow-cpu",
              "tensorflow-datasets", "ml_collections"):
    try:
      out[pkg] = importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
      pass
  return out


def _int_counts(row: Mapping) -> dict:
  """The row with its count fields (n_id, n_ood, ...) as ints."""
  out = dict(row)
  for k in schema.INT_FIELDS:
    v = out.get(k)
    if isinstance(v, (float, np.floating)) and math.isfinite(v) and float(v).is_integer():
      out[k] = int(v)
  return out


def write_per_class(rows: Sequence[Mapping], workdir: str,
                    group_names: Optional[Mapping[str, Sequence[str]]] = None,
                    predicted_as: Optional[Mapping[str, Mapping]] = None) -> None:
  """One CSV per (detector, OOD set) with the metrics of every OOD class vs all ID images:
  per_class/<ood set>/<detector>.csv (`group` = the dataset's class id, `class` its name,
  `predicted_as` / `predicted_share` the ID class its images are most often predicted as)."""
  group_names, predicted_as = dict(group_names or {}), dict(predicted_as or {})
  for r in rows:
    table_ = r.get("per_class")
    if not table_:
      continue
    folder = os.path.join(workdir, "per_class", str(r["ood_set"]).replace("/", "_"))
    os.makedirs(folder, exist_ok=True)
    keys = ["group", "n_ood"] + sorted(k for k in table_ if k not in ("group", "n_ood"))
    names = list(group_names.get(r["ood_set"]) or [])
    pred = predicted_as.get(r["ood_set"]) or {}
    with open(os.path.join(folder, f"{r['detector']}.csv"), "w", newline="") as f:
      w = csv.writer(f)
      w.writerow(keys[:1] + ["class", "predicted_as", "predicted_share"] + keys[1:])
      for i in range(len(table_[keys[0]])):
        g = int(table_["group"][i])
        p = pred.get(str(g)) or {}
        vals = [schema.jsonable(table_[k][i]) for k in keys]
        vals[1] = int(vals[1])   # n_ood
        w.writerow([g, names[g] if 0 <= g < len(names) else "", p.get("class", ""),
                    p.get("share", "")] + vals[1:])


def predicted_as(logits: np.ndarray, groups: np.ndarray,
                 class_names: Optional[Sequence[str]] = None) -> dict[str, dict]:
  """{str(group): {"class", "class_id", "share"}}: per OOD class, the ID class its images
  are most often predicted as (argmax of the logits) and the share of its images that are."""
  pred = np.argmax(np.asarray(logits), axis=1)
  groups = np.asarray(groups)
  out = {}
  for g in np.unique(groups[groups >= 0]):
    p = pred[groups == g]
    ids, counts = np.unique(p, return_counts=True)
    c = int(ids[np.argmax(counts)])   # np.unique sorts: ties go to the lowest class id
    name = class_names[c] if class_names is not None and c < len(class_names) else str(c)
    out[str(int(g))] = {"class": str(name), "class_id": c,
                        "share": float(counts.max() / len(p))}
  return out


def write(results: Mapping, workdir: str) -> None:
  """Writes results.json, results.csv, results.md and per_class/ into `workdir`."""
  os.makedirs(workdir, exist_ok=True)
  meta = results.get("meta", {})
  write_per_class(results["rows"], workdir, meta.get("group_names"), meta.get("predicted_as"))
  md = tables.table(results)
  per_class = tables.per_class_tables(results)
  results = {**results, "failed": failures(results),
             "rows": [_int_counts({k: v for k, v in r.items() if k != "per_class"})
                      for r in results["rows"]]}
  with open(os.path.join(workdir, "results.json"), "w") as f:
    json.dump(schema.jsonable(results), f, indent=1)
  rows = results["rows"]
  fields = list(schema.KEY_COLUMNS)
  for r in rows:
    fields += [k for k in r if k not in fields]
  with open(os.path.join(workdir, "results.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=fields)
    w.writeheader()
    for r in rows:
      w.writerow(schema.jsonable(r))
  key, where = tables.sort_spec(results)
  title = schema.model_label(results)
  if meta.get("random_init"):
    title += " (RANDOM INIT: untrained weights, not a released model)"
  with open(os.path.join(workdir, "results.md"), "w") as f:
    f.write(f"# fi_jax results: {title}\n\n")
    f.write(md + "\n\n")
    title_of = {k: t for t, k, _ in tables.TABLE_COLUMNS}
    f.write(f"Sorted by {title_of.get(key, key)} on {where} "
            f"({'lower' if lower_is_better(key) else 'higher'} is better). "
            "Metrics in percent; ID is the positive class for AUROC and FPR@95 (threshold: the "
            "K-th largest ID score); FPR@95 (OOD+) is OpenOOD v1.5's. Brackets: bootstrap CI.\n")
    for fl in failures(results):
      f.write(f"\n- detector {fl['detector']} failed: {tables.cell(fl['failed'], 2000)}\n")
    if per_class:
      f.write("\n" + per_class + "\n")


def write_scores(workdir: str, scores: Mapping[str, Mapping[str, np.ndarray]],
                 sets: Mapping[str, Mapping[str, np.ndarray]]) -> list[str]:
  """scores/<set>.npz for id_test and every OOD set ("ood/x" -> scores/ood/x.npz): `id` (the
  example's index in its set: the set's `_id` column where it has one, i.e. where
  `pipeline.drop_nonfinite` dropped rows, else the row number), `label`, `group` and one float
  array per detector. Returns the files written."""
  written = []
  for set_name, arrays in sets.items():
    if set_name == "id_fit":
      continue
    n = len(arrays["logits"])
    ids = arrays.get(columns.ID)
    cols = {"id": np.arange(n, dtype=np.int64) if ids is None else np.asarray(ids, np.int64)}
    for k in ("label", "group"):
      if k in arrays:
        cols[k] = np.asarray(arrays[k], np.int64)
    for det, per_set in scores.items():
      if set_name in per_set:
        if det in cols:
          raise ValueError(f"A detector named {det!r} clashes with the score file's own "
                           f"{det!r} column.")
        cols[det] = np.asarray(per_set[set_name])
    path = os.path.join(workdir, "scores", set_name + ".npz")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.savez(path, **cols)
    written.append(path)
  return written


def load_scores(workdir: str, set_name: str) -> dict[str, np.ndarray]:
  """The arrays of scores/<set>.npz ("id_test" or "ood/<name>")."""
  path = os.path.join(workdir, "scores", set_name + ".npz")
  if not os.path.exists(path):
    raise FileNotFoundError(f"No per-example scores {path}; rerun that workdir's config with "
                            "this version of fi_jax (the feature cache makes it quick).")
  with np.load(path, allow_pickle=False) as z:
    return {k: z[k] for k in z.files}
