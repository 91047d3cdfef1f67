"""The report's figures, sized from what they show so that they stay legible at 40+ detectors
and many models (every figure names the model(s) and the sets it shows):

* `heatmap`: a rows x columns grid of FPR@95 (detectors x models per OOD set in `compare` and
  the leaderboard, detectors x OOD sets in a run): cell size, font and value format follow the
  grid; failed cells are hatched with a letter whose reason is in the footnote, cells without
  a result are grey with a dash; the best value of each column is bold.
* `bars`: horizontal bars of FPR@95 per detector, best first, with the bootstrap CI as whiskers
  when the rows have it: what a one-column grid (one model, or one OOD set) becomes
  (`fpr95_figure` chooses).
* ROC curves per OOD set of the `top` best detectors on that set (the title says which subset
  is shown), each with its operating point at TPR >= `tpr` (`operating_point`) marked.
* ID-vs-OOD score histograms per detector on a robust range (`robust_range`: the 0.5 and 99.5
  percentiles of the pooled scores) with the scores beyond it counted per set
  (`tail_counts`), drawn in a background thread while the next detectors run (`HistWriter`).

All figures are PNG files written with matplotlib's Agg backend at 100 dpi.
"""
from __future__ import annotations

import concurrent.futures
import math
import os
import textwrap
from typing import Mapping, Optional, Sequence

import numpy as np

from fi_jax.metrics.reference import auroc, roc_curve, threshold_rank
from fi_jax.report import schema
from fi_jax.report.schema import failures, ood_sets
from fi_jax.report.tables import ranked_detectors, sort_spec

DPI = 100
HIST_PERCENTILES = (0.5, 99.5)   # the histogram's shown range: these percentiles of all scores
HIST_BINS = 60
FAILED_COLOR = "#f4cccc"         # failed cells and bars: light red, hatched
MISSING_COLOR = "#e6e6e6"        # cells without a result and without a failure: grey, "–"
FAILED_MARK = "✗"                # before the letter of a failed cell's reason
FOOT_SIZE = 7.5                  # pt of the footnotes (failure reasons, tails)
_KEY_TITLES = {"fpr95": "FPR@95", "auroc": "AUROC", "aupr_in": "AUPR-In", "aupr_out": "AUPR-Out",
               "fpr95_ood_positive": "FPR@95 (OOD+)", "detection_error": "detection error"}


# ----------------------------------------------------------------------------- numbers

def operating_point(id_scores: np.ndarray, ood_scores: np.ndarray,
                    tpr: float = 0.95) -> tuple[float, float]:
  """(FPR, TPR) of the threshold that the `fpr95` metric uses (fi_jax.metrics.reference
  `fpr_at_tpr`): t = the K-th largest ID score, K = min{k : k / n_id >= tpr}; FPR = the share
  of OOD scores >= t (the metric's value), TPR = the share of ID scores >= t (>= tpr; above
  K / n_id only when ID scores tie at t). The point is a vertex of `roc_curve`."""
  id_scores, ood_scores = np.asarray(id_scores), np.asarray(ood_scores)
  n = len(id_scores)
  k = threshold_rank(n, tpr)
  t = np.partition(id_scores, n - k)[n - k]
  return float(np.mean(ood_scores >= t)), float(np.mean(id_scores >= t))


def robust_range(arrays: Sequence[np.ndarray],
                 percentiles: tuple[float, float] = HIST_PERCENTILES) -> tuple[float, float]:
  """(lo, hi): the `percentiles` of the pooled finite values of `arrays`; the full range when
  those coincide (a spike) and a unit interval around a single value."""
  pooled = np.concatenate([np.asarray(a, np.float64).ravel() for a in arrays])
  pooled = pooled[np.isfinite(pooled)]
  if not pooled.size:
    raise ValueError("robust_range: no finite value.")
  lo, hi = (float(v) for v in np.percentile(pooled, percentiles))
  if not hi > lo:
    lo, hi = float(pooled.min()), float(pooled.max())
  if not hi > lo:
    lo, hi = lo - 0.5, hi + 0.5
  return lo, hi


def tail_counts(values: np.ndarray, lo: float, hi: float) -> tuple[int, int]:
  """(values < lo, values > hi): the finite values a histogram on [lo, hi] does not show."""
  v = np.asarray(values, np.float64)
  v = v[np.isfinite(v)]
  return int(np.sum(v < lo)), int(np.sum(v > hi))


