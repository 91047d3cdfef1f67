"""Report files of a run, and the comparison of several runs.

A run's workdir gets:
  results.json   everything: meta, id_accuracy, `rows` (one per model, detector, ID set, OOD
                 set, in configured order) and `failed` (one {"detector", "failed": reason}
                 per detector that raised or gave non-finite scores; such a detector has no rows)
  results.csv    every field of every row
  results.md     the table, sorted by `config.report.sort_by` on `config.report.sort_set`
                 (default: FPR@95 on fi_imagenet_1k, else the first OOD set), every configured
                 detector listed (failed ones with their reason), then per-class tables
  per_class/<ood set>/<detector>.csv   metrics of every OOD class against all ID images
  scores/id_test.npz, scores/ood/<set>.npz   per-example scores: `id` (the example's index in
                 its set), `label`, `group`, and one float array per detector (higher = more ID)
  plots/         ROC curves per OOD set (best detectors), ID-vs-OOD score histograms per
                 detector, the FPR@95 heat map detector x OOD set

Metric values are fractions in [0, 1] in the files; the tables show percent, as papers do.
`fpr95` is the ID-positive FPR@95%TPR with the K-th largest ID score as threshold (ViM, KNN
papers), `fpr95_ninco` NINCO's interpolated-quantile variant, `fpr95_ood_positive` OpenOOD
v1.5's convention — see docs/metrics.md for the exact definitions.

  python -m fi_jax.report compare WORKDIR... [--out DIR] [--pair MODEL:DET MODEL:DET]

writes compare.md / compare.csv / compare_fpr95.png over the runs and, with --pair, a paired
bootstrap test of two (model, detector) pairs on the same images (see `paired_bootstrap`).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import csv
import importlib.metadata
import json
import math
import os
import sys
from typing import Any, Mapping, Optional, Sequence

import numpy as np

_KEY_COLUMNS = ["model", "detector", "id_set", "ood_set"]
# (column title, row key, is a percentage)
_TABLE = [("AUROC", "auroc", True), ("FPR@95", "fpr95", True),
          ("FPR@95 (OOD+)", "fpr95_ood_positive", True), ("AUPR-In", "aupr_in", True),
          ("AUPR-Out", "aupr_out", True), ("AUROC macro", "auroc_macro", True),
          ("FPR@95 macro", "fpr95_macro", True), ("n_id", "n_id", False),
          ("n_ood", "n_ood", False)]
# Row fields that are counts: written as integers.
_INT_KEYS = ("n_id", "n_ood", "n_ood_groups", "n_bootstrap", "group")
DEFAULT_SORT_BY = "fpr95"
DEFAULT_SORT_SET = "fi_imagenet_1k"


def versions() -> dict[str, str]:
  out = {}
  for pkg in ("jax", "jaxlib", "flax", "optax", "numpy", "scikit-learn", "tensorflow-cpu",
              "tensorflow-datasets", "ml_collections"):
    try:
      out[pkg] = importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
      pass
  return out


def lower_is_better(key: str) -> bool:
  """FPRs and errors are better low; AUROC / AUPR / TNR high."""
  return key.startswith("fpr") or "error" in key


# ----------------------------------------------------------------------------- ordering

def ood_sets(results: Mapping) -> list[str]:
  """The OOD sets in configured order (meta `ood_sets`, else order of first appearance)."""
  order = list(results.get("meta", {}).get("ood_sets") or [])
  for r in results.get("rows", []):
    if r["ood_set"] not in order:
      order.append(r["ood_set"])
  return order


def _report_cfg(results: Mapping) -> dict:
  return dict(results.get("meta", {}).get("config", {}).get("report") or {})


def sort_spec(results: Mapping) -> tuple[str, str]:
  """(metric key, OOD set) that results.md is sorted by."""
  cfg, sets = _report_cfg(results), ood_sets(results)
  key = cfg.get("sort_by") or DEFAULT_SORT_BY
  where = cfg.get("sort_set") or (DEFAULT_SORT_SET if DEFAULT_SORT_SET in sets
                                  else (sets[0] if sets else ""))
  return key, where


def ranked_detectors(rows: Sequence[Mapping], key: str, ood_set: str) -> list[str]:
  """Detectors best first by `key` on `ood_set` (ties and missing values keep row order)."""
  names = list(dict.fromkeys(r["detector"] for r in rows))
  value = {r["detector"]: r.get(key) for r in rows if r["ood_set"] == ood_set}
  sign = 1.0 if lower_is_better(key) else -1.0

  def rank(name):
    v = value.get(name)
    ok = v is not None and isinstance(v, (int, float)) and math.isfinite(v)
    return (0, sign * v) if ok else (1, 0.0)
  return sorted(names, key=rank)


def configured_detectors(results: Mapping) -> list[str]:
  """Every detector the config names (else the ones with rows), in configured order."""
  names = list(results.get("meta", {}).get("config", {}).get("detectors") or [])
  for r in results.get("rows", []):
    if r["detector"] not in names:
      names.append(r["detector"])
  for f in failures(results):
    if f["detector"] not in names:
      names.append(f["detector"])
  return names


def failures(results: Mapping) -> list[dict]:
  """[{"detector", "failed": reason}]: the results' `failed` list (or meta.detector_errors)."""
  if results.get("failed") is not None:
    return list(results["failed"])
  errors = results.get("meta", {}).get("detector_errors") or {}
  return [{"detector": k, "failed": v} for k, v in errors.items()]


