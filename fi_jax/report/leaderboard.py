"""The leaderboard of a sweep (many models x every detector x every OOD set): the numbers behind
"no (model, detector) pair reaches FPR@95 below X% on set A" and "set A is r times harder than
set B", from the finished runs of a sweep folder (fi_jax.run.sweep) or any folder of run
folders.

  python -m fi_jax.report leaderboard WORKDIR [--out DIR] [--hardness A B]
         [--detectors best_third|all|d1,d2,...] [--n_bootstrap N] [--seed S]

writes leaderboard.md / .csv / .json and the figures leaderboard_*.png into DIR (default
WORKDIR). Every model of the sweep is listed: done, failed (with its reason) or missing (not
run yet, or killed: its folder has no results.json). Only finished runs (`schema.load`) and
their per-example scores (`files.load_scores`) are read. What each number is:

* per OOD set: the best (model, detector) pair by FPR@95 (lowest; ties: higher AUROC, then
  sweep and detector order) and by AUROC (highest; ties: lower FPR@95, then order), with the
  rows' bootstrap CIs (`fpr95_ci_low/high`, `auroc_ci_low/high`: the runs' percentile CIs,
  present when the runs had metrics.n_bootstrap > 0); the minimum FPR@95 over all pairs, and
  how many pairs lie within its CI: pairs whose FPR@95 is <= the best pair's `fpr95_ci_high`
  (the best pair included; none counted without a CI).
* detectors: on the "ranking sets" (the OOD sets every finished model has), each model ranks
  the detectors that have an FPR@95 on every ranking set for every finished model by their
  mean FPR@95 over those sets (1 = best, ties averaged); the mean rank over models, the
  Friedman test and the Nemenyi critical difference (fi_jax.metrics.ranking has the
  formulas). Detectors missing anywhere are listed as not ranked, with where they are missing.
* hardness ratio of set A (numerator) to set B (denominator), default fi_imagenet_1k vs
  ninco: mean FPR@95 on A / mean FPR@95 on B over the chosen detectors (default
  "best_third": the ceil(k/3) detectors of best mean rank; "all"; or a list of names), per
  model and over all models (the mean over every (model, detector) pair), with the paired
  bootstrap CI of fi_jax.metrics.hardness: the ID test, A and B images resampled with a
  fixed seed and FPR@95 recomputed from the per-example score files, the same resample for
  numerator and denominator and for every model and detector. Point values come from the
  runs' rows (results.json); a model whose score files do not hold the same examples as the
  first model's (ids, sizes) has no CI and is left out of the overall CI, with a note.
* per model: status, ID accuracy, the best detector on the primary set (`primary`; default
  the hardness numerator when some model has it, else the first OOD set) and its FPR@95.
* full spectrum (runs with covariate-shifted ID sets, docs/metrics.md#full-spectrum): per ID
  side (a row's `id_set`: OpenOOD's FS union, or a class subset's label space) the best pairs
  per OOD set as above, and per model the FS ID accuracy pooled and per shifted set. The
  ranking and the hardness ratio use the standard rows only.

The files hold no timings, dates or absolute paths, so two sweeps that computed the same runs
(interrupted and resumed, sharded or not) write identical leaderboards.
"""
from __future__ import annotations

import csv
import io
import math
import os
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from fi_jax.metrics import hardness as hardness_lib
from fi_jax.metrics import ranking
from fi_jax.report import plots, schema, sweep_state
from fi_jax.report.files import load_scores

DEFAULTS: dict[str, Any] = dict(hardness=("fi_imagenet_1k", "ninco"), detectors="best_third",
                                n_bootstrap=1000, seed=0, ci=0.95, alpha=0.05, primary="")
FILES = ("leaderboard.md", "leaderboard.csv", "leaderboard.json")
CSV_FIELDS = ("ood_set", "rank", "model", "detector", "fpr95", "fpr95_ci_low", "fpr95_ci_high",
              "auroc", "auroc_ci_low", "auroc_ci_high", "within_min_ci", "id_set")