def value_text(v: float, decimals: int = 1) -> str:
  """A percentage as a cell shows it: one decimal ("7.3", "45.0"), "100" for 100."""
  return "100" if v >= 100 - 0.5 * 10 ** -decimals else f"{v:.{decimals}f}"


def short_reason(reason: str, limit: int = 110) -> str:
  """A failure reason on one line, at most `limit` characters."""
  text = " ".join(str(reason).split())
  return text if len(text) <= limit else text[:limit - 1] + "…"


def _letters(k: int) -> str:
  """a, b, ..., z, aa, ab, ... for k = 0, 1, ..."""
  out = ""
  k += 1
  while k:
    k, r = divmod(k - 1, 26)
    out = chr(ord("a") + r) + out
  return out


def failure_codes(reasons: Sequence[str]) -> dict[str, str]:
  """{reason: letter}, one letter per distinct reason (shortened) in order of first use."""
  codes: dict[str, str] = {}
  for r in reasons:
    codes.setdefault(short_reason(r), _letters(len(codes)))
  return codes


# ----------------------------------------------------------------------------- layout

def _text_width(text: str, size: float) -> float:
  """Inches a label of `text` takes at `size` pt (DejaVu Sans averages ~0.6 em per char)."""
  return 0.6 * size / 72 * len(text)


def _wrap(lines: Sequence[str], width_in: float, size: float) -> list[str]:
  chars = max(30, int(width_in / (0.6 * size / 72)))
  out: list[str] = []
  for line in lines:
    out += textwrap.wrap(line, chars, subsequent_indent="    ") or [""]
  return out


def _footnote(fig, lines: Sequence[str], y_in: float, height: float, width: float,
              size: float = 7.0) -> None:
  """`lines` below the axes, top at `y_in` inches from the figure's bottom."""
  if lines:
    fig.text(0.1 / width, y_in / height, "\n".join(lines), ha="left", va="top",
             fontsize=size, linespacing=1.35)


def _line_height(size: float) -> float:
  return 1.35 * size / 72


def grid_layout(n_rows: int, n_cols: int) -> dict:
  """Cell width / height (inches), value font (pt) and decimals of an n_rows x n_cols heat
  map: cells narrow (0.75 to 0.42 in) and rows shrink (0.26 to 0.17 in) as the grid grows,
  the value font with them (8 to 5.5 pt); values lose their decimal when the cell is too
  narrow for "99.9"."""
  col_w = float(np.clip(6.0 / max(1, n_cols), 0.42, 0.75))
  row_h = float(np.clip(18.0 / max(1, n_rows), 0.17, 0.26))
  size = float(np.clip(min(row_h * 72 * 0.55, col_w * 72 / (4 * 0.62)), 5.5, 8.0))
  decimals = 1 if _text_width("99.9", size) <= 0.9 * col_w else 0
  return {"col_w": col_w, "row_h": row_h, "size": size, "decimals": decimals,
          "label_size": float(np.clip(size + 1, 6.5, 8.5))}


# ----------------------------------------------------------------------------- heat map

