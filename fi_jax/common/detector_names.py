"""The registered detectors' names and what the configs choose them by, without importing JAX.

The command line checks `--config.detectors` against `NAMES` before JAX starts, and
configs/common.py picks its detector lists from these tables; `fi_jax.detectors.REGISTRY` is
the source of truth and tests/detectors/test_detector_names.py pins that both say the same:

  NAMES            every canonical name, in `fi_jax.detectors.names()` order
  INPUT_GRADIENT   those whose `needs` has "inputs" (a backward pass per image)
  LAYERS           those whose `needs` has "layers" (per-block columns)
  MODEL_FAMILIES   {name: the `model_families` it works on} for those limited to some
  TWO_TOWER        {name: the model families that give its two-tower inputs} (zero-shot ones)
"""
from __future__ import annotations

import difflib

NAMES: tuple[str, ...] = (
    "msp", "maxlogit", "energy", "tempscale", "odin", "gen", "klm", "react", "ash_p", "ash_b",
    "ash_s", "scale", "she", "dice", "mds", "rmds", "residual", "vim", "knn", "nnguide", "fdbd",
    "nci", "gradnorm", "cosine", "relative_cosine", "mcm", "neglabel", "csp", "glmcm",
    "weiper_kld", "weiper", "optfs",
    "bats", "line", "mds_pp", "rmds_pp", "ssd", "neco", "relation", "openmax", "vra",
    "adascale_a", "adascale_l", "combood", "rankfeat", "iodin", "mdsens", "gram",
    "ora", "cfood", "grood",
)
INPUT_GRADIENT: frozenset[str] = frozenset(
    ("odin", "adascale_a", "adascale_l", "rankfeat", "iodin"))
LAYERS: frozenset[str] = frozenset(("mdsens", "gram", "glmcm"))
MODEL_FAMILIES: dict[str, tuple[str, ...]] = {
    "rankfeat": ("resnet", "resnetv2", "vit", "dinov2", "clip", "two_towers"),
}
# The zero-shot detectors that need what only a two-tower model gives (its text bank: NegLabel,
# CSP; CLIP's local patch score: GL-MCM), by the model families that give it. Not enforced
# (elsewhere they fail with one clear line); the configs list them only for these families.
TWO_TOWER: dict[str, tuple[str, ...]] = {
    "neglabel": ("clip", "two_towers", "pe_core"), "csp": ("clip", "two_towers", "pe_core"),
    "glmcm": ("clip", "pe_core"),
}


def unknown(names) -> str | None:
  """None when every name in `names` is a registered detector; else one sentence naming the
  first unknown one, with the closest registered names as a suggestion."""
  for name in names:
    if name not in NAMES:
      close = difflib.get_close_matches(str(name).lower(), NAMES, n=3)
      hint = (f"did you mean {' or '.join(repr(c) for c in close)}?" if close
              else f"known: {', '.join(NAMES)}.")
      return f"unknown detector {name!r}; {hint}"
  return None
