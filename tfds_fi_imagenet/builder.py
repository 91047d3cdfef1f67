"""The base class and the features of the OOD builders: configurable count checks."""
from __future__ import annotations

import abc
from typing import Mapping, Optional

import numpy as np
import tensorflow_datasets as tfds

from tfds_fi_imagenet import errors


def ood_features(**extra) -> tfds.features.FeaturesDict:
  """Features shared by the OOD sets (plus `extra`)."""
  return tfds.features.FeaturesDict({
      "image": tfds.features.Image(shape=(None, None, 3)),
      "file_name": tfds.features.Text(),
      "ood_class": tfds.features.Text(),
      "ood_class_id": tfds.features.Scalar(dtype=np.int64),
      **extra,
  })


class OodBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Base of the builders here: count checks configurable by a builder kwarg.

  `expected`: {split name or 'classes': count}. None = the published counts
  (`default_expected()`); a mapping replaces them entirely (keys it lacks are not
  checked), which is how tests and later releases of a list set other sizes.
  """

  def __init__(self, *, expected: Optional[Mapping[str, int]] = None, **kwargs):
    super().__init__(**kwargs)
    self._original_state["expected"] = expected
    defaults = self.default_expected()
    if expected is None:
      expected = defaults
    unknown = set(expected) - set(defaults)
    if unknown:
      raise errors.UsageError(f"{self.name}: unknown count key(s) {sorted(unknown)} in expected=; "
                       f"known: {sorted(defaults)}.")
    self.expected = {k: int(v) for k, v in expected.items()}

  @abc.abstractmethod
  def default_expected(self) -> dict[str, int]:
    """Published count per split (and 'classes' where classes are known)."""

  def check_count(self, key: str, got: int, what: str, hint: str = "") -> None:
    """ValueError when a checked count differs from the expected one."""
    want = self.expected.get(key)
    if want is not None and got != want:
      raise ValueError(
          f"{self.name}: {what} has {got} {'classes' if key == 'classes' else 'images'}, "
          f"expected {want}.{(' ' + hint) if hint else ''} For another release pass "
          f"expected={{'{key}': {got}, ...}} (CLI: --expect {key}={got}).")
