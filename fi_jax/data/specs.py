"""Set specs: the sets of a run by name.

A run has three kinds of sets: "id_fit" (what detectors fit on), "id_test" and one
"ood/<name>" per OOD set. Each spec is a dict that `fi_jax.data.loader` opens (`source`:
"tfds", "arrays", "digits", or "features" for arrays read from files; docs/data.md).
"""
from __future__ import annotations

from typing import Mapping, Sequence

ID_FIT = "id_fit"
ID_TEST = "id_test"
OOD_PREFIX = "ood/"


def set_specs(id_fit: Mapping, id_test: Mapping, ood: Mapping[str, Mapping],
              ood_order: Sequence[str] = ()) -> dict[str, dict]:
  """{set name: spec} for the ID fit set, the ID test set and every OOD set; the OOD sets
  named in `ood_order` first, in that order (a ConfigDict sorts its keys), then the others."""
  order = [n for n in ood_order if n in ood]
  names = order + [n for n in ood if n not in order]
  return {ID_FIT: dict(id_fit), ID_TEST: dict(id_test),
          **{OOD_PREFIX + name: dict(ood[name]) for name in names}}


def ood_name(set_name: str) -> str:
  """"ood/<name>" -> "<name>"."""
  return set_name[len(OOD_PREFIX):]


def is_ood(set_name: str) -> bool:
  return set_name.startswith(OOD_PREFIX)
