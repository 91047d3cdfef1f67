"""timm's ViTs whose blocks or patch embedding differ from big_vision's, in timm's own layout.

One Flax module covers (timm 1.0, `timm/models/vision_transformer*.py`):
- `vision_transformer_relpos` (`vit_relpos_*`, `vit_srelpos_*`): no absolute posemb; every
  attention adds a relative-position bias that a 2-layer MLP (ReLU, hidden `rel_pos_dim`)
  computes from the log-spaced offsets sign(d)·ln(1 + |d|) between patches (timm's
  `RelPosMlp`, mode 'cr'), per block or once for all blocks (`shared_rel_pos`); the bias
  depends on the patch grid, so it is recomputed for any input size (a class token gets a zero
  bias). LayerScale (`ls1` / `ls2`) on the pre-norm blocks.
- residual post-norm blocks (`block="respost"`: x + norm1(attn(x)); x + norm2(mlp(x)); the
  `_rpn` models of both modules).
- the `sbb` "wee / little" ViTs: differential attention (`attn="diff"`, arXiv 2410.05258:
  softmax(q1·k1) - λ·softmax(q2·k2) over half-width heads, an RMSNorm per head, times
  1 - λ_init with λ_init = 0.8 - 0.6·exp(-0.3·block index)) and the parallel blocks of ViT-22B
  (`block="parallel"`: one LayerNorm, one fused in_proj into [mlp | q | k | v], the attention
  and MLP branches summed by two output projections, or by one fused out_proj for the
  differential variant `block="diff_parallel"`), register tokens without posemb.
- `vision_transformer_hybrid`: a ResNetV2 backbone (non-pre-activation bottlenecks,
  weight-standardised convs with TF-"SAME" padding, GroupNorm(32)) or only its stem, then a
  `patch_size` conv to the embedding (`vit_*_r*_s*`), followed by timm's standard ViT.
- BEiT-3's image classifiers as timm ships them (`beit3_*`: remapped to a VisionTransformer
  with LayerNorms before the attention's output projection and before the MLP's fc2,
  `scale_norm`), and timm's small `test_vit*` models (ImageNet-1k weights at 160 px;
  `test_vit3` pools with timm's AttentionPoolLatent over all tokens).

Parameters carry timm's names (module path with '/' for '.', `blocks_3` for `blocks.3`;
Linear/Conv `weight` -> `kernel`, norm `weight` -> `scale`; `gamma`, `lambda_q1`,
`cls_token`, `pos_embed`, `reg_token` as they are), so `load` is a transpose per tensor
(fi_jax.models.convert.vit_timm). `Model(1000, variant="vit_relpos_medium_patch16_224")`;
`apply({"params": p}, images_nhwc)` -> `(logits, out)` with out["pre_logits"] = timm's
`forward_head(pre_logits=True)`.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.models import _blocks
from fi_jax.models import _pretrained as pretrained
from fi_jax.models.convert import readers
from fi_jax.models.convert import resnet as convert_resnet
from fi_jax.models.convert import vit_timm as convert
from fi_jax.models.resnetv2 import make_divisible

HIGHEST = jax.lax.Precision.HIGHEST
BLOCKS = ("pre", "respost", "parallel", "diff_parallel")
ATTENTIONS = ("plain", "diff", "relpos_mlp")


def _dense(features: int, name: str, use_bias: bool = True) -> nn.Dense:
  return nn.Dense(features, use_bias=use_bias, precision=HIGHEST, name=name)


def _layernorm(name: str, eps: float = 1e-6) -> nn.LayerNorm:
  return nn.LayerNorm(epsilon=eps, name=name)


class LayerScale(nn.Module):
  """timm LayerScale: x * gamma."""

  @nn.compact
  def __call__(self, x):
    return x * self.param("gamma", nn.initializers.constant(1e-5), (x.shape[-1],), jnp.float32)


class RmsNorm(nn.Module):
  """timm RmsNorm: x * rsqrt(mean(x²) + eps) * scale over the last axis."""
  eps: float = 1e-5

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), jnp.float32)
    return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), -1, keepdims=True) + self.eps) * scale


class Mlp(nn.Module):
  """timm Mlp: fc1 -> activation -> (LayerNorm `norm` if scale_norm) -> fc2."""
  hidden: int
  out: Optional[int] = None
  act: Any = _blocks.gelu_exact
  scale_norm: bool = False
  ln_eps: float = 1e-6

  @nn.compact
  def __call__(self, x):
    y = self.act(_dense(self.hidden, "fc1")(x))
    if self.scale_norm:
      y = _layernorm("norm", self.ln_eps)(y)
    return _dense(self.out or x.shape[-1], "fc2")(y)


def relative_position_index(h: int, w: int) -> np.ndarray:
  """timm's gen_relative_position_index: (h*w, h*w) indices into the (2h-1)(2w-1) offsets."""
  coords = np.stack(np.meshgrid(np.arange(h), np.arange(w), indexing="ij")).reshape(2, -1)
  rel = (coords[:, :, None] - coords[:, None, :]).transpose(1, 2, 0)
  return (rel[..., 0] + h - 1) * (2 * w - 1) + (rel[..., 1] + w - 1)