def settings_of(workdir: str, **overrides) -> dict[str, Any]:
  """DEFAULTS, then sweep.json's "leaderboard" settings, then the `overrides` that are not
  None. `detectors` may be "best_third", "all", a list or a comma-separated string."""
  out = dict(DEFAULTS)
  sweep = sweep_state.read_sweep(workdir) or {}
  out.update({k: v for k, v in (sweep.get("leaderboard") or {}).items() if k in DEFAULTS})
  out.update({k: v for k, v in overrides.items() if v is not None})
  if isinstance(out["detectors"], str) and out["detectors"] not in ("best_third", "all"):
    out["detectors"] = [d for d in out["detectors"].split(",") if d]
  if not isinstance(out["detectors"], str):
    out["detectors"] = list(out["detectors"])
  out["hardness"] = list(out["hardness"])
  if len(out["hardness"]) != 2:
    raise ValueError(f"hardness takes two OOD sets (numerator, denominator), got "
                     f"{out['hardness']}.")
  return out


# ----------------------------------------------------------------------------- the numbers

def _fpr(row: Optional[Mapping]) -> Optional[float]:
  v = None if row is None else row.get("fpr95")
  return float(v) if v is not None and math.isfinite(v) else None


def _pair(label: str, row: Mapping) -> dict:
  return {"model": label, "detector": row["detector"],
          **{k: row.get(k) for k in ("fpr95", "fpr95_ci_low", "fpr95_ci_high", "auroc",
                                     "auroc_ci_low", "auroc_ci_high", "n_id", "n_ood")}}


def _best_per_set(sets, done, dets, rows) -> tuple[dict, list[dict]]:
  """{set: best pairs, minimum and its CI count} and the CSV rows."""
  per_set, csv_rows = {}, []
  for s in sets:
    cands = [(m, d, rows[(m, d, s)]) for m in done for d in dets
             if _fpr(rows.get((m, d, s))) is not None]
    if not cands:
      per_set[s] = {"n_pairs": 0}
      continue
    auroc = lambda r: r.get("auroc") if r.get("auroc") is not None else -math.inf
    by_fpr = sorted(cands, key=lambda c: (_fpr(c[2]), -auroc(c[2])))   # stable: order
    by_auroc = sorted(cands, key=lambda c: (-auroc(c[2]), _fpr(c[2])))
    best = by_fpr[0][2]
    hi = best.get("fpr95_ci_high")
    within = ([f"{m}:{d}" for m, d, r in by_fpr if _fpr(r) <= hi] if hi is not None else None)
    per_set[s] = {
        "n_pairs": len(cands), "min_fpr95": _fpr(best),
        "min_fpr95_ci_low": best.get("fpr95_ci_low"), "min_fpr95_ci_high": hi,
        "best_fpr95": _pair(by_fpr[0][0], best),
        "best_auroc": _pair(by_auroc[0][0], by_auroc[0][2]),
        "n_within_ci": None if within is None else len(within), "within_ci": within}
    for i, (m, d, r) in enumerate(by_fpr):
      csv_rows.append({"ood_set": s, "rank": i + 1, "model": m, "detector": d,
                       **{k: r.get(k) for k in CSV_FIELDS[4:-2]}, "id_set": r.get("id_set"),
                       "within_min_ci": "" if within is None else f"{m}:{d}" in within})
  return per_set, csv_rows


def _ranking(done, dets, rows, runs, settings) -> dict:
  """Mean ranks of the detectors over the finished models, Friedman and Nemenyi."""
  rank_sets = [s for s in _sets(runs[m] for m in done) if all(
      s in schema.ood_sets(runs[m]) for m in done)]
  missing = {d: [m for m in done if any(_fpr(rows.get((m, d, s))) is None for s in rank_sets)]
             for d in dets}
  ranked = [d for d in dets if not missing[d]]
  out: dict[str, Any] = {"sets": rank_sets, "metric": "fpr95", "n_models": len(done),
                         "not_ranked": {d: m for d, m in missing.items() if m}}
  if not done or not ranked or not rank_sets:
    out.update(detectors=[], friedman=None)
    return out
  values = np.array([[np.mean([_fpr(rows[(m, d, s)]) for s in rank_sets]) for d in ranked]
                     for m in done])
  fr = ranking.friedman(values, lower_is_better=True, alpha=settings["alpha"])
  order = sorted(range(len(ranked)), key=lambda j: fr["mean_ranks"][j])   # stable: ties
  out["detectors"] = [{"detector": ranked[j], "mean_rank": fr["mean_ranks"][j],
                       "mean_fpr95": float(values[:, j].mean())} for j in order]
  out["friedman"] = {k: v for k, v in fr.items() if k != "mean_ranks"}
  return out


