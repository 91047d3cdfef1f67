"""The benchmark run: config -> model -> sets -> extract -> detectors -> metrics -> report.

`run(config, workdir)` is what `main.py` calls. The stages (sets, extraction, detectors,
metric rows) are fi_jax/pipeline.py, shared with the big_vision evaluator; this module adds
what a benchmark run needs around them:
  0. preflight (fi_jax/run/preflight.py): every set, checkpoint and tokenizer is checked in
     seconds, all problems reported at once, before anything is computed;
  1. model: `fi_jax.models.<config.model_name>` builds `Model(**config.model)`, loads
     `config.model_init` (or trains on `config.train`, the demo), and gives a predictor
     images -> (logits, penultimate features) plus the classifier `Head`;
  2. extract: every set (`id_fit`, `id_test`, each of `ood`) through the jitted, sharded
     forward, cached per set under `<workdir>/cache` (see fi_jax/extract/cache.py);
  3. detectors: each configured detector is fitted on the ID fit set and scores the ID test
     set and every OOD set;
  4. metrics and report: one row per (model, detector, ID set, OOD set) in
     results.json / results.csv / results.md, per-example scores, plots (fi_jax/report/),
     published into the workdir as one unit (`report.StagedReport`).
With every set `source="features"` (fi_jax/extract/own_features.py) steps 1-2 read arrays from files.
"""
from __future__ import annotations

import contextlib
import logging
import os
import platform
import sys
import threading
import time
from typing import Any, Callable, Optional

import jax
import numpy as np

from fi_jax import detectors, pipeline, report
from fi_jax.common import distributed
from fi_jax.data import id_labels, preprocess
from fi_jax.data import loader as data
from fi_jax.data import specs as specs_lib
from fi_jax.extract import cache
from fi_jax.extract import own_features as features
from fi_jax.metrics import multilabel
from fi_jax.report import schema
from fi_jax.run import compile_ahead as ahead_lib
from fi_jax.run import jax_cache, preflight, validate, workdirs
from fi_jax.run.model import (
  LazyModel,
  cached_head,
  checkpoint_meta,
  log_on_process_0,
  model_key,
  model_label,
  to_dict,
)

Log = Callable[[str], None]
# the tracebacks of the detectors that failed (appended per run; the console has one line each)
TRACEBACKS_FILE = "tracebacks.log"


class _OncePerRun(logging.Filter):
  """Lets through each (level, text) of a log record once: a warning repeated per set, per
  batch or per detector call (KNN's `k > bank size` on every scored set) is printed once."""

  def __init__(self):
    super().__init__()
    self._seen: set = set()
    self._lock = threading.Lock()

  def filter(self, record: logging.LogRecord) -> bool:
    if getattr(record, "_fi_jax_passed", None) is self:   # let through at an earlier filter
      return True
    key = (record.levelno, record.getMessage())
    with self._lock:
      if key in self._seen:
        return False
      self._seen.add(key)
    record._fi_jax_passed = self
    return True


@contextlib.contextmanager
def each_message_once():
  """While the run lasts, every log record (absl's and the standard library's: the root and
  absl loggers and their handlers, which every propagated record reaches) is emitted once."""
  once = _OncePerRun()
  root, absl_logger = logging.getLogger(), logging.getLogger("absl")
  targets = list(dict.fromkeys([root, absl_logger, *root.handlers, *absl_logger.handlers]))
  for t in targets:
    t.addFilter(once)
  try:
    yield
  finally:
    for t in targets:
      t.removeFilter(once)


def traceback_writer(workdir: str, run_id: str) -> Log:
  """debug(text) for `pipeline.score_sets`: appends text to <workdir>/tracebacks.log under a
  header naming the run (process 0 only)."""
  path = os.path.join(workdir, TRACEBACKS_FILE)

  def write(text: str) -> None:
    if jax.process_index() != 0:
      return
    with open(path, "a") as f:
      f.write(f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} run {run_id}: {text.rstrip()}\n")
  return write



# ----------------------------------------------------------------------------- sets

def config_specs(config) -> dict[str, dict]:
  """`specs.set_specs` of `config.id_fit`, `config.id_test`, `config.ood` (in
  `config.ood_order`) and `config.csid` (in `config.csid_order`)."""
  return specs_lib.set_specs(to_dict(config.id_fit), to_dict(config.id_test),
                             to_dict(config.ood), tuple(config.get("ood_order") or ()),
                             csid=to_dict(config.get("csid") or {}),
                             csid_order=tuple(config.get("csid_order") or ()))


