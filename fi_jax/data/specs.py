"""Set specs: the sets of a run by name.

A run has three kinds of sets: "id_fit" (what detectors fit on), "id_test" and one
"ood/<name>" per OOD set; for full-spectrum evaluation (OpenOOD v1.5 "FS") also one
"csid/<name>" per covariate-shifted ID set (ImageNet-V2, -R, -C, ...), which joins the ID side. Each spec is a dict that `fi_jax.data.loader` opens (`source`:
"tfds", "arrays", "digits", or "features" for arrays read from files; docs/data.md).
"""
from __future__ import annotations

from typing import Mapping, Sequence

ID_FIT = "id_fit"
ID_TEST = "id_test"
OOD_PREFIX = "ood/"
CSID_PREFIX = "csid/"


def set_specs(id_fit: Mapping, id_test: Mapping, ood: Mapping[str, Mapping],
              ood_order: Sequence[str] = (), csid: Mapping[str, Mapping] = (),
              csid_order: Sequence[str] = ()) -> dict[str, dict]:
  """{set name: spec} for the ID fit set, the ID test set, every OOD set and every
  covariate-shifted ID set ("csid/<name>", none by default); the sets named in `ood_order`
  (`csid_order`) first, in that order (a ConfigDict sorts its keys), then the others."""
  def ordered(sets, order):
    first = [n for n in order if n in sets]
    return first + [n for n in sets if n not in first]
  csid = dict(csid or {})
  return {ID_FIT: dict(id_fit), ID_TEST: dict(id_test),
          **{OOD_PREFIX + name: dict(ood[name]) for name in ordered(ood, ood_order)},
          **{CSID_PREFIX + name: dict(csid[name]) for name in ordered(csid, csid_order)}}


def ood_name(set_name: str) -> str:
  """"ood/<name>" -> "<name>"."""
  return set_name[len(OOD_PREFIX):]


def is_ood(set_name: str) -> bool:
  return set_name.startswith(OOD_PREFIX)


def csid_name(set_name: str) -> str:
  """"csid/<name>" -> "<name>"."""
  return set_name[len(CSID_PREFIX):]


def is_csid(set_name: str) -> bool:
  return set_name.startswith(CSID_PREFIX)


def restricts_logits(spec: Mapping) -> bool:
  """Whether a covariate-shifted ID set also gets full-spectrum rows in its class subset's
  label space (docs/metrics.md#class-subsets): its spec's `restrict_logits`, by default True
  when it names a `class_subset`."""
  return bool(spec.get("class_subset") is not None and spec.get("restrict_logits", True))
