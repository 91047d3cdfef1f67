"""Inference layers shared by the convolutional ports (ResNet, RegNet): PyTorch-style conv and
pooling padding, and a BatchNorm whose running statistics are ordinary params.

Keeping `mean` / `var` in the `params` collection (next to `scale` / `bias`) lets
`model.apply({"params": p}, x)` run without a `batch_stats` collection: these ports are for
inference only.
"""
from __future__ import annotations

from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

HIGHEST = jax.lax.Precision.HIGHEST


def compute_dtype(dtype: str) -> Any:
  """'float32' | 'bfloat16' -> the jnp dtype activations and conv inputs are computed in."""
  if dtype not in ("float32", "bfloat16"):
    raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}.")
  return jnp.dtype(dtype)


class BatchNorm(nn.Module):
  """Eval-mode BatchNorm2d over the last axis: (x - mean) / sqrt(var + eps) * scale + bias."""
  eps: float = 1e-5

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    c = x.shape[-1]
    scale = self.param("scale", nn.initializers.ones, (c,), jnp.float32)
    bias = self.param("bias", nn.initializers.zeros, (c,), jnp.float32)
    mean = self.param("mean", nn.initializers.zeros, (c,), jnp.float32)
    var = self.param("var", nn.initializers.ones, (c,), jnp.float32)
    mul = scale * jax.lax.rsqrt(var + self.eps)
    return x * mul.astype(x.dtype) + (bias - mean * mul).astype(x.dtype)


def conv(features: int, kernel: int, stride: int = 1, *, padding: Optional[int] = None,
         groups: int = 1, use_bias: bool = False, dtype: Any = jnp.float32,
         precision: Any = HIGHEST, name: Optional[str] = None) -> nn.Conv:
  """A torch `Conv2d(k, stride, padding)`: symmetric padding (default (k - 1) // 2)."""
  p = (kernel - 1) // 2 if padding is None else padding
  return nn.Conv(features, (kernel, kernel), strides=(stride, stride), padding=((p, p), (p, p)),
                 feature_group_count=groups, use_bias=use_bias, dtype=dtype,
                 param_dtype=jnp.float32, precision=precision, name=name)


def max_pool(x: jax.Array, kernel: int = 3, stride: int = 2, padding: int = 1) -> jax.Array:
  """torch MaxPool2d(kernel, stride, padding): padded cells never win (-inf)."""
  p = ((padding, padding), (padding, padding))
  return nn.max_pool(x, (kernel, kernel), strides=(stride, stride), padding=p)


def avg_pool_ceil(x: jax.Array, kernel: int = 2, stride: int = 2) -> jax.Array:
  """torch AvgPool2d(kernel, stride, ceil_mode=True, count_include_pad=False): a partial last
  window (odd sizes) averages only the cells it covers."""
  pads = []
  for n in x.shape[1:3]:
    out = -(-(n - kernel) // stride) + 1
    if (out - 1) * stride >= n:   # torch drops a window that would start past the input
      out -= 1
    pads.append((0, max(0, (out - 1) * stride + kernel - n)))
  return nn.avg_pool(x, (kernel, kernel), strides=(stride, stride), padding=tuple(pads),
                     count_include_pad=False)


def global_avg_pool(x: jax.Array) -> jax.Array:
  """[B, H, W, C] -> [B, C] mean in float32 (the classifier input)."""
  return jnp.mean(x.astype(jnp.float32), axis=(1, 2))