def _chosen(settings, ranked: list[str]) -> tuple[list[str], str]:
  want = settings["detectors"]
  if want == "best_third":
    n = math.ceil(len(ranked) / 3)
    return ranked[:n], f"the best third by mean rank ({n} of {len(ranked)})"
  if want == "all":
    return list(ranked), f"every ranked detector ({len(ranked)})"
  return list(want), "named: " + ", ".join(want)


def _hardness(done, rows, runs, workdir, dirs, chosen, settings) -> dict:
  num, den = settings["hardness"]
  out: dict[str, Any] = {"numerator": num, "denominator": den, "detectors": chosen,
                         "n_bootstrap": settings["n_bootstrap"], "seed": settings["seed"],
                         "ci": settings["ci"], "models": [], "overall": None, "notes": []}
  models = [m for m in done if num in schema.ood_sets(runs[m]) and
            den in schema.ood_sets(runs[m])]
  if not models:
    out["notes"].append(f"no finished model has both {num} and {den}.")
    return out
  tprs = {float(((runs[m]["meta"].get("config") or {}).get("metrics") or {}).get("tpr", 0.95))
          for m in models}
  if len(tprs) > 1:
    out["notes"].append(f"the runs use different TPRs {sorted(tprs)}: no bootstrap CI.")
  tpr = min(tprs)
  per_model, pairs = [], []   # pairs: (model, detector) rows of the bootstrap
  for m in models:
    ds = [d for d in chosen if _fpr(rows.get((m, d, num))) is not None
          and _fpr(rows.get((m, d, den))) is not None]
    if not ds:
      out["notes"].append(f"{m}: none of the chosen detectors has FPR@95 on both sets.")
      continue
    fa = [_fpr(rows[(m, d, num)]) for d in ds]
    fb = [_fpr(rows[(m, d, den)]) for d in ds]
    per_model.append({"model": m, "detectors": ds, "fpr_num": float(np.mean(fa)),
                      "fpr_den": float(np.mean(fb)), "ratio": _ratio(fa, fb),
                      "ci_low": None, "ci_high": None})
    pairs += [(m, d) for d in ds]
  out["models"] = per_model
  if not per_model:
    return out
  fa = [_fpr(rows[(m, d, num)]) for m, d in pairs]
  fb = [_fpr(rows[(m, d, den)]) for m, d in pairs]
  overall = {"models": [p["model"] for p in per_model], "n_pairs": len(pairs),
             "fpr_num": float(np.mean(fa)), "fpr_den": float(np.mean(fb)),
             "ratio": _ratio(fa, fb), "ci_low": None, "ci_high": None}
  out["overall"] = overall
  if settings["n_bootstrap"] <= 0 or len(tprs) > 1:
    return out
  # the per-example scores, paired by example id across models
  scores, ref_ids, boot_rows, paired = {}, None, [], []
  for p in per_model:
    m = p["model"]
    try:
      z = {s: load_scores(os.path.join(workdir, dirs[m]), s)
           for s in ("id_test", f"ood/{num}", f"ood/{den}")}
    except (FileNotFoundError, OSError, ValueError) as e:
      out["notes"].append(f"{m}: no CI ({' '.join(str(e).split())}).")
      continue
    missing = [d for d in p["detectors"] if any(d not in z[s] for s in z)]
    if missing:
      out["notes"].append(f"{m}: no per-example scores of {missing}: no CI.")
      continue
    ids = tuple(z[s]["id"] for s in ("id_test", f"ood/{num}", f"ood/{den}"))
    if ref_ids is None:
      ref_ids = ids
    elif any(len(a) != len(b) or not np.array_equal(a, b) for a, b in zip(ids, ref_ids)):
      out["notes"].append(f"{m}: its score files hold other examples than "
                          f"{paired[0]}'s: no CI.")
      continue
    scores[m] = z
    paired.append(m)
    boot_rows += [(m, d) for d in p["detectors"]]
  if not boot_rows:
    return out
  mat = {s: np.stack([np.asarray(scores[m][s][d], np.float64) for m, d in boot_rows])
         for s in ("id_test", f"ood/{num}", f"ood/{den}")}
  groups = {m: [i for i, (mm, _) in enumerate(boot_rows) if mm == m] for m in paired}
  all_paired = len(paired) == len(per_model)
  if all_paired:
    groups["\0overall"] = list(range(len(boot_rows)))
  else:
    out["notes"].append("the overall CI is not given: not every model's scores are paired.")
  res = hardness_lib.hardness_bootstrap(
      mat["id_test"], mat[f"ood/{num}"], mat[f"ood/{den}"], groups, tpr=tpr,
      n_bootstrap=settings["n_bootstrap"], seed=settings["seed"], ci=settings["ci"])
  for p in per_model:
    if p["model"] in res:
      p["ci_low"], p["ci_high"] = res[p["model"]]["ci_low"], res[p["model"]]["ci_high"]
  if all_paired:
    overall["ci_low"], overall["ci_high"] = res["\0overall"]["ci_low"], res["\0overall"]["ci_high"]
  return out