def set_path(config, workdir: str, name: str, spec: dict, columns) -> str:
  """The cache entry of a set's arrays (with several processes: the folder of their parts);
  `columns`: pipeline.column_names of the set. `restrict_logits` (what the metrics do with
  the logits, not what is extracted) is not part of the key."""
  spec = {k: v for k, v in spec.items() if k != "restrict_logits"}
  return (cache.set_dir(os.path.join(workdir, "cache"), model_key(config), name) + "-"
          + cache.key_of(spec, sorted(columns)))


def extract_cached(config, model: LazyModel, workdir: str, log: Log, dets: dict,
                 ahead: Optional[ahead_lib.CompileAhead] = None,
                 ) -> dict[str, dict[str, np.ndarray]]:
  """Features/logits of every set, from the cache or by running the model (then cached). A set's
  cache key includes its column names (input scorers, layer reducers: pipeline.column_names),
  so a set extracted with other columns is another entry.

  With several processes each process gets, loads and caches only its own rows of each set
  (`cache.part`); `pipeline.collect_sets` brings them together on process 0.

  With `ahead` (one process), the forwards, metrics and detectors compile in its thread while
  the model trains (fi_jax.run.compile_ahead); the caller's detector stage claims the detectors from it
  (`ahead.claim`) and calls `ahead.finish()` after."""
  path = lambda name, spec, columns: set_path(config, workdir, name, spec, columns)
  own = lambda p: cache.part(p, jax.process_index(), jax.process_count())

  def load(name, spec, columns):
    p = path(name, spec, columns)
    cached = cache.load(own(p), log=log) if config.get("cache", True) else None
    if cached is not None:
      mine = " (this process's rows)" if jax.process_count() > 1 else ""
      log(f"{name}: {len(cached['logits'])} examples{mine} from cache {p}")
    return cached

  def save(name, spec, columns, arrays, seconds):
    cache.save(own(path(name, spec, columns)), arrays,   # each process its own rows
               {"set": name, "spec": spec, "seconds": seconds,
                "process": [jax.process_index(), jax.process_count()]})

  def shard_root(name, spec, columns, batch_size, shard_size):
    # shard boundaries are runs of global batches: they move with these
    return (path(name, spec, columns) + ".shards-"
            + cache.key_of(batch_size, shard_size, jax.process_count()))

  specs, forwards = config_specs(config), {}
  common = dict(pp_fn=preprocess.get_preprocess_fn(config.pp), batch_size=config.batch_size,
                mesh=distributed.data_mesh(),
                input_std=config.get("input_std", (0.5, 0.5, 0.5)))
  if ahead is not None and jax.process_count() == 1:
    model.on_train_start = lambda predict, params, head: ahead.start(
        specs, dets, predict, params, head, forwards, hold=True, metric_kw=metric_kwargs(config),
        nonfinite=config.get("nonfinite", "error"), **common)
  return pipeline.extract_sets(
      specs, lambda: model.get()[:2], dets, log=log, load=load, save=save,
      shard_size=config.get("cache_shard_size", 0),
      shard_root=shard_root if config.get("cache", True) else None, forwards=forwards, **common)


def metric_kwargs(config) -> dict[str, Any]:
  """`pipeline.metric_rows` keyword arguments from `config.metrics` (tpr, per_group,
  n_bootstrap) and the seed."""
  mcfg = to_dict(config.get("metrics", {}))
  return dict(tpr=mcfg.get("tpr", 0.95), per_group=mcfg.get("per_group", True),
              n_bootstrap=mcfg.get("n_bootstrap", 0), seed=config.seed)


# ----------------------------------------------------------------------------- detectors

def config_detectors(config) -> dict[str, Any]:
  """{name: detector} of `config.detectors` with the preset and per-detector hparams."""
  return detectors.build_suite(config.detectors, config.get("detector_preset") or None,
                                  to_dict(config.get("detector_hparams", {})))


# ----------------------------------------------------------------------------- entry point

