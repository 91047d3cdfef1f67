"""Session-wide test setup: float64 JAX and the torchvision import shim.

x64: fi_jax's pipeline runs with `jax_enable_x64` (metrics, covariances and pseudo-inverses in
float64), so the tests do too. Models stay float32 because they cast explicitly.

Shim: PyPI's torchvision 0.28 is CUDA-linked; beside the CPU torch 2.13 wheel its C ops never
register and `import torchvision` (hence timm / open_clip) dies on `torchvision::nms`.
Defining the two op schemas before anything imports torchvision fixes it.
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("NO_GCE_CHECK", "true")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

_TV_LIB = None


def _torchvision_shim():
  global _TV_LIB
  try:
    import torch
  except ImportError:  # torch is a test extra; tests that need it skip themselves
    return
  try:
    torch.ops.torchvision.nms  # pylint: disable=pointless-statement
  except (AttributeError, RuntimeError):
    _TV_LIB = torch.library.Library("torchvision", "DEF")
    _TV_LIB.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _TV_LIB.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


_torchvision_shim()