def _ratio(num: Sequence[float], den: Sequence[float]) -> Optional[float]:
  d, n = float(np.mean(den)), float(np.mean(num))
  if d == 0:
    return None   # undefined (infinite or 0/0)
  return n / d


def _sets(runs) -> list[str]:
  out: list[str] = []
  for r in runs:
    out += [s for s in schema.ood_sets(r) if s not in out]
  return out


def build(workdir: str, **overrides) -> dict[str, Any]:
  """Every number of the leaderboard of the sweep in `workdir` (module docstring), as the
  JSON file holds them. `overrides`: settings (DEFAULTS' keys) over sweep.json's."""
  settings = settings_of(workdir, **overrides)
  sweep = sweep_state.read_sweep(workdir) or {}
  entries, runs, dirs = [], {}, {}
  for m in sweep_state.models(workdir):
    state, detail = sweep_state.status(os.path.join(workdir, m["dir"]))
    e = {"model": m["label"], "dir": m["dir"], "status": state}
    if state == "done":
      runs[m["label"]] = detail
    elif state == "failed":
      e["reason"] = str((detail or {}).get("reason", ""))
    elif state == "running":
      e["reason"] = (f"started by {detail.get('host', '?')} pid {detail.get('pid', '?')} "
                     "(running, or killed: rerun the sweep to resume it)")
    dirs[m["label"]] = m["dir"]
    entries.append(e)
  done = [e["model"] for e in entries if e["status"] == "done"]
  sets = _sets(runs[m] for m in done)
  dets: list[str] = []
  for m in done:
    dets += [d for d in schema.configured_detectors(runs[m]) if d not in dets]
  rows = {(m, r["detector"], r["ood_set"]): r for m in done for r in runs[m]["rows"]}
  primary = settings["primary"] or (settings["hardness"][0] if settings["hardness"][0] in sets
                                    else (sets[0] if sets else ""))
  per_set, csv_rows = _best_per_set(sets, done, dets, rows)
  ranks = _ranking(done, dets, rows, runs, settings)
  ranked = [d["detector"] for d in ranks["detectors"]]
  chosen, how = _chosen(settings, ranked)
  hard = _hardness(done, rows, runs, workdir, dirs, chosen, settings)
  hard["chosen_by"] = how
  for e in entries:
    if e["status"] != "done":
      continue
    res, m = runs[e["model"]], e["model"]
    cands = [(d, rows[(m, d, primary)]) for d in dets if _fpr(rows.get((m, d, primary))) is not None]
    best = min(cands, key=lambda c: _fpr(c[1])) if cands else None
    e.update(id_accuracy=res.get("id_accuracy"), primary_set=primary,
             best_detector=best[0] if best else None,
             best_fpr95=_fpr(best[1]) if best else None,
             best_fpr95_ci_low=best[1].get("fpr95_ci_low") if best else None,
             best_fpr95_ci_high=best[1].get("fpr95_ci_high") if best else None,
             n_rows=len(res["rows"]),
             failed_detectors=[f["detector"] for f in schema.failures(res)])
    fs = res.get("full_spectrum")
    if fs:   # the ID accuracy of the full-spectrum ID side and of each shifted set
      e["full_spectrum"] = {"id_set": fs.get("id_set"), "accuracy": fs.get("accuracy"),
                            "csid_accuracy": dict(fs.get("csid_accuracy") or {}),
                            "restricted": {b["id_set"]: b.get("accuracy")
                                           for b in fs.get("restricted", [])}}
  fs_board = _full_spectrum(done, dets, runs)
  return schema.jsonable({
      "name": sweep.get("name", os.path.basename(os.path.abspath(workdir))),
      "settings": settings, "primary_set": primary, "ood_sets": sets, "detectors": dets,
      "models": entries,
      "counts": {k: sum(e["status"] == k for e in entries)
                 for k in ("done", "failed", "running", "missing")},
      "per_set": per_set, "ranking": ranks, "hardness": hard, "pairs": csv_rows,
      **({"full_spectrum": fs_board} if fs_board else {})})