# ----------------------------------------------------------------------------- tables

def _fmt(row: Mapping, key: str, pct: bool) -> str:
  v = row.get(key)
  if v is None or (isinstance(v, float) and math.isnan(v)):
    return "-"
  if not pct:
    return str(int(v)) if float(v).is_integer() else f"{v:.4g}"
  text = f"{100 * v:.2f}"
  lo, hi = row.get(f"{key}_ci_low"), row.get(f"{key}_ci_high")
  if lo is not None and hi is not None:
    text += f" [{100 * lo:.1f}, {100 * hi:.1f}]"
  return text


def _columns(rows: Sequence[Mapping]) -> list[tuple[str, str, bool]]:
  return [c for c in _TABLE if any(c[1] in r for r in rows)]


def _cell(text: str, limit: int = 160) -> str:
  text = " ".join(str(text).split()).replace("|", "\\|")
  return text if len(text) <= limit else text[:limit - 3] + "..."


def table(results: Mapping) -> str:
  """The Markdown table: per OOD set (configured order) every configured detector, best
  first by the sort key; failed detectors last with their reason."""
  rows = list(results["rows"])
  cols = _columns(rows)
  failed = {f["detector"]: f["failed"] for f in failures(results)}
  key, where = sort_spec(results)
  order = ranked_detectors(rows, key, where)
  order += [d for d in configured_detectors(results) if d not in order]
  head = ["model", "detector", "ID", "OOD"] + [c[0] for c in cols]
  if failed:
    head.append("note")
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  meta = results.get("meta", {})
  model = (rows[0]["model"] if rows else meta.get("model_label")
           or meta.get("config", {}).get("model_label") or meta.get("model_name", ""))
  id_set = rows[0]["id_set"] if rows else meta.get("config", {}).get("id_name", "")
  by_key = {(r["detector"], r["ood_set"]): r for r in rows}
  for ood in ood_sets(results) or [""]:
    for det in order:
      r = by_key.get((det, ood))
      if r is not None:
        cells = [str(r.get(k, "")) for k in _KEY_COLUMNS] + [_fmt(r, k, p) for _, k, p in cols]
        if failed:
          cells.append("")
      else:
        reason = failed.get(det, "no result")
        cells = [str(model), det, str(id_set), ood] + ["failed"] * len(cols) + [_cell(reason)]
        if not failed:
          cells = cells[:-1]
      lines.append("| " + " | ".join(cells) + " |")
  acc = results.get("id_accuracy")
  intro = f"ID accuracy: {100 * acc:.2f}%\n\n" if acc is not None else ""
  return intro + "\n".join(lines)


