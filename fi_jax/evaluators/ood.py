"""A big_vision-style evaluator: OOD detection metrics of the model being trained.

Compatible by design with big_vision's jit evaluator API (`API = "jit"`,
`Evaluator(predict_fn, *, batch_size, devices, **kw)`, `run(train_state)` yielding
`(name, value)`), without importing big_vision. To use it from big_vision's train.py, add a
one-line module inside big_vision's evaluators package, e.g.
`big_vision/evaluators/fi_ood.py`: ``from fi_jax.evaluators.ood import *``, and a config entry

    config.evals.ood = dict(type="fi_ood", pred="predict", log_percent=0.1,
                            pp_fn="decode|resize_small(256)|central_crop(224)|value_range(-1, 1)",
                            id_fit=dict(source="tfds", name="imagenet2012", split="train[:10000]"),
                            id_test=dict(source="tfds", name="fi_imagenet_1k", split="id"),
                            ood=dict(fi_imagenet_1k=dict(source="tfds", name="fi_imagenet_1k",
                                                         split="ood", label_key=None)),
                            detectors=("msp", "energy", "mds"))

`predict_fn(train_state, batch)` is big_vision's: it returns `(logits, out)` for
`batch["image"]`; the features are `out[features_key]` and the detectors' `Head` is read from
`train_state["params"]` at `head_path`.
"""
from __future__ import annotations

from typing import Callable, Iterator, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from fi_jax import data as data_lib
from fi_jax import distributed, extract, metrics, preprocess

API = "jit"


class Evaluator:
  """OOD metrics (per detector and OOD set) and the ID accuracy of the current train_state."""

  def __init__(self, predict_fn: Callable, *, batch_size: int, devices: Sequence,
               pp_fn: str, id_fit: dict, id_test: dict, ood: dict,
               detectors: Sequence[str] = ("msp", "maxlogit", "energy"),
               detector_preset: Optional[str] = "ninco", detector_hparams: Optional[dict] = None,
               features_key: str = "pre_logits", head_path: str = "head", tpr: float = 0.95,
               input_std: Sequence[float] = (0.5, 0.5, 0.5),
               metric_keys: Sequence[str] = ("auroc", "fpr95", "fpr95_ood_positive")):
    from fi_jax import detectors as det_lib  # pylint: disable=g-import-not-at-top
    self.predict_fn = predict_fn
    self.batch_size = batch_size
    self.mesh = Mesh(np.asarray(devices), (distributed.DATA_AXIS,))
    self.pp = preprocess.get_preprocess_fn(pp_fn)
    self.sets = {"id_fit": dict(id_fit), "id_test": dict(id_test),
                 **{f"ood/{k}": dict(v) for k, v in ood.items()}}
    hp = dict(detector_hparams or {})
    self.detectors = {n: det_lib.build(n, preset=detector_preset or None, **hp.get(n, {}))
                      for n in detectors}
    self.features_key, self.head_path = features_key, head_path
    self.tpr, self.metric_keys = tpr, tuple(metric_keys)
    self.input_std = tuple(input_std)

  def _predict(self, train_state, images):
    logits, out = self.predict_fn(train_state, {"image": images})
    return logits, out[self.features_key]

  def _head(self, train_state):
    from fi_jax import detectors as det_lib  # pylint: disable=g-import-not-at-top
    node = train_state["params"]
    for part in self.head_path.split("/"):
      node = node[part]
    return det_lib.Head(node["kernel"], node["bias"])

  def _extract(self, train_state) -> dict[str, dict[str, np.ndarray]]:
    out = {}
    for name, spec in self.sets.items():
      scorers = {}
      if name != "id_fit":
        for dname, det in self.detectors.items():
          if "inputs" in det.needs:
            scorers[dname] = (lambda ts, x, det=det: det.score_inputs(
                {}, lambda y: self._predict(ts, y)[0], x, input_std=self.input_std))
      it, steps, _ = data_lib.batches(spec, self.pp, self.batch_size,
                                      process_index=jax.process_index(),
                                      process_count=jax.process_count())
      out[name] = extract.extract(self._predict, train_state, it, self.mesh,
                                  input_scorers=scorers, steps=steps)
    return out

  def run(self, train_state) -> Iterator[tuple[str, float]]:
    """Yields ("<ood set>/<detector>/<metric>", value) and ("id_accuracy", value)."""
    from fi_jax import detectors as det_lib  # pylint: disable=g-import-not-at-top
    sets = self._extract(train_state)
    # train.py runs with jax_transfer_guard="disallow"; host arrays move explicitly here.
    with jax.transfer_guard("allow"):
      head = jax.device_get(self._head(train_state))
      head = det_lib.Head(jnp.asarray(head.w), jnp.asarray(head.b))

      def outputs(a):
        return det_lib.Outputs(jnp.asarray(a["features"]), jnp.asarray(a["logits"]),
                               jnp.asarray(a["label"]))
      test = sets["id_test"]
      labels = test["label"]
      if (labels >= 0).any():
        yield "id_accuracy", float(metrics.classification_accuracy(
            jnp.asarray(test["logits"]), jnp.asarray(labels)))
      fit = outputs(sets["id_fit"])
      test_sets = {k: outputs(v) for k, v in sets.items() if k != "id_fit"}
      all_scores = {}
      with det_lib.shared(self.detectors.values()):   # closed before the first yield
        for dname, det in self.detectors.items():
          if "inputs" in det.needs:
            all_scores[dname] = {k: sets[k][f"score/{dname}"] for k in test_sets}
          else:
            state = det.fit(fit, head)
            all_scores[dname] = {k: np.asarray(det.score(state, out))
                                 for k, out in test_sets.items()}
      for dname, scored in all_scores.items():
        for set_name, s in scored.items():
          if not set_name.startswith("ood/"):
            continue
          m = metrics.ood_metrics(jnp.asarray(scored["id_test"]), jnp.asarray(s), tpr=self.tpr)
          for key in self.metric_keys:
            yield f"{set_name[4:]}/{dname}/{key}", float(m[key])
