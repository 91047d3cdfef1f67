"""Multi-label top-1 accuracy (ReaL, ReImageNet): a prediction is a hit when the argmax of
the logits is any of the image's valid labels; images without a valid label (an empty set:
no ImageNet-1k class) are left out, as ReaL's evaluation does (google-research/
reassessed-imagenet: `is_correct = [pred in real_labels[i] ... if real_labels[i]]`)."""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np


def multilabel_accuracy(logits: np.ndarray, label_sets: Sequence[Sequence[int]],
                        ) -> tuple[Optional[float], int]:
  """(accuracy, images scored): the mean over images with a non-empty label set of
  argmax(logits) in that set; (None, 0) when no image has one."""
  logits = np.asarray(logits)
  if logits.ndim != 2 or len(logits) != len(label_sets):
    raise ValueError(f"logits [n, classes] and one label set per row are needed, got shape "
                     f"{logits.shape} and {len(label_sets)} label sets.")
  pred = np.argmax(logits, axis=1)
  hits = [int(p) in set(s) for p, s in zip(pred, label_sets) if len(s)]
  return (float(np.mean(hits)) if hits else None), len(hits)