def heatmap_figure(grid: np.ndarray, rows: Sequence[str], cols: Sequence[str], title: str, *,
                   failed: Optional[Mapping[tuple[int, int], str]] = None,
                   mark: Optional[tuple[int, int]] = None, value_label: str = "FPR@95 (%)",
                   lower_is_better: bool = True, col_title: str = "", row_title: str = ""):
  """The matplotlib figure of `heatmap` (not saved; the caller closes it)."""
  plt = _plt()
  grid = np.asarray(grid, np.float64).reshape(len(rows), len(cols))
  failed = dict(failed or {})
  n_r, n_c = max(1, len(rows)), max(1, len(cols))
  lay = grid_layout(n_r, n_c)
  size, lsize = lay["size"], lay["label_size"]
  ax_w, ax_h = lay["col_w"] * n_c, lay["row_h"] * n_r
  left = 0.25 + _text_width(max(rows, key=len, default=""), lsize)
  top_labels = 0.15 + 0.72 * _text_width(max(cols, key=len, default=""), lsize)   # 45 degrees
  codes = failure_codes([failed[k] for k in sorted(failed)])
  notes = [f"{FAILED_MARK}{c}: {r}" for r, c in codes.items()]
  if np.isnan(grid).any() and len(failed) < int(np.isnan(grid).sum()):
    notes.append("–: no value (not evaluated, or not a finite number)")
  best_note = ("bold: the best value of each column" if n_r > 1 else "")
  width = max(5.5, left + ax_w + 1.3)
  title = "\n".join(_wrap(title.split("\n"), width - 0.3, 10))
  foot = _wrap([n for n in [best_note] + notes if n], width - 0.2, FOOT_SIZE)
  head = 0.25 + (title.count("\n") + 1) * _line_height(10) + top_labels
  bottom = 0.25 + len(foot) * _line_height(FOOT_SIZE)
  height = head + ax_h + bottom
  fig = plt.figure(figsize=(width, height))
  ax = fig.add_axes([left / width, bottom / height, ax_w / width, ax_h / height])
  cmap = plt.get_cmap("viridis_r" if lower_is_better else "viridis").with_extremes(
      bad=MISSING_COLOR)
  im = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0, vmax=100, aspect="auto",
                 interpolation="nearest")
  ax.xaxis.tick_top()
  ax.set_xticks(range(len(cols)), cols, rotation=45, ha="left", rotation_mode="anchor",
                fontsize=lsize)
  ax.set_yticks(range(len(rows)), rows, fontsize=lsize)
  ax.tick_params(length=0)
  ax.hlines(np.arange(0.5, n_r - 1), -0.5, n_c - 0.5, color="white", lw=0.6)   # cell borders
  ax.vlines(np.arange(0.5, n_c - 1), -0.5, n_r - 0.5, color="white", lw=0.6)
  for s in ax.spines.values():
    s.set_visible(False)
  finite = np.where(np.isfinite(grid), grid, np.nan)
  with np.errstate(all="ignore"):
    best = (np.nanmin(finite, axis=0) if lower_is_better else np.nanmax(finite, axis=0)) \
        if np.isfinite(finite).any() else np.full(n_c, np.nan)
  for i in range(len(rows)):
    for j in range(len(cols)):
      v = grid[i, j]
      if (i, j) in failed:
        ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor=FAILED_COLOR,
                                   edgecolor="#cc0000", hatch="////", lw=0.0))
        ax.text(j, i, FAILED_MARK + codes[short_reason(failed[(i, j)])], ha="center",
                va="center", fontsize=size, color="#990000", fontweight="bold",
                bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.9))
      elif np.isfinite(v):
        dark = (v > 55) if lower_is_better else (v < 45)
        ax.text(j, i, value_text(v, lay["decimals"]), ha="center", va="center", fontsize=size,
                color="white" if dark else "black",
                fontweight="bold" if n_r > 1 and v == best[j] else "normal")
      else:
        ax.text(j, i, "–", ha="center", va="center", fontsize=size, color="#555555")
  if mark is not None:
    ax.add_patch(plt.Rectangle((mark[1] - 0.5, mark[0] - 0.5), 1, 1, fill=False,
                               edgecolor="red", lw=2))
  if row_title:
    ax.set_ylabel(row_title, fontsize=lsize)
  ax.set_title(title, fontsize=10, loc="left", x=-left / ax_w + 0.1 / ax_w, pad=8)
  if col_title:
    ax.text(1.0, 1.0, col_title, transform=ax.transAxes, fontsize=lsize, ha="left",
            va="bottom", color="#444444")
  bar_h = min(ax_h, 3.0)   # the colour bar beside the heat map's top rows
  cax = fig.add_axes([(left + ax_w + 0.15) / width, (bottom + ax_h - bar_h) / height,
                      0.15 / width, bar_h / height])
  fig.colorbar(im, cax=cax).set_label(value_label, fontsize=lsize)
  cax.tick_params(labelsize=lsize)
  _footnote(fig, foot, bottom - 0.15, height, width, FOOT_SIZE)
  return fig


def heatmap(grid: np.ndarray, rows: Sequence[str], cols: Sequence[str], title: str, path: str,
            **kwargs) -> str:
  """An annotated heat map of percentages (rows x cols; lower = lighter with the default
  `lower_is_better`) saved to `path`: `failed` {(row, col): reason} cells hatched with a
  letter explained in the footnote, missing cells (NaN, not failed) grey with "–", `mark` =
  (row, col) boxed in red, the best value per column bold; sized by `grid_layout`."""
  return _save(heatmap_figure(grid, rows, cols, title, **kwargs), path)


# ----------------------------------------------------------------------------- bars

