"""The results schema: what `results.json` holds, the one definition that the run's writer
(fi_jax.run.benchmark), the report's files and tables, `compare` and the leaderboard use.

    {"schema": SCHEMA_VERSION,
     "meta": Meta,                 # config, versions, set sizes, timings, model label, ...
     "id_accuracy": float | None,  # top-1 on the ID test set (None: no labels)
     "rows": [Row, ...],           # one per (model, detector, ID set, OOD set)
     "failed": [Failure, ...],     # one per detector that raised, gave non-finite scores or
                                   # degenerate ones (status "degenerate": a single value, or
                                   # fewer than a handful, on a set)
     "full_spectrum": FullSpectrum}   # only with covariate-shifted ID sets (config.csid)

Metric values are fractions in [0, 1]; a missing or non-finite value is `null` in the file.
A new metric is one function in fi_jax.metrics and one entry of `METRICS` here (its `_macro`
and `_ci_low`/`_ci_high` fields follow); `check_row` rejects a row field the schema does not
name, so a metric cannot reach the files without being declared.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Mapping, Optional, Sequence, TypedDict

SCHEMA_VERSION = 1
KEY_COLUMNS = ("model", "detector", "id_set", "ood_set")
# every per-row metric (fractions); each also has `<m>_macro` (mean over OOD classes, with
# groups) and `<m>_ci_low` / `<m>_ci_high` (bootstrap percentile CI, with n_bootstrap > 0)
METRICS = ("auroc", "fpr95", "fpr95_ood_positive", "fpr95_ninco", "aupr_in", "aupr_out",
           "detection_error", "tnr95")
# the row's counts and settings
COUNT_FIELDS = ("n_id", "n_ood", "n_ood_groups", "n_bootstrap")
SETTING_FIELDS = ("tpr", "ci_level")
# fields of a per-class table (`Row.per_class`, per_class/*.csv) that are integers
INT_FIELDS = COUNT_FIELDS + ("group",)


class Row(TypedDict, total=False):
  """One (model, detector, ID set, OOD set) row; the metric fields are those of `METRICS`
  (with `_macro`, `_ci_low`, `_ci_high` variants, see `row_fields`)."""
  model: str
  detector: str
  id_set: str
  ood_set: str
  auroc: float
  fpr95: float
  fpr95_ood_positive: float
  fpr95_ninco: float
  aupr_in: float
  aupr_out: float
  detection_error: float
  tnr95: float
  n_id: int
  n_ood: int
  n_ood_groups: int
  n_bootstrap: int
  tpr: float
  ci_level: float
  per_class: dict   # in memory only: {group, n_ood, <metric>: [per OOD class]} -> per_class/


# a detector whose scores rank nothing (fi_jax.pipeline.degenerate_scores: a single value, or
# fewer than a handful, on a set): its Failure's `failed` text starts with this and its `status`
# is DEGENERATE
DEGENERATE = "degenerate"
DEGENERATE_PREFIX = DEGENERATE + ": "


class Failure(TypedDict, total=False):
  detector: str
  failed: str   # "<ExceptionType>: <message>", or "degenerate: <why>"
  status: str   # "failed" or DEGENERATE (absent in files written before: "failed")


class Meta(TypedDict, total=False):
  run_id: str              # the run's identity (uuid4 hex), also in each of its scores files
  config: dict
  workdir: str
  versions: dict
  platform: str
  xla_flags: str
  glibc_tunables: str      # GLIBC_TUNABLES the process ran with (fi_jax/run/huge_pages.py)
  devices: list
  process_count: int
  set_sizes: dict          # {set name: rows}
  ood_sets: list           # OOD set names in configured order
  random_init: bool
  model_label: str
  model_name: str
  checkpoint: list
  timings_s: dict
  detector_errors: dict    # {detector: reason} (the same as `failed`)
  nonfinite_dropped: dict  # {set name: rows dropped} with nonfinite="drop"
  group_names: dict        # {OOD set: [class name per group id]}
  predicted_as: dict       # {OOD set: {group id: {class, class_id, share}}}
  plot_error: str
  id_label_accuracy: dict  # {"reimagenet" | "real": {accuracy, n}} (config.id_labels)
  reannotation_dropped: int  # ID test images dropped as ReImageNet-ambiguous


class FullSpectrum(TypedDict):
  """OpenOOD v1.5's full-spectrum evaluation: the ID side is the ID test set plus the
  covariate-shifted ID sets (docs/metrics.md#full-spectrum)."""
  id_set: str              # the name of that union in `rows` ("<id_name> + <csid> + ...")
  csid_sets: list          # the covariate-shifted ID sets, in order
  accuracy: Optional[float]        # top-1 pooled over the union (OpenOOD's csid_acc)
  csid_accuracy: dict      # {csid set: its own top-1, over its class_subset where it has one}
  rows: list               # Rows as in `rows`, with id_set = `id_set`
  # shifted sets with a class subset (ImageNet-R / -A) that restrict the logits: per subset,
  # the logit-only detectors' FS rows in its label space (docs/metrics.md#class-subsets):
  # [{class_subset, id_set, n_classes, csid_sets, n_id_test, accuracy, detectors, failed,
  #   rows[, skipped]}]
  restricted: list


class Results(TypedDict, total=False):
  schema: int
  meta: Meta
  id_accuracy: Optional[float]
  rows: list
  failed: list
  full_spectrum: FullSpectrum   # absent without covariate-shifted ID sets


class ResultsError(ValueError):
  """A results.json that cannot be read or does not follow the schema."""


def row_fields() -> tuple[str, ...]:
  """Every field a row may have (`per_class` aside)."""
  derived = tuple(f"{m}{s}" for m in METRICS for s in ("_macro", "_ci_low", "_ci_high"))
  return KEY_COLUMNS + METRICS + derived + COUNT_FIELDS + SETTING_FIELDS


_ROW_FIELDS = frozenset(row_fields()) | {"per_class"}


def check_row(row: Mapping) -> None:
  """ValueError naming the row when a key column is missing or a field is not in the schema."""
  missing = [k for k in KEY_COLUMNS if k not in row]
  unknown = sorted(set(row) - _ROW_FIELDS)
  if missing or unknown:
    what = "/".join(str(row.get(k, "?")) for k in KEY_COLUMNS)
    raise ValueError(f"results row {what}: " + "; ".join(
        ([f"missing {missing}"] if missing else [])
        + ([f"fields {unknown} are not in fi_jax.report.schema (declare a new metric in "
            f"METRICS)"] if unknown else [])))


def failure(detector: str, reason: str) -> Failure:
  """The `failed` entry of a detector without rows: its reason, and `status` DEGENERATE when
  the reason is a degenerate-scores finding (DEGENERATE_PREFIX), else "failed"."""
  return {"detector": detector, "failed": reason,
          "status": DEGENERATE if reason.startswith(DEGENERATE_PREFIX) else "failed"}


def is_degenerate(entry: Mapping) -> bool:
  """Whether a `failed` entry is a degenerate detector (not one that raised)."""
  return entry.get("status") == DEGENERATE or str(entry.get("failed", "")).startswith(
      DEGENERATE_PREFIX)


def make(meta: Mapping, id_accuracy: Optional[float], rows: Sequence[Mapping],
         failed: Sequence[Mapping], full_spectrum: Optional[Mapping] = None) -> Results:
  """A run's results, every row (the full-spectrum ones too) checked against the schema."""
  for r in list(rows) + full_spectrum_rows({"full_spectrum": full_spectrum}):
    check_row(r)
  out: Results = {"schema": SCHEMA_VERSION, "meta": dict(meta), "id_accuracy": id_accuracy,
                  "rows": list(rows), "failed": [dict(f) for f in failed]}
  if full_spectrum is not None:
    out["full_spectrum"] = {**full_spectrum, "rows": list(full_spectrum.get("rows", []))}
    if "restricted" in full_spectrum:
      out["full_spectrum"]["restricted"] = [{**b, "rows": list(b.get("rows", []))}
                                            for b in full_spectrum["restricted"]]
  return out


def full_spectrum_rows(results: Mapping) -> list:
  """Every full-spectrum row of a run's results: the FS rows on all the logits, then those of
  each class subset's restricted block (their `id_set` tells them apart); [] without FS."""
  fs = results.get("full_spectrum") or {}
  return list(fs.get("rows", [])) + [r for b in fs.get("restricted", []) for r in b.get("rows", [])]


def jsonable(x: Any) -> Any:
  """numpy / jax values as plain Python; NaN and inf as None (JSON has neither)."""
  if isinstance(x, dict):
    return {str(k): jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [jsonable(v) for v in x]
  if hasattr(x, "tolist"):   # numpy / jax scalars and arrays
    return jsonable(x.tolist())
  if isinstance(x, float) and not math.isfinite(x):
    return None
  return x


# the types `load` accepts for what the tables and `compare` read (absent or null is fine)
_META_TYPES = {"config": dict, "ood_sets": list, "model_label": str, "model_name": str,
               "run_id": str, "set_sizes": dict, "detector_errors": dict, "group_names": dict,
               "predicted_as": dict, "id_label_accuracy": dict}
_CONFIG_TYPES = {"id_test": dict, "ood": dict, "metrics": dict, "report": dict,
                 "detectors": list, "model_label": str, "id_name": str}


def _is_number(v: Any) -> bool:
  return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _problems(res: Any) -> list[str]:
  """What in a parsed results.json does not follow the schema (the first problem of each part)."""
  if not isinstance(res, dict):
    return [f"a JSON {type(res).__name__}, not an object"]
  problems = []
  if res.get("schema", SCHEMA_VERSION) != SCHEMA_VERSION:
    problems.append(f"schema version {res.get('schema')!r}, this fi_jax reads {SCHEMA_VERSION}")
  meta = res.get("meta", {})
  if not isinstance(meta, dict):
    problems.append("'meta' is not an object")
    meta = {}
  for key, kind in _META_TYPES.items():
    if meta.get(key) is not None and not isinstance(meta[key], kind):
      problems.append(f"meta.{key} is a {type(meta[key]).__name__}, not a {kind.__name__}")
  if isinstance(meta.get("ood_sets"), list) and not all(isinstance(x, str)
                                                        for x in meta["ood_sets"]):
    problems.append("meta.ood_sets holds a value that is not a set name")
  config = meta.get("config") if isinstance(meta.get("config"), dict) else {}
  for key, kind in _CONFIG_TYPES.items():
    if config.get(key) is not None and not isinstance(config[key], kind):
      problems.append(f"meta.config.{key} is a {type(config[key]).__name__}, not a "
                      f"{kind.__name__}")
  tpr = (config.get("metrics") if isinstance(config.get("metrics"), dict) else {}).get("tpr")
  if tpr is not None and not (_is_number(tpr) and 0 < tpr < 1):
    problems.append(f"meta.config.metrics.tpr is {tpr!r}, not a number in (0, 1)")
  if not _is_number(res.get("id_accuracy")):
    problems.append("'id_accuracy' is not a number")
  rows = res.get("rows")
  if not isinstance(rows, list):
    problems.append("no 'rows' list")
  else:
    numbers = set(row_fields()) - set(KEY_COLUMNS)
    for i, r in enumerate(rows):
      if not isinstance(r, dict) or any(not isinstance(r.get(k), str) for k in KEY_COLUMNS):
        problems.append(f"row {i} lacks the key columns {list(KEY_COLUMNS)}")
        break
      bad = sorted(k for k in r if k in numbers and not _is_number(r[k]))
      if bad:
        what = "/".join(r[k] for k in KEY_COLUMNS)
        problems.append(f"row {i} ({what}): {bad} not numbers")
        break
  fs = res.get("full_spectrum")
  if fs is not None and (not isinstance(fs, dict) or not isinstance(fs.get("rows"), list)
                         or not isinstance(fs.get("id_set"), str)):
    problems.append("'full_spectrum' is not an object with an 'id_set' and a 'rows' list")
  elif fs is not None and not (isinstance(fs.get("restricted", []), list) and all(
      isinstance(b, dict) and isinstance(b.get("rows"), list) and isinstance(b.get("id_set"), str)
      for b in fs.get("restricted", []))):
    problems.append("'full_spectrum.restricted' is not a list of objects with an 'id_set' and a "
                    "'rows' list")
  failed = res.get("failed", [])
  if failed is not None and not isinstance(failed, list):
    problems.append("'failed' is not a list")
  elif failed and not all(isinstance(f, dict) and isinstance(f.get("detector"), str)
                          for f in failed):
    problems.append("'failed' holds an entry without a detector name")
  return problems


def load(workdir: str, folder: Optional[str] = None) -> Results:
  """`<folder>/results.json` (default folder: `workdir`) checked against the schema;
  FileNotFoundError naming the workdir when it has none, ResultsError naming the file (and
  what is wrong) when it is unreadable, truncated, not JSON, or holds a value of the wrong
  type where the tables and `compare` read one. Results written before the schema version
  existed are read too."""
  path = os.path.join(folder or workdir, "results.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{workdir} has no results.json; run main.py with "
                            f"--workdir={workdir} first.")
  try:
    with open(path, encoding="utf-8") as f:
      res = json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
    raise ResultsError(f"{path}: not a readable results file ({type(e).__name__}: {e}); rerun "
                       "that workdir's config to rewrite it.") from None
  problems = _problems(res)
  if problems:
    raise ResultsError(f"{path}: " + "; ".join(problems) + ".")
  res.setdefault("meta", {})
  res.setdefault("failed", [])
  res.setdefault("id_accuracy", None)
  return res


def lower_is_better(key: str) -> bool:
  """FPRs and errors are better low; AUROC / AUPR / TNR high."""
  return key.startswith("fpr") or "error" in key


def model_label(results: Mapping) -> str:
  """The run's model label (meta, else the config's, else the model family name)."""
  meta = results.get("meta", {})
  return (meta.get("model_label") or meta.get("config", {}).get("model_label")
          or meta.get("model_name", ""))


def ood_sets(results: Mapping) -> list[str]:
  """The OOD sets in configured order (meta `ood_sets`, else order of first appearance)."""
  order = list(results.get("meta", {}).get("ood_sets") or [])
  for r in results.get("rows", []):
    if r["ood_set"] not in order:
      order.append(r["ood_set"])
  return order


def failures(results: Mapping) -> list[dict]:
  """[{"detector", "failed": reason}]: the results' `failed` list (or meta.detector_errors)."""
  if results.get("failed") is not None:
    return list(results["failed"])
  errors = results.get("meta", {}).get("detector_errors") or {}
  return [{"detector": k, "failed": v} for k, v in errors.items()]


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