def per_class_tables(results: Mapping, top: int = 3) -> str:
  """Markdown per OOD set with classes: class name, images, the ID class they are most often
  predicted as, and FPR@95 of the `top` best detectors (by the sort key)."""
  meta = results.get("meta", {})
  names = meta.get("group_names") or {}
  predicted = meta.get("predicted_as") or {}
  key, where = sort_spec(results)
  best = ranked_detectors(results["rows"], key, where)[:top]
  out = []
  for ood in ood_sets(results):
    rows = {r["detector"]: r for r in results["rows"]
            if r["ood_set"] == ood and r.get("per_class")}
    dets = [d for d in best if d in rows]
    if not dets:
      continue
    groups = [int(g) for g in rows[dets[0]]["per_class"]["group"]]
    n = rows[dets[0]]["per_class"]["n_ood"]
    set_names = names.get(ood) or []
    pred = predicted.get(ood) or {}
    lines = [f"### {ood}: per OOD class", "",
             "| class | n_ood | most predicted as (share) | "
             + " | ".join(f"FPR@95 {d}" for d in dets) + " |",
             "|" + "---|" * (3 + len(dets))]
    for i, g in enumerate(groups):
      name = set_names[g] if 0 <= g < len(set_names) else str(g)
      p = pred.get(str(g))
      p_text = f"{_cell(p['class'], 40)} ({100 * p['share']:.0f}%)" if p else "-"
      vals = [_fmt({"v": rows[d]["per_class"]["fpr95"][i]}, "v", True) for d in dets]
      lines.append(f"| {_cell(name, 60)} | {int(n[i])} | {p_text} | " + " | ".join(vals) + " |")
    out.append("\n".join(lines))
  return "\n\n".join(out)


def _jsonable(x: Any) -> Any:
  if isinstance(x, dict):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if hasattr(x, "tolist"):   # numpy / jax scalars and arrays
    return _jsonable(x.tolist())
  if isinstance(x, float) and not math.isfinite(x):
    return None
  return x