def _full_spectrum(done, dets, runs) -> dict:
  """{ID side: {"per_set": the best pairs per OOD set as `per_set`, "pairs": their rows}} over
  the finished runs' full-spectrum rows (`schema.full_spectrum_rows`: OpenOOD's FS rows and the
  class-subset ones), grouped by the rows' `id_set`; {} when no run has any."""
  by_id: dict[str, dict] = {}
  for m in done:
    for r in schema.full_spectrum_rows(runs[m]):
      by_id.setdefault(r["id_set"], {})[(m, r["detector"], r["ood_set"])] = r
  out = {}
  for id_set, rows in by_id.items():
    sets = list(dict.fromkeys(k[2] for k in rows))
    per_set, pairs = _best_per_set(sets, done, dets, rows)
    out[id_set] = {"per_set": per_set, "pairs": [{**p, "id_set": id_set} for p in pairs]}
  return out


# ----------------------------------------------------------------------------- the files

def _pct(v, lo=None, hi=None, digits=2) -> str:
  if v is None:
    return "-"
  text = f"{100 * v:.{digits}f}"
  if lo is not None and hi is not None:
    text += f" [{100 * lo:.1f}, {100 * hi:.1f}]"
  return text


def _num(v, fmt="{:.3g}") -> str:
  return "-" if v is None else fmt.format(v)


