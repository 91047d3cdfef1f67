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

from fi_jax import detectors as det_lib   # aliased: `detectors` is an Evaluator argument
from fi_jax import distributed, pipeline, preprocess

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
    self.predict_fn = predict_fn
    self.batch_size = batch_size
    self.mesh = Mesh(np.asarray(devices), (distributed.DATA_AXIS,))
    self.pp = preprocess.get_preprocess_fn(pp_fn)
    self.sets = pipeline.set_specs(id_fit, id_test, ood)
    self.detectors = pipeline.build_detectors(detectors, detector_preset, detector_hparams)
    self.features_key, self.head_path = features_key, head_path
    self.tpr, self.metric_keys = tpr, tuple(metric_keys)
    self.input_std = tuple(input_std)

  def _predict(self, train_state, images):
    logits, out = self.predict_fn(train_state, {"image": images})
    return logits, out[self.features_key]

  def _head(self, train_state) -> det_lib.Head:
    node = train_state["params"]
    for part in self.head_path.split("/"):
      node = node[part]
    return det_lib.Head(node["kernel"], node["bias"])

  def run(self, train_state) -> Iterator[tuple[str, float]]:
    """Yields ("<ood set>/<detector>/<metric>", value) and ("id_accuracy", value)."""
    sets = pipeline.extract_sets(self.sets, lambda: (self._predict, train_state),
                                 self.detectors, pp_fn=self.pp, batch_size=self.batch_size,
                                 mesh=self.mesh, input_std=self.input_std)
    # train.py runs with jax_transfer_guard="disallow"; host arrays move explicitly here.
    with jax.transfer_guard("allow"):
      head = jax.device_get(self._head(train_state))
      head = det_lib.Head(jnp.asarray(head.w), jnp.asarray(head.b))
      accuracy = pipeline.id_accuracy(sets["id_test"])
      if accuracy is not None:
        yield "id_accuracy", accuracy
      # its detectors.shared() scope closes before the next yield
      scores, _ = pipeline.score_sets(self.detectors, sets, head)
      for row in pipeline.metric_rows(scores, sets, tpr=self.tpr):
        for key in self.metric_keys:
          yield f"{row['ood_set']}/{row['detector']}/{key}", float(row[key])