def relative_log_coords(h: int, w: int) -> np.ndarray:
  """timm's gen_relative_log_coords(mode='cr'): (2h-1, 2w-1, 2) of sign(d)·ln(1 + |d|)."""
  d = np.stack(np.meshgrid(np.arange(-(h - 1), h, dtype=np.float32),
                           np.arange(-(w - 1), w, dtype=np.float32), indexing="ij"), -1)
  return (np.sign(d) * np.log(1.0 + np.abs(d))).astype(np.float32)


class RelPosMlp(nn.Module):
  """timm RelPosMlp (mode 'cr'): the (1, heads, N, N) attention bias of an (h, w) patch grid
  (zero rows / columns for `prefix_tokens`)."""
  num_heads: int
  hidden: int = 128
  prefix_tokens: int = 0

  @nn.compact
  def __call__(self, grid: tuple[int, int]):
    h, w = grid
    table = Mlp(self.hidden, self.num_heads, nn.relu, name="mlp")(
        jnp.asarray(relative_log_coords(h, w)))
    bias = table.reshape(-1, self.num_heads)[relative_position_index(h, w).reshape(-1)]
    bias = bias.reshape(h * w, h * w, self.num_heads).transpose(2, 0, 1)
    p = self.prefix_tokens
    return jnp.pad(bias, ((0, 0), (p, 0), (p, 0)))[None]


def _softmax_attention(q, k, v, bias=None):
  """[B, H, N, d] q / k / v (q unscaled) -> [B, H, N, d_v]."""
  return _blocks.attention(q / math.sqrt(q.shape[-1]), k, v, bias=bias, precision=HIGHEST)


