"""Report files: results.json (everything), results.csv (all row fields), results.md (the table).

Rows are one (model, detector, ID set, OOD set) each. Metric values are fractions in [0, 1] in
the files; the printed / Markdown table shows them in percent, as papers do. `fpr95` is the
ID-positive FPR@95%TPR with the K-th largest ID score as threshold (ViM, KNN papers), `fpr95_ninco`
NINCO's interpolated-quantile variant, `fpr95_ood_positive` OpenOOD v1.5's convention — see
docs/metrics.md for the exact definitions.
"""
from __future__ import annotations

import csv
import importlib.metadata
import json
import math
import os
from typing import Any

_KEY_COLUMNS = ["model", "detector", "id_set", "ood_set"]
# (column title, row key, is a percentage)
_TABLE = [("AUROC", "auroc", True), ("FPR@95", "fpr95", True),
          ("FPR@95 (OOD+)", "fpr95_ood_positive", True), ("AUPR-In", "aupr_in", True),
          ("AUPR-Out", "aupr_out", True), ("AUROC macro", "auroc_macro", True),
          ("FPR@95 macro", "fpr95_macro", True), ("n_id", "n_id", False),
          ("n_ood", "n_ood", False)]


def versions() -> dict[str, str]:
  out = {}
  for pkg in ("jax", "jaxlib", "flax", "optax", "numpy", "scikit-learn", "tensorflow-cpu",
              "tensorflow-datasets", "ml_collections"):
    try:
      out[pkg] = importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
      pass
  return out


def _fmt(row: dict, key: str, pct: bool) -> str:
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


def _columns(rows: list[dict]) -> list[tuple[str, str, bool]]:
  return [c for c in _TABLE if any(c[1] in r for r in rows)]


def table(results: dict) -> str:
  """The Markdown table of all rows (also what the run prints at the end)."""
  rows = results["rows"]
  cols = _columns(rows)
  head = ["model", "detector", "ID", "OOD"] + [c[0] for c in cols]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in rows:
    cells = [str(r.get(k, "")) for k in _KEY_COLUMNS] + [_fmt(r, k, p) for _, k, p in cols]
    lines.append("| " + " | ".join(cells) + " |")
  acc = results.get("id_accuracy")
  intro = f"ID accuracy: {100 * acc:.2f}%\n\n" if acc is not None else ""
  return intro + "\n".join(lines)


def _jsonable(x: Any) -> Any:
  if isinstance(x, dict):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if hasattr(x, "tolist"):   # numpy / jax scalars and arrays
    return x.tolist()
  if isinstance(x, float) and not math.isfinite(x):
    return None
  return x


def write_per_class(rows: list[dict], workdir: str) -> None:
  """One CSV per (detector, OOD set) with the metrics of every OOD class vs all ID images:
  per_class/<ood set>/<detector>.csv (class ids as the dataset's `group` feature)."""
  for r in rows:
    table = r.get("per_class")
    if not table:
      continue
    folder = os.path.join(workdir, "per_class", str(r["ood_set"]).replace("/", "_"))
    os.makedirs(folder, exist_ok=True)
    keys = ["group", "n_ood"] + sorted(k for k in table if k not in ("group", "n_ood"))
    with open(os.path.join(folder, f"{r['detector']}.csv"), "w", newline="") as f:
      w = csv.writer(f)
      w.writerow(keys)
      for i in range(len(table[keys[0]])):
        w.writerow([_jsonable(table[k][i]) for k in keys])


def write(results: dict, workdir: str) -> None:
  """Writes results.json, results.csv, results.md and per_class/ into `workdir`."""
  os.makedirs(workdir, exist_ok=True)
  write_per_class(results["rows"], workdir)
  results = {**results, "rows": [{k: v for k, v in r.items() if k != "per_class"}
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
  meta = results.get("meta", {})
  with open(os.path.join(workdir, "results.md"), "w") as f:
    f.write(f"# fi_jax results: {meta.get('config', {}).get('model_label', '')}\n\n")
    f.write(table(results) + "\n\n")
    f.write("Metrics in percent; ID is the positive class for AUROC and FPR@95 (threshold: the "
            "K-th largest ID score); FPR@95 (OOD+) is OpenOOD v1.5's. Brackets: bootstrap CI.\n")
    errors = meta.get("detector_errors") or {}
    for name, err in errors.items():
      f.write(f"\n- detector {name} failed: {err}\n")