def feature_sets(config, specs: dict[str, dict], dets: dict):
  """(sets, head, model_meta) of a config whose sets are all `source="features"` (arrays
  extracted elsewhere, see fi_jax/extract/own_features.py): no model, no extraction, no cache."""
  scorers = [n for n, d in dets.items() if "inputs" in d.needs]
  if scorers:
    raise ValueError(f"Detector(s) {scorers} score the images themselves and cannot run on "
                     "features read from files; drop them from config.detectors.")
  head = features.load_head(config.head) if config.get("head") else None
  sets = features.load_sets(specs, head)
  return sets, head, {"model_name": config.get("model_name", "features"),
                      "source": "features", "head": config.get("head") or None}


def _kept_sets(workdir: str) -> int:
  """How many finished sets the feature cache holds (for the Ctrl-C line)."""
  root = os.path.join(workdir, "cache")
  return sum("meta.json" in files for _, _, files in os.walk(root))


def report_extras(specs: dict[str, dict], sets: dict) -> dict:
  """meta additions for the report: OOD class names of every OOD set with groups, the ID
  class each OOD class is most often predicted as (argmax of the logits), and the examples a
  set's `drop_overlaps` left out."""
  id_names = data.class_names(specs["id_test"])
  names, predicted, dropped = {}, {}, {}
  for set_name, spec in specs.items():
    if not set_name.startswith("ood/"):
      continue
    ood = set_name[len("ood/"):]
    if spec.get("drop_overlaps"):
      dropped[ood] = data.dropped_overlaps(spec)
    groups = sets[set_name].get("group")
    if groups is None or not (np.asarray(groups) >= 0).any():
      continue
    gn = data.group_names(spec)
    if gn:
      names[ood] = gn
    logits = sets[set_name]["logits"]
    cls = id_names
    if cls is None or len(cls) != logits.shape[1]:
      cls = data.default_class_names(logits.shape[1])
    predicted[ood] = report.predicted_as(logits, groups, cls)
  extras = {"group_names": names, "predicted_as": predicted}
  if dropped:   # what each set's drop_overlaps left out (the overlap report's file names)
    extras["dropped_overlaps"] = dropped
  return extras



def _checks(config, workdir: str, log: Log) -> tuple[dict, dict]:
  """(detectors, set specs) once every value (`validate`), detector and set, file and
  checkpoint (`preflight`) passed; logs what preflight notes (a per-class fit set smaller
  than asked, with its numbers)."""
  validate.validate_config(config, workdir)   # every bad value fails here, before any work
  if config.get("x64", True):
    jax.config.update("jax_enable_x64", True)
  jax_cache.use(config.get("compilation_cache_dir", None))
  dets = config_detectors(config)   # fails fast on unknown detector names / hparams
  specs = config_specs(config)
  t = time.time()
  preflight.run(config, specs)     # every set, file and checkpoint: all problems at once
  log(f"Preflight: {len(specs)} sets and the model's files are in place ({time.time() - t:.1f} s).")
  for note in preflight.notes(specs):
    log(note)
  return dets, specs


def run(config, workdir: str, log: Log = log_on_process_0, *, verbose: bool = False) -> dict:
  """Runs the whole benchmark described by `config`; writes and returns the results. A run
  that fails its checks (the config's values, preflight) leaves none of the workdir's folders
  it made behind (a workdir that existed before stays as it was).

  A detector that fails is one line in `log`; its traceback goes to <workdir>/tracebacks.log
  (`TRACEBACKS_FILE`) and, with `verbose`, to `log` too. Each log record (a warning the same
  detector gives on every set, ...) is emitted once per run (`each_message_once`).

  An error that a program loaded from JAX's persistent compilation cache gives when it is not
  the program its key names (fi_jax/run/jax_cache.py) becomes one `CompilationCacheError`
  naming the cache folder and saying to delete it."""
  try:
    with each_message_once():
      return _run(config, workdir, log, time.time(), verbose)
  except Exception as e:
    if jax_cache.points_to_cache(e):
      raise jax_cache.error(e, jax.config.jax_compilation_cache_dir) from None
    raise