def markdown(board: Mapping) -> str:
  """The leaderboard as Markdown (leaderboard.md)."""
  s = board["settings"]
  c = board["counts"]
  out = [f"# fi_jax leaderboard: {board['name']}", ""]
  out.append(f"{len(board['models'])} models: {c['done']} done, {c['failed']} failed, "
             f"{c['running'] + c['missing']} not finished. OOD sets: "
             f"{', '.join(board['ood_sets']) or '-'}. Metrics in percent; FPR@95 is "
             "ID-positive (threshold: the K-th largest ID score), lower is better; brackets: "
             "bootstrap CI.")
  left = [e for e in board["models"] if e["status"] != "done"]
  if left:
    out += ["", "Not in the tables:"]
    for e in left:
      why = f": {' '.join(str(e.get('reason', '')).split())}" if e.get("reason") else ""
      out.append(f"- {e['model']} — {e['status']}{why}")

  out += ["", "## Best (model, detector) pair per OOD set", "",
          "| OOD set | pairs | min FPR@95 [CI] | best pair by FPR@95 | pairs within the CI "
          "| max AUROC [CI] | best pair by AUROC |", "|---|---|---|---|---|---|---|"]
  for name, p in board["per_set"].items():
    if not p.get("n_pairs"):
      out.append(f"| {name} | 0 | - | - | - | - | - |")
      continue
    bf, ba = p["best_fpr95"], p["best_auroc"]
    out.append(f"| {name} | {p['n_pairs']} | "
               f"{_pct(p['min_fpr95'], p['min_fpr95_ci_low'], p['min_fpr95_ci_high'])} | "
               f"{bf['model']}: {bf['detector']} | {_num(p['n_within_ci'], '{}')} | "
               f"{_pct(ba['auroc'], ba['auroc_ci_low'], ba['auroc_ci_high'])} | "
               f"{ba['model']}: {ba['detector']} |")
  out += ["", "Pairs within the CI: pairs whose FPR@95 is at most the upper end of the best "
          "pair's bootstrap CI (the best pair included; '-' when the runs have no CIs)."]

  h = board["hardness"]
  out += ["", f"## Hardness: {h['numerator']} vs {h['denominator']}", ""]
  out.append(f"Ratio = mean FPR@95 on {h['numerator']} / mean FPR@95 on {h['denominator']} "
             f"over {h['chosen_by']}: {', '.join(h['detectors']) or '-'}. CI: "
             f"{int(s['ci'] * 100)}% paired bootstrap, {h['n_bootstrap']} resamples of the ID "
             f"test and both OOD sets' images (seed {h['seed']}), the same for every model, "
             "detector, numerator and denominator.")
  if h["models"]:
    out += ["", f"| model | pairs | mean FPR@95 {h['numerator']} | mean FPR@95 "
            f"{h['denominator']} | ratio [CI] |", "|---|---|---|---|---|"]
    lines = [(p["model"], len(p["detectors"]), p) for p in h["models"]]
    if h["overall"]:
      lines.append(("**all models**", h["overall"]["n_pairs"], h["overall"]))
    for name, n, p in lines:
      ci = (f" [{p['ci_low']:.2f}, {p['ci_high']:.2f}]"
            if p.get("ci_low") is not None and p.get("ci_high") is not None else "")
      out.append(f"| {name} | {n} | {_pct(p['fpr_num'])} | {_pct(p['fpr_den'])} | "
                 f"{_num(p['ratio'], '{:.2f}')}{ci} |")
  for n in h["notes"]:
    out.append(f"\n- {n}")

  r = board["ranking"]
  out += ["", "## Detectors: mean rank over models", ""]
  out.append(f"Each finished model ranks the detectors by their mean FPR@95 over "
             f"{', '.join(r['sets']) or '-'} (1 = best, ties averaged); the mean over "
             f"{r['n_models']} models.")
  if r["detectors"]:
    out += ["", "| rank | detector | mean rank | mean FPR@95 |", "|---|---|---|---|"]
    for i, d in enumerate(r["detectors"]):
      out.append(f"| {i + 1} | {d['detector']} | {d['mean_rank']:.2f} | "
                 f"{_pct(d['mean_fpr95'])} |")
  f = r.get("friedman")
  if f and f.get("chi2") is not None:
    out += ["", f"Friedman χ²_F = {f['chi2']:.3f} (df {f['df']}, p = {f['p']:.3g}); "
            f"Iman–Davenport F_F = {_num(f['iman_davenport_f'], '{:.3f}')} "
            f"(df {f['f_df1']}, {f['f_df2']}; p = {f['f_p']:.3g}). Nemenyi critical "
            f"difference at α = {f['alpha']}: CD = {f['cd']:.3f} (q_α = {f['q_alpha']:.3f}, "
            f"k = {f['n_treatments']}, N = {f['n_blocks']}): two detectors whose mean ranks "
            "differ by more than CD differ significantly."]
  elif r["detectors"]:
    out += ["", "Friedman test: needs at least 2 finished models and 2 ranked detectors."]
  if r["not_ranked"]:
    out += ["", "Not ranked (no FPR@95 on some ranking set of some model): " + "; ".join(
        f"{d} (missing on {', '.join(ms)})" for d, ms in r["not_ranked"].items())]

  for id_set, part in (board.get("full_spectrum") or {}).items():
    out += ["", f"## Full spectrum: ID = {id_set}", "",
            "The covariate-shifted ID sets join the ID side (OpenOOD v1.5 FS; in brackets: the "
            "rows in a class subset's label space).", "",
            "| OOD set | pairs | min FPR@95 [CI] | best pair by FPR@95 | max AUROC [CI] | best "
            "pair by AUROC |", "|---|---|---|---|---|---|"]
    for name, p in part["per_set"].items():
      if not p.get("n_pairs"):
        out.append(f"| {name} | 0 | - | - | - | - |")
        continue
      bf, ba = p["best_fpr95"], p["best_auroc"]
      out.append(f"| {name} | {p['n_pairs']} | "
                 f"{_pct(p['min_fpr95'], p['min_fpr95_ci_low'], p['min_fpr95_ci_high'])} | "
                 f"{bf['model']}: {bf['detector']} | "
                 f"{_pct(ba['auroc'], ba['auroc_ci_low'], ba['auroc_ci_high'])} | "
                 f"{ba['model']}: {ba['detector']} |")
  with_fs = [e for e in board["models"] if e.get("full_spectrum")]
  if with_fs:
    out += ["", "Full-spectrum ID accuracy (the shifted sets' own over their class subset "
            "where they have one):", "", "| model | ID side | accuracy | per shifted set |",
            "|---|---|---|---|"]
    for e in with_fs:
      f = e["full_spectrum"]
      out.append(f"| {e['model']} | {f['id_set']} | {_pct(f['accuracy'])} | " + (", ".join(
          f"{k} {_pct(v)}" for k, v in f["csid_accuracy"].items()) or "-") + " |")
      out += [f"| {e['model']} | {k} | {_pct(v)} | - |" for k, v in f["restricted"].items()]

  out += ["", f"## Models (best detector on {board['primary_set'] or '-'})", "",
          "| model | status | ID accuracy | best detector | best FPR@95 [CI] | failed detectors |",
          "|---|---|---|---|---|---|"]
  for e in board["models"]:
    if e["status"] != "done":   # the whole reason is listed above
      why = " ".join(str(e.get("reason", "")).split())
      why = why if len(why) <= 120 else why[:117] + "..."
      out.append(f"| {e['model']} | {e['status']}{': ' + why if why else ''} | - | - | - | - |")
      continue
    out.append(f"| {e['model']} | done | {_pct(e['id_accuracy'])} | "
               f"{e['best_detector'] or '-'} | "
               f"{_pct(e['best_fpr95'], e['best_fpr95_ci_low'], e['best_fpr95_ci_high'])} | "
               f"{', '.join(e['failed_detectors']) or '-'} |")
  if board.get("figures"):
    out += ["", "## Figures", ""] + [f"- [{os.path.basename(p)}]({os.path.basename(p)})"
                                     for p in board["figures"]]
  if board.get("plot_error"):
    out += ["", f"Figures failed: {board['plot_error']}"]
  return "\n".join(out) + "\n"