def bars_figure(values: Sequence[float], labels: Sequence[str], title: str, *,
                ci: Optional[Sequence[Optional[tuple[float, float]]]] = None,
                failed: Optional[Mapping[int, str]] = None, value_label: str = "FPR@95 (%)",
                lower_is_better: bool = True):
  """The matplotlib figure of `bars` (not saved; the caller closes it)."""
  plt = _plt()
  values = np.asarray(values, np.float64)
  failed = dict(failed or {})
  ci = list(ci) if ci is not None else [None] * len(values)
  ok = [i for i in range(len(values)) if i not in failed and np.isfinite(values[i])]
  sign = 1 if lower_is_better else -1
  ok.sort(key=lambda i: sign * values[i])
  rest = [i for i in range(len(values)) if i not in ok]
  order = ok + rest
  n = max(1, len(order))
  codes = failure_codes([failed[i] for i in sorted(failed)])
  notes = [f"{FAILED_MARK}{c}: {r}" for r, c in codes.items()]
  if any(i not in failed for i in rest):
    notes.append("no result: the detector has no value here")
  has_ci = any(ci[i] is not None for i in ok)
  if has_ci:
    notes.insert(0, "whiskers: the bootstrap confidence interval of each value")
  size = 8.0 if n <= 60 else 6.5
  row_h = 0.24 if n <= 60 else 0.17
  left = 0.3 + _text_width(max(labels, key=len, default=""), size)
  ax_w = 5.0
  width = left + ax_w + 0.4
  title = "\n".join(_wrap(title.split("\n"), width - 0.3, 10))
  foot = _wrap(notes, width - 0.2, FOOT_SIZE)
  head = 0.6 + (title.count("\n") + 1) * _line_height(10)
  bottom = 0.55 + len(foot) * _line_height(FOOT_SIZE)
  ax_h = row_h * n
  height = head + ax_h + bottom
  fig = plt.figure(figsize=(width, height))
  ax = fig.add_axes([left / width, bottom / height, ax_w / width, ax_h / height])
  y = np.arange(len(order))
  shown = np.array([values[i] if i in ok else 0.0 for i in order])
  ax.barh(y, shown, height=0.7, color="#4c72b0")
  if has_ci:
    lo = np.array([shown[k] - ci[i][0] if i in ok and ci[i] is not None else 0.0
                   for k, i in enumerate(order)])
    hi = np.array([ci[i][1] - shown[k] if i in ok and ci[i] is not None else 0.0
                   for k, i in enumerate(order)])
    ax.errorbar(shown, y, xerr=[np.maximum(lo, 0), np.maximum(hi, 0)], fmt="none",
                ecolor="black", elinewidth=0.8, capsize=2)
  for k, i in enumerate(order):
    if i in failed:
      ax.barh(k, 100, height=0.7, color=FAILED_COLOR, hatch="////", edgecolor="#cc0000", lw=0)
      ax.text(2, k, f"failed ({FAILED_MARK}{codes[short_reason(failed[i])]})", va="center",
              fontsize=size, color="#990000", fontweight="bold",
              bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.9))
    elif i not in ok:
      ax.text(2, k, "no result", va="center", fontsize=size, color="#555555")
    else:
      end = ci[i][1] if has_ci and ci[i] is not None else values[i]
      ax.text(min(end, 100) + 1, k, value_text(values[i]), va="center", fontsize=size - 0.5)
  ax.set_yticks(y, [labels[i] for i in order], fontsize=size)
  ax.set_ylim(len(order) - 0.5, -0.5)
  ax.set_xlim(0, 110)
  ax.set_xticks(range(0, 101, 20))
  ax.xaxis.grid(True, alpha=0.3)
  ax.set_axisbelow(True)
  ax.set_xlabel(value_label + (" (lower is better)" if lower_is_better else ""), fontsize=8)
  ax.tick_params(axis="x", labelsize=8, top=True, labeltop=True)
  ax.set_title(title, fontsize=10, loc="left", x=-left / ax_w + 0.1 / ax_w, pad=22)
  _footnote(fig, foot, bottom - 0.45, height, width, FOOT_SIZE)
  return fig


def bars(values: Sequence[float], labels: Sequence[str], title: str, path: str,
         **kwargs) -> str:
  """Horizontal bars of percentages (one per label), best first, then `failed` {index:
  reason} (hatched, with a letter explained in the footnote) and values without a result;
  `ci` [(low, high) or None per label, in percent] drawn as whiskers. Saved to `path`."""
  return _save(bars_figure(values, labels, title, **kwargs), path)


