"""The pipeline core: sets -> extract -> detectors -> metric rows.

Used by `fi_jax.run` (the benchmark: configs, model building, feature cache, report files) and
by `fi_jax.evaluators.ood` (big_vision's evaluator API, on the model being trained). Stages
talk through plain arrays; a set's arrays are {features, logits, label, group, score/<name>}
as `fi_jax.extract.extract` returns them. Set names are "id_fit" (what detectors fit on),
"id_test" and "ood/<name>".
"""
from __future__ import annotations

import time
import traceback
from typing import Any, Callable, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fi_jax import data, detectors, extract, metrics, progress

Log = Callable[[str], None]
Arrays = dict[str, np.ndarray]
# load(set name, spec, input scorer names) -> the set's arrays, or None to extract it
LoadFn = Callable[[str, dict, list], Optional[Arrays]]
# save(set name, spec, input scorer names, arrays, seconds the extraction took)
SaveFn = Callable[[str, dict, list, Arrays, float], None]


def _no_log(msg: str) -> None:
  del msg


def set_specs(id_fit: Mapping, id_test: Mapping, ood: Mapping[str, Mapping]) -> dict[str, dict]:
  """{set name: spec} for the ID fit set, the ID test set and every OOD set."""
  return {"id_fit": dict(id_fit), "id_test": dict(id_test),
          **{f"ood/{name}": dict(spec) for name, spec in ood.items()}}


def build_detectors(names: Sequence[str], preset: Optional[str] = None,
                    hparams: Optional[Mapping[str, dict]] = None) -> dict[str, Any]:
  """{name: detector}; fails fast on unknown names or hyperparameters."""
  hparams = dict(hparams or {})
  return {name: detectors.build(name, preset=preset or None, **hparams.get(name, {}))
          for name in names}


def input_scorer_names(dets: Mapping[str, Any], set_name: str) -> list[str]:
  """The detectors that score the images themselves during extraction (ODIN); none on the
  fit set, which no detector scores."""
  if set_name == "id_fit":
    return []
  return [name for name, det in dets.items() if "inputs" in det.needs]


def input_scorers(dets: Mapping[str, Any], names: Sequence[str], predict: extract.PredictFn,
                  input_std: Sequence[float]) -> dict[str, extract.InputScorer]:
  """{name: scorer(params, images)} for `fi_jax.extract.extract`.

  `input_std` is the per-channel std of the model's input in [0, 1] pixel units (0.5 for
  value_range(-1, 1)), so that ODIN's epsilon is a pixel-unit step.
  """
  input_std = tuple(input_std)
  return {n: (lambda p, images, det=dets[n]: det.score_inputs(
      {}, lambda x: predict(p, x)[0], images, input_std=input_std)) for n in names}


def extract_sets(specs: Mapping[str, dict], model: Callable[[], tuple[extract.PredictFn, Any]],
                 dets: Mapping[str, Any], *, pp_fn: Callable, batch_size: int, mesh,
                 input_std: Sequence[float], log: Log = _no_log,
                 load: Optional[LoadFn] = None, save: Optional[SaveFn] = None,
                 ) -> dict[str, Arrays]:
  """The arrays of every set: from `load` when it has them, else through the model.

  `model()` returns (predict_fn, params) and is called only when a set is extracted (so a
  caller can build the model lazily); `save` receives every extracted set.
  """
  out = {}
  for name, spec in specs.items():
    names = input_scorer_names(dets, name)
    arrays = load(name, spec, names) if load else None
    if arrays is None:
      predict, params = model()
      scorers = input_scorers(dets, names, predict, input_std)
      t = time.time()
      it, steps, info = data.batches(spec, pp_fn, batch_size,
                                     process_index=jax.process_index(),
                                     process_count=jax.process_count())
      log(f"{name}: {info.num_examples} examples, {steps} batches of {batch_size}")
      it = progress.batches(it, info.num_examples_per_process[jax.process_index()], name)
      arrays = extract.extract(predict, params, it, mesh, input_scorers=scorers, steps=steps,
                               log=log)
      if save:
        save(name, spec, names, arrays, time.time() - t)
      log(f"{name}: done in {time.time() - t:.1f} s")
    out[name] = arrays
  return out


def outputs_of(arrays: Mapping[str, np.ndarray]) -> detectors.Outputs:
  """A set's arrays as the detectors' `Outputs`."""
  labels = arrays.get("label")
  return detectors.Outputs(jnp.asarray(arrays["features"]), jnp.asarray(arrays["logits"]),
                           None if labels is None else jnp.asarray(labels))


def score_sets(dets: Mapping[str, Any], sets: Mapping[str, Arrays], head: detectors.Head, *,
               log: Log = _no_log, keep_going: bool = False) -> tuple[dict, dict]:
  """Fits every detector on "id_fit" and scores every other set, all inside one
  `detectors.shared()` scope (work common to several detectors is done once).

  Returns ({detector: {set name: scores}}, {detector: error text}). With `keep_going`, a
  detector that raises is logged and reported in the errors instead of ending the run.
  """
  fit = outputs_of(sets["id_fit"])
  # one Outputs per set, so that detectors.shared() recognises the same arrays across detectors
  test_sets = {s: outputs_of(a) for s, a in sets.items() if s != "id_fit"}
  scores, errors = {}, {}
  with detectors.shared(dets.values()):
    for name, det in dets.items():
      t = time.time()
      try:
        if "inputs" in det.needs:   # scored during extraction
          scores[name] = {s: np.asarray(sets[s][f"score/{name}"]) for s in test_sets}
        else:
          state = det.fit(fit, head)
          scores[name] = {s: np.asarray(det.score(state, out)) for s, out in test_sets.items()}
        log(f"  {name}: {time.time() - t:.2f} s")
      except Exception as e:  # pylint: disable=broad-except  (one detector must not sink the run)
        if not keep_going:
          raise
        errors[name] = f"{type(e).__name__}: {e}"
        log(f"  {name}: FAILED ({errors[name]})\n{traceback.format_exc(limit=3)}")
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
      use_groups = per_group and groups is not None and (groups >= 0).any()
      m = metrics.ood_metrics(jnp.asarray(id_scores), jnp.asarray(ood_scores), tpr=tpr,
                              ood_groups=jnp.asarray(groups) if use_groups else None,
                              n_bootstrap=n_bootstrap, seed=seed)
      row = {"model": model, "detector": det_name, "id_set": id_set,
             "ood_set": set_name[len("ood/"):], **m}
      if use_groups:
        row["per_class"] = metrics.per_group_metrics(
            jnp.asarray(id_scores), jnp.asarray(ood_scores), jnp.asarray(groups), tpr=tpr)
      rows.append(row)
  return rows


def id_accuracy(arrays: Mapping[str, np.ndarray]) -> Optional[float]:
  """Top-1 accuracy of a set's logits; None when it has no ID labels."""
  if "label" not in arrays or not (arrays["label"] >= 0).any():
    return None
  return float(metrics.classification_accuracy(jnp.asarray(arrays["logits"]),
                                               jnp.asarray(arrays["label"])))
