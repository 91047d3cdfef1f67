"""The base class and the features of the OOD builders: configurable count checks."""
from __future__ import annotations

import abc
import functools
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
  checked), which is how tests and later releases of a list set other sizes. Every count
  a builder's `_split_generators` checks is compared; all mismatches are reported together
  in one ValueError when it returns (or when it fails for another reason, before that error).
  """

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    gen = cls.__dict__.get("_split_generators")
    if gen is not None:
      @functools.wraps(gen)
      def split_generators(self, *args, **kw):
        self._count_errors = []
        try:
          out = gen(self, *args, **kw)
        except Exception:
          self._raise_count_errors()   # the counts explain the failure better, if any differ
          raise
        self._raise_count_errors()
        return out
      cls._split_generators = split_generators

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
    """Records a checked count that differs from the expected one (raised, with every other
    mismatch, when `_split_generators` ends)."""
    want = self.expected.get(key)
    if want is not None and got != want:
      errors_ = self.__dict__.setdefault("_count_errors", [])
      errors_.append((key, got, f"{what} has {got} {'classes' if key == 'classes' else 'images'}, "
                                f"expected {want}.{(' ' + hint) if hint else ''}"))

  def _raise_count_errors(self) -> None:
    found, self._count_errors = self.__dict__.get("_count_errors") or [], []
    if found:
      flags = " ".join(f"--expect {k}={g}" for k, g, _ in found)
      kw = ", ".join(f"'{k}': {g}" for k, g, _ in found)
      raise ValueError(
          f"{self.name}: {len(found)} count(s) differ from the expected ones: "
          + " ".join(m for _, _, m in found)
          + f" For another release pass expected={{{kw}, ...}} (CLI: {flags}).")

  def archives(self) -> list:
    """The `downloads.Archive`s this builder (config) downloads; [] for manual-only builders."""
    return []
