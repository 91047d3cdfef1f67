"""The comparison of several runs: one table and FPR@95 heat map over their workdirs and, with
`pair`, the paired bootstrap of two (run, detector) pairs on the same images.

  python -m fi_jax.report compare WORKDIR... [--out DIR] [--pair RUN:DET RUN:DET]

writes compare.md / compare.csv / compare.json and per OOD set compare_fpr95_<set>.png
(`plots.write_compare_figures`).

A run is its workdir (and the run id its report records), not its model label: two runs with
the same label (the same checkpoint in float32 and bfloat16, say) are both shown, named
`label@<workdir>` (the shortest end of the workdir path that tells them apart). RUN in `--pair`
is a label that names one run, a name `label@<workdir>`, or a workdir path. Each run's report is
read from one folder (`files.report_folder`), and its scores files must carry the run id of its
results.json.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
from typing import Any, Optional, Sequence

import numpy as np

from fi_jax.metrics.paired import paired_bootstrap
from fi_jax.report import plots, schema
from fi_jax.report.files import (
  SCORE_FILE_COLUMNS,
  ScoresError,
  load_results,
  load_scores,
  report_folder,
  scores_run_id,
)
from fi_jax.report.schema import failures, lower_is_better, ood_sets
from fi_jax.report.tables import DEFAULT_SORT_BY, DEFAULT_SORT_SET, fmt

PAIR_FORMS = "LABEL:DETECTOR, LABEL@WORKDIR:DETECTOR or WORKDIR:DETECTOR"


@dataclasses.dataclass
class Run:
  """One compared run: `workdir` as given, the report `folder` it was read from, its
  `results`, model `label`, the `name` it is shown under (unique among the compared runs) and
  its `run_id` ('' for reports written before run ids)."""
  workdir: str
  folder: str
  results: dict
  label: str
  name: str = ""
  run_id: str = ""

  @property
  def detectors(self) -> list[str]:
    """The detectors with rows, in row order."""
    return list(dict.fromkeys(r["detector"] for r in self.results["rows"]))


def load_runs(workdirs: Sequence[str]) -> list[Run]:
  """The runs of `workdirs` with unique names; ValueError when a workdir is given twice."""
  seen: dict[str, str] = {}
  runs = []
  for w in workdirs:
    real = os.path.realpath(w)
    if real in seen:
      raise ValueError(f"{w} and {seen[real]} are the same workdir; give each run once.")
    seen[real] = w
    folder = report_folder(w)
    res = dict(load_results(w, folder))
    rows = res["rows"]
    label = str(rows[0]["model"]) if rows else schema.model_label(res)
    runs.append(Run(w, folder, res, label, run_id=str(res["meta"].get("run_id") or "")))
  _name_runs(runs)
  return runs


def _path_suffixes(workdir: str) -> list[str]:
  """'c', 'b/c', 'a/b/c', ... of the workdir's absolute path, shortest first."""
  parts = [p for p in os.path.abspath(workdir).split(os.sep) if p]
  return [os.path.join(*parts[-k:]) for k in range(1, len(parts) + 1)] or [os.sep]


def _name_runs(runs: Sequence[Run]) -> None:
  """Each run's `name`: its label, or `label@<workdir end>` where several runs share it."""
  by_label: dict[str, list[Run]] = {}
  for r in runs:
    by_label.setdefault(r.label, []).append(r)
  for label, group in by_label.items():
    if len(group) == 1:
      group[0].name = label
      continue
    suffixes = [_path_suffixes(r.workdir) for r in group]
    for r, own in zip(group, suffixes):
      others = {s for o in suffixes if o is not own for s in o}
      end = next((s for s in own if s not in others), os.path.abspath(r.workdir))
      r.name = f"{label}@{end}"
  names = [r.name for r in runs]
  if len(set(names)) < len(names):   # a label@end equal to another run's label
    for r in runs:
      if names.count(r.name) > 1:
        r.name = f"{r.label}@{os.path.abspath(r.workdir)}"