def csv_text(board: Mapping) -> str:
  """Every (OOD set, model, detector) pair, best first per set, then the full-spectrum pairs
  per ID side (their `id_set` tells them apart) (leaderboard.csv)."""
  buf = io.StringIO()
  w = csv.DictWriter(buf, fieldnames=list(CSV_FIELDS), lineterminator="\n")
  w.writeheader()
  fs_pairs = [p for part in (board.get("full_spectrum") or {}).values() for p in part["pairs"]]
  for r in list(board["pairs"]) + fs_pairs:
    w.writerow({k: "" if r.get(k) is None else r[k] for k in CSV_FIELDS})
  return buf.getvalue()


def write(workdir: str, out: Optional[str] = None, log=print, **overrides) -> dict[str, Any]:
  """Builds the leaderboard of `workdir` and writes leaderboard.md / .csv / .json and the
  figures into `out` (default `workdir`), each file atomically. Returns the board."""
  import json
  board = build(workdir, **overrides)
  out = out or workdir
  os.makedirs(out, exist_ok=True)
  try:
    board["figures"] = [os.path.basename(p) for p in figures(board, out)]
  except Exception as e:  # the figures must not cost the numbers
    board["plot_error"] = f"{type(e).__name__}: {e}"
    log(f"Leaderboard figures failed ({board['plot_error']}); the tables are written.")
  sweep_state.write_text(os.path.join(out, "leaderboard.md"), markdown(board))
  sweep_state.write_text(os.path.join(out, "leaderboard.csv"), csv_text(board))
  sweep_state.write_text(os.path.join(out, "leaderboard.json"),
                         json.dumps(schema.jsonable(board), indent=1) + "\n")
  c = board["counts"]
  log(f"Leaderboard: {c['done']} done, {c['failed']} failed, {c['running'] + c['missing']} "
      f"not finished -> {os.path.join(out, 'leaderboard.md')} (+ .csv, .json, "
      f"{len(board.get('figures', []))} figures).")
  return board


# ----------------------------------------------------------------------------- the figures

def _pyplot():
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib import pyplot
  return pyplot


