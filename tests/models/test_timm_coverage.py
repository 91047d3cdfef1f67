"""The zoo against timm's own list: every ImageNet-1k classifier timm publishes
(`timm.list_pretrained()`, pretrained_cfg num_classes == 1000) of an architecture fi_jax
ports natively resolves, and its config's parameters have timm's shapes.

Shapes come from `timm.create_model(name, pretrained=False)` on the meta device (no weights,
no download); the check loads a state dict of those shapes (zero-stride arrays, no memory)
through `zoo.from_pretrained`, so every key is mapped, consumed and shape-checked by the same
converter a real file goes through. Tags sharing an architecture, class count and input size
have the same timm shapes, so one tag per such group is loaded.
"""
from __future__ import annotations

import collections
import functools
import os

import numpy as np
import pytest
import timm
import torch

from fi_jax.models import _checkpoints, _torchax_adapter, zoo
from fi_jax.models.convert import readers

# The targets are 45% of all and 90% of vit_*; these floors pin what is ported now.
MIN_COVERAGE_ALL = 0.377
MIN_COVERAGE_VIT = 0.65


@functools.lru_cache(maxsize=None)
def in1k_classifiers() -> tuple[str, ...]:
  return tuple(n for n in timm.list_pretrained()
               if timm.models.get_pretrained_cfg(n).num_classes == 1000)


def _resolves(name: str) -> bool:
  """Whether zoo.resolve accepts "timm/<name>" (a full name with its tag: a table key)."""
  return f"timm/{name}" in zoo.table()


def coverage() -> dict:
  """{'all': (native, total), 'vit': (native, total), 'missing': Counter of timm modules}."""
  names = in1k_classifiers()
  native = [n for n in names if _resolves(n)]
  vit = [n for n in names if n.startswith("vit_")]
  modules = timm.models._registry._model_to_module
  missing = collections.Counter(modules.get(n.split(".")[0], "?") for n in names
                                if n not in set(native))
  return dict(all=(len(native), len(names)), vit=(sum(n in native for n in vit), len(vit)),
              missing=missing, native=native)


def test_native_coverage_of_timm_in1k_classifiers(capsys):
  cov = coverage()
  (n_all, total), (n_vit, total_vit) = cov["all"], cov["vit"]
  with capsys.disabled():
    print(f"\nfi_jax native coverage of timm's ImageNet-1k classifiers: {n_all}/{total} "
          f"({n_all / total:.1%}); vit_*: {n_vit}/{total_vit} ({n_vit / total_vit:.1%})")
    print("missing (timm module: classifiers): " + ", ".join(
        f"{m}: {k}" for m, k in cov["missing"].most_common()))
  assert n_all / total >= MIN_COVERAGE_ALL and n_vit / total_vit >= MIN_COVERAGE_VIT
  # every tag of a supported architecture resolves (tags are data, not code)
  models = {n.split("/")[1].split(".")[0] for n in zoo.names() if n.startswith("timm/")}
  from fi_jax.models import _pretrained
  not_resolved = [n for n in in1k_classifiers() if n.split(".")[0] in models
                  and not _resolves(n) and _pretrained.timm_unsupported_reason(n) is None]
  assert not not_resolved


def meta_shapes(name: str) -> dict[str, tuple[int, ...]]:
  """timm's state_dict shapes of `name` (meta device: nothing allocated or downloaded)."""
  with torch.device("meta"):
    model = timm.create_model(name, pretrained=False)
  return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def load_shapes_only(name: str, path: str, monkeypatch) -> None:
  """zoo.from_pretrained("timm/<name>") on a state dict of timm's shapes (zero-stride zeros):
  raises the loader's CheckpointError on any missing, unexpected or misshaped key."""
  zero = np.zeros((), np.float32)
  sd = {k: np.broadcast_to(zero, s) for k, s in meta_shapes(name).items()}
  monkeypatch.setattr(readers, "read_state_dict", lambda *a, **k: sd)
  monkeypatch.setattr(_checkpoints, "check_finite", lambda *a, **k: None)
  zoo.from_pretrained(f"timm/{name}", path)


def shape_groups() -> dict[tuple, str]:
  """{(family, variant, input size): the first IN-1k classifier tag of that group}."""
  out = {}
  for name in coverage()["native"]:
    info = zoo.resolve(f"timm/{name}")
    out.setdefault((info["family"], info["variant"], info["input_size"]), name)
  return out


# Loading every group takes many minutes on a 2-core machine (docs/performance.md); the suite
# loads a fixed sample: the architectures no other full-size test covers (timm's RegNet,
# tiered-stem ResNet, a zero-qkv-bias ViT, registers folded out of the posemb); the families'
# own test files check other full-size layouts. FI_JAX_TIMM_COVERAGE=all loads every group,
# FI_JAX_TIMM_COVERAGE=<family> those of one family.
SAMPLE = ("resnet26t.ra2_in1k", "regnety_040.ra3_in1k",
          "vit_base_patch16_224_miil.in21k_ft_in1k",
          "vit_so150m_patch16_reg4_gap_256.sbb_e250_in12k_ft_in1k")


def _cases():
  which = os.environ.get("FI_JAX_TIMM_COVERAGE")
  if which:
    return sorted(n for (family, _, _), n in shape_groups().items()
                  if which in ("all", family))
  return SAMPLE


@pytest.mark.slow
def test_classifiers_have_timms_parameter_shapes(tmp_path, monkeypatch):
  path = str(tmp_path / "shapes_only.pth")
  open(path, "wb").close()
  failures = {}
  for name in _cases():
    try:
      load_shapes_only(name, path, monkeypatch)
    except Exception as e:   # noqa: BLE001 - collected, reported together
      failures[name] = f"{type(e).__name__}: {str(e)[:300]}"
  assert not failures, "\n".join(f"{k}: {v}" for k, v in failures.items())


def test_with_the_torchax_route_almost_every_in1k_classifier_resolves(capsys, tmp_path,
                                                                       monkeypatch):
  """Native ports first; every other timm ImageNet-1k classifier resolves to the torchax route
  (fi_jax/models/torchax_classifier.py), which admits a checkpoint only after its equivalence
  check against torch eager (tests/models/test_torchax_route.py runs ten families)."""
  try:
    _torchax_adapter.environment()
  except ImportError as e:
    pytest.skip(f"the torchax route's extra is not installed: {e}")
  monkeypatch.setenv("FI_JAX_TORCHAX_CACHE", str(tmp_path))
  names = in1k_classifiers()
  routes, refused = collections.Counter(), {}
  for name in names:
    try:
      routes[zoo.resolve(f"timm/{name}")["route"]] += 1
    except ValueError as e:
      refused[name] = str(e).rsplit("Nor does the torchax route take it: ", 1)[-1][:120]
  covered = routes["flax"] + routes["torchax"]
  with capsys.disabled():
    print(f"\ntimm ImageNet-1k classifiers that resolve: native {routes['flax']}/{len(names)} "
          f"({routes['flax'] / len(names):.1%}), with torchax {covered}/{len(names)} "
          f"({covered / len(names):.1%}); refused: " + "; ".join(
              f"{k}: {v}" for k, v in sorted(refused.items())))
  assert routes["flax"] == len(coverage()["native"])
  assert covered / len(names) >= 0.95