def _same_workdir(path: str, run: Run) -> bool:
  return os.path.realpath(path) == os.path.realpath(run.workdir)


def _run_list(runs: Sequence[Run]) -> str:
  return ", ".join(f"{r.name} ({r.workdir})" for r in runs)


def resolve_pair(runs: Sequence[Run], spec: str) -> tuple[Run, str]:
  """(run, detector) of one `--pair` argument (`PAIR_FORMS`); ValueError naming the
  candidates when it names no run, several runs, or a detector the run has no rows of."""
  name, colon, det = spec.rpartition(":")
  if not colon or not name or not det:
    raise ValueError(f"--pair takes {PAIR_FORMS}, got {spec!r}.")
  hits = [r for r in runs if name == r.name]
  if not hits:
    hits = [r for r in runs if name == r.label]
  if not hits:
    hits = [r for r in runs if _same_workdir(name, r)]
  if not hits and "@" in name:
    label, _, where = name.rpartition("@")
    hits = [r for r in runs if r.label == label and _same_workdir(where, r)]
  if not hits:
    raise ValueError(
        f"--pair {spec!r}: no compared run is named {name!r}. The runs: {_run_list(runs)}. "
        f"Their detectors: {', '.join(dict.fromkeys(d for r in runs for d in r.detectors))}.")
  if len(hits) > 1:
    raise ValueError(
        f"--pair {spec!r} is ambiguous: {len(hits)} runs have the label {name!r}: "
        f"{_run_list(hits)}. Name one as {hits[0].name}:{det} or {hits[0].workdir}:{det}.")
  (run,) = hits
  if det not in run.detectors:
    raise ValueError(f"--pair {spec!r}: run {run.name} ({run.workdir}) has no rows of detector "
                     f"{det!r}; its detectors: {', '.join(run.detectors) or 'none'}.")
  return run, det


def _pair_scores(run: Run, detector: str, set_name: str,
                 expect_run_id: Optional[str]) -> tuple[np.ndarray, np.ndarray, str]:
  """(example ids, scores, file) of one detector of one run on one set, checked: the file's run
  id is the results' (`expect_run_id`), ids are unique, scores are finite."""
  path = os.path.join(run.folder, "scores", set_name + ".npz")
  try:
    z = load_scores(run.workdir, set_name, run.folder)
  except FileNotFoundError:
    if not os.path.isdir(run.folder):
      raise ValueError(f"{run.workdir}: its report was replaced while compare read it; run "
                       "compare again.") from None
    raise
  got = scores_run_id(z)
  if (got or "") != (expect_run_id or ""):
    raise ScoresError(
        f"{path} was written by run {got or '(no run id)'}, but "
        f"{os.path.join(run.folder, 'results.json')} by run {expect_run_id or '(no run id)'}: "
        "the scores and the results of that workdir come from different runs. Rerun its "
        "config to write a consistent report.")
  if detector not in z:
    raise ValueError(f"{path}: no scores of detector {detector!r} (has: "
                     f"{sorted(k for k in z if k not in SCORE_FILE_COLUMNS)}).")
  ids, scores = z["id"], np.asarray(z[detector], np.float64)
  bad = int(np.size(scores) - np.isfinite(scores).sum())
  if bad:
    raise ScoresError(f"{path}: detector {detector!r} has {bad} non-finite score(s) (NaN or "
                      f"inf) of {len(scores)}; a paired test needs finite scores.")
  if len(np.unique(ids)) != len(ids):
    raise ScoresError(f"{path}: the example ids (`id`) repeat; a paired test pairs examples "
                      "by id.")
  return ids, scores, path


