"""The column names of an extracted set: the one definition every stage uses.

A set's arrays (what extraction returns, the feature cache stores, the detectors read and the
report's per-example score files carry) are a dict of equal-length arrays:

  features [N, D]              the model's penultimate features (float32 or wider)
  logits [N, C]                the classifier's logits (float32 or wider)
  label [N]                    the ID class, -1 where there is none (OOD sets)
  group [N]                    the OOD class id for per-class metrics, -1 where there is none
  _id [N]                      the example's index in its set: while rows of several
                               processes are brought together (dropped in set order), and
                               in a set that lost rows to `pipeline.drop_nonfinite` (kept, so
                               that the score files name the dataset's own examples)
  _mask [B]                    per-batch: 1 for real rows, 0 for padding (never leaves a step)
  score/<detector>             an input scorer's score per image (ODIN, RankFeat, ...)
  stat/<detector>              an input scorer's per-image statistic that its fit reads
                               (AdaSCALE)
  layer/<reducer>/<block>      a block's reduced activations (the layer detectors)

`scorer_column`, `layer_column` and friends build and parse these names; nothing else spells
them out.
"""
from __future__ import annotations

from typing import Optional

FEATURES = "features"
LOGITS = "logits"
LABEL = "label"
GROUP = "group"
ID = "_id"
MASK = "_mask"
MODEL_OUTPUTS = (FEATURES, LOGITS)
# what a batch carries through the forward step unchanged
PASS_THROUGH = (LABEL, GROUP, ID, MASK)
# what a set read from files (`source="features"`) may hold
FILE_KEYS = (FEATURES, LOGITS, LABEL, GROUP)

SCORE = "score"    # an input scorer's score column: score/<detector>
STAT = "stat"      # an input scorer's statistic column: stat/<detector>
LAYER = "layer"    # layer columns: layer/<reducer>/<block>


def scorer_column(kind: str, detector: str) -> str:
  """`<kind>/<detector>`, kind "score" or "stat" (or another key of a scorer's dict output)."""
  return f"{kind}/{detector}"


def layer_column(reducer: str, block: str) -> str:
  return f"{LAYER}/{reducer}/{block}"


def layer_group(reducer: str) -> str:
  """`layer/<reducer>`: how a set's column list names all of a reducer's block columns."""
  return f"{LAYER}/{reducer}"


def is_layer_column(key: str) -> bool:
  return key.startswith(LAYER + "/")


def scorer_of(column: str) -> Optional[str]:
  """The input scorer whose output `column` is (`<kind>/<scorer>`), None for the model's own
  columns (features, logits, the pass-through ones, `layer/...`)."""
  if "/" not in column or is_layer_column(column):
    return None
  return column.rpartition("/")[2]