def fpr95_figure(grid: np.ndarray, rows: Sequence[str], cols: Sequence[str], title: str,
                 path: str, *, failed: Optional[Mapping[tuple[int, int], str]] = None,
                 ci: Optional[Mapping[tuple[int, int], tuple[float, float]]] = None,
                 mark: Optional[tuple[int, int]] = None, col_title: str = "") -> str:
  """FPR@95 in percent of `rows` (detectors) x `cols`: a heat map (`heatmap`), or bars
  (`bars`, with the CI whiskers of `ci` {(row, col): (low, high)}) when there is one column."""
  failed = dict(failed or {})
  if len(cols) == 1:
    return bars(np.asarray(grid, np.float64).reshape(-1), rows, title, path,
                ci=[(ci or {}).get((i, 0)) for i in range(len(rows))],
                failed={i: r for (i, _), r in failed.items()})
  return heatmap(grid, rows, cols, title, path, failed=failed, mark=mark, col_title=col_title)


# ----------------------------------------------------------------------------- from results

def _pct(v) -> Optional[float]:
  return 100 * float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def detector_notes(results: Mapping) -> dict[str, str]:
  """{detector: why it has no numbers}: the results' failures."""
  return {f["detector"]: str(f.get("failed") or "failed") for f in failures(results)}


def cells(results: Mapping, detectors: Sequence[str], sets: Sequence[str], key: str = "fpr95"):
  """(grid, failed, ci) of `key` in percent for `detectors` x `sets` of one run's results:
  grid NaN where there is no finite value, failed {(i, j): reason} for failed detectors and
  rows whose value is not finite, ci {(i, j): (low, high)} where the rows have a CI."""
  by = {(r["detector"], r["ood_set"]): r for r in results.get("rows", [])}
  notes = detector_notes(results)
  grid = np.full((len(detectors), len(sets)), np.nan)
  failed, ci = {}, {}
  for i, d in enumerate(detectors):
    for j, s in enumerate(sets):
      row = by.get((d, s))
      v = _pct(None if row is None else row.get(key))
      if v is not None:
        grid[i, j] = v
        lo, hi = _pct(row.get(f"{key}_ci_low")), _pct(row.get(f"{key}_ci_high"))
        if lo is not None and hi is not None:
          ci[(i, j)] = (lo, hi)
      elif d in notes:
        failed[(i, j)] = notes[d]
      elif row is not None:
        failed[(i, j)] = f"{_KEY_TITLES.get(key, key)} is not a finite number"
  return grid, failed, ci


def run_model(results: Mapping) -> str:
  rows = results.get("rows") or []
  return str(rows[0]["model"]) if rows else schema.model_label(results)


def run_id_set(results: Mapping) -> str:
  rows = results.get("rows") or []
  return str(rows[0]["id_set"]) if rows else str(
      results.get("meta", {}).get("config", {}).get("id_name") or "ID")


def write_fpr95_per_set(out: str, prefix: str, runs: Sequence[tuple[str, Mapping]],
                        detectors: Sequence[str], sets: Sequence[str], *, id_set: str = "",
                        order: str = "",
                        marks: Optional[Mapping[str, tuple[str, str]]] = None) -> list[str]:
  """<out>/<prefix>_<set>.png per OOD set: FPR@95 (%) of `detectors` (rows, in this order,
  which `order` describes in the heat maps' titles) x `runs` [(model name, results)]
  (columns): a heat map, bars with one model. `marks` {set: (detector, model)} boxes a cell.
  Returns the files."""
  os.makedirs(out, exist_ok=True)
  written = []
  models = [m for m, _ in runs]
  for s in sets:
    grid = np.full((len(detectors), len(runs)), np.nan)
    failed, ci = {}, {}
    for j, (_, res) in enumerate(runs):
      g, f, c = cells(res, detectors, [s])
      grid[:, j] = g[:, 0]
      failed.update({(i, j): r for (i, _), r in f.items()})
      ci.update({(i, j): v for (i, _), v in c.items()})
    where = f" (ID: {id_set})" if id_set else ""
    if len(runs) == 1:
      title = (f"FPR@95 on {s}{where}\nmodel: {models[0]}; {len(detectors)} detectors, "
               "best first")
    else:
      title = (f"FPR@95 (%) on {s}{where}\n{len(detectors)} detectors × {len(models)} models"
               + (f"; detectors sorted by {order}" if order else ""))
    mark = None
    if marks and s in marks and marks[s][0] in detectors and marks[s][1] in models:
      mark = (list(detectors).index(marks[s][0]), models.index(marks[s][1]))
    written.append(fpr95_figure(grid, detectors, models, title,
                                os.path.join(out, f"{prefix}_{_file_safe(s)}.png"),
                                failed=failed, ci=ci, mark=mark))
  return written


