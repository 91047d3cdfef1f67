"""The pipeline core: sets -> extract -> detectors -> metric rows.

Used by `fi_jax.run` (the benchmark: configs, model building, feature cache, report files) and
by `fi_jax.evaluators.ood` (big_vision's evaluator API, on the model being trained). Stages
talk through plain arrays; a set's arrays are {features, logits, label, group, score/<name>,
stat/<name>} as `fi_jax.extract.extract` returns them (stat/: AdaSCALE's per-image statistic).
Set names are "id_fit" (what detectors fit on), "id_test" and "ood/<name>". With layer
detectors (fi_jax/detectors/intermediate.py) every set also has `layer/<reducer>/<block>` columns
(fi_jax/extract/layer_columns.py), which reach those detectors as `Outputs.extras`.
"""
from __future__ import annotations

import os
import time
import traceback
from typing import Any, Callable, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fi_jax import detectors
from fi_jax.common import columns as columns_lib
from fi_jax.common import distributed, progress
from fi_jax.data import class_subsets
from fi_jax.data import loader as data
from fi_jax.data import specs as specs_lib
from fi_jax.extract import cache
from fi_jax.extract import forward as extract
from fi_jax.extract import layer_columns as layer_lib
from fi_jax.metrics import device as metrics
from fi_jax.models import _predictor
from fi_jax.report import schema

Log = Callable[[str], None]
Arrays = dict[str, np.ndarray]
# load(set name, spec, column names) -> the set's arrays, or None to extract it; the column
# names are the input scorer names plus "layer/<reducer>" per layer reducer (`column_names`)
LoadFn = Callable[[str, dict, list], Optional[Arrays]]
# save(set name, spec, column names, arrays, seconds the extraction took)
SaveFn = Callable[[str, dict, list, Arrays, float], None]
# shard_root(set name, spec, column names, batch size, shard size) -> the folder of the
# set's shards (its name must change with anything that moves the shard boundaries)
ShardRootFn = Callable[[str, dict, list, int, int], str]
NONFINITE_MODES = ("error", "drop")


def _no_log(msg: str) -> None:
  del msg


def input_scorer_names(dets: Mapping[str, Any], set_name: str) -> list[str]:
  """The detectors that score the images themselves during extraction (ODIN, AdaSCALE); on the
  fit set only those that fit on what they compute from the images (`fit_inputs`: AdaSCALE)."""
  return [name for name, det in dets.items() if "inputs" in det.needs
          and (set_name != "id_fit" or det.fit_inputs)]


def layer_reducers(dets: Mapping[str, Any]) -> tuple[str, ...]:
  """The union of the layer reducers the layer detectors need (sorted; () without any)."""
  return layer_lib.check_reducers([r for det in dets.values() if "layers" in det.needs
                                   for r in det.layer_reducers])


def column_names(scorer_names: Sequence[str], reducers: Sequence[str]) -> list[str]:
  """What besides features / logits a set's arrays hold: the input scorer names and
  "layer/<reducer>" per reducer (what the cache key of a set is made of)."""
  return list(scorer_names) + [columns_lib.layer_group(r) for r in reducers]


def set_columns(dets: Mapping[str, Any], set_name: str) -> list[str]:
  """`column_names` of set `set_name` for the detectors `dets` (its cache key's columns)."""
  return column_names(input_scorer_names(dets, set_name), layer_reducers(dets))


def input_scorers(dets: Mapping[str, Any], names: Sequence[str], predict: extract.PredictFn,
                  input_std: Sequence[float]) -> dict[str, extract.InputScorer]:
  """{name: scorer(params, images)} for `fi_jax.extract.Forward`.

  `input_std` is the per-channel std of the model's input in [0, 1] pixel units (0.5 for
  value_range(-1, 1)), so that ODIN's epsilon is a pixel-unit step. ODIN gets the logits
  function, a `fit_inputs` detector (AdaSCALE) the whole predict function (logits, features).
  """
  input_std = tuple(input_std)

  def scorer(det):
    full = det.fit_inputs
    return lambda p, images: det.score_inputs(
        {}, (lambda x: predict(p, x)) if full else (lambda x: predict(p, x)[0]), images,
        input_std=input_std)
  return {n: scorer(dets[n]) for n in names}


def build_forward(dets: Mapping[str, Any], predict: extract.PredictFn, mesh,
                  input_std: Sequence[float], predict_out: Optional[extract.PredictOutFn] = None,
                  ) -> extract.Forward:
  """The one `extract.Forward` of a run: every input scorer of a scored set (a superset of the
  fit set's), those the fit set does not run `optional`; the layer reducers when `predict_out`
  is given."""
  names = input_scorer_names(dets, "id_test")
  fit_set = input_scorer_names(dets, "id_fit")
  return extract.Forward(
      predict, mesh, input_scorers=input_scorers(dets, names, predict, input_std),
      optional=[n for n in names if n not in fit_set],
      layers=layer_reducers(dets) if predict_out is not None else (), predict_out=predict_out)


