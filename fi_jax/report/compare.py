"""The comparison of several runs: one table and FPR@95 heat map over their workdirs and, with
`pair`, the paired bootstrap of two (model, detector) pairs on the same images.

  python -m fi_jax.report compare WORKDIR... [--out DIR] [--pair MODEL:DET MODEL:DET]

writes compare.md / compare.csv / compare.json / compare_fpr95.png.
"""
from __future__ import annotations

import csv
import json
import os
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from fi_jax.metrics.paired import paired_bootstrap
from fi_jax.report import schema
from fi_jax.report.files import load_scores
from fi_jax.report.plots import heatmap
from fi_jax.report.schema import failures, lower_is_better, ood_sets
from fi_jax.report.tables import DEFAULT_SORT_BY, DEFAULT_SORT_SET, fmt


def _load_run(workdir: str) -> dict:
  res = dict(schema.load(workdir))
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
      label = schema.model_label(r)
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
      cells += [fmt(r, "auroc", True), fmt(r, "fpr95", True)] if r else ["-", "-"]
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
    w.writerows(schema.jsonable(csv_rows))
  with open(os.path.join(out, "compare.json"), "w") as f:
    json.dump(schema.jsonable(result), f, indent=1)
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