def order_by_mean(runs: Sequence[Mapping], detectors: Sequence[str], ood_set: str,
                  key: str = "fpr95") -> list[str]:
  """`detectors` best first by the mean of `key` on `ood_set` over the `runs` that have it
  (those with no value anywhere last, in their order)."""
  sign = 1.0 if schema.lower_is_better(key) else -1.0
  mean = {}
  for d in detectors:
    vals = [_pct(r.get(key)) for res in runs for r in res.get("rows", [])
            if r["detector"] == d and r["ood_set"] == ood_set]
    vals = [v for v in vals if v is not None]
    if vals:
      mean[d] = sign * float(np.mean(vals))
  return sorted(detectors, key=lambda d: (0, mean[d]) if d in mean else (1, 0.0))


def write_compare_figures(out: str, runs: Sequence[tuple[str, Mapping]], sets: Sequence[str],
                          sort_set: str, prefix: str = "compare_fpr95") -> list[str]:
  """`write_fpr95_per_set` for `report compare`: every detector of the runs [(name,
  results)], best first by the mean FPR@95 over the runs on `sort_set` (the same order in
  every set's figure); the ID set named when all runs share it."""
  dets: list[str] = []
  for _, res in runs:
    dets += [d for d in schema.configured_detectors(res) if d not in dets]
  dets = order_by_mean([res for _, res in runs], dets, sort_set)
  id_sets = {run_id_set(res) for _, res in runs}
  return write_fpr95_per_set(out, prefix, runs, dets, sets,
                             id_set=id_sets.pop() if len(id_sets) == 1 else "",
                             order=f"the mean FPR@95 on {sort_set}")


# ----------------------------------------------------------------------------- a run's plots

def write_plots(workdir: str, results: Mapping, scores: Mapping[str, Mapping[str, np.ndarray]],
                top: int = 5, hists: Optional["HistWriter"] = None) -> list[str]:
  """plots/roc_<set>.png (per OOD set the `top` best detectors on that set by the sort key,
  with their operating point at the configured TPR), plots/hist_<detector>.png (ID test vs
  each OOD set), plots/fpr95.png (every configured detector: bars with one OOD set, a
  detector x OOD set heat map with several). Returns the files written. `hists`: a HistWriter
  that has drawn (some of) the histograms already."""
  folder = os.path.join(workdir, "plots")
  os.makedirs(folder, exist_ok=True)
  key, where = sort_spec(results)
  sets = ood_sets(results)
  model, id_set = run_model(results), run_id_set(results)
  tpr = float((results.get("meta", {}).get("config", {}).get("metrics") or {}).get("tpr", 0.95))
  drawn = hists.result() if hists is not None else {}
  written = []
  for ood in sets:
    ranked = [d for d in ranked_detectors([r for r in results["rows"] if r["ood_set"] == ood],
                                          key, ood)
              if all(k in scores.get(d, {}) and np.isfinite(scores[d][k]).all()
                     for k in ("id_test", f"ood/{ood}"))]
    written.append(roc_figure(os.path.join(folder, f"roc_{_file_safe(ood)}.png"), scores,
                              ranked[:top], n_ranked=len(ranked), ood=ood, model=model,
                              id_set=id_set, key=key, tpr=tpr))
  for det, per_set in scores.items():
    path = drawn[det] if det in drawn else write_hist(folder, det, per_set, sets, model=model,
                                                      id_set=id_set)
    if path is not None:
      written.append(path)
  dets = ranked_detectors(results["rows"], key, where)
  dets += [d for d in schema.configured_detectors(results) if d not in dets]
  grid, failed, ci = cells(results, dets, sets)
  if len(sets) == 1:
    title = (f"FPR@95 on {sets[0]} (ID: {id_set})\nmodel: {model}; {len(dets)} detectors, "
             "best first")
  else:
    title = (f"FPR@95 (%): {len(dets)} detectors × {len(sets)} OOD sets (ID: {id_set})\n"
             f"model: {model}; detectors sorted by {_KEY_TITLES.get(key, key)} on {where}")
  written.append(fpr95_figure(grid, dets, sets, title, os.path.join(folder, "fpr95.png"),
                              failed=failed, ci=ci))
  return written