def _int_counts(row: Mapping) -> dict:
  """The row with its count fields (n_id, n_ood, ...) as ints."""
  out = dict(row)
  for k in _INT_KEYS:
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
        vals = [_jsonable(table_[k][i]) for k in keys]
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
  md = table(results)
  per_class = per_class_tables(results)
  results = {**results, "failed": failures(results),
             "rows": [_int_counts({k: v for k, v in r.items() if k != "per_class"})
                      for r in results["rows"]]}
  with open(os.path.join(workdir, "results.json"), "w") as f:
    json.dump(_jsonable(results), f, indent=1)
  rows = results["rows"]
  fields = list(_KEY_COLUMNS)
  for r in rows:
    fields += [k for k in r if k not in fields]
  with open(os.path.join(workdir, "results.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=fields)
    w.writeheader()
    for r in rows:
      w.writerow(_jsonable(r))
  key, where = sort_spec(results)
  title = (meta.get("model_label") or meta.get("config", {}).get("model_label")
           or meta.get("model_name", ""))
  if meta.get("random_init"):
    title += " (RANDOM INIT: untrained weights, not a released model)"
  with open(os.path.join(workdir, "results.md"), "w") as f:
    f.write(f"# fi_jax results: {title}\n\n")
    f.write(md + "\n\n")
    title_of = {k: t for t, k, _ in _TABLE}
    f.write(f"Sorted by {title_of.get(key, key)} on {where} "
            f"({'lower' if lower_is_better(key) else 'higher'} is better). "
            "Metrics in percent; ID is the positive class for AUROC and FPR@95 (threshold: the "
            "K-th largest ID score); FPR@95 (OOD+) is OpenOOD v1.5's. Brackets: bootstrap CI.\n")
    for fl in failures(results):
      f.write(f"\n- detector {fl['detector']} failed: {_cell(fl['failed'], 2000)}\n")
    if per_class:
      f.write("\n" + per_class + "\n")


# ----------------------------------------------------------------------------- scores

def write_scores(workdir: str, scores: Mapping[str, Mapping[str, np.ndarray]],
                 sets: Mapping[str, Mapping[str, np.ndarray]]) -> list[str]:
  """scores/<set>.npz for id_test and every OOD set ("ood/x" -> scores/ood/x.npz): `id`
  (index of the example in its set), `label`, `group` and one float array per detector.
  Returns the files written."""
  written = []
  for set_name, arrays in sets.items():
    if set_name == "id_fit":
      continue
    n = len(arrays["logits"])
    cols = {"id": np.arange(n, dtype=np.int64)}
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


# ----------------------------------------------------------------------------- numpy metrics

def auroc(id_scores: np.ndarray, ood_scores: np.ndarray) -> float:
  """P(s_id > s_ood) + 1/2 P(tie) (Mann-Whitney), the same value as fi_jax.metrics'."""
  n_id, n_ood = len(id_scores), len(ood_scores)
  _, inverse, counts = np.unique(np.concatenate([id_scores, ood_scores]), return_inverse=True,
                                 return_counts=True)
  ranks = (np.cumsum(counts) - (counts - 1) / 2.0)[inverse]   # average ranks of ties, 1-based
  return float((ranks[:n_id].sum() - n_id * (n_id + 1) / 2) / (n_id * n_ood))


def fpr_at_tpr(id_scores: np.ndarray, ood_scores: np.ndarray, tpr: float = 0.95) -> float:
  """ID-positive FPR@TPR as fi_jax.metrics' `fpr95`: threshold t = the K-th largest ID score,
  K = min{k : k / n_id >= tpr}; the fraction of OOD scores >= t."""
  n = len(id_scores)
  k = next(k for k in range(max(1, int(math.floor(tpr * n)) - 1), n + 1)
           if float(k) / float(n) >= tpr)
  t = np.partition(np.asarray(id_scores), n - k)[n - k]
  return float(np.mean(np.asarray(ood_scores) >= t))


def roc_curve(id_scores: np.ndarray, ood_scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(FPR, TPR) at every distinct threshold, ID positive, from (0, 0) to (1, 1)."""
  s = np.concatenate([id_scores, ood_scores])
  y = np.concatenate([np.ones(len(id_scores)), np.zeros(len(ood_scores))])
  order = np.argsort(-s, kind="stable")
  s, y = s[order], y[order]
  last = np.r_[np.flatnonzero(np.diff(s) != 0), len(s) - 1]
  tp, fp = np.cumsum(y)[last], np.cumsum(1 - y)[last]
  return (np.r_[0.0, fp / max(1, len(ood_scores))], np.r_[0.0, tp / max(1, len(id_scores))])


# ----------------------------------------------------------------------------- plots

def write_plots(workdir: str, results: Mapping, scores: Mapping[str, Mapping[str, np.ndarray]],
                top: int = 5, hists: Optional["HistWriter"] = None) -> list[str]:
  """plots/roc_<set>.png (the `top` best detectors by the sort key), plots/hist_<detector>.png
  (ID test vs each OOD set), plots/fpr95_heatmap.png. Returns the files written. `hists`: a
  HistWriter that has drawn (some of) the histograms already."""
  folder = os.path.join(workdir, "plots")
  os.makedirs(folder, exist_ok=True)
  key, where = sort_spec(results)
  best = ranked_detectors(results["rows"], key, where)[:top]
  sets = ood_sets(results)
  drawn = hists.result() if hists is not None else {}
  written = []
  for ood in sets:
    fig, ax = _plt().subplots(figsize=(5, 5))
    for det in best:
      if f"ood/{ood}" in scores.get(det, {}):
        fpr, tpr = roc_curve(scores[det]["id_test"], scores[det][f"ood/{ood}"])
        ax.plot(fpr, tpr, label=f"{det} (AUROC {100 * auroc(scores[det]['id_test'], scores[det][f'ood/{ood}']):.1f})")
    ax.plot([0, 1], [0, 1], ":", color="grey", lw=0.8)
    ax.set(xlabel="FPR (OOD accepted)", ylabel="TPR (ID accepted)", title=f"ROC: {ood}")
    ax.legend(fontsize=7, loc="lower right")
    written.append(_save(fig, os.path.join(folder, f"roc_{_file_safe(ood)}.png")))
  for det, per_set in scores.items():
    path = drawn[det] if det in drawn else write_hist(folder, det, per_set, sets)
    if path is not None:
      written.append(path)
  dets = ranked_detectors(results["rows"], key, where)
  value = {(r["detector"], r["ood_set"]): r.get("fpr95") for r in results["rows"]}
  grid = np.array([[np.nan if value.get((d, s)) is None else 100 * value[(d, s)] for s in sets]
                   for d in dets], float).reshape(len(dets), len(sets))
  written.append(heatmap(grid, dets, sets, "FPR@95 (%)", os.path.join(folder, "fpr95_heatmap.png")))
  return written


def write_hist(folder: str, det: str, per_set: Mapping[str, np.ndarray],
               sets: Sequence[str]) -> Optional[str]:
  """<folder>/hist_<det>.png: the ID test scores against each OOD set's (`sets`: OOD set
  names); None (nothing drawn) when a set has no finite score."""
  finite = {k: np.asarray(v)[np.isfinite(v)] for k, v in per_set.items()}
  if not all(v.size for v in finite.values()):
    return None
  fig, ax = _plt().subplots(figsize=(6, 4))
  lo = min(v.min() for v in finite.values())
  hi = max(v.max() for v in finite.values())
  bins = np.linspace(lo, hi if hi > lo else lo + 1, 51)
  # one filled / outlined step path per set (ax.hist draws a patch per bar: ~10x slower)
  ax.stairs(np.histogram(finite["id_test"], bins, density=True)[0], bins, fill=True,
            alpha=0.5, label="ID test")
  for ood in sets:
    if f"ood/{ood}" in finite:
      ax.stairs(np.histogram(finite[f"ood/{ood}"], bins, density=True)[0], bins, label=ood)
  ax.set(xlabel=f"{det} score (higher = more ID)", ylabel="density", title=det)
  ax.legend(fontsize=7)
  fig.subplots_adjust(left=0.13, right=0.98, bottom=0.13, top=0.92)   # fixed: no tight_layout
  return _save(fig, os.path.join(folder, f"hist_{_file_safe(det)}.png"), tight=False)


class HistWriter:
  """Draws each detector's histogram (`write_hist`) in one background thread as soon as its
  scores exist, while the next detectors run (their time is mostly XLA compilation and
  computation, outside the GIL); `write_plots(..., hists=)` takes the files. Only this thread
  draws until `result()` returns (pyplot is not for concurrent use)."""

  def __init__(self, workdir: str, sets: Sequence[str]):
    self.folder, self.sets = os.path.join(workdir, "plots"), list(sets)
    self._pool = concurrent.futures.ThreadPoolExecutor(1, "fi_jax-plots")
    self._futures: dict[str, concurrent.futures.Future] = {}

  def submit(self, det: str, per_set: Mapping[str, np.ndarray]) -> None:
    if not self._futures:
      os.makedirs(self.folder, exist_ok=True)
    self._futures[det] = self._pool.submit(write_hist, self.folder, det, dict(per_set),
                                           self.sets)

  def result(self) -> dict[str, Optional[str]]:
    """{detector: file or None}; waits for every drawing and re-raises the first failure."""
    self._pool.shutdown(wait=True)
    return {det: f.result() for det, f in self._futures.items()}


def heatmap(grid: np.ndarray, rows: Sequence[str], cols: Sequence[str], title: str,
            path: str) -> str:
  """A annotated heat map (lower = better = lighter) saved to `path`."""
  fig, ax = _plt().subplots(figsize=(3.0 + 1.1 * max(1, len(cols)), 1.0 + 0.35 * max(1, len(rows))))
  im = ax.imshow(grid, cmap="viridis_r", vmin=0, vmax=100, aspect="auto")
  ax.set_xticks(range(len(cols)), cols, rotation=30, ha="right", fontsize=8)
  ax.set_yticks(range(len(rows)), rows, fontsize=8)
  for i in range(grid.shape[0]):
    for j in range(grid.shape[1]):
      if np.isfinite(grid[i, j]):
        ax.text(j, i, f"{grid[i, j]:.1f}", ha="center", va="center", fontsize=7,
                color="white" if grid[i, j] > 50 else "black")
  ax.set_title(title)
  fig.colorbar(im, ax=ax)
  return _save(fig, path)


def _save(fig, path: str, tight: bool = True) -> str:
  if tight:
    fig.tight_layout()
  fig.savefig(path, dpi=100)
  _plt().close(fig)
  return path


def _plt():
  """matplotlib.pyplot on the Agg backend (files only; never a display), imported on first use:
  a run imports it in the thread that draws the first histogram, not at start-up."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  return pyplot


def _file_safe(name: str) -> str:
  return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


# ----------------------------------------------------------------------------- compare

def paired_bootstrap(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray], *,
                     n_bootstrap: int = 1000, seed: int = 0, tpr: float = 0.95,
                     ci: float = 0.95) -> dict[str, float]:
  """Paired bootstrap of AUROC and FPR@TPR differences (a - b) on the same images.

  `a` and `b` are (ID scores, OOD scores) of two detectors / models on the *same* examples in
  the same order. Each resample draws ID and OOD examples independently with replacement
  (sizes n_id and n_ood, as fi_jax.metrics' CIs) and applies the same draw to both, so that
  the per-image correlation between a and b is kept. Returns the observed differences, the
  percentile CI at level `ci`, and a two-sided p-value for "no difference":
  p = min(1, 2 min((1 + #{d* <= 0}) / (B + 1), (1 + #{d* >= 0}) / (B + 1))).
  """
  (ai, ao), (bi, bo) = [tuple(np.asarray(x, np.float64) for x in p) for p in (a, b)]
  if ai.shape != bi.shape or ao.shape != bo.shape:
    raise ValueError(f"Paired scores must cover the same examples: ID {ai.shape} vs "
                     f"{bi.shape}, OOD {ao.shape} vs {bo.shape}.")
  fns = {"auroc": auroc, "fpr95": lambda i, o: fpr_at_tpr(i, o, tpr)}
  rng = np.random.default_rng(seed)
  draws = {k: [] for k in fns}
  for _ in range(n_bootstrap):
    i = rng.integers(0, len(ai), len(ai))
    o = rng.integers(0, len(ao), len(ao))
    for k, fn in fns.items():
      draws[k].append(fn(ai[i], ao[o]) - fn(bi[i], bo[o]))
  out = {"n_id": len(ai), "n_ood": len(ao), "n_bootstrap": n_bootstrap}
  for k, fn in fns.items():
    d = np.asarray(draws[k])
    out[f"{k}_a"], out[f"{k}_b"] = fn(ai, ao), fn(bi, bo)
    out[f"{k}_diff"] = out[f"{k}_a"] - out[f"{k}_b"]
    if n_bootstrap:
      out[f"{k}_diff_ci_low"] = float(np.quantile(d, (1 - ci) / 2))
      out[f"{k}_diff_ci_high"] = float(np.quantile(d, 1 - (1 - ci) / 2))
      out[f"{k}_p"] = float(min(1.0, 2 * min((1 + np.sum(d <= 0)) / (n_bootstrap + 1),
                                              (1 + np.sum(d >= 0)) / (n_bootstrap + 1))))
  return out


def _load_run(workdir: str) -> dict:
  path = os.path.join(workdir, "results.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{workdir} has no results.json; run main.py with --workdir={workdir} "
                            "first.")
  with open(path) as f:
    res = json.load(f)
  res["_workdir"] = workdir
  return res


def _paired_scores(run: Mapping, detector: str, ood: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """(ID ids, ID scores, OOD ids, OOD scores) of one detector of one run."""
  out = []
  for s in ("id_test", f"ood/{ood}"):
    z = load_scores(run["_workdir"], s)
    if detector not in z:
      raise ValueError(f"{run['_workdir']}: no scores of detector {detector!r} for {s} "
                       f"(has: {sorted(k for k in z if k not in ('id', 'label', 'group'))}).")
    out += [z["id"], z[detector]]
  return tuple(out)


def _align(ids_a, sa, ids_b, sb, what: str):
  """The scores of the examples both runs have, paired by example id."""
  common, ia, ib = np.intersect1d(ids_a, ids_b, return_indices=True)
  if not len(common):
    raise ValueError(f"{what}: the two runs share no example ids.")
  return sa[ia], sb[ib]


def _spec_key(spec: Mapping) -> dict:
  return {k: v for k, v in dict(spec or {}).items() if k != "data_dir"}


def compare(workdirs: Sequence[str], out: Optional[str] = None,
            pair: Optional[Sequence[str]] = None, *, n_bootstrap: int = 1000, seed: int = 0,
            log=print) -> dict:
  """The table (model x detector x OOD set) and FPR@95 heat map of several runs; with
  `pair` = ("MODEL:DET", "MODEL:DET") also the paired bootstrap on every common OOD set.
  Writes compare.md, compare.csv, compare_fpr95.png (and compare.json) into `out`."""
  runs = [_load_run(w) for w in workdirs]
  out = out or "."
  os.makedirs(out, exist_ok=True)
  sets: list[str] = []
  for r in runs:
    sets += [s for s in ood_sets(r) if s not in sets]
  rows = [r_ for r in runs for r_ in r["rows"]]
  keys = list(dict.fromkeys((r["model"], r["detector"]) for r in rows))
  for r in runs:
    for f in failures(r):
      label = (r["meta"].get("model_label") or r["meta"].get("config", {}).get("model_label")
               or r["meta"].get("model_name", ""))
      if (label, f["detector"]) not in keys:
        keys.append((label, f["detector"]))
  by = {(r["model"], r["detector"], r["ood_set"]): r for r in rows}
  key_metric = DEFAULT_SORT_BY
  where = DEFAULT_SORT_SET if DEFAULT_SORT_SET in sets else (sets[0] if sets else "")
  sign = 1 if lower_is_better(key_metric) else -1

  def rank(k):
    v = (by.get((*k, where)) or {}).get(key_metric)
    return (0, sign * v) if v is not None else (1, 0)
  keys.sort(key=rank)
  head = ["model", "detector"] + [f"{s} {m}" for s in sets for m in ("AUROC", "FPR@95")]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  csv_rows = []
  for k in keys:
    cells = list(k)
    for s in sets:
      r = by.get((*k, s))
      cells += [_fmt(r, "auroc", True), _fmt(r, "fpr95", True)] if r else ["-", "-"]
      if r:
        csv_rows.append({"model": k[0], "detector": k[1], "id_set": r["id_set"], "ood_set": s,
                         "auroc": r.get("auroc"), "fpr95": r.get("fpr95"),
                         "n_id": r.get("n_id"), "n_ood": r.get("n_ood")})
    lines.append("| " + " | ".join(cells) + " |")
  text = (f"Sorted by FPR@95 on {where}; AUROC / FPR@95 in percent.\n\n" + "\n".join(lines))
  result: dict[str, Any] = {"runs": list(workdirs), "rows": csv_rows}
  if pair:
    tests = paired_tests(runs, pair, sets, n_bootstrap=n_bootstrap, seed=seed)
    result["paired"] = tests
    a, b = pair
    plines = [f"\n\nPaired bootstrap ({n_bootstrap} resamples, the same images drawn for both): "
              f"A = {a}, B = {b}; differences A - B in percent points, 95% CI, two-sided p.\n",
              "| OOD | n_id | n_ood | AUROC A | AUROC B | ΔAUROC [CI] | p | FPR@95 A | FPR@95 B "
              "| ΔFPR@95 [CI] | p |", "|" + "---|" * 11]
    for s, t in tests.items():
      plines.append(
          f"| {s} | {t['n_id']} | {t['n_ood']} | {100 * t['auroc_a']:.2f} | "
          f"{100 * t['auroc_b']:.2f} | {100 * t['auroc_diff']:+.2f} "
          f"[{100 * t['auroc_diff_ci_low']:+.2f}, {100 * t['auroc_diff_ci_high']:+.2f}] | "
          f"{t['auroc_p']:.3g} | {100 * t['fpr95_a']:.2f} | {100 * t['fpr95_b']:.2f} | "
          f"{100 * t['fpr95_diff']:+.2f} [{100 * t['fpr95_diff_ci_low']:+.2f}, "
          f"{100 * t['fpr95_diff_ci_high']:+.2f}] | {t['fpr95_p']:.3g} |")
    text += "\n".join(plines)
  with open(os.path.join(out, "compare.md"), "w") as f:
    f.write("# fi_jax comparison\n\n" + text + "\n")
  with open(os.path.join(out, "compare.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=["model", "detector", "id_set", "ood_set", "auroc",
                                      "fpr95", "n_id", "n_ood"])
    w.writeheader()
    w.writerows(_jsonable(csv_rows))
  with open(os.path.join(out, "compare.json"), "w") as f:
    json.dump(_jsonable(result), f, indent=1)
  grid = np.array([[np.nan if (by.get((*k, s)) or {}).get("fpr95") is None
                    else 100 * by[(*k, s)]["fpr95"] for s in sets] for k in keys], float)
  heatmap(grid.reshape(len(keys), len(sets)), [f"{m}:{d}" for m, d in keys], sets,
          "FPR@95 (%)", os.path.join(out, "compare_fpr95.png"))
  log(text)
  log(f"Wrote {os.path.join(out, 'compare.md')} (+ .csv, .json, compare_fpr95.png).")
  return result


def paired_tests(runs: Sequence[Mapping], pair: Sequence[str], sets: Sequence[str], *,
                 n_bootstrap: int, seed: int) -> dict[str, dict]:
  """{OOD set: paired_bootstrap(A, B)} for the OOD sets both pairs were evaluated on."""
  if len(pair) != 2:
    raise ValueError(f"--pair takes two MODEL:DETECTOR, got {list(pair)}.")
  picked = []
  for p in pair:
    model, colon, det = p.rpartition(":")
    if not colon or not model or not det:
      raise ValueError(f"--pair expects MODEL:DETECTOR, got {p!r}.")
    run = next((r for r in runs if any(x["model"] == model and x["detector"] == det
                                       for x in r["rows"])), None)
    if run is None:
      have = sorted({f"{x['model']}:{x['detector']}" for r in runs for x in r["rows"]})
      raise ValueError(f"No run has {p!r}; the runs have: {', '.join(have)}.")
    picked.append((run, det))
  (ra, da), (rb, db) = picked
  ca, cb = ra["meta"].get("config", {}), rb["meta"].get("config", {})
  if _spec_key(ca.get("id_test")) != _spec_key(cb.get("id_test")):
    raise ValueError("The two runs' ID test sets differ (config id_test); a paired test needs "
                     "the same images.")
  tests = {}
  for s in sets:
    if not (s in ood_sets(ra) and s in ood_sets(rb)):
      continue
    if _spec_key((ca.get("ood") or {}).get(s)) != _spec_key((cb.get("ood") or {}).get(s)):
      raise ValueError(f"OOD set {s} differs between the two runs' configs; a paired test "
                       "needs the same images.")
    ia, sia, oa, soa = _paired_scores(ra, da, s)
    ib, sib, ob, sob = _paired_scores(rb, db, s)
    id_a, id_b = _align(ia, sia, ib, sib, "id_test")
    ood_a, ood_b = _align(oa, soa, ob, sob, s)
    tpr = float((ca.get("metrics") or {}).get("tpr", 0.95))
    tests[s] = paired_bootstrap((id_a, ood_a), (id_b, ood_b), n_bootstrap=n_bootstrap,
                                seed=seed, tpr=tpr)
  return tests


def main(argv: Optional[Sequence[str]] = None) -> int:
  p = argparse.ArgumentParser(prog="python -m fi_jax.report",
                              description="Compare the results of several fi_jax runs.")
  sub = p.add_subparsers(dest="command", required=True)
  c = sub.add_parser("compare", help="one table and heat map over several workdirs")
  c.add_argument("workdirs", nargs="+", help="workdirs of finished runs (results.json)")
  c.add_argument("--out", default=".", help="where compare.md/.csv/.json/.png go")
  c.add_argument("--pair", nargs=2, metavar="MODEL:DET",
                 help="paired bootstrap test between two (model, detector) pairs")
  c.add_argument("--n_bootstrap", type=int, default=1000)
  c.add_argument("--seed", type=int, default=0)
  args = p.parse_args(argv)
  try:
    compare(args.workdirs, args.out, args.pair, n_bootstrap=args.n_bootstrap, seed=args.seed)
  except (ValueError, FileNotFoundError) as e:
    print(f"python -m fi_jax.report: error: {' '.join(str(e).split())}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
