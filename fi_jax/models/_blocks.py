"""Inference layers shared by the ports: PyTorch-style conv and pooling padding, a BatchNorm
whose running statistics are ordinary params, the depthwise convolution, the exact GELU and the
softmax attention of the transformers, each written for XLA:CPU's speed without changing the
math.

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


def gelu_exact(x: jax.Array) -> jax.Array:
  """The exact (erf) GELU as PyTorch's CPU kernel computes it: x / 2 * (1 + erf(x / sqrt(2))).

  The same function as `jax.nn.gelu(x, approximate=False)`, which writes it with erfc; XLA:CPU
  evaluates erfc far more slowly than erf (a ViT-B/16 MLP's activation took ~1.5x as long).
  The erf form differs from the erfc form by at most ~1e-6 absolute in float32 (where
  1 + erf(x) cancels, x < -3) and is what nn.GELU() computes in torch."""
  return x * 0.5 * (1 + jax.lax.erf(x * (2 ** -0.5)))


# the attention logits one step of the CPU path holds, per [rows, N_q, N_k] chunk (bytes)
ATTENTION_CHUNK_BYTES = 4 << 20


def attention(q: jax.Array, k: jax.Array, v: jax.Array, *, bias: Optional[jax.Array] = None,
              mask: Optional[jax.Array] = None, precision: Any = HIGHEST,
              softmax_dtype: Any = None, layout: str = "bhnd") -> jax.Array:
  """softmax(q k^T + bias, masked) v on [B, H, N, d] arrays; q comes scaled.

  `layout="bnhd"`: q, k, v and the output are [B, N, H, d] (a Dense's heads layout) instead; on
  the CPU the images then run in chunks of at least two, each chunk moved to the heads-first
  layout inside the step, where it is in cache (ViT-B/16: ~20% faster attention than
  transposing the whole [B, N, H, d] arrays first).

  `bias` (added to the logits) and `mask` (True = attend; masked logits get finfo.min, as flax)
  broadcast to [B, H, N_q, N_k]. The softmax runs in `softmax_dtype` (default: the logits'),
  the weights are cast to v's dtype for the second product. On the CPU backend the B x H
  (batch, head) pairs run in chunks of ~`ATTENTION_CHUNK_BYTES` of logits (`lax.map`) and the
  normalisation divides the [N_q, d] output instead of the [N_q, N_k] weights: XLA:CPU then
  keeps each chunk's logits in cache instead of streaming a [B, H, N, N] array through memory
  four times (EVA-02-S at 577 tokens: ~1.5x faster attention). Other backends run the plain
  formula. Both equal the textbook softmax to float rounding.
  """
  if layout not in ("bhnd", "bnhd"):
    raise ValueError(f"attention layout must be 'bhnd' or 'bnhd', got {layout!r}.")
  if layout == "bnhd":
    return _attention_bnhd(q, k, v, bias=bias, mask=mask, precision=precision,
                           softmax_dtype=softmax_dtype)
  b, h, nq, d = q.shape
  nk, dv = k.shape[-2], v.shape[-1]
  on_cpu = jax.default_backend() == "cpu"

  def chunk(q, k, v, bias, mask):
    logits = jnp.einsum("...qd,...kd->...qk", q, k, precision=precision)
    if bias is not None:
      logits = logits + bias
    if softmax_dtype is not None:
      logits = logits.astype(softmax_dtype)
    if mask is not None:
      logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
    if not on_cpu:
      weights = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
      return jnp.einsum("...qk,...kd->...qd", weights, v, precision=precision)
    e = jnp.exp(logits - logits.max(-1, keepdims=True))
    out = jnp.einsum("...qk,...kd->...qd", e.astype(v.dtype), v, precision=precision)
    return (out / e.sum(-1, keepdims=True)).astype(v.dtype)

  rows = max(1, ATTENTION_CHUNK_BYTES // (nq * nk * 4))
  if not on_cpu or rows >= b * h:
    return chunk(q, k, v, bias, mask)

  # one row per (batch, head) pair; bias / mask rows are gathered per chunk from their own
  # (possibly batch- or head-broadcast) arrays instead of being broadcast to B x H first
  flat = lambda t: t.reshape(b * h, *t.shape[2:])
  index = jnp.arange(b * h)

  def rows_of(t):
    if t is None:
      return None, None
    t = _as_4d(t)
    tb, th = t.shape[:2]
    t = jnp.broadcast_to(t, (tb, th, nq, nk)).reshape(tb * th, nq, nk)
    rows = (index // h if tb > 1 else 0) * th + (index % h if th > 1 else 0)
    return t, jnp.broadcast_to(jnp.asarray(rows, jnp.int32), (b * h,))

  bias_rows, bias_index = rows_of(bias)
  mask_rows, mask_index = rows_of(mask)

  def step(xs):
    q, k, v, bi, mi = xs
    return chunk(q, k, v, None if bias_rows is None else bias_rows[bi],
                 None if mask_rows is None else mask_rows[mi])

  zeros = jnp.zeros((b * h,), jnp.int32)
  out = jax.lax.map(step, (flat(q), flat(k), flat(v),
                           zeros if bias_index is None else bias_index,
                           zeros if mask_index is None else mask_index), batch_size=rows)
  return out.reshape(b, h, nq, dv)


def _as_4d(t: Optional[jax.Array]) -> Optional[jax.Array]:
  """A bias / mask with fewer than 4 axes, with leading axes of size 1 added (None stays)."""
  if t is None:
    return None
  t = jnp.asarray(t)
  return t.reshape((1,) * (4 - t.ndim) + t.shape)


def _attention_bnhd(q, k, v, *, bias, mask, precision, softmax_dtype):
  """`attention` on [B, N, H, d] arrays (see there)."""
  b, nq, h, _ = q.shape
  nk = k.shape[1]
  heads_first = lambda t: jnp.swapaxes(t, -3, -2)
  kw = dict(precision=precision, softmax_dtype=softmax_dtype)
  images = max(2, ATTENTION_CHUNK_BYTES // (h * nq * nk * 4))
  if jax.default_backend() != "cpu" or images >= b:
    out = attention(heads_first(q), heads_first(k), heads_first(v), bias=bias, mask=mask, **kw)
    return heads_first(out)
  # bias / mask: [1 or B, 1 or H, Nq, Nk]; each image's slice is gathered inside the step
  bias, mask = _as_4d(bias), _as_4d(mask)
  index = jnp.arange(b, dtype=jnp.int32)
  of_image = lambda t: (jnp.zeros_like(index) if t is None or t.shape[0] == 1 else index)

  def step(xs):   # one image (lax.map vmaps it over a chunk): [N, H, d] -> [N, H, d]
    q, k, v, bi, mi = xs
    out = attention(heads_first(q)[None], heads_first(k)[None], heads_first(v)[None],
                    bias=None if bias is None else bias[bi][None],
                    mask=None if mask is None else mask[mi][None], **kw)
    return heads_first(out[0])

  return jax.lax.map(step, (q, k, v, of_image(bias), of_image(mask)), batch_size=images)


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


class DepthwiseConv(nn.Module):
  """A depthwise convolution (`nn.Conv(C, k, feature_group_count=C)`, the same params:
  `kernel` [kh, kw, 1, C], `bias` [C]) that XLA:CPU runs fast.

  XLA:CPU lowers a grouped convolution with one channel per group to a slow generic loop
  (ConvNeXt-T's 7x7 depthwise convolutions ran ~5x slower than torch's kernel and made the
  model 0.5x torch); on the CPU this module computes the same sum as kh * kw shifted slices
  of the padded input times the per-channel weights, which XLA fuses into one vectorised
  loop. The products are accumulated in float32 in (row, column) order, so results differ
  from the convolution's in the last bits. Other backends use the convolution.
  `padding`: ((top, bottom), (left, right)) or "SAME" (TensorFlow's split)."""
  kernel_size: tuple[int, int]
  strides: tuple[int, int] = (1, 1)
  padding: Any = ((0, 0), (0, 0))
  use_bias: bool = True
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  precision: Any = HIGHEST

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    c = x.shape[-1]
    kh, kw = self.kernel_size
    kernel = self.param("kernel", nn.initializers.lecun_normal(), (kh, kw, 1, c),
                        self.param_dtype)
    bias = self.param("bias", nn.initializers.zeros, (c,), self.param_dtype) \
        if self.use_bias else None
    pads = _pads(x.shape[1:3], self.kernel_size, self.strides, self.padding)
    if jax.default_backend() != "cpu":
      y = jax.lax.conv_general_dilated(
          x.astype(self.dtype), kernel.astype(self.dtype), self.strides, pads,
          dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=c,
          precision=self.precision)
    else:
      y = shifted_depthwise(x, kernel, self.strides, pads)
    if bias is not None:
      y = y + bias.astype(jnp.float32)
    return y.astype(self.dtype)


def _pads(hw, kernel, strides, padding) -> tuple[tuple[int, int], tuple[int, int]]:
  if padding != "SAME":
    return tuple(tuple(int(v) for v in p) for p in padding)
  out = []
  for n, k, s in zip(hw, kernel, strides):
    total = max((-(-n // s) - 1) * s + k - n, 0)
    out.append((total // 2, total - total // 2))
  return tuple(out)


def shifted_depthwise(x: jax.Array, kernel: jax.Array, strides, pads) -> jax.Array:
  """sum_ij pad(x)[:, i::s, j::s, :] * kernel[i, j, 0, :] in float32 (see DepthwiseConv)."""
  (pt, pb), (pl, pr) = pads
  sh, sw = strides
  kh, kw = kernel.shape[:2]
  p = jnp.pad(x.astype(jnp.float32), ((0, 0), (pt, pb), (pl, pr), (0, 0)))
  oh = (p.shape[1] - kh) // sh + 1
  ow = (p.shape[2] - kw) // sw + 1
  k = kernel.astype(jnp.float32)
  out = None
  for i in range(kh):
    for j in range(kw):
      t = p[:, i:i + (oh - 1) * sh + 1:sh, j:j + (ow - 1) * sw + 1:sw, :] * k[i, j, 0]
      out = t if out is None else out + t
  return out