def roc_figure(path: str, scores: Mapping[str, Mapping[str, np.ndarray]],
               detectors: Sequence[str], *, n_ranked: int, ood: str, model: str, id_set: str,
               key: str = "fpr95", tpr: float = 0.95) -> str:
  """ROC curves on `ood` of `detectors` (the best of `n_ranked` by `key`), each with its
  operating point at TPR >= `tpr` (`operating_point`) marked, saved to `path`."""
  return _save(roc_figure_of(scores, detectors, n_ranked=n_ranked, ood=ood, model=model,
                             id_set=id_set, key=key, tpr=tpr), path)


def roc_figure_of(scores: Mapping[str, Mapping[str, np.ndarray]], detectors: Sequence[str], *,
                  n_ranked: int, ood: str, model: str, id_set: str, key: str = "fpr95",
                  tpr: float = 0.95):
  """The matplotlib figure of `roc_figure` (not saved; the caller closes it)."""
  plt = _plt()
  fig, ax = plt.subplots(figsize=(6.4, 6.4))
  for k, det in enumerate(detectors):
    a, b = scores[det]["id_test"], scores[det][f"ood/{ood}"]
    fpr, tp = roc_curve(a, b)
    x, y = operating_point(a, b, tpr)
    ax.plot(fpr, tp, lw=1.4, color=f"C{k % 10}",
            label=f"{det}: AUROC {100 * auroc(a, b):.1f}, FPR@{100 * tpr:g} {100 * x:.1f}")
    ax.plot([x], [y], "o", ms=6, color=f"C{k % 10}", mec="black", mew=0.8,
            gid=f"operating_point:{det}")
  ax.axhline(tpr, ls=":", color="grey", lw=0.8)
  ax.text(1.0, tpr, f" TPR {100 * tpr:g}%", va="bottom", ha="right", fontsize=7, color="grey")
  ax.plot([0, 1], [0, 1], ":", color="grey", lw=0.8)
  ax.set(xlim=(0, 1), ylim=(0, 1.01), xlabel="FPR (OOD accepted as ID)",
         ylabel="TPR (ID accepted)")
  ax.set_title(f"ROC on {ood} (ID: {id_set})\nmodel: {model}", fontsize=10)
  by = _KEY_TITLES.get(key, key)
  shown = (f"top {len(detectors)} of {n_ranked} detectors by {by} on {ood}"
           if len(detectors) < n_ranked else f"all {n_ranked} detectors")
  ax.legend(fontsize=7, loc="lower right", title=f"{shown}\n● operating point at TPR "
            f"≥ {100 * tpr:g}%", title_fontsize=7)
  ax.grid(alpha=0.25)
  fig.tight_layout()
  return fig


# ----------------------------------------------------------------------------- histograms

def hist_layout(per_set: Mapping[str, np.ndarray], sets: Sequence[str]):
  """(lo, hi, [(name, finite scores, below, above)]) of a detector's histogram: the robust
  range of all its finite scores and each drawn set (ID test first, then `sets` that have
  scores) with its counts beyond the range; None when a set has no finite score."""
  finite = {k: np.asarray(v, np.float64)[np.isfinite(v)] for k, v in per_set.items()}
  if not finite or not all(v.size for v in finite.values()):
    return None
  lo, hi = robust_range(list(finite.values()))
  names = ["id_test"] + [f"ood/{s}" for s in sets if f"ood/{s}" in finite]
  return lo, hi, [(n, finite[n], *tail_counts(finite[n], lo, hi)) for n in names if n in finite]


