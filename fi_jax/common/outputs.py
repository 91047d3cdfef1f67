"""What a model hands the detectors: `Outputs` (features, logits, labels) and `Head` (its last
linear layer). A module of its own so that models build heads without importing the detectors."""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Outputs:
  """What a model produced for a set: penultimate features [N, D], logits [N, C], labels [N]
  (int, -1 = unknown; or None). A field a detector does not need may be None. `extras`:
  per-image arrays [N, ...] computed during extraction, or None: an input-gradient detector's
  statistic (AdaSCALE's {"stat": [N]}), the layer detectors' block columns
  ({"layer/<reducer>/<block>": [N, C] or [N, P, C]}, fi_jax/extract/layer_columns.py)."""
  features: Any
  logits: Any
  labels: Optional[Any] = None
  extras: Optional[dict] = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Head:
  """The classifier's last linear layer: logits = features @ w + b; w [D, C], b [C].
  `texts`: for two-tower models, the text banks the negative-label detectors read
  ({"<bank>/<array>": numpy array}, fi_jax/models/zero_shot_head.py `text_bank`), or None."""
  w: Any
  b: Any
  texts: Optional[dict] = None
