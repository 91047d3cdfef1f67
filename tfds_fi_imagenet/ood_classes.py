"""OOD class names and the `ood_class_id` convention of every builder here."""
from __future__ import annotations

import re
from typing import Iterable


def normalize_class(name: str) -> str:
  """Class names: surrounding quotes and whitespace stripped, inner runs collapsed."""
  name = name.strip()
  if len(name) >= 2 and name[0] == name[-1] == '"':
    name = name[1:-1].replace('""', '"')
  return re.sub(r"\s+", " ", name).strip()


def class_ids(names: Iterable[str]) -> tuple[list[str], dict[str, int]]:
  """Sorted unique non-empty class names and {name: index}; '' maps to -1.

  This is the `ood_class_id` convention of every builder here: the index of the class
  name in the sorted list of the distinct names present in the split(s), -1 when the
  class is unknown. Deterministic for a given set of names.
  """
  classes = sorted({n for n in names if n})
  lookup = {n: i for i, n in enumerate(classes)}
  lookup[""] = -1
  return classes, lookup