def _run(config, workdir: str, log: Log, t_start: float, verbose: bool = False) -> dict:
  """`run`'s body."""
  timings: dict[str, float] = {}
  created = workdirs.missing(workdir)   # what validate's writability test makes
  try:
    dets, specs = _checks(config, workdir, log)
  except BaseException:
    workdirs.remove_empty(created)   # a failed check leaves no workdir behind
    raise
  os.makedirs(workdir, exist_ok=True)
  random_init = bool(config.get("random_init", False))
  if random_init and not config.get("model_init"):
    log("WARNING: random_init=True: the model has random weights (not a released model).")

  # its thread runs while the model trains and into the detector stage (fi_jax.run.compile_ahead); if no
  # model trains it never starts, and its claim just says yes
  ahead = ahead_lib.CompileAhead()
  try:
    from_features = [features.is_features_spec(s) for s in specs.values()]
    t = time.time()
    on_0_only = False   # whether only process 0 holds every set (and scores them)
    if all(from_features):
      sets, head, model_meta = feature_sets(config, specs, dets)
    elif any(from_features):
      raise ValueError("Either every set or none is source='features' (a model cannot extract "
                       "the others while some come from files).")
    else:
      model = LazyModel(config, log, workdir)
      try:
        sets = extract_cached(config, model, workdir, log, dets,
                            ahead if config.get("compile_ahead", True) else None)
      except KeyboardInterrupt:
        log(f"\nInterrupted: {_kept_sets(workdir)} finished set(s) kept in "
            f"{os.path.join(workdir, 'cache')}; rerun the same command to resume.")
        raise
      head = cached_head(config, model, workdir, log)
      model_meta = model.get()[3] if model._built else {
          "model_name": config.model_name, "model": to_dict(config.model), "from_cache": True}
      # several processes: process 0 reads every process's rows from the cache; the others
      # drop theirs and wait for its results
      sets = pipeline.collect_sets(sets, part_reader(config, workdir, specs, dets, log))
      on_0_only = jax.process_count() > 1
    timings["extract"] = time.time() - t   # includes building the model, if needed
    if sets is None:
      results = distributed.broadcast_json(None)
      if "error" in results:
        raise RuntimeError(f"process 0 failed, so this process stops too: {results['error']}")
      return results
    try:
      results = _score_and_report(config, workdir, log, dets, specs, sets, head, model_meta,
                                  random_init, timings, t_start, ahead, verbose)
    except Exception as e:
      if on_0_only:   # the other processes are waiting for the results
        distributed.broadcast_json({"error": f"{type(e).__name__}: {e}"})
      raise
    if on_0_only:
      results = distributed.broadcast_json(results)
    return results
  finally:
    ahead.finish(wait=sys.exc_info()[0] is None)   # an interrupt does not wait for it


def part_reader(config, workdir: str, specs: dict, dets: dict, log: Log):
  """read(set name, process index) -> that process's cached rows of the set (or None)."""
  def read(name, index):
    p = cache.part(set_path(config, workdir, name, specs[name], pipeline.set_columns(dets, name)),
                   index, jax.process_count())
    return cache.load(p, log=log)
  return read


