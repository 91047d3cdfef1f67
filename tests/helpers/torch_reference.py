"""Reference-side helpers of the equivalence tests: random but non-trivial weights for torch /
timm / torchvision modules, saving them in the formats fi_jax reads, and running them on NHWC
numpy images. Every model test builds its reference with these (one copy, not one per file).

Weights are perturbed because a freshly initialised module has trivial norm layers (scale 1,
shift 0, running stats 0/1) and zero biases: a key map that swapped or dropped those would
still match. Import after tests/conftest.py has installed the torchvision shim.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import torch


def perturb_norms(m: torch.nn.Module, seed: int = 0, *,
                  linear_weights: bool = False) -> torch.nn.Module:
  """BatchNorm / GroupNorm scales around 1, shifts, running means and variances off their
  trivial init, every Linear / Conv2d bias non-zero; with `linear_weights` also the Linear
  weights redrawn with std 1/sqrt(fan_in) (torchvision inits a classifier with std 0.01: tiny
  logits). Returns the module in eval mode."""
  g = torch.Generator().manual_seed(seed)
  rnd = lambda t: torch.randn(t.shape, generator=g)
  with torch.no_grad():
    for mod in m.modules():
      if isinstance(mod, (torch.nn.BatchNorm2d, torch.nn.GroupNorm)):
        mod.weight.copy_(1 + 0.2 * rnd(mod.weight))
        mod.bias.copy_(0.2 * rnd(mod.bias))
      if isinstance(mod, torch.nn.BatchNorm2d):
        mod.running_mean.copy_(0.2 * rnd(mod.running_mean))
        mod.running_var.copy_(0.5 + torch.rand(mod.running_var.shape, generator=g))
      if isinstance(mod, (torch.nn.Linear, torch.nn.Conv2d)) and mod.bias is not None:
        mod.bias.copy_(0.2 * rnd(mod.bias))
      if linear_weights and isinstance(mod, torch.nn.Linear):
        mod.weight.copy_(rnd(mod.weight) / mod.in_features ** 0.5)
  return m.eval()


def _is_norm_scale(name: str, p: torch.Tensor) -> bool:
  return "norm" in name and name.endswith("weight")


def randomize_params(m: torch.nn.Module, seed: int = 0, *,
                     is_scale: Callable[[str, torch.Tensor], bool] = _is_norm_scale,
                     ) -> torch.nn.Module:
  """Every parameter drawn anew, N(0, 0.2²), norm scales (`is_scale(name, param)`) around 1:
  a wrong map or a zero init shows. Returns the module in eval mode."""
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in m.named_parameters():
      p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (1.0 if is_scale(name, p) else 0.0))
  return m.eval()


def perturb_scaled(m: torch.nn.Module, seed: int = 0, *,
                   special: Optional[Callable[[str, torch.Tensor], Optional[torch.Tensor]]] = None,
                   ) -> torch.nn.Module:
  """Multiplicative noise on the weights (p·(1 + 0.2 r)), LayerNorm scales 1 + 0.3 r, other
  1-D parameters 0.3 r; `special(name, r)` may return another value for a parameter (a family's
  layer scales, logit scales, position-bias tables). Returns the module in eval mode."""
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for n, p in m.named_parameters():
      r = torch.randn(p.shape, generator=g)
      value = special(n, r) if special is not None else None
      if value is not None:
        p.copy_(value)
      elif p.ndim == 1 and n.endswith("weight"):   # LayerNorm scales
        p.copy_(1 + 0.3 * r)
      elif p.ndim == 1:
        p.copy_(0.3 * r)
      else:
        p.copy_(p * (1 + 0.2 * r))
  return m.eval()


def save_state_dict(m: torch.nn.Module, path) -> str:
  """The module's state dict as `path`: safetensors for *.safetensors, else torch.save."""
  sd = {k: v.contiguous() for k, v in m.state_dict().items()}
  if str(path).endswith(".safetensors"):
    import safetensors.torch
    safetensors.torch.save_file(sd, str(path))
  else:
    torch.save(sd, str(path))
  return str(path)


def nchw(x: np.ndarray, dtype=None) -> torch.Tensor:
  """NHWC numpy images as an NCHW torch tensor (in `dtype`, default the array's)."""
  t = torch.tensor(np.asarray(x)).permute(0, 3, 1, 2)
  return t if dtype is None else t.to(dtype)