def _align(a: tuple, b: tuple, what: str) -> tuple[np.ndarray, np.ndarray]:
  """The scores of the examples both runs have, paired by example id."""
  (ids_a, sa, file_a), (ids_b, sb, file_b) = a, b
  common, ia, ib = np.intersect1d(ids_a, ids_b, return_indices=True)
  if not len(common):
    raise ValueError(f"{what}: {file_a} and {file_b} share no example ids.")
  return sa[ia], sb[ib]


def _spec_key(spec: Any) -> dict:
  return {k: v for k, v in dict(spec or {}).items() if k != "data_dir"}


def _config(run: Run) -> dict:
  return run.results["meta"].get("config") or {}


def _number(v: Any) -> Optional[float]:
  return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def compare(workdirs: Sequence[str], out: Optional[str] = None,
            pair: Optional[Sequence[str]] = None, *, n_bootstrap: int = 1000, seed: int = 0,
            log=print) -> dict:
  """The table (run x detector x OOD set) and FPR@95 figures of several runs; with
  `pair` = (RUN:DET, RUN:DET) (`PAIR_FORMS`) also the paired bootstrap on every common OOD set.
  Writes compare.md, compare.csv, compare.json and compare_fpr95_<set>.png into `out`."""
  if pair and (isinstance(n_bootstrap, bool) or not isinstance(n_bootstrap, int)
               or n_bootstrap < 1):
    raise ValueError(f"n_bootstrap must be an integer >= 1, got {n_bootstrap!r}.")
  runs = load_runs(workdirs)
  out = out or "."
  if os.path.exists(out) and not os.path.isdir(out):
    raise ValueError(f"--out={out} is a file; name a folder for compare.md and its companions.")
  sets: list[str] = []
  for r in runs:
    sets += [s for s in ood_sets(r.results) if s not in sets]
  keys = []   # (run index, detector)
  by: dict[tuple[int, str, str], dict] = {}
  for i, r in enumerate(runs):
    for row in r.results["rows"]:
      keys.append((i, row["detector"]))
      by[(i, row["detector"], row["ood_set"])] = row
    keys += [(i, f["detector"]) for f in failures(r.results)]
  keys = list(dict.fromkeys(keys))
  key_metric = DEFAULT_SORT_BY
  where = DEFAULT_SORT_SET if DEFAULT_SORT_SET in sets else (sets[0] if sets else "")
  sign = 1 if lower_is_better(key_metric) else -1

  def rank(k):
    v = _number((by.get((*k, where)) or {}).get(key_metric))
    return (0, sign * v) if v is not None else (1, 0)
  keys.sort(key=rank)
  head = ["model", "detector"] + [f"{s} {m}" for s in sets for m in ("AUROC", "FPR@95")]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  csv_rows = []
  for i, det in keys:
    run = runs[i]
    cells = [run.name, det]
    for s in sets:
      r = by.get((i, det, s))
      cells += [fmt(r, "auroc", True), fmt(r, "fpr95", True)] if r else ["-", "-"]
      if r:
        csv_rows.append({"model": run.name, "detector": det, "id_set": r["id_set"],
                         "ood_set": s, "auroc": r.get("auroc"), "fpr95": r.get("fpr95"),
                         "n_id": r.get("n_id"), "n_ood": r.get("n_ood"),
                         "workdir": run.workdir})
    lines.append("| " + " | ".join(cells) + " |")
  text = (f"Sorted by FPR@95 on {where}; AUROC / FPR@95 in percent.\n\n" + "\n".join(lines))
  fs_text, fs_csv, fs_json = _full_spectrum_part(runs, sets, where, key_metric, sign)
  text += fs_text
  shared = [r for r in runs if r.name != r.label]
  if shared:
    text = ("Runs with the same model label are told apart by their workdir: "
            + ", ".join(f"{r.name} = {r.workdir}" for r in shared) + ".\n\n" + text)
  result: dict[str, Any] = {
      "runs": list(workdirs), "rows": csv_rows,
      "run_names": [{"workdir": r.workdir, "model": r.name, "label": r.label,
                     "run_id": r.run_id or None} for r in runs]}
  if fs_json:
    result["full_spectrum"] = fs_json
  if pair:
    (ra, da), (rb, db), tests = paired_tests(runs, pair, sets, n_bootstrap=n_bootstrap,
                                             seed=seed)
    result["paired"] = tests
    result["pair"] = [{"model": r.name, "workdir": r.workdir, "detector": d}
                      for r, d in ((ra, da), (rb, db))]
    plines = [f"\n\nPaired bootstrap ({n_bootstrap} resamples, the same images drawn for both): "
              f"A = {ra.name}:{da} ({ra.workdir}), B = {rb.name}:{db} ({rb.workdir}); "
              "differences A - B in percent points, 95% CI, two-sided p.\n",
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
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "compare.md"), "w") as f:
    f.write("# fi_jax comparison\n\n" + text + "\n")
  with open(os.path.join(out, "compare.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=["model", "detector", "id_set", "ood_set", "auroc",
                                      "fpr95", "n_id", "n_ood", "workdir"])
    w.writeheader()
    w.writerows(schema.jsonable(csv_rows + fs_csv))   # the FS rows: their id_set tells
  with open(os.path.join(out, "compare.json"), "w") as f:
    json.dump(schema.jsonable(result), f, indent=1)
  figures = plots.write_compare_figures(out, [(r.name, r.results) for r in runs], sets, where)
  log(text)
  log(f"Wrote {os.path.join(out, 'compare.md')} (+ .csv, .json, "
      f"{', '.join(os.path.basename(f) for f in figures)}).")
  return result