def _score_and_report(config, workdir: str, log: Log, dets: dict, specs: dict, sets: dict,
                      head, model_meta: dict, random_init: bool, timings: dict,
                      t_start: float, ahead: ahead_lib.CompileAhead,
                      verbose: bool = False) -> dict:
  """Detectors, metric rows and the report files of every set's arrays (on one process);
  `ahead`'s thread, if it runs, shares the detectors (`CompileAhead.claim`).

  Process 0 writes the report into a staging folder (`report.StagedReport`) and publishes it
  as one unit at the end: a run that is killed, or whose writing fails, leaves the previous
  report as it was. The per-example scores are written first: if the metrics then fail, they
  are published alone (marked incomplete) before the error is raised. A failed detector's
  traceback goes to <workdir>/tracebacks.log (and `log` with `verbose`)."""
  sets, dropped = pipeline.drop_nonfinite(sets, config.get("nonfinite", "error"), log)
  sets, id_label_meta = reannotated_id(config, specs, sets, log)
  run_id = report.new_run_id()
  to_file = traceback_writer(workdir, run_id)
  debug = (lambda text: (to_file(text), log(text))) if verbose else to_file
  rcfg = to_dict(config.get("report", {}))
  stage = report.StagedReport(workdir, run_id) if jax.process_index() == 0 else None
  # each detector's histogram is drawn (into the staging folder) in the background while the
  # next detectors run
  ood_names = [s[len("ood/"):] for s in specs if s.startswith("ood/")]
  hists = (report.HistWriter(stage.path, ood_names, model=model_label(config),
                             id_set=config.get("id_name", "id"))
           if stage is not None and rcfg.get("plots", True) else None)
  try:
    t = time.time()
    log(f"Detectors ({len(dets)}):")
    try:
      scores, errors = pipeline.score_sets(dets, sets, head, log=log, keep_going=True,
                                           nonfinite=config.get("nonfinite", "error"),
                                           take=ahead.claim, fatal=jax_cache.points_to_cache,
                                           on_scores=hists.submit if hists else None,
                                           debug=debug)
    finally:
      ahead.finish()
    timings["detectors"] = time.time() - t
    t = time.time()
    if stage is not None:   # first: a failure in the metrics publishes them alone
      report.write_scores(stage.path, scores, sets, run_id=run_id)
    scores_seconds = time.time() - t

    try:
      results = _results(config, workdir, log, dets, specs, sets, scores, errors, dropped,
                         model_meta, random_init, timings, run_id, head=head)
      results["meta"].update(id_label_meta)
    except BaseException as e:
      if stage is not None:
        _publish_scores_alone(stage, hists, e, workdir, log)
      raise
    if stage is None:
      timings["total"] = time.time() - t_start
      results["meta"]["timings_s"] = {k: round(v, 3) for k, v in timings.items()}
      return results

    t = time.time()
    if rcfg.get("plots", True) and results["rows"]:
      try:
        report.write_plots(stage.path, results, scores, top=int(rcfg.get("plot_top", 5)),
                           hists=hists)
      except Exception as e:  # plots must not cost the results
        results["meta"]["plot_error"] = f"{type(e).__name__}: {e}"
        log(f"Plots failed ({results['meta']['plot_error']}); the results files are written "
            f"without them (or run with --config.report.plots=False).")
    timings["report"] = time.time() - t + scores_seconds
    timings["total"] = time.time() - t_start
    results["meta"]["timings_s"] = {k: round(v, 3) for k, v in timings.items()}
    report.write(results, stage.path)
    if hists is not None:
      hists.close()   # nothing draws into the folder once it is published
    stage.publish()
  except BaseException as e:
    if hists is not None:
      hists.close()
    if stage is not None and not stage.published:
      stage.discard()
      log(f"The report was not written ({type(e).__name__}); {workdir}'s previous report, if "
          "any, is unchanged.")
    raise
  log(report.table(results))
  log(f"Wrote {os.path.join(workdir, 'results.md')} (+ .json, .csv, scores/, plots/, "
      f"per_class/) in {timings['total']:.1f} s.")
  return results


def _results(config, workdir: str, log: Log, dets: dict, specs: dict, sets: dict, scores: dict,
             errors: dict, dropped: dict, model_meta: dict, random_init: bool, timings: dict,
             run_id: str, head=None) -> dict:
  """The run's results (`schema.make`): the metric rows of `scores` and the meta."""
  t = time.time()
  rows = pipeline.metric_rows(scores, sets, model=model_label(config),
                              id_set=config.get("id_name", "id"), **metric_kwargs(config))
  timings["metrics"] = time.time() - t
  log(f"Metrics: {len(rows)} rows ({len(scores)} detectors x "
      f"{sum(s.startswith('ood/') for s in sets)} OOD sets) in {timings['metrics']:.1f} s.")

  meta = {
      "run_id": run_id,
      "config": to_dict(config), "workdir": os.path.abspath(workdir),
      "versions": report.versions(), "platform": platform.platform(),
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
      "devices": [str(d) for d in jax.devices()], "process_count": jax.process_count(),
      "set_sizes": {k: int(len(v["logits"])) for k, v in sets.items()},
      "ood_sets": [s[len("ood/"):] for s in specs if s.startswith("ood/")],
      "random_init": random_init and not config.get("model_init"),
      "model_label": model_label(config), "checkpoint": checkpoint_meta(config),
      "timings_s": {},
      "detector_errors": errors, "nonfinite_dropped": dropped, **model_meta,
  }
  results = schema.make(meta, pipeline.id_accuracy(sets["id_test"]), rows,
                        [schema.failure(n, errors[n]) for n in dets if n in errors],
                        full_spectrum(config, specs, sets, scores, dets, head, log))
  if jax.process_index() == 0:
    results["meta"].update(report_extras(specs, sets))
  return results