def plan_forwards(names: Sequence[str], dets: Mapping[str, Any], predict: extract.PredictFn,
                  mesh, input_std: Sequence[float], forwards: dict,
                  log: Log = _no_log) -> dict[str, extract.Forward]:
  """{set name: the `extract.Forward` that extracts it}: one per (predict_fn, input scorers,
  layer reducers) for every set (each set runs its own scorers, `input_scorer_names`), taken
  from `forwards` or created there (so that callers sharing the dict share the compiled
  step)."""
  reducers = layer_reducers(dets)
  predict_out = _predictor.out_variant(predict) if reducers else None
  if reducers and predict_out is None and names:
    log("the predict function has no variant that returns the model's out: no layer "
        "columns; the layer detectors (" + ", ".join(
            n for n, d in dets.items() if "layers" in d.needs) + ") will fail")
  key = (predict, tuple(input_scorer_names(dets, "id_test")), reducers)
  if names and key not in forwards:
    forwards[key] = build_forward(dets, predict, mesh, input_std, predict_out)
  return {name: forwards[key] for name in names}


def _finished_shards(root: str, log: Log) -> list[Arrays]:
  """This process's shards of an interrupted extraction under `root`, in order, up to the
  first one that is missing or damaged (that one and every later one are recomputed)."""
  done = []
  while True:
    arrays = cache.load(_shard_path(root, len(done)), log=log)
    if arrays is None:
      return done
    done.append(arrays)


def _shard_path(root: str, k: int) -> str:
  """Shard k of this process (with several processes each writes its own rows' entry)."""
  return cache.part(os.path.join(root, f"shard-{k:05d}"), jax.process_index(),
                    jax.process_count())


