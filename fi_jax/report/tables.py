"""The Markdown tables of a run's results: the main table (every configured detector per OOD
set, best first by the sort key, failed ones with their reason) and the per-OOD-class tables.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

from fi_jax.report import schema
from fi_jax.report.schema import configured_detectors, failures, lower_is_better, ood_sets

# (column title, row key, is a percentage)
TABLE_COLUMNS = [("AUROC", "auroc", True), ("FPR@95", "fpr95", True),
          ("FPR@95 (OOD+)", "fpr95_ood_positive", True), ("AUPR-In", "aupr_in", True),
          ("AUPR-Out", "aupr_out", True), ("AUROC macro", "auroc_macro", True),
          ("FPR@95 macro", "fpr95_macro", True), ("n_id", "n_id", False),
          ("n_ood", "n_ood", False)]
DEFAULT_SORT_BY = "fpr95"

DEFAULT_SORT_SET = "fi_imagenet_1k"


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


def fmt(row: Mapping, key: str, pct: bool) -> str:
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
  return [c for c in TABLE_COLUMNS if any(c[1] in r for r in rows)]


def cell(text: str, limit: int = 160) -> str:
  text = " ".join(str(text).split()).replace("|", "\\|")
  return text if len(text) <= limit else text[:limit - 3] + "..."


def table(results: Mapping) -> str:
  """The Markdown table: per OOD set (configured order) every configured detector, best
  first by the sort key; failed detectors last with their reason (cells `degenerate` for a
  detector whose scores rank nothing, `schema.is_degenerate`, else `failed`)."""
  rows = list(results["rows"])
  cols = _columns(rows)
  failed = {f["detector"]: f["failed"] for f in failures(results)}
  degenerate = {f["detector"] for f in failures(results) if schema.is_degenerate(f)}
  key, where = sort_spec(results)
  order = ranked_detectors(rows, key, where)
  order += [d for d in configured_detectors(results) if d not in order]
  head = ["model", "detector", "ID", "OOD"] + [c[0] for c in cols]
  if failed:
    head.append("note")
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  meta = results.get("meta", {})
  model = rows[0]["model"] if rows else schema.model_label(results)
  id_set = rows[0]["id_set"] if rows else meta.get("config", {}).get("id_name", "")
  by_key = {(r["detector"], r["ood_set"]): r for r in rows}
  for ood in ood_sets(results) or [""]:
    for det in order:
      r = by_key.get((det, ood))
      if r is not None:
        cells = [str(r.get(k, "")) for k in schema.KEY_COLUMNS] + [fmt(r, k, p) for _, k, p in cols]
        if failed:
          cells.append("")
      else:
        reason = failed.get(det, "no result")
        status = schema.DEGENERATE if det in degenerate else "failed"
        cells = [str(model), det, str(id_set), ood] + [status] * len(cols) + [cell(reason)]
        if not failed:
          cells = cells[:-1]
      lines.append("| " + " | ".join(cells) + " |")
  acc = results.get("id_accuracy")
  intro = f"ID accuracy: {100 * acc:.2f}%\n\n" if acc is not None else ""
  for source, v in (meta.get("id_label_accuracy") or {}).items():   # ReImageNet, ReaL
    if isinstance(v, dict) and v.get("accuracy") is not None:
      intro += (f"ID accuracy ({source} multi-label: argmax in the image's labels): "
                f"{100 * v['accuracy']:.2f}% on {v.get('n')} images\n\n")
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
      p_text = f"{cell(p['class'], 40)} ({100 * p['share']:.0f}%)" if p else "-"
      vals = [fmt({"v": rows[d]["per_class"]["fpr95"][i]}, "v", True) for d in dets]
      lines.append(f"| {cell(name, 60)} | {int(n[i])} | {p_text} | " + " | ".join(vals) + " |")
    out.append("\n".join(lines))
  return "\n\n".join(out)