def _safe(name: str) -> str:
  return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def figures(board: Mapping, out: str) -> list[str]:
  """leaderboard_fpr95_<set>.png (detectors x models heat map per OOD set),
  leaderboard_min_fpr95.png (per-set minimum with its CI) and
  leaderboard_accuracy_vs_fpr95.png; returns the files written."""
  done = [e for e in board["models"] if e["status"] == "done"]
  if not done or not board["ood_sets"]:
    return []
  plt = _pyplot()
  written = []
  ranked = [d["detector"] for d in board["ranking"]["detectors"]]
  dets = ranked + [d for d in board["detectors"] if d not in ranked]
  pair = {(p["model"], p["detector"], p["ood_set"]): p for p in board["pairs"]}
  models = [e["model"] for e in done]
  failed = {(e["model"], d) for e in done for d in e.get("failed_detectors") or ()}
  for s in board["ood_sets"]:
    grid = np.full((len(dets), len(models)), np.nan)
    cells, ci = {}, {}
    for i, d in enumerate(dets):
      for j, m in enumerate(models):
        p = pair.get((m, d, s))
        if p is not None and p.get("fpr95") is not None:
          grid[i, j] = 100 * p["fpr95"]
          if p.get("fpr95_ci_low") is not None and p.get("fpr95_ci_high") is not None:
            ci[(i, j)] = (100 * p["fpr95_ci_low"], 100 * p["fpr95_ci_high"])
        elif (m, d) in failed:
          cells[(i, j)] = "the detector failed in this model's run (its results.md says why)"
    best = board["per_set"][s].get("best_fpr95")
    mark = (dets.index(best["detector"]), models.index(best["model"])) if best else None
    path = os.path.join(out, f"leaderboard_fpr95_{_safe(s)}.png")
    order = "mean rank" if ranked else "configured order"
    title = (f"FPR@95 (%) on {s}: {len(dets)} detectors × {len(models)} models\n"
             f"detectors by {order}; red box: the best pair" if len(models) > 1 else
             f"FPR@95 on {s}\nmodel: {models[0]}; {len(dets)} detectors, best first")
    written.append(plots.fpr95_figure(grid, dets, models, title, path, failed=cells, ci=ci,
                                      mark=mark))
  # per-set minimum FPR@95 with the CI of the best pair
  sets = [s for s in board["ood_sets"] if board["per_set"][s].get("n_pairs")]
  fig, ax = plt.subplots(figsize=(2.5 + 1.3 * len(sets), 4.5))
  v = np.array([100 * board["per_set"][s]["min_fpr95"] for s in sets])
  lo = [board["per_set"][s]["min_fpr95_ci_low"] for s in sets]
  hi = [board["per_set"][s]["min_fpr95_ci_high"] for s in sets]
  err = None
  if all(x is not None for x in lo + hi):
    err = np.array([v - 100 * np.array(lo), 100 * np.array(hi) - v])
  ax.bar(range(len(sets)), v, yerr=err, capsize=4, color="#4c72b0")
  for i, s in enumerate(sets):
    b = board["per_set"][s]["best_fpr95"]
    ax.text(i, v[i] / 2, f"{b['model']}\n{b['detector']}", ha="center", va="center",
            rotation=90, fontsize=7, color="white")
    ax.text(i, (v[i] if err is None else v[i] + err[1][i]) + 1, f"{v[i]:.1f}", ha="center",
            va="bottom", fontsize=8)
  ax.set_xticks(range(len(sets)), sets, rotation=30, ha="right", fontsize=8)
  ax.set(ylabel="minimum FPR@95 over all pairs (%)", ylim=(0, 105),
         title="Best (model, detector) pair per OOD set")
  written.append(_save(fig, os.path.join(out, "leaderboard_min_fpr95.png")))
  # ID accuracy vs best FPR@95 on the primary set
  pts = [e for e in done if e.get("id_accuracy") is not None and e.get("best_fpr95") is not None]
  fig, ax = plt.subplots(figsize=(6.5, 5))
  for e in pts:
    x, y = 100 * e["id_accuracy"], 100 * e["best_fpr95"]
    yerr = None
    if e.get("best_fpr95_ci_low") is not None and e.get("best_fpr95_ci_high") is not None:
      yerr = [[y - 100 * e["best_fpr95_ci_low"]], [100 * e["best_fpr95_ci_high"] - y]]
    ax.errorbar([x], [y], yerr=yerr, fmt="o", capsize=3)
    ax.annotate(f"{e['model']}\n({e['best_detector']})", (x, y), textcoords="offset points",
                xytext=(5, 4), fontsize=7)
  ax.set(xlabel="ID accuracy (%)",
         ylabel=f"best FPR@95 on {board['primary_set']} (%)",
         title="ID accuracy vs the best detector's FPR@95")
  ax.grid(alpha=0.3)
  written.append(_save(fig, os.path.join(out, "leaderboard_accuracy_vs_fpr95.png")))
  return written


def _save(fig, path: str, tight: bool = True) -> str:
  if tight:
    fig.tight_layout()
  folder = os.path.dirname(os.path.abspath(path))
  tmp = os.path.join(folder, "." + os.path.basename(path) + f".{os.getpid()}.tmp.png")
  fig.savefig(tmp, dpi=100)
  _pyplot().close(fig)
  os.replace(tmp, path)
  return path