def _extract_sharded(name: str, spec: dict, forward: extract.Forward, params, *,
                     pp_fn: Callable, batch_size: int, shard_size: int, shard_root: Optional[str],
                     log: Log, scorers: Optional[Sequence[str]] = None) -> Arrays:
  """One set through the model, written to `shard_root` in shards of about `shard_size`
  examples as it goes, so that a rerun after a kill resumes at the shard in flight.

  A shard is a run of whole global batches; each process writes the rows it extracted of it
  (its own entry), with their `_id`s. Returns this process's rows in set order, exactly as one
  pass would give them (the same batches through the same jitted step): with one process the
  whole set, with several its own part with `_id` kept. Rows are written in place into one
  buffer as they arrive from the device (shards are saved from views of it), while the next
  steps are in flight.
  """
  steps_per_shard = max(1, -(-shard_size // batch_size)) if shard_size else 0
  done = _finished_shards(shard_root, log) if shard_root and steps_per_shard else []
  n_done = distributed.agree_min(len(done))   # every process skips the same shards
  done = done[:n_done]
  it, steps, info = data.batches(spec, pp_fn, batch_size, process_index=jax.process_index(),
                                 process_count=jax.process_count(),
                                 skip_steps=n_done * steps_per_shard)
  n_local = info.num_examples_per_process[jax.process_index()]
  # a resumed set's total is what is left: unknown per process, so the bar counts only
  total = None if n_done else n_local
  it = progress.batches(it, total, name)
  n_shards = -(-steps // steps_per_shard) if steps_per_shard else 1
  log(f"{name}: {info.num_examples} examples, {steps} batches of {batch_size}"
      + (f", {n_shards} shards" if n_shards > 1 else ""))
  if n_done:
    log(f"{name}: resuming at shard {n_done + 1}/{n_shards} ({n_done} finished shard(s), "
        f"{sum(len(d['_id']) for d in done)} examples, from {shard_root})")
  rows = extract.RowBuffer(n_local)
  for d in done:
    rows.add(d)
  del done
  shard_start, step = rows.size, n_done * steps_per_shard
  for chunk in forward.chunks(params, it, scorers=scorers, steps=steps, log=log):
    rows.add(chunk)
    step += 1
    if steps_per_shard and step % steps_per_shard == 0 and step < steps:
      k = step // steps_per_shard - 1
      if shard_root:
        cache.save(_shard_path(shard_root, k), rows.view(shard_start, rows.size),
                   {"set": name, "shard": k, "steps": [k * steps_per_shard, step],
                    "process": [jax.process_index(), jax.process_count()]})
        log(f"{name}: shard {k + 1}/{n_shards} saved")
      shard_start = rows.size
  return rows.result(keep_id=jax.process_count() > 1)


def extract_sets(specs: Mapping[str, dict], model: Callable[[], tuple[extract.PredictFn, Any]],
                 dets: Mapping[str, Any], *, pp_fn: Callable, batch_size: int, mesh,
                 input_std: Sequence[float], log: Log = _no_log,
                 load: Optional[LoadFn] = None, save: Optional[SaveFn] = None,
                 shard_size: int = 0, shard_root: Optional[ShardRootFn] = None,
                 forwards: Optional[dict] = None) -> dict[str, Arrays]:
  """The arrays of every set: from `load` when it has them, else through the model.

  With one process these are whole sets. With several, each process gets (and `load`
  returns, `save` receives) only its own rows of each set, with their `_id`s: the rows of its
  part of the set, never the others' (`collect_sets` then brings them together where the
  detectors run). A set is loaded only when every process's `load` has its rows, else every
  process extracts it (they run the same jitted steps).

  `model()` returns (predict_fn, params) and is called only when a set is extracted (so a
  caller can build the model lazily); `save` receives every extracted set. With `shard_size`
  and `shard_root`, a set is also written in shards of about `shard_size` examples while it
  is extracted (removed once `save` has the whole set), and an interrupted extraction resumes
  at its first missing shard.

  The compiled forward is built once per run, not per set: one `extract.Forward` holding every
  input scorer, compiled once for the per-device batch shape, each set running only its own
  scorers (the fit set none, or AdaSCALE's); the sets in the cache are loaded first. Pass the
  same `forwards` dict to several calls with the same `model()` predict_fn and detectors
  (e.g. the evaluator, every evaluation) to reuse the compilation across calls too.
  """
  forwards = {} if forwards is None else forwards
  out, todo = {}, {}
  for name, spec in specs.items():   # first what the cache has (every process agrees)
    cols = set_columns(dets, name)
    arrays = load(name, spec, cols) if load else None
    if not distributed.all_agree(arrays is not None):
      arrays = None
    if arrays is None:
      todo[name] = cols
    else:
      out[name] = arrays
  if todo:
    predict, params = model()
    set_forwards = plan_forwards(list(todo), dets, predict, mesh, input_std, forwards, log)
  for name, cols in todo.items():
    spec, forward = specs[name], set_forwards[name]
    t = time.time()
    root = shard_root(name, spec, cols, batch_size, shard_size) if shard_root else None
    arrays = _extract_sharded(name, spec, forward, params, pp_fn=pp_fn,
                              batch_size=batch_size, shard_size=shard_size,
                              shard_root=root, log=log,
                              scorers=input_scorer_names(dets, name))
    if save:
      save(name, spec, cols, arrays, time.time() - t)
    if root:
      # every process has saved its rows of the set (so no longer needs its shards)
      distributed.sync(f"fi_jax shards {name}")
      if jax.process_index() == 0:
        cache.remove(root)
    log(f"{name}: done in {time.time() - t:.1f} s")
    out[name] = arrays
  return {name: out[name] for name in specs}


def collect_sets(local: Mapping[str, Arrays],
                 read: Optional[Callable[[str, int], Optional[Arrays]]] = None,
                 ) -> Optional[dict[str, Arrays]]:
  """Every set's rows, in set order, where the detectors run.

  One process: `local` as it is. Several, with `read(set name, process index)` (each
  process's rows as saved, e.g. from the cache in a workdir every process sees): process 0
  reads the other processes' rows after a barrier and gets every set; the other processes get
  None (they hold nothing more than their own rows, which they drop). Several without `read`:
  every process gets every set (an all-gather; each process then holds all rows).
  """
  if jax.process_count() == 1:
    return dict(local)
  if read is None:
    return {name: extract.in_set_order([distributed.allgather_rows(a)])
            for name, a in local.items()}
  distributed.sync("fi_jax sets saved")   # every process's rows are on disk
  if jax.process_index() != 0:
    return None
  out = {}
  for name, own in local.items():
    parts = []
    for i in range(jax.process_count()):
      part = own if i == 0 else read(name, i)
      if part is None:
        raise FileNotFoundError(
            f"set {name!r}: process 0 cannot read the rows that process {i} saved. A run "
            f"with several processes needs a workdir that every process sees (a shared "
            f"filesystem): each process saves its rows there and process 0 reads them.")
      parts.append(part)
    out[name] = extract.in_set_order(parts)
  return out


def drop_nonfinite(sets: Mapping[str, Arrays], mode: str = "error", log: Log = _no_log,
                   ) -> tuple[dict[str, Arrays], dict[str, int]]:
  """Checks that the model's outputs (features, logits) are finite in every set.

  mode "error": a set with non-finite rows raises one ValueError naming the set, the count
  and the first example ids; mode "drop": those rows are removed from the set (all its arrays)
  and counted, and the set keeps each remaining row's example id (its index in the set as
  given, or the set's own `_id` column) in `_id`, so that the per-example score files name the
  dataset's examples, never a renumbering. Returns (sets, {set name: rows dropped}) with only
  sets that lost rows counted; a set that lost none is returned as it was given. A set without
  rows, or left without rows by "drop", is a ValueError naming it.
  """
  if mode not in NONFINITE_MODES:
    raise ValueError(f"nonfinite must be one of {NONFINITE_MODES}, got {mode!r}.")
  out, dropped = {}, {}
  for name, arrays in sets.items():
    if not len(arrays["logits"]):
      raise ValueError(f"set {name!r} has no examples: its spec selects none (split, classes, "
                       f"per_class) or its files hold no rows; fix the spec or leave the set "
                       f"out.")
    bad = np.zeros(len(arrays["logits"]), bool)
    for key in ("features", "logits"):
      a = np.asarray(arrays[key])
      if np.issubdtype(a.dtype, np.inexact):
        bad |= ~np.isfinite(a.reshape(len(a), -1)).all(axis=1)
    n_bad = int(bad.sum())
    if n_bad and mode == "error":
      ids = np.flatnonzero(bad)[:10].tolist()
      raise ValueError(
          f"set {name!r}: the model gave non-finite features or logits (NaN/Inf) for {n_bad} "
          f"of {len(bad)} examples (first example ids: {ids}). Check the checkpoint and the "
          f"preprocessing, or set --config.nonfinite=drop to drop these examples (the count "
          f"goes into results.json).")
    if n_bad and n_bad == len(bad):
      raise ValueError(
          f"set {name!r}: the model gave non-finite features or logits (NaN/Inf) for all "
          f"{n_bad} examples, so --config.nonfinite=drop leaves nothing to score. Check the "
          f"checkpoint and the preprocessing.")
    if n_bad:
      log(f"{name}: dropped {n_bad} of {len(bad)} examples with non-finite features or logits")
      ids = np.asarray(arrays.get(columns_lib.ID, np.arange(len(bad), dtype=np.int64)))
      arrays = {k: np.asarray(v)[~bad] for k, v in arrays.items()}
      arrays[columns_lib.ID] = ids[~bad]
      dropped[name] = n_bad
    out[name] = arrays
  return out, dropped


def outputs_of(arrays: Mapping[str, np.ndarray]) -> detectors.Outputs:
  """A set's arrays as the detectors' `Outputs`."""
  labels = arrays.get("label")
  return detectors.Outputs(jnp.asarray(arrays["features"]), jnp.asarray(arrays["logits"]),
                           None if labels is None else jnp.asarray(labels))


def layer_outputs(out: detectors.Outputs, arrays: Mapping[str, np.ndarray]) -> detectors.Outputs:
  """`out` with the set's `layer/...` columns as `extras` (what layer detectors read)."""
  extras = {k: jnp.asarray(v) for k, v in arrays.items() if layer_lib.is_column(k)}
  return detectors.Outputs(out.features, out.logits, out.labels, extras)


def one_line(text: str) -> str:
  """`text` with its line breaks and runs of spaces as single spaces (a console line)."""
  return " ".join(str(text).split())


def check_finite_scores(name: str, per_set: Mapping[str, np.ndarray]) -> None:
  """ValueError naming the detector, every set with NaN or inf scores and their counts."""
  bad = {s: int(np.size(v) - np.isfinite(v).sum()) for s, v in per_set.items()}
  bad = {s: k for s, k in bad.items() if k}
  if bad:
    where = "; ".join(f"{k} of {np.size(per_set[s])} on {s!r}" for s, k in bad.items())
    raise ValueError(f"{name}: non-finite scores (NaN or inf): {where}. Its metric rows are "
                     f"left out (docs/detectors.md#input-checks).")


# A set's scores are degenerate (the detector ranks nothing) when they take a single value
# (2+ examples), or fewer than MIN_DISTINCT_SCORES values on a set of at least
# 2 * MIN_DISTINCT_SCORES examples. Values within DISTINCT_ULPS units in the last place of the
# scores' dtype (relative to the largest |score|) count as one: a constant computed in another
# summation order differs in its last bits, and rounding noise ranks nothing.
MIN_DISTINCT_SCORES = 5
DISTINCT_ULPS = 4


def distinct_values(scores: np.ndarray) -> int:
  """How many distinct values `scores` take (values within DISTINCT_ULPS ulps of their dtype,
  relative to the largest |score|, are one)."""
  a = np.asarray(scores)
  eps = float(np.finfo(a.dtype if np.issubdtype(a.dtype, np.floating) else np.float64).eps)
  v = np.sort(a.astype(np.float64).ravel())
  if not v.size:
    return 0
  tol = DISTINCT_ULPS * eps * float(np.max(np.abs(v)))
  return 1 + int(np.count_nonzero(np.diff(v) > tol))


def degenerate_scores(name: str, per_set: Mapping[str, np.ndarray]) -> Optional[str]:
  """Why detector `name`'s finite scores are degenerate (see MIN_DISTINCT_SCORES), naming
  each such set with its count of distinct values and examples; None when none is."""
  bad = []
  for s, v in per_set.items():
    n, k = int(np.size(v)), distinct_values(v)
    if n >= 2 and (k == 1 or (n >= 2 * MIN_DISTINCT_SCORES and k < MIN_DISTINCT_SCORES)):
      bad.append(f"{'a single value' if k == 1 else f'{k} distinct values'} on {s!r} "
                 f"({n} examples)")
  if not bad:
    return None
  return (f"{name}: its scores take " + "; ".join(bad) + f" (fewer than {MIN_DISTINCT_SCORES} "
          "distinct values rank nothing: its AUROC would be a tie, not a result). Its metric "
          "rows are left out (docs/detectors.md#degenerate-scores).")


def _with_stat(out: detectors.Outputs, arrays: Arrays, name: str) -> detectors.Outputs:
  """The set's features with detector `name`'s extraction-time statistic as extras["stat"]."""
  return detectors.Outputs(out.features, None, None, {"stat": jnp.asarray(arrays[columns_lib.scorer_column(columns_lib.STAT, name)])})


def fits_on_fit_set(det) -> bool:
  """Whether `det.fit` reads the fit set (its features, logits, labels or extraction-time
  statistics); detectors that do not (MSP, energy, ...) score the same on any fit set."""
  return bool(det.fit_needs) or det.fit_inputs


def degenerate_fit(dets: Mapping[str, Any], fit: Arrays) -> dict[str, str]:
  """{detector: why} for the detectors the fit set cannot serve: with fewer than 2 rows every
  detector that fits on it (statistics of one row are degenerate: a zero covariance, all-zero
  Mahalanobis scores, AUROC 50.00), and with the labelled rows all of one class every detector
  that fits per-class statistics on the labels (MDS, RMDS, cosine, ...: one class leaves
  nothing to compare; relative cosine scores 1 everywhere). The fit set's rows with label -1
  count as rows, not as a class; with no labelled row at all the detectors say so
  themselves."""
  n = len(fit[columns_lib.LOGITS])
  labels = np.asarray(fit.get(columns_lib.LABEL, np.full(n, -1)))
  classes = np.unique(labels[labels >= 0])
  out = {}
  for name, det in dets.items():
    if n < 2 and fits_on_fit_set(det):
      out[name] = (f"the fit set (id_fit) has {n} row{'s' if n != 1 else ''}; {name} fits "
                   "statistics on it and needs at least 2 (a one-row fit is degenerate)")
    elif len(classes) == 1 and "labels" in det.fit_needs:
      out[name] = (f"the fit set's (id_fit) labels hold a single class ({int(classes[0])}); "
                   f"{name} fits per-class statistics and needs at least 2 classes")
  return out


def score_sets(dets: Mapping[str, Any], sets: Mapping[str, Arrays], head: detectors.Head, *,
               log: Log = _no_log, keep_going: bool = False,
               nonfinite: str = "error", take: Optional[Callable[[str], bool]] = None,
               on_scores: Optional[Callable[[str, dict], None]] = None,
               fatal: Optional[Callable[[BaseException], bool]] = None,
               debug: Optional[Log] = None) -> tuple[dict, dict]:
  """Fits every detector on "id_fit" and scores every other set, all inside one
  `detectors.shared()` scope (work common to several detectors is done once), in scoring blocks
  sized for the largest scored set (`detectors.scoring_rows`).

  Returns ({detector: {set name: scores}}, {detector: error text}). A detector whose scores
  contain NaN or inf on any set fails (`check_finite_scores`) and gets no scores; one whose
  scores are degenerate on a set (`degenerate_scores`: a single value, or fewer than
  MIN_DISTINCT_SCORES) gets none either, its error text starting with
  `schema.DEGENERATE_PREFIX` ("degenerate: "). With `keep_going`, a detector that fails is
  logged in one line and reported in the errors instead of ending the run; its traceback goes
  to `debug` (if given), never to `log`. `nonfinite` ("error" | "drop") is passed to
  `Detector.fit`: what a fit row with a NaN or inf does. With `take`, a detector runs only if `take(name)`, called just before it,
  is true (a caller that shares the detectors with another worker claims each one there).
  `on_scores(detector, {set name: scores})` is called with each detector's finite scores as
  soon as they exist (e.g. report.HistWriter.submit). An error for which `fatal(error)` is
  true ends the run even with `keep_going` (the runner's compilation-cache faults: every
  detector would fail the same way). A detector the fit set cannot serve (`degenerate_fit`:
  one row, or one class for the detectors that fit on the labels) fails with the reason, after
  one warning in the log; the other detectors run as usual.
  """
  degenerate = degenerate_fit(dets, sets["id_fit"])
  if degenerate:
    log(f"WARNING: {next(iter(degenerate.values())).split(';')[0]}: the {len(degenerate)} "
        f"detector(s) that need more ({', '.join(degenerate)}) are marked failed; the others "
        "run as usual.")
  fit = outputs_of(sets["id_fit"])
  # one Outputs per set, so that detectors.shared() recognises the same arrays across detectors
  test_sets = {s: outputs_of(a) for s, a in sets.items() if s != "id_fit"}
  if any("layers" in det.needs for det in dets.values()):   # one Outputs each, for sharing
    fit_layers = layer_outputs(fit, sets["id_fit"])
    test_layers = {s: layer_outputs(out, sets[s]) for s, out in test_sets.items()}
  scores, errors = {}, {}
  largest = max((detectors.num_rows(out) for out in test_sets.values()), default=0)
  with detectors.shared(dets.values()), detectors.scoring_rows(largest):
    for name, det in dets.items():
      if take is not None and not take(name):
        continue
      t = time.time()
      if name in degenerate:
        if not keep_going:
          raise ValueError(f"{name}: {degenerate[name]}.")
        errors[name] = f"ValueError: {degenerate[name]}."
        log(f"  {name}: FAILED ({errors[name]})")
        continue
      try:
        if det.fit_inputs:   # fits on / scores its extraction-time stats
          state = det.fit(_with_stat(fit, sets["id_fit"], name), head, nonfinite=nonfinite)
          per_set = {s: np.asarray(det.score(state, _with_stat(out, sets[s], name)))
                     for s, out in test_sets.items()}
        elif "inputs" in det.needs:   # scored during extraction
          per_set = {s: np.asarray(sets[s][columns_lib.scorer_column(columns_lib.SCORE, name)]) for s in test_sets}
        elif "layers" in det.needs:   # reads the sets' layer/... columns
          state = det.fit(fit_layers, head, nonfinite=nonfinite)
          per_set = {s: np.asarray(det.score(state, out)) for s, out in test_layers.items()}
        else:
          state = det.fit(fit, head, nonfinite=nonfinite)
          per_set = {s: np.asarray(det.score(state, out)) for s, out in test_sets.items()}
        check_finite_scores(name, per_set)
        why = degenerate_scores(name, per_set)
        if why is not None:
          if not keep_going:
            raise ValueError(why)
          errors[name] = schema.DEGENERATE_PREFIX + why
          log(f"  {name}: DEGENERATE ({one_line(why)})")
          continue
        scores[name] = per_set
        if on_scores is not None:
          on_scores(name, per_set)
        log(f"  {name}: {time.time() - t:.2f} s")
      except Exception as e:  # one detector must not sink the run
        if not keep_going or (fatal is not None and fatal(e)):
          raise
        errors[name] = f"{type(e).__name__}: {e}"
        log(f"  {name}: FAILED ({one_line(errors[name])})")
        if debug is not None:
          debug(f"{name}: FAILED\n{traceback.format_exc()}")
  return scores, errors


def metric_rows(scores: Mapping[str, Mapping[str, np.ndarray]], sets: Mapping[str, Arrays], *,
                model: str = "", id_set: str = "", tpr: float = 0.95, per_group: bool = False,
                n_bootstrap: int = 0, seed: int = 0) -> list[dict]:
  """One row per (detector, OOD set): {model, detector, id_set, ood_set, **ood_metrics}.

  With `per_group` and group ids in the OOD set, the row also has the `*_macro` metrics and
  `per_class` (the metrics of every OOD class against all ID images).
  """
  rows = []
  for det_name, per_set in scores.items():
    id_scores = per_set["id_test"]
    for set_name, ood_scores in per_set.items():
      if not set_name.startswith("ood/"):
        continue
      groups = sets[set_name].get("group")
      use_groups = per_group and groups is not None and (np.asarray(groups) >= 0).any()
      what = f"{det_name} on {set_name} (vs id_test)"
      kw = dict(tpr=tpr, n_bootstrap=n_bootstrap, seed=seed, name=what)
      table = None
      if use_groups:   # one pass gives the macro keys and the per-class table
        # the host array, so that ids beyond int32 never wrap with x64 off
        m, table = metrics.ood_metrics_and_table(jnp.asarray(id_scores), jnp.asarray(ood_scores),
                                                 np.asarray(groups), **kw)
      else:
        m = metrics.ood_metrics(jnp.asarray(id_scores), jnp.asarray(ood_scores), **kw)
      row = {"model": model, "detector": det_name, "id_set": id_set,
             "ood_set": set_name[len("ood/"):], **m}
      if use_groups:
        row["per_class"] = table
      rows.append(row)
  return rows


def full_spectrum_rows(scores: Mapping[str, Mapping[str, np.ndarray]],
                       sets: Mapping[str, Arrays], csid_sets: Sequence[str], *,
                       id_set: str = "", **kw) -> list[dict]:
  """OpenOOD v1.5's full-spectrum ("FS") rows: `metric_rows` with the ID side made of the ID
  test set's scores followed by those of every covariate-shifted ID set in `csid_sets` (set
  names "csid/<name>", in that order), against each OOD set; `id_set` names that union in the
  rows. A detector without scores on one of them has no FS rows. `kw`: `metric_rows`'."""
  if not csid_sets:
    raise ValueError("full_spectrum_rows needs at least one covariate-shifted ID set.")
  joined = {}
  for det, per_set in scores.items():
    if all(s in per_set for s in ("id_test", *csid_sets)):
      joined[det] = {**{s: v for s, v in per_set.items() if s.startswith("ood/")},
                     "id_test": np.concatenate([np.asarray(per_set[s])
                                                for s in ("id_test", *csid_sets)])}
  return metric_rows(joined, sets, id_set=id_set, **kw)


def logit_only(det) -> bool:
  """Whether a detector is a function of the logits alone (MSP, MaxLogit, energy, GEN,
  KL-Matching, TempScale, OpenMax): it scores from the logits only (`needs` = {"logits"}) and
  fits, if at all, on the fit set's logits and labels. Such a detector is defined on any
  subset of the classes: the logits restricted to the subset are a smaller classifier's."""
  return (det.needs == frozenset({"logits"}) and not det.fit_inputs
          and det.fit_needs <= frozenset({"logits", "labels"}))


def restrict_to_classes(arrays: Mapping[str, np.ndarray], subset: np.ndarray, *,
                        keep_rows: str = "all") -> Arrays:
  """A set's arrays as the classifier restricted to `subset` (ascending label indices) sees
  them, for the logit-only detectors (`logit_only`): `logits[:, subset]`, `label` as positions
  in `subset` (-1 for a label outside it), `group`, `_id` (the rows' own numbering) and
  zero-width `features` [n, 0] (never read by those detectors; the set's features are not
  copied). keep_rows: "all", or "labelled" (only the rows whose label is in `subset`: the
  images of those classes)."""
  subset = np.asarray(subset, np.int64)
  logits = np.asarray(arrays[columns_lib.LOGITS])
  if subset.max() >= logits.shape[1]:
    raise ValueError(f"class_subset holds label {int(subset.max())} but the logits have "
                     f"{logits.shape[1]} classes.")
  n = len(logits)
  labels = np.asarray(arrays.get(columns_lib.LABEL, np.full(n, -1)), np.int64)
  pos = np.clip(np.searchsorted(subset, labels), 0, len(subset) - 1)
  new_labels = np.where((labels >= 0) & (subset[pos] == labels), pos, -1)
  keep = np.ones(n, bool) if keep_rows == "all" else new_labels >= 0
  rows = np.flatnonzero(keep)
  out = {columns_lib.LOGITS: logits[rows[:, None], subset[None, :]],   # one gather, no copy of all columns
         columns_lib.FEATURES: np.zeros((int(keep.sum()), 0), np.float32),
         "_id": np.asarray(arrays.get("_id", np.arange(n, dtype=np.int64)))[keep]}
  if columns_lib.LABEL in arrays:
    out[columns_lib.LABEL] = new_labels[keep]
  if columns_lib.GROUP in arrays:
    out[columns_lib.GROUP] = np.asarray(arrays[columns_lib.GROUP])[keep]
  return out


def restricted_full_spectrum(dets: Mapping[str, Any], sets: Mapping[str, Arrays],
                             head: Optional[detectors.Head], csid_sets: Sequence[str],
                             subset: np.ndarray, *, id_set: str = "", log: Log = _no_log,
                             **kw) -> dict:
  """Full-spectrum rows in a class subset's label space (ImageNet-R / -A's 200 classes, as
  their papers evaluate a 1000-class model; docs/metrics.md#class-subsets): the logit-only
  detectors (`logit_only`) refitted and rescored on every set's logits restricted to `subset`
  (`restrict_to_classes`): the fit set and the ID test set keep only their images of those
  classes (for a classifier of these classes the others are not ID), the covariate-shifted ID
  sets `csid_sets` and every OOD set keep all rows. The ID side is the restricted ID test set
  followed by `csid_sets`, against each OOD set (`full_spectrum_rows`); `kw`: its metric
  arguments. The head, if given, is restricted the same way (w[:, subset], b[subset]).

  Returns {id_set, n_classes, csid_sets (names without "csid/"), n_id_test (ID test images
  kept), accuracy (top-1 over the subset, pooled over the ID side), detectors (those scored),
  failed ({detector: error}), rows}; with no ID test image of the subset, rows is empty and
  `skipped` says why."""
  subset = np.sort(np.asarray(subset, np.int64))
  names = [s[len("csid/"):] if s.startswith("csid/") else s for s in csid_sets]
  out = {"id_set": id_set, "n_classes": int(len(subset)), "csid_sets": names,
         "detectors": [], "failed": {}, "rows": []}
  chosen = {n: d for n, d in dets.items() if logit_only(d)}
  fit = sets["id_fit"]
  if not any(fits_on_fit_set(d) for d in chosen.values()):   # MSP, energy, ...: not read
    fit = {k: np.asarray(v)[:2] for k, v in fit.items()}
  restricted = {"id_fit": restrict_to_classes(fit, subset, keep_rows="labelled"),
                "id_test": restrict_to_classes(sets["id_test"], subset, keep_rows="labelled")}
  restricted.update({s: restrict_to_classes(sets[s], subset) for s in csid_sets})
  restricted.update({s: restrict_to_classes(a, subset) for s, a in sets.items()
                     if s.startswith("ood/")})
  out["n_id_test"] = n_test = int(len(restricted["id_test"][columns_lib.LOGITS]))
  out["accuracy"] = pooled_accuracy([restricted[s] for s in ("id_test", *csid_sets)])
  if not n_test:
    out["skipped"] = (f"the ID test set has no labelled image of the {len(subset)} classes "
                      "(its labels are needed to keep the images of the subset)")
    log(f"Full spectrum over {len(subset)} classes ({id_set}): skipped, {out['skipped']}.")
    return out
  if not chosen:
    return out
  if head is not None and head.w is not None:
    head = detectors.Head(jnp.asarray(head.w)[:, subset], jnp.asarray(head.b)[subset],
                          head.texts)
  scores, errors = score_sets(chosen, restricted, head, keep_going=True)
  log(f"Full spectrum over {len(subset)} classes ({id_set}): {len(scores)} logit-only "
      f"detector(s) rescored" + (f", {len(errors)} failed" if errors else "") + ".")
  out["detectors"], out["failed"] = list(scores), errors
  out["rows"] = full_spectrum_rows(scores, restricted, list(csid_sets), id_set=id_set, **kw)
  return out


def full_spectrum(specs: Mapping[str, Mapping], sets: Mapping[str, Arrays],
                  scores: Mapping[str, Mapping[str, np.ndarray]], *, id_name: str = "id",
                  dets: Optional[Mapping[str, Any]] = None,
                  head: Optional[detectors.Head] = None, log: Log = _no_log,
                  **kw) -> Optional[dict]:
  """The full-spectrum part of a run's results (`report.schema.FullSpectrum`) when `specs`
  has covariate-shifted ID sets ("csid/<name>"), else None: the FS rows
  (`full_spectrum_rows`: every detector on all the logits, as OpenOOD), the top-1 accuracy
  pooled over the ID test set and every shifted set (OpenOOD's csid_acc), each shifted set's
  own accuracy (over its `class_subset`, e.g. ImageNet-R's 200 classes, where its spec names
  one) and, with `dets`, `restricted`: per class subset of the shifted sets that restrict
  their logits (`data.specs.restricts_logits`), the logit-only detectors' FS rows in that
  subset's label space (`restricted_full_spectrum`). `kw`: `metric_rows`' arguments."""
  csid = [s for s in specs if specs_lib.is_csid(s)]
  if not csid:
    return None
  id_set = " + ".join([id_name] + [specs_lib.csid_name(s) for s in csid])
  accuracy = {}
  for s in csid:
    subset = specs[s].get("class_subset")
    accuracy[specs_lib.csid_name(s)] = id_accuracy(
        sets[s], None if subset is None else class_subsets.subset_indices(subset))
  out = {"id_set": id_set, "csid_sets": [specs_lib.csid_name(s) for s in csid],
         "accuracy": pooled_accuracy([sets["id_test"]] + [sets[s] for s in csid]),
         "csid_accuracy": accuracy,
         "rows": full_spectrum_rows(scores, sets, csid, id_set=id_set, **kw)}
  groups: dict = {}   # the subset's indices -> (its name, the shifted sets restricted to it)
  for s in csid:
    if dets is not None and specs_lib.restricts_logits(specs[s]):
      subset = specs[s]["class_subset"]
      key = tuple(class_subsets.subset_indices(subset).tolist())
      name = subset if isinstance(subset, str) else f"class_subset of {specs_lib.csid_name(s)}"
      groups.setdefault(key, (name, []))[1].append(s)
  if groups:
    out["restricted"] = []
    for key, (name, members) in groups.items():
      label = (f"{id_name} + " + " + ".join(specs_lib.csid_name(s) for s in members)
               + f" [{len(key)} classes of {name}]")
      block = restricted_full_spectrum(dets, sets, head, members, np.asarray(key, np.int64),
                                       id_set=label, log=log, **kw)
      out["restricted"].append({"class_subset": name, **block})
  return out


def id_accuracy(arrays: Mapping[str, np.ndarray],
                class_subset: Optional[np.ndarray] = None) -> Optional[float]:
  """Top-1 accuracy of a set's logits; None when it has no ID labels.

  With `class_subset` (ascending label indices, `fi_jax.data.class_subsets.subset_indices`:
  ImageNet-R / -A's 200 classes) the argmax is taken over those classes' logits only, as the
  sets' papers score a 1000-class model; a label outside the subset is a ValueError."""
  if "label" not in arrays or not (arrays["label"] >= 0).any():
    return None
  logits, labels = np.asarray(arrays["logits"]), np.asarray(arrays["label"])
  if class_subset is not None:
    subset = np.asarray(class_subset, np.int64)
    if subset.max() >= logits.shape[1]:
      raise ValueError(f"class_subset holds label {int(subset.max())} but the logits have "
                       f"{logits.shape[1]} classes.")
    pos = np.clip(np.searchsorted(subset, labels), 0, len(subset) - 1)
    inside = subset[pos] == labels
    if not inside[labels >= 0].all():
      bad = np.unique(labels[(labels >= 0) & ~inside])[:10].tolist()
      raise ValueError(f"labels {bad} are not in the set's class_subset ({len(subset)} "
                       "classes): the subset does not fit this set.")
    logits, labels = logits[:, subset], np.where(labels >= 0, pos, -1)
  return float(metrics.classification_accuracy(jnp.asarray(logits), jnp.asarray(labels)))


def pooled_accuracy(sets: Sequence[Mapping[str, np.ndarray]]) -> Optional[float]:
  """Top-1 accuracy (argmax over all classes) pooled over the labelled rows of several sets:
  OpenOOD v1.5's `csid_acc` (ID test plus every covariate-shifted ID set); None without
  labels."""
  correct = total = 0
  for arrays in sets:
    labels = np.asarray(arrays.get("label", np.zeros(0, np.int64)))
    keep = labels >= 0
    if keep.any():
      pred = np.argmax(np.asarray(arrays["logits"])[keep], axis=1)
      correct += int((pred == labels[keep]).sum())
      total += int(keep.sum())
  return correct / total if total else None