def reannotated_id(config, specs: dict, sets: dict, log: Log) -> tuple[dict, dict]:
  """`config.id_labels` on the ID test set: with `drop_ambiguous` the rows ReImageNet marks
  ambiguous are dropped (before the detectors; `_id` keeps the examples' numbering), then the
  multi-label accuracy against ReImageNet's label sets (`reimagenet`: the path of the user's
  reannotation.jsonl) and against ReaL (`real`: TFDS imagenet2012_real in the ID test set's
  data_dir). Returns (sets, meta additions): `id_label_accuracy` {source: {accuracy, n}} and
  `reannotation_dropped` (rows dropped)."""
  cfg = to_dict(config.get("id_labels") or {})
  path, use_real, drop = cfg.get("reimagenet", ""), cfg.get("real", False), cfg.get("drop_ambiguous", False)
  if drop and not path:
    raise ValueError("config.id_labels.drop_ambiguous needs config.id_labels.reimagenet (the "
                     "path of ReImageNet's reannotation.jsonl).")
  if not (path or use_real):
    return sets, {}
  spec, arrays = specs["id_test"], sets["id_test"]
  names = id_labels.rows_file_names(id_labels.set_file_names(spec), arrays)
  meta: dict = {"id_label_accuracy": {}}
  if path:
    label_sets, ambiguous = id_labels.reimagenet(
        path, names, label_field=cfg.get("label_field", ""),
        ambiguous_field=cfg.get("ambiguous_field", ""))
    if drop:
      keep = ~ambiguous
      ids = np.asarray(arrays.get("_id", np.arange(len(keep), dtype=np.int64)))
      arrays = {k: np.asarray(v)[keep] for k, v in arrays.items()}
      arrays["_id"] = ids[keep]
      sets = {**sets, "id_test": arrays}
      names = [n for n, k in zip(names, keep) if k]
      label_sets = [s for s, k in zip(label_sets, keep) if k]
      meta["reannotation_dropped"] = int((~keep).sum())
      log(f"id_test: dropped {meta['reannotation_dropped']} image(s) ReImageNet marks ambiguous")
    acc, n = multilabel.multilabel_accuracy(arrays["logits"], label_sets)
    meta["id_label_accuracy"]["reimagenet"] = {"accuracy": acc, "n": n}
  if use_real:
    acc, n = multilabel.multilabel_accuracy(
        arrays["logits"], id_labels.real(spec.get("data_dir"), names))
    meta["id_label_accuracy"]["real"] = {"accuracy": acc, "n": n}
  for source, v in meta["id_label_accuracy"].items():
    log(f"ID accuracy ({source} labels): "
        + ("-" if v["accuracy"] is None else f"{100 * v['accuracy']:.2f}%") + f" on {v['n']} images")
  return sets, meta


def full_spectrum(config, specs: dict, sets: dict, scores: dict, dets: Optional[dict] = None,
                  head=None, log: Log = print) -> Optional[dict]:
  """The results' `full_spectrum` part (schema.FullSpectrum) when the config has
  covariate-shifted ID sets (`config.csid`), else None: `pipeline.full_spectrum` with the
  config's ID set name, model label and metric settings (with `dets`, also the restricted
  rows of the shifted sets with a class subset)."""
  return pipeline.full_spectrum(specs, sets, scores, id_name=config.get("id_name", "id"),
                                dets=dets, head=head, log=log, model=model_label(config),
                                **metric_kwargs(config))


def _publish_scores_alone(stage, hists, error: BaseException, workdir: str, log: Log) -> None:
  """Publishes the staged scores (and the histograms drawn so far) without results, marked
  incomplete with `error`; if even that fails, the previous report stays."""
  if hists is not None:
    hists.close()
  reason = f"{type(error).__name__}: {error}"
  try:
    stage.publish(incomplete=reason)
  except Exception as e:
    log(f"The run stopped before its results ({reason}) and its scores could not be published "
        f"either ({type(e).__name__}: {e}).")
    return
  log(f"The run stopped before its results ({reason}); its per-example scores are published "
      f"alone in {os.path.join(workdir, 'scores')} (marked by "
      f"{os.path.join(workdir, report.REPORT_LINK, report.INCOMPLETE)}).")