def write_hist(folder: str, det: str, per_set: Mapping[str, np.ndarray],
               sets: Sequence[str], *, model: str = "", id_set: str = "") -> Optional[str]:
  """<folder>/hist_<det>.png: the ID test scores against each OOD set's (`sets`: OOD set
  names) on the robust range (`hist_layout`), each set's density relative to all its scores,
  the scores beyond the range counted in the footnote; None (nothing drawn) when a set has
  no finite score."""
  layout = hist_layout(per_set, sets)
  if layout is None:
    return None
  lo, hi, drawn = layout
  tails = []
  for name, _, below, above in drawn:
    shown = "ID test" if name == "id_test" else name[len("ood/"):]
    if below or above:
      tails.append(f"{shown} {below + above} ({below} below, {above} above)")
  p_lo, p_hi = HIST_PERCENTILES
  foot = [f"Range [{lo:.4g}, {hi:.4g}]: the {p_lo:g}–{p_hi:g} percentiles of all scores. "
          + ("Scores beyond it: " + "; ".join(tails) + "." if tails
             else "No score lies beyond it.")]
  width = 7.0
  foot = _wrap(foot, width - 0.3, FOOT_SIZE)
  height = 4.6 + len(foot) * _line_height(FOOT_SIZE)
  fig = _plt().figure(figsize=(width, height))
  bottom = 0.55 + len(foot) * _line_height(FOOT_SIZE)
  ax = fig.add_axes([0.75 / width, bottom / height, (width - 0.95) / width,
                     (height - bottom - 0.6) / height])
  bins = np.linspace(lo, hi, HIST_BINS + 1)
  width_bin = bins[1] - bins[0]
  peak = 0.0
  # one filled / outlined step path per set (ax.hist draws a patch per bar: ~10x slower)
  for k, (name, v, below, above) in enumerate(drawn):
    dens = np.histogram(v[(v >= lo) & (v <= hi)], bins)[0] / (len(v) * width_bin)
    peak = max(peak, float(dens.max()))
    counts = f"n={len(v)}" + (f", {below + above} beyond the range" if below + above else "")
    if name == "id_test":
      ax.stairs(dens, bins, fill=True, alpha=0.45, color="C0",
                label=f"ID test{': ' + id_set if id_set else ''} ({counts})")
    else:
      ax.stairs(dens, bins, color=f"C{k % 10}", lw=1.3,
                label=f"OOD: {name[len('ood/'):]} ({counts})")
  ax.set_xlim(lo, hi)
  ax_h = height - bottom - 0.6
  legend_h = 0.15 + len(drawn) * _line_height(7.0)   # the legend sits above the highest bar
  ax.set_ylim(0, (peak or 1.0) * 1.05 / max(0.3, 1 - legend_h / ax_h))
  ax.set_xlabel(f"{det} score (higher = more ID)", fontsize=8)
  ax.set_ylabel("density (of all the set's scores)", fontsize=8)
  ax.tick_params(labelsize=8)
  ax.set_title(f"{det} scores: ID vs OOD" + (f"\nmodel: {model}" if model else ""),
               fontsize=10)
  ax.legend(fontsize=7, loc="upper right")
  _footnote(fig, foot, bottom - 0.4, height, width, FOOT_SIZE)
  return _save(fig, os.path.join(folder, f"hist_{_file_safe(det)}.png"))


class HistWriter:
  """Draws each detector's histogram (`write_hist`) into `<workdir>/plots` in one background
  thread as soon as its scores exist, while the next detectors run (their time is mostly XLA
  compilation and computation, outside the GIL); `write_plots(..., hists=)` takes the files.
  A run passes its report's staging folder (`files.StagedReport.path`) as `workdir`, so the
  histograms are published with the rest of the report, and its `model` label and `id_set`
  name for the titles. Only this thread draws until `result()` or `close()` returns (pyplot
  is not for concurrent use)."""

  def __init__(self, workdir: str, sets: Sequence[str], *, model: str = "", id_set: str = ""):
    self.folder, self.sets = os.path.join(workdir, "plots"), list(sets)
    self.model, self.id_set = model, id_set
    self._pool = concurrent.futures.ThreadPoolExecutor(1, "fi_jax-plots")
    self._futures: dict[str, concurrent.futures.Future] = {}

  def submit(self, det: str, per_set: Mapping[str, np.ndarray]) -> None:
    if not self._futures:
      os.makedirs(self.folder, exist_ok=True)
    self._futures[det] = self._pool.submit(write_hist, self.folder, det, dict(per_set),
                                           self.sets, model=self.model, id_set=self.id_set)

  def result(self) -> dict[str, Optional[str]]:
    """{detector: file or None}; waits for every drawing and re-raises the first failure."""
    self._pool.shutdown(wait=True)
    return {det: f.result() for det, f in self._futures.items()}

  def close(self) -> None:
    """Waits for every drawing and ignores their failures (the report they were for is
    published without its results, or thrown away)."""
    self._pool.shutdown(wait=True)


# ----------------------------------------------------------------------------- files

def _save(fig, path: str) -> str:
  """`fig` as a PNG at `path` (atomically: a reader sees the old file or the whole new one),
  then closed. The figure's size is final: its layout was computed for it."""
  folder = os.path.dirname(os.path.abspath(path))
  tmp = os.path.join(folder, "." + os.path.basename(path) + f".{os.getpid()}.tmp.png")
  try:
    fig.savefig(tmp, dpi=DPI)
    os.replace(tmp, path)
  finally:
    _plt().close(fig)
    if os.path.exists(tmp):
      os.remove(tmp)
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
