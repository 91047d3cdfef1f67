"""A run's figures: ROC curves per OOD set, ID-vs-OOD score histograms per detector (drawn in a
background thread while the next detectors run: `HistWriter`), the FPR@95 heat map."""
from __future__ import annotations

import concurrent.futures
import os
from typing import Mapping, Optional, Sequence

import numpy as np

from fi_jax.metrics.reference import auroc, roc_curve
from fi_jax.report.schema import ood_sets
from fi_jax.report.tables import ranked_detectors, sort_spec


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
  """Draws each detector's histogram (`write_hist`) into `<workdir>/plots` in one background
  thread as soon as its scores exist, while the next detectors run (their time is mostly XLA
  compilation and computation, outside the GIL); `write_plots(..., hists=)` takes the files.
  A run passes its report's staging folder (`files.StagedReport.path`) as `workdir`, so the
  histograms are published with the rest of the report. Only this thread draws until
  `result()` or `close()` returns (pyplot is not for concurrent use)."""

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

  def close(self) -> None:
    """Waits for every drawing and ignores their failures (the report they were for is
    published without its results, or thrown away)."""
    self._pool.shutdown(wait=True)


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
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib import pyplot
  return pyplot


def _file_safe(name: str) -> str:
  return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