def _full_spectrum_part(runs: Sequence[Run], sets: Sequence[str], where: str, key_metric: str,
                        sign: int) -> tuple[str, list[dict], dict]:
  """The full-spectrum rows of the runs that have them (`schema.full_spectrum_rows`: OpenOOD's
  FS rows and the class-subset ones; docs/metrics.md#full-spectrum), as (a Markdown section:
  one line per (run, detector, ID side) with AUROC / FPR@95 per OOD set, then the accuracies;
  compare.csv rows, told apart from the standard ones by their id_set; compare.json's
  `full_spectrum`: {"rows", "accuracy": {run name: {id_set, accuracy, csid_accuracy,
  restricted: {id_set: accuracy}}}}). Empty when no run has FS rows."""
  keys, by = [], {}
  for i, run in enumerate(runs):
    for row in schema.full_spectrum_rows(run.results):
      keys.append((i, row["detector"], row["id_set"]))
      by[(i, row["detector"], row["id_set"], row["ood_set"])] = row
  if not keys:
    return "", [], {}
  keys = list(dict.fromkeys(keys))

  def rank(k):
    v = _number((by.get((*k, where)) or {}).get(key_metric))
    return (k[2], 0, sign * v) if v is not None else (k[2], 1, 0)
  keys.sort(key=rank)   # grouped by ID side, best first within it
  head = ["model", "detector", "ID"] + [f"{s} {m}" for s in sets for m in ("AUROC", "FPR@95")]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  csv_rows = []
  for i, det, id_set in keys:
    run = runs[i]
    cells = [run.name, det, id_set]
    for s in sets:
      r = by.get((i, det, id_set, s))
      cells += [fmt(r, "auroc", True), fmt(r, "fpr95", True)] if r else ["-", "-"]
      if r:
        csv_rows.append({"model": run.name, "detector": det, "id_set": id_set, "ood_set": s,
                         "auroc": r.get("auroc"), "fpr95": r.get("fpr95"),
                         "n_id": r.get("n_id"), "n_ood": r.get("n_ood"),
                         "workdir": run.workdir})
    lines.append("| " + " | ".join(cells) + " |")
  pct = lambda v: "-" if _number(v) is None else f"{100 * v:.2f}"   # noqa: E731
  accuracy, alines = {}, ["| model | ID side | ID accuracy (pooled) | per shifted set |",
                          "|---|---|---|---|"]
  for run in runs:
    fs = run.results.get("full_spectrum")
    if not fs:
      continue
    restricted = {b["id_set"]: b.get("accuracy") for b in fs.get("restricted", [])}
    accuracy[run.name] = {"id_set": fs.get("id_set"), "accuracy": fs.get("accuracy"),
                          "csid_accuracy": dict(fs.get("csid_accuracy") or {}),
                          "restricted": restricted}
    alines.append(f"| {run.name} | {fs.get('id_set')} | {pct(fs.get('accuracy'))} | "
                  + (", ".join(f"{k} {pct(v)}" for k, v in (fs.get("csid_accuracy") or {}).items())
                     or "-") + " |")
    alines += [f"| {run.name} | {k} | {pct(v)} | - |" for k, v in restricted.items()]
  text = ("\n\n## Full spectrum (OpenOOD v1.5 FS)\n\nThe covariate-shifted ID sets join the ID "
          "side (column ID; rows in a class subset's label space name it in brackets). Sorted by "
          f"FPR@95 on {where} within each ID side; AUROC / FPR@95 in percent.\n\n"
          + "\n".join(lines) + "\n\nID accuracy (percent; the shifted sets' own accuracy over "
          "their class subset where they have one):\n\n" + "\n".join(alines))
  return text, csv_rows, {"rows": csv_rows, "accuracy": accuracy}


