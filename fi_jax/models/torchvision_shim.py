"""Lets timm and open_clip import on CPU-only torch beside PyPI's CUDA-linked torchvision.

PyPI's torchvision wheels (0.28 here) are built against CUDA torch: beside the CPU torch
wheel their C ops never register, and `import torchvision` (hence timm and open_clip, which
import it) fails on the missing `torchvision::nms` operator. Defining the two op schemas it
looks up at import (`nms`, `qnms`) before anything imports torchvision lets the import
succeed (detection ops then stay unusable; no classifier needs them).

Used by the torchax route (fi_jax.models.torchax_classifier), tests/conftest.py (through
tests/helpers/torchvision_shim.py) and bench/: `install()` before importing timm, torchvision
or open_clip.
"""
from __future__ import annotations

_LIB = None   # the schemas stay registered as long as this library object lives


def install() -> None:
  """Registers the op schemas unless torchvision's own ops (or an earlier call) did.

  Without torch (an optional extra) it does nothing.
  """
  global _LIB
  try:
    import torch  # optional, and heavy
  except ImportError:
    return
  try:
    torch.ops.torchvision.nms
  except (AttributeError, RuntimeError):
    _LIB = torch.library.Library("torchvision", "DEF")
    _LIB.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _LIB.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