def diff_attention(module: nn.Module, q, k, v, num_heads: int, block_index: int):
  """The differential attention of timm's DiffAttention / DiffParallelScalingBlock on fused
  q, k, v [B, N, D] -> [B, N, D]; its params (lambda_{q,k}{1,2}, `sub_norm`) belong to
  `module` (call from its compact method)."""
  b, n, d = q.shape
  hd = d // num_heads // 2
  lam = {name: module.param(name, nn.initializers.normal(0.1), (hd,), jnp.float32)
         for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")}
  lambda_init = 0.8 - 0.6 * math.exp(-0.3 * block_index)
  lam_full = (jnp.exp(jnp.sum(lam["lambda_q1"] * lam["lambda_k1"]))
              - jnp.exp(jnp.sum(lam["lambda_q2"] * lam["lambda_k2"])) + lambda_init)
  q = q.reshape(b, n, 2 * num_heads, hd).transpose(0, 2, 1, 3)
  k = k.reshape(b, n, 2 * num_heads, hd).transpose(0, 2, 1, 3)
  v = v.reshape(b, n, num_heads, 2 * hd).transpose(0, 2, 1, 3)
  logits = jnp.einsum("bhqd,bhkd->bhqk", q / math.sqrt(hd), k, precision=HIGHEST)
  attn = jax.nn.softmax(logits, -1).reshape(b, num_heads, 2, n, n)
  attn = attn[:, :, 0] - lam_full * attn[:, :, 1]
  x = jnp.einsum("bhqk,bhkd->bhqd", attn, v, precision=HIGHEST)
  x = RmsNorm(1e-5, name="sub_norm")(x) * (1 - lambda_init)
  return x.transpose(0, 2, 1, 3).reshape(b, n, d)


class Attention(nn.Module):
  """timm Attention / RelPosAttention / DiffAttention (`qkv`, `proj`, optional `rel_pos`;
  `scale_norm`: a LayerNorm `norm` before `proj`)."""
  num_heads: int
  qkv_bias: bool = True
  kind: str = "plain"
  rel_pos_dim: int = 128
  prefix_tokens: int = 0
  block_index: int = 0
  scale_norm: bool = False
  ln_eps: float = 1e-6

  @nn.compact
  def __call__(self, x, grid, shared_bias=None):
    b, n, d = x.shape
    q, k, v = jnp.split(_dense(3 * d, "qkv", self.qkv_bias)(x), 3, axis=-1)
    if self.kind == "diff":
      y = diff_attention(self, q, k, v, self.num_heads, self.block_index)
    else:
      heads = lambda t: t.reshape(b, n, self.num_heads, -1).transpose(0, 2, 1, 3)
      bias = shared_bias
      if self.kind == "relpos_mlp" and shared_bias is None:
        bias = RelPosMlp(self.num_heads, self.rel_pos_dim, self.prefix_tokens,
                         name="rel_pos")(grid)
      y = _softmax_attention(heads(q), heads(k), heads(v), bias)
      y = y.transpose(0, 2, 1, 3).reshape(b, n, d)
    if self.scale_norm:
      y = _layernorm("norm", self.ln_eps)(y)
    return _dense(d, "proj")(y)


class Block(nn.Module):
  """One timm block: `kind` 'pre' (Block / RelPosBlock), 'respost' (ResPostBlock /
  ResPostRelPosBlock), 'parallel' (ParallelScalingBlock), 'diff_parallel'
  (DiffParallelScalingBlock)."""
  num_heads: int
  mlp_dim: int
  kind: str = "pre"
  attn: str = "plain"
  qkv_bias: bool = True
  layerscale: bool = False
  rel_pos_dim: int = 128
  prefix_tokens: int = 0
  block_index: int = 0
  ln_eps: float = 1e-6
  scale_norm: bool = False    # BEiT-3's sub-LN: LayerNorms inside the attention and the MLP

  @nn.compact
  def __call__(self, x, grid, shared_bias=None):
    if self.kind in ("parallel", "diff_parallel"):
      return self._parallel(x)
    attn = Attention(self.num_heads, self.qkv_bias, self.attn, self.rel_pos_dim,
                     self.prefix_tokens, self.block_index, self.scale_norm, self.ln_eps,
                     name="attn")
    mlp = Mlp(self.mlp_dim, scale_norm=self.scale_norm, ln_eps=self.ln_eps, name="mlp")
    if self.kind == "respost":
      x = x + _layernorm("norm1", self.ln_eps)(attn(x, grid, shared_bias))
      return x + _layernorm("norm2", self.ln_eps)(mlp(x))
    ls = (lambda name: LayerScale(name=name)) if self.layerscale else (lambda name: lambda y: y)
    x = x + ls("ls1")(attn(_layernorm("norm1", self.ln_eps)(x), grid, shared_bias))
    return x + ls("ls2")(mlp(_layernorm("norm2", self.ln_eps)(x)))

  def _parallel(self, x):
    b, n, d = x.shape
    y = _dense(self.mlp_dim + 3 * d, "in_proj", self.qkv_bias)(_layernorm("in_norm",
                                                                          self.ln_eps)(x))
    x_mlp, q, k, v = jnp.split(y, np.cumsum([self.mlp_dim, d, d]), axis=-1)
    if not self.qkv_bias:
      x_mlp = x_mlp + self.param("mlp_bias", nn.initializers.zeros, (self.mlp_dim,), jnp.float32)
    x_mlp = _blocks.gelu_exact(x_mlp)
    if self.kind == "diff_parallel":
      x_attn = diff_attention(self, q, k, v, self.num_heads, self.block_index)
      y = _dense(d, "out_proj")(jnp.concatenate([x_attn, x_mlp], -1))
    else:
      heads = lambda t: t.reshape(b, n, self.num_heads, -1).transpose(0, 2, 1, 3)
      x_attn = _softmax_attention(heads(q), heads(k), heads(v)).transpose(0, 2, 1, 3)
      y = (_dense(d, "attn_out_proj")(x_attn.reshape(b, n, d))
           + _dense(d, "mlp_out_proj")(x_mlp))
    return x + (LayerScale(name="ls")(y) if self.layerscale else y)


class AttentionPoolLatent(nn.Module):
  """timm AttentionPoolLatent (one latent query, `global_pool="map"`): multi-head attention
  of `latent` (through `q`) over the tokens (`kv`), `proj`, then + mlp(norm(·)); [B, D]."""
  num_heads: int
  mlp_dim: int
  ln_eps: float = 1e-6

  @nn.compact
  def __call__(self, x):
    b, n, d = x.shape
    latent = self.param("latent", nn.initializers.normal(d ** -0.5), (1, 1, d), jnp.float32)
    heads = lambda t: t.reshape(b, t.shape[1], self.num_heads, -1).transpose(0, 2, 1, 3)
    q = _dense(d, "q")(jnp.broadcast_to(latent, (b, 1, d)))
    k, v = jnp.split(_dense(2 * d, "kv")(x), 2, axis=-1)
    y = _softmax_attention(heads(q), heads(k), heads(v)).transpose(0, 2, 1, 3).reshape(b, 1, d)
    y = _dense(d, "proj")(y)
    y = y + Mlp(self.mlp_dim, name="mlp")(_layernorm("norm", self.ln_eps)(y))
    return y[:, 0]


# ----------------------------------------------------------------------------- hybrid stem

def same_pads(hw: Sequence[int], kernel: int, stride: int) -> tuple[tuple[int, int], ...]:
  """TF "SAME" padding of an (h, w) input (timm's pad_same): the total max((ceil(n/s) - 1)·s
  + k - n, 0), its smaller half before."""
  out = []
  for n in hw:
    total = max((-(-n // stride) - 1) * stride + kernel - n, 0)
    out.append((total // 2, total - total // 2))
  return tuple(out)


class StdConvSame(nn.Module):
  """timm StdConv2dSame: the kernel standardised per output filter (biased variance, eps),
  TF-"SAME" padding computed from the input size, no bias."""
  features: int
  kernel: int
  stride: int = 1
  eps: float = 1e-8

  @nn.compact
  def __call__(self, x):
    k = self.kernel
    w = self.param("kernel", nn.initializers.lecun_normal(), (k, k, x.shape[-1], self.features),
                   jnp.float32)
    mean = jnp.mean(w, axis=(0, 1, 2), keepdims=True)
    var = jnp.mean(jnp.square(w - mean), axis=(0, 1, 2), keepdims=True)
    w = (w - mean) * jax.lax.rsqrt(var + self.eps)
    pads = same_pads(x.shape[1:3], k, self.stride)
    return jax.lax.conv_general_dilated(x, w, (self.stride, self.stride), pads,
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                        precision=HIGHEST)


class GroupNorm(nn.Module):
  """torch GroupNorm(32, eps 1e-5), optionally followed by ReLU (timm GroupNormAct)."""
  act: bool = True
  groups: int = 32
  eps: float = 1e-5

  @nn.compact
  def __call__(self, x):
    c = x.shape[-1]
    scale = self.param("scale", nn.initializers.ones, (c,), jnp.float32)
    bias = self.param("bias", nn.initializers.zeros, (c,), jnp.float32)
    y = x.reshape(*x.shape[:-1], self.groups, c // self.groups)
    mean = jnp.mean(y, axis=(1, 2, 4), keepdims=True)
    var = jnp.mean(jnp.square(y - mean), axis=(1, 2, 4), keepdims=True)
    y = ((y - mean) * jax.lax.rsqrt(var + self.eps)).reshape(x.shape) * scale + bias
    return nn.relu(y) if self.act else y


def _max_pool_same(x):
  """timm MaxPool2dSame(3, 2): TF-"SAME" padding with -inf."""
  pads = same_pads(x.shape[1:3], 3, 2)
  return nn.max_pool(x, (3, 3), strides=(2, 2), padding=pads)


class Bottleneck(nn.Module):
  """timm resnetv2.Bottleneck (non-pre-activation): conv1x1-GN-ReLU, conv3x3 (stride)-GN-ReLU,
  conv1x1-GN, + shortcut (`downsample`: strided 1x1 conv + GN), ReLU."""
  features: int
  stride: int = 1
  proj: bool = False

  @nn.compact
  def __call__(self, x):
    mid = make_divisible(self.features * 0.25)
    shortcut = x
    if self.proj:
      shortcut = _Downsample(self.features, self.stride, name="downsample")(x)
    y = GroupNorm(name="norm1")(StdConvSame(mid, 1, name="conv1")(x))
    y = GroupNorm(name="norm2")(StdConvSame(mid, 3, self.stride, name="conv2")(y))
    y = GroupNorm(False, name="norm3")(StdConvSame(self.features, 1, name="conv3")(y))
    return nn.relu(y + shortcut)


class _Downsample(nn.Module):
  features: int
  stride: int

  @nn.compact
  def __call__(self, x):
    return GroupNorm(False, name="norm")(StdConvSame(self.features, 1, self.stride,
                                                     name="conv")(x))


class HybridBackbone(nn.Module):
  """timm's `_resnetv2(layers)` of vision_transformer_hybrid: the 'same' stem (StdConv 7x7/2,
  GN-ReLU, SAME max pool 3/2) and `layers` stages of bottlenecks (stride 2 from the second
  stage on); `layers=()` is the stem alone (then its modules sit at the top: `conv`, `norm`)."""
  layers: Sequence[int] = ()
  channels: Sequence[int] = (256, 512, 1024, 2048)
  stem_width: int = 64

  @nn.compact
  def __call__(self, x):
    if not self.layers:   # the stem alone: timm's nn.Sequential(conv, norm, pool)
      return _max_pool_same(GroupNorm(name="norm")(StdConvSame(self.stem_width, 7, 2,
                                                               name="conv")(x)))
    x = _Stem(self.stem_width, name="stem")(x)
    for s, (depth, c) in enumerate(zip(self.layers, self.channels)):
      stage = _Stage(depth, c, 1 if s == 0 else 2, name=f"stages_{s}")
      x = stage(x)
    return x


class _Stem(nn.Module):
  width: int

  @nn.compact
  def __call__(self, x):
    x = GroupNorm(name="norm")(StdConvSame(self.width, 7, 2, name="conv")(x))
    return _max_pool_same(x)


class _Stage(nn.Module):
  depth: int
  features: int
  stride: int

  @nn.compact
  def __call__(self, x):
    for b in range(self.depth):
      x = Bottleneck(self.features, self.stride if b == 0 else 1, b == 0,
                     name=f"blocks_{b}")(x)
    return x


# ----------------------------------------------------------------------------- model

class VisionTransformer(nn.Module):
  """timm's VisionTransformer / VisionTransformerRelPos with the options above.

  `pos_embed`: a learned absolute posemb (`pos_embed`, covering the prefix tokens unless
  `no_embed_class`); `class_token` / `reg_tokens`: prefix tokens; `global_pool` 'avg' (the
  mean of the patch tokens), 'token' (the class token) or 'map' (`attn_pool`, over the patch
  tokens, or every token with `pool_include_prefix`); `fc_norm`: the final LayerNorm on
  the pooled feature instead of the tokens (`norm`); `block` in BLOCKS, `attn` in ATTENTIONS;
  `layerscale`: LayerScale on the residual branches (not in 'respost' blocks);
  `hybrid_layers`: None for the patch conv, else the ResNetV2 stages (() = its stem only)
  in front of a `patch_size` conv; `scale_norm`: LayerNorms before the attention's output
  projection and the MLP's fc2 (BEiT-3); `ln_eps`: of every LayerNorm."""
  num_classes: Optional[int] = 1000
  patch_size: int = 16
  width: int = 768
  depth: int = 12
  num_heads: int = 12
  mlp_dim: int = 3072
  qkv_bias: bool = True
  class_token: bool = False
  reg_tokens: int = 0
  pos_embed: bool = True
  no_embed_class: bool = False
  global_pool: str = "avg"
  fc_norm: bool = False
  layerscale: bool = False
  block: str = "pre"
  attn: str = "plain"
  rel_pos_dim: int = 128
  shared_rel_pos: bool = False
  hybrid_layers: Optional[Sequence[int]] = None
  hybrid_channels: Sequence[int] = (256, 512, 1024, 2048)
  hybrid_stem_width: int = 64
  ln_eps: float = 1e-6
  scale_norm: bool = False
  pool_include_prefix: bool = False

  @nn.compact
  def __call__(self, images, *, train: bool = False):
    del train   # inference only
    if self.block not in BLOCKS or self.attn not in ATTENTIONS:
      raise ValueError(f"block must be one of {BLOCKS} and attn one of {ATTENTIONS}, got "
                       f"{self.block!r}, {self.attn!r}.")
    if self.global_pool not in ("avg", "token", "map"):
      raise ValueError(f"global_pool must be 'avg', 'token' or 'map', got {self.global_pool!r}.")
    out = {}
    x = jnp.asarray(images, jnp.float32)
    x, grid = PatchEmbed(self.width, self.patch_size, self.hybrid_layers, self.hybrid_channels,
                         self.hybrid_stem_width, name="patch_embed")(x)
    n, d = x.shape[0], self.width
    prefix = []
    if self.class_token:
      prefix.append(self.param("cls_token", nn.initializers.zeros, (1, 1, d), jnp.float32))
    if self.reg_tokens:
      prefix.append(self.param("reg_token", nn.initializers.zeros, (1, self.reg_tokens, d),
                               jnp.float32))
    prefix = [jnp.broadcast_to(t, (n, *t.shape[1:])) for t in prefix]
    n_prefix = sum(t.shape[1] for t in prefix)
    pos = None
    if self.pos_embed:
      n_pos = x.shape[1] + (0 if self.no_embed_class else n_prefix)
      pos = self.param("pos_embed", nn.initializers.normal(0.02), (1, n_pos, d), jnp.float32)
    if pos is not None and self.no_embed_class:
      x = x + pos
    x = jnp.concatenate(prefix + [x], axis=1) if prefix else x
    if pos is not None and not self.no_embed_class:
      x = x + pos
    shared = None
    if self.shared_rel_pos:
      shared = RelPosMlp(self.num_heads, self.rel_pos_dim, n_prefix, name="shared_rel_pos")(grid)
    for i in range(self.depth):
      x = Block(self.num_heads, self.mlp_dim, self.block, self.attn, self.qkv_bias,
                self.layerscale, self.rel_pos_dim, n_prefix, i, self.ln_eps, self.scale_norm,
                name=f"blocks_{i}")(x, grid, shared)
    if not self.fc_norm:
      x = _layernorm("norm", self.ln_eps)(x)
    out["encoded"] = x
    if self.global_pool == "map":
      tokens = x if self.pool_include_prefix else x[:, n_prefix:]
      x = AttentionPoolLatent(self.num_heads, self.mlp_dim, self.ln_eps, name="attn_pool")(tokens)
    elif self.global_pool == "avg":
      x = jnp.mean(x[:, n_prefix:], axis=1)
    else:
      x = x[:, 0]
    if self.fc_norm:
      x = _layernorm("fc_norm", self.ln_eps)(x)
    out["pre_logits"] = x
    if self.num_classes:
      x = out["logits"] = _dense(self.num_classes, "head")(x)
    return x, out


class PatchEmbed(nn.Module):
  """timm PatchEmbed (`proj`, a patch_size conv) or HybridEmbed (`backbone`, then `proj`):
  returns the [B, h*w, width] tokens and the (h, w) grid."""
  width: int
  patch_size: int
  hybrid_layers: Optional[Sequence[int]] = None
  hybrid_channels: Sequence[int] = (256, 512, 1024, 2048)
  hybrid_stem_width: int = 64

  @nn.compact
  def __call__(self, x):
    if self.hybrid_layers is not None:
      x = HybridBackbone(tuple(self.hybrid_layers), tuple(self.hybrid_channels),
                         self.hybrid_stem_width, name="backbone")(x)
    p = self.patch_size
    x = nn.Conv(self.width, (p, p), strides=(p, p), padding="VALID", precision=HIGHEST,
                name="proj")(x)
    n, h, w, c = x.shape
    return x.reshape(n, h * w, c), (h, w)


# ----------------------------------------------------------------------------- zoo

def _vit(width: int, depth: int, heads: int, mlp_ratio: float = 4.0, patch: int = 16,
         **kw) -> dict:
  """timm's model_args as VisionTransformer fields (MLP width int(width * mlp_ratio))."""
  return dict(width=width, depth=depth, num_heads=heads, mlp_dim=int(width * mlp_ratio),
              patch_size=patch, **kw)


# vision_transformer_relpos: no absolute posemb, RelPosMlp in every attention, LayerScale
_RELPOS = dict(pos_embed=False, attn="relpos_mlp", layerscale=True, qkv_bias=False)
_RELPOS_GAP = dict(_RELPOS, fc_norm=True)
_RPN = dict(_RELPOS, block="respost", layerscale=False)
# vision_transformer's sbb "wee / little" models: registers without posemb, LayerScale, GAP
_SBB = dict(reg_tokens=1, no_embed_class=True, layerscale=True, fc_norm=True)
# vision_transformer_hybrid: the original ViT on a ResNetV2 feature map
_HYBRID = dict(class_token=True, global_pool="token")

ARCHS: dict[str, dict] = {
    "vit_relpos_small_patch16_224": _vit(384, 12, 6, **_RELPOS_GAP),
    "vit_relpos_medium_patch16_224": _vit(512, 12, 8, **_RELPOS_GAP),
    "vit_relpos_base_patch16_224": _vit(768, 12, 12, **_RELPOS_GAP),
    "vit_srelpos_small_patch16_224": _vit(384, 12, 6, **_RELPOS, rel_pos_dim=384,
                                          shared_rel_pos=True),
    "vit_srelpos_medium_patch16_224": _vit(512, 12, 8, **_RELPOS, rel_pos_dim=512,
                                           shared_rel_pos=True),
    "vit_relpos_medium_patch16_cls_224": _vit(512, 12, 8, **_RELPOS, rel_pos_dim=256,
                                              class_token=True, global_pool="token"),
    "vit_relpos_base_patch16_clsgap_224": _vit(768, 12, 12, **_RELPOS_GAP, class_token=True),
    "vit_relpos_medium_patch16_rpn_224": _vit(512, 12, 8, **_RPN),
    "vit_relpos_base_patch32_plus_rpn_256": _vit(896, 12, 14, patch=32,
                                                 **dict(_RPN, qkv_bias=True)),
    "vit_base_patch16_rpn_224": _vit(768, 12, 12, qkv_bias=False, block="respost",
                                     fc_norm=True),
    "vit_dwee_patch16_reg1_gap_256": _vit(256, 14, 4, 5, **_SBB, attn="diff"),
    "vit_pwee_patch16_reg1_gap_256": _vit(256, 16, 4, 5, **_SBB, block="parallel"),
    "vit_dpwee_patch16_reg1_gap_256": _vit(256, 16, 4, 5, **_SBB, block="diff_parallel"),
    "vit_dlittle_patch16_reg1_gap_256": _vit(320, 14, 5, 5.6, **_SBB, attn="diff"),
}
for _size in (224, 384):
  ARCHS[f"vit_tiny_r_s16_p8_{_size}"] = _vit(192, 12, 3, patch=8, hybrid_layers=(), **_HYBRID)
  ARCHS[f"vit_small_r26_s32_{_size}"] = _vit(384, 12, 6, patch=1, hybrid_layers=(2, 2, 2, 2),
                                             **_HYBRID)
  ARCHS[f"vit_large_r50_s32_{_size}"] = _vit(1024, 24, 16, patch=1,
                                             hybrid_layers=(3, 4, 6, 3), **_HYBRID)
ARCHS["vit_base_r50_s16_384"] = _vit(768, 12, 12, patch=1, hybrid_layers=(3, 4, 9), **_HYBRID)
# BEiT-3's image classifiers as timm remaps them (timm's _convert_beit3: branch A of the
# multiway blocks, fused qkv): sub-LN, class token with posemb, GAP + fc_norm, eps 1e-5
_BEIT3 = dict(scale_norm=True, class_token=True, fc_norm=True, ln_eps=1e-5)
ARCHS["beit3_base_patch16_224"] = _vit(768, 12, 12, **_BEIT3)
ARCHS["beit3_large_patch16_224"] = _vit(1024, 24, 16, **_BEIT3)
# timm's small test ViTs with ImageNet weights (r160): class token; a register with a posemb
ARCHS["test_vit"] = _vit(64, 6, 2, 3, class_token=True, global_pool="token")
ARCHS["test_vit2"] = _vit(64, 8, 2, 3, reg_tokens=1, layerscale=True, fc_norm=True)
ARCHS["test_vit3"] = _vit(96, 9, 3, 2, reg_tokens=1, layerscale=True, global_pool="map",
                          pool_include_prefix=True)

# every timm tag of these architectures (eval transforms from timm's pretrained_cfg).
PRETRAINED: dict[str, dict] = pretrained.timm_tags(list(ARCHS))

DOWNLOAD_HINT = ("timm ViT weights: https://huggingface.co/timm/<model>.<tag> "
                 "model.safetensors (see fi_jax.models.vit_timm.PRETRAINED)")


def Model(num_classes: Optional[int] = 1000, *, variant: str, **kw) -> VisionTransformer:
  """`Model(1000, variant="vit_relpos_medium_patch16_224")`; `kw` overrides ARCHS fields
  (e.g. smaller widths for a stand-in file)."""
  if variant not in ARCHS:
    raise ValueError(f"Unknown timm ViT variant {variant!r}; known: {sorted(ARCHS)}.")
  dtype = kw.pop("dtype", "float32")
  if dtype != "float32":
    raise ValueError(f"fi_jax.models.vit_timm runs in float32 only, got dtype={dtype!r}.")
  return VisionTransformer(num_classes, **{**ARCHS[variant], **kw})


def load(init_params, init_file: str, model_cfg: Optional[Mapping[str, Any]] = None,
         dont_load: Sequence[str] = ()) -> dict:
  """timm state dict (.safetensors / .pth) -> params on `init_params`'s tree (arrays or
  ShapeDtypeStructs). A model without a head (num_classes=None) drops the file's `head`; a
  missing, unexpected or misshaped tensor raises CheckpointError naming the key and file."""
  del model_cfg   # timm is the only source
  init_params = jax.device_get(init_params)
  sd = readers.read_state_dict(init_file, hint=DOWNLOAD_HINT)
  where: dict[str, str] = {}
  flat = convert.convert(sd, source=init_file, hint=DOWNLOAD_HINT, where=where)
  return convert_resnet.merge(flat, init_params, init_file, DOWNLOAD_HINT, dont_load, sd=sd,
                              where=where, torch_module=convert.torch_module)