def paired_tests(runs: Sequence[Run], pair: Sequence[str], sets: Sequence[str], *,
                 n_bootstrap: int, seed: int) -> tuple[tuple[Run, str], tuple[Run, str],
                                                       dict[str, dict]]:
  """((run A, detector A), (run B, detector B), {OOD set: paired_bootstrap(A, B)}) for the OOD
  sets both runs were evaluated on, examples paired by their ids. ValueError when a pair
  names a run ambiguously, pairs a run's detector with itself, or the two runs' sets differ."""
  if len(pair) != 2:
    raise ValueError(f"--pair takes two of {PAIR_FORMS}, got {list(pair)}.")
  (ra, da), (rb, db) = [resolve_pair(runs, p) for p in pair]
  if da == db and (ra is rb or (ra.run_id and ra.run_id == rb.run_id)):
    same = (f"the same run ({ra.workdir})" if ra is rb else
            f"copies of one run (run id {ra.run_id}: {ra.workdir}, {rb.workdir})")
    raise ValueError(f"--pair {pair[0]} {pair[1]} pairs {da} of {same} with itself; a paired "
                     "test needs two runs or two detectors.")
  ca, cb = _config(ra), _config(rb)
  if _spec_key(ca.get("id_test")) != _spec_key(cb.get("id_test")):
    raise ValueError("The two runs' ID test sets differ (config id_test); a paired test needs "
                     "the same images.")
  tests = {}
  for s in sets:
    if not (s in ood_sets(ra.results) and s in ood_sets(rb.results)):
      continue
    if _spec_key((ca.get("ood") or {}).get(s)) != _spec_key((cb.get("ood") or {}).get(s)):
      raise ValueError(f"OOD set {s} differs between the two runs' configs; a paired test "
                       "needs the same images.")
    paired = {}
    for set_name in ("id_test", f"ood/{s}"):
      a = _pair_scores(ra, da, set_name, ra.run_id)
      b = _pair_scores(rb, db, set_name, rb.run_id)
      paired[set_name] = _align(a, b, set_name)
    (id_a, id_b), (ood_a, ood_b) = paired["id_test"], paired[f"ood/{s}"]
    tpr = float((ca.get("metrics") or {}).get("tpr", 0.95))
    tests[s] = paired_bootstrap((id_a, ood_a), (id_b, ood_b), n_bootstrap=n_bootstrap,
                                seed=seed, tpr=tpr)
  return (ra, da), (rb, db), tests
