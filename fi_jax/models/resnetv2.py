"""BiT ResNetV2 (timm `resnetv2_{50,101,152}x{1,2,3,4}_bit`) and timm's plain pre-activation
ResNetV2s (`resnetv2_18/34/50/101[d]`, `resnetv2_50d_gn`, `resnetv2_50d_evos`) in Flax.

The plain ones (timm 1.0 `models/resnetv2.py`, `create_conv2d` + `BatchNormAct2d` /
`GroupNormAct` / `EvoNorm2dS0`): ordinary convs (`conv_kind="plain"`), BN + ReLU,
GroupNorm(32) + ReLU or EvoNorm-S0 for every norm-act (`norm`), the 7x7 stem or the 'deep'
one (3x3 convs of stem_width / 2, stem_width / 2, stem_width with norm-act between; no
norm after the last), max pool padding 1, PreActBasic blocks for 18 / 34 (`basic`: 3x3
(stride) -> norm-act -> 3x3, projecting only where the shape changes) and the 2x2 ceil-mode
average pool before the 1x1 projection on 'd' models (`avg_down`).

Pre-activation bottlenecks with weight-standardised convs and GroupNorm(32) + ReLU: per block
x_pre = relu(GN(x)); shortcut = x, or a strided 1x1 StdConv of x_pre on a stage's first block;
residual = conv1x1(x_pre) -> GN-ReLU -> conv3x3 (stride) -> GN-ReLU -> conv1x1. The 'fixed'
stem (BiT's SAME-padding approximation): StdConv 7x7 / 2 (padding 3), a zero pad of 1, then
max pool 3 / 2 without padding. After the stages: GN + ReLU, global average pool, "head"
(timm's 1x1 conv `head.fc`, converted to a Dense). StdConv2d standardises each output
filter over (in, kh, kw) with the biased variance and eps 1e-8 (timm's BiT setting); the
GroupNorm eps is 1e-5.

`Model(1000, variant="resnetv2_50x1_bit")`; `apply({"params": p}, images_nhwc)` returns
`(logits, out)`: out["pre_logits"] (= timm's forward_head(pre_logits=True)), out["stem"],
out["stage1".."stage4"] (before the final norm). `load(init, file)` reads timm state dicts
(.safetensors / .pth; fi_jax.models.convert.resnetv2).
"""
from __future__ import annotations

import functools
from typing import Any, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fi_jax.models import _blocks as blocks
from fi_jax.models import _pretrained as pretrained
from fi_jax.models.convert import readers
from fi_jax.models.convert import resnet as convert_resnet
from fi_jax.models.convert import resnetv2 as convert_resnetv2

ARCHS: dict[str, dict] = {
    "resnetv2_50x1_bit": dict(depths=(3, 4, 6, 3), width_factor=1),
    "resnetv2_50x3_bit": dict(depths=(3, 4, 6, 3), width_factor=3),
    "resnetv2_101x1_bit": dict(depths=(3, 4, 23, 3), width_factor=1),
    "resnetv2_101x3_bit": dict(depths=(3, 4, 23, 3), width_factor=3),
    "resnetv2_152x2_bit": dict(depths=(3, 8, 36, 3), width_factor=2),
    "resnetv2_152x4_bit": dict(depths=(3, 8, 36, 3), width_factor=4),
}
_PLAIN = dict(conv_kind="plain", norm="batch", stem="")
_BASIC = dict(channels=(64, 128, 256, 512), basic=True, bottle_ratio=1.0)
_DEEP = dict(stem="deep", avg_down=True)
# timm's plain pre-activation ResNets (create_conv2d, BatchNormAct2d / GroupNormAct)
ARCHS.update({
    "resnetv2_18": dict(depths=(2, 2, 2, 2), **_BASIC, **_PLAIN),
    "resnetv2_18d": dict(depths=(2, 2, 2, 2), **_BASIC, **{**_PLAIN, **_DEEP}),
    "resnetv2_34": dict(depths=(3, 4, 6, 3), **_BASIC, **_PLAIN),
    "resnetv2_34d": dict(depths=(3, 4, 6, 3), **_BASIC, **{**_PLAIN, **_DEEP}),
    "resnetv2_50": dict(depths=(3, 4, 6, 3), **_PLAIN),
    "resnetv2_50d": dict(depths=(3, 4, 6, 3), **{**_PLAIN, **_DEEP}),
    "resnetv2_101": dict(depths=(3, 4, 23, 3), **_PLAIN),
    "resnetv2_101d": dict(depths=(3, 4, 23, 3), **{**_PLAIN, **_DEEP}),
    "resnetv2_50d_gn": dict(depths=(3, 4, 6, 3), **{**_PLAIN, **_DEEP, "norm": "group"}),
    "resnetv2_50d_evos": dict(depths=(3, 4, 6, 3), **{**_PLAIN, **_DEEP, "norm": "evos"}),
})

# every timm tag of the architectures (eval transforms from timm's pretrained_cfg).
PRETRAINED: dict[str, dict] = pretrained.timm_tags(
    [a for a in ARCHS if a in pretrained.TIMM_TAGS_BY_MODEL])

DOWNLOAD_HINT = ("BiT ResNetV2 weights: timm's https://huggingface.co/timm/resnetv2_<depth>x"
                 "<width>_bit.<tag> model.safetensors (see fi_jax.models.resnetv2.PRETRAINED)")


def make_divisible(v: float, divisor: int = 8) -> int:
  """timm's make_divisible (round to the nearest multiple, never below 90% of `v`)."""
  new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
  return new_v + divisor if new_v < 0.9 * v else new_v


class StdConv(nn.Module):
  """timm StdConv2d: the kernel standardised per output filter (biased variance, eps) at
  every call, then a conv with symmetric padding ((stride - 1) + (k - 1)) // 2, no bias."""
  features: int
  kernel: int
  stride: int = 1
  eps: float = 1e-8
  dtype: str = "float32"
  precision: Any = blocks.HIGHEST

  @nn.compact
  def __call__(self, x):
    k = self.kernel
    w = self.param("kernel", nn.initializers.lecun_normal(), (k, k, x.shape[-1], self.features),
                   jnp.float32)
    mean = jnp.mean(w, axis=(0, 1, 2), keepdims=True)
    var = jnp.mean(jnp.square(w - mean), axis=(0, 1, 2), keepdims=True)
    w = (w - mean) * jax.lax.rsqrt(var + self.eps)
    p = ((self.stride - 1) + (k - 1)) // 2
    cdt = blocks.compute_dtype(self.dtype)
    return jax.lax.conv_general_dilated(
        x.astype(cdt), w.astype(cdt), (self.stride, self.stride), ((p, p), (p, p)),
        dimension_numbers=("NHWC", "HWIO", "NHWC"), precision=self.precision)


class GroupNormAct(nn.Module):
  """torch GroupNorm(groups, eps) (statistics in float32) followed by ReLU (`relu=False`:
  the GroupNorm alone)."""
  groups: int = 32
  eps: float = 1e-5
  relu: bool = True

  @nn.compact
  def __call__(self, x):
    c = x.shape[-1]
    if c % self.groups:
      raise ValueError(f"GroupNorm: {c} channels are not divisible by {self.groups} groups.")
    scale = self.param("scale", nn.initializers.ones, (c,), jnp.float32)
    bias = self.param("bias", nn.initializers.zeros, (c,), jnp.float32)
    y = x.astype(jnp.float32).reshape(*x.shape[:-1], self.groups, c // self.groups)
    mean = jnp.mean(y, axis=(1, 2, 4), keepdims=True)
    var = jnp.mean(jnp.square(y - mean), axis=(1, 2, 4), keepdims=True)
    y = ((y - mean) * jax.lax.rsqrt(var + self.eps)).reshape(x.shape) * scale + bias
    return (nn.relu(y) if self.relu else y).astype(x.dtype)


class EvoNormS0(nn.Module):
  """timm EvoNorm2dS0 (its own non-linearity): x * sigmoid(v * x) / group_std(x) * scale +
  bias, group_std over `groups` channel groups and H, W (biased variance + eps, float32)."""
  groups: int = 32
  eps: float = 1e-5
  apply_act: bool = True          # False: no `v`, x / group_std(x) * scale + bias

  @nn.compact
  def __call__(self, x):
    c = x.shape[-1]
    if c % self.groups:
      raise ValueError(f"EvoNorm: {c} channels are not divisible by {self.groups} groups.")
    scale = self.param("scale", nn.initializers.ones, (c,), jnp.float32)
    bias = self.param("bias", nn.initializers.zeros, (c,), jnp.float32)
    xf = x.astype(jnp.float32)
    g = xf.reshape(*x.shape[:-1], self.groups, c // self.groups)
    mean = jnp.mean(g, axis=(1, 2, 4), keepdims=True)
    var = jnp.mean(jnp.square(g - mean), axis=(1, 2, 4), keepdims=True)
    std = jnp.broadcast_to(jnp.sqrt(var + self.eps), g.shape).reshape(x.shape)
    if self.apply_act:
      v = self.param("v", nn.initializers.ones, (c,), jnp.float32)
      xf = xf * nn.sigmoid(xf * v)
    y = xf / std
    return (y * scale + bias).astype(x.dtype)


def _norm_act(norm: str, groups: int, eps: float, name: str):
  """GroupNormAct (BiT, '_gn'), EvoNormS0 ('_evos') or an eval-mode BatchNorm + ReLU (timm
  BatchNormAct2d), made in the calling module's scope as `name`."""
  if norm == "group":
    return GroupNormAct(groups, eps, name=name)
  if norm == "evos":
    return EvoNormS0(groups, eps, name=name)
  bn = blocks.BatchNorm(eps, name=name)
  return lambda x: nn.relu(bn(x))


class PreActBlock(nn.Module):
  """timm PreActBottleneck (stride on the 3x3 conv) and PreActBasic (`basic`: 3x3 (stride)
  -> norm-act -> 3x3): x_pre = norm1(x); the shortcut is x, or on a projecting block a 1x1
  conv (stride) of x_pre, or of the 2x2 ceil-mode average pool of x_pre (`avg_down`)."""
  features: int
  stride: int = 1
  proj: bool = False
  bottle_ratio: float = 0.25
  groups: int = 32                # GroupNorm groups
  gn_eps: float = 1e-5
  ws_eps: float = 1e-8
  basic: bool = False
  conv_kind: str = "std"          # "std" (StdConv2d) | "plain"
  norm: str = "group"             # "group" | "batch" | "evos"
  avg_down: bool = False
  dtype: str = "float32"
  precision: Any = blocks.HIGHEST

  @nn.compact
  def __call__(self, x):
    conv = _conv_factory(self.conv_kind, self.ws_eps, self.dtype, self.precision)
    norm = functools.partial(_norm_act, self.norm, self.groups, self.gn_eps)
    mid = make_divisible(self.features * self.bottle_ratio)
    x_pre = norm(name="norm1")(x)
    shortcut = x
    if self.proj:
      s = x_pre
      if self.avg_down:
        s = blocks.avg_pool_ceil(s, 2, self.stride) if self.stride > 1 else s
      shortcut = conv(self.features, 1, 1 if self.avg_down else self.stride,
                      name="downsample_conv")(s)
    if self.basic:
      y = norm(name="norm2")(conv(mid, 3, self.stride, name="conv1")(x_pre))
      return conv(self.features, 3, name="conv2")(y) + shortcut
    y = norm(name="norm2")(conv(mid, 1, name="conv1")(x_pre))
    y = norm(name="norm3")(conv(mid, 3, self.stride, name="conv2")(y))
    return conv(self.features, 1, name="conv3")(y) + shortcut


PreActBottleneck = PreActBlock


def _conv_factory(kind: str, ws_eps: float, dtype: str, precision: Any):
  if kind == "std":
    return functools.partial(StdConv, eps=ws_eps, dtype=dtype, precision=precision)
  return lambda features, kernel, stride=1, name=None: blocks.conv(
      features, kernel, stride, dtype=blocks.compute_dtype(dtype), precision=precision,
      name=name)


class ResNetV2(nn.Module):
  """timm ResNetV2 (pre-activation): stem, 4 stages (the first block of each projects where
  the shape changes), norm-act, pool, head. BiT: StdConv2d + GroupNorm, 'fixed' stem; the
  plain ones (resnetv2_18 / 34 / 50 / 101[d], 50d_gn): plain convs, BatchNorm (or GroupNorm),
  7x7 or 'deep' stem (3x3 convs of stem_width / 2, stem_width / 2, stem_width, norm-act
  between), max pool padding 1."""
  num_classes: Optional[int] = 1000
  depths: Sequence[int] = (3, 4, 6, 3)
  channels: Sequence[int] = (256, 512, 1024, 2048)
  width_factor: int = 1
  stem_width: int = 64
  stem: str = "fixed"             # "fixed" (BiT: zero pad 1 + max pool) | "" | "deep"
  bottle_ratio: float = 0.25
  groups: int = 32                # GroupNorm groups
  gn_eps: float = 1e-5
  ws_eps: float = 1e-8            # StdConv2d eps of timm's BiT models
  basic: bool = False             # PreActBasic blocks (resnetv2_18 / 34)
  conv_kind: str = "std"          # "std" | "plain"
  norm: str = "group"             # "group" | "batch" | "evos"
  avg_down: bool = False
  dtype: str = "float32"
  precision: Any = blocks.HIGHEST

  @nn.compact
  def __call__(self, images, *, train: bool = False):
    del train   # inference only
    if self.stem not in ("fixed", "", "deep"):
      raise ValueError(f"stem must be 'fixed' (BiT), '' or 'deep', got {self.stem!r}.")
    if self.conv_kind not in ("std", "plain") or self.norm not in ("group", "batch", "evos"):
      raise ValueError(f"conv_kind must be 'std' or 'plain' and norm 'group', 'batch' or "
                       f"'evos', got "
                       f"{self.conv_kind!r}, {self.norm!r}.")
    conv = _conv_factory(self.conv_kind, self.ws_eps, self.dtype, self.precision)
    out = {}
    x = jnp.asarray(images, blocks.compute_dtype(self.dtype))
    width = make_divisible(self.stem_width * self.width_factor)
    if self.stem == "deep":
      x = _norm_act(self.norm, self.groups, self.gn_eps, "stem_norm1")(
          conv(width // 2, 3, 2, name="stem_conv1")(x))
      x = _norm_act(self.norm, self.groups, self.gn_eps, "stem_norm2")(
          conv(width // 2, 3, name="stem_conv2")(x))
      x = conv(width, 3, name="stem_conv3")(x)
    else:
      x = conv(width, 7, 2, name="stem_conv")(x)
    if self.stem == "fixed":
      x = blocks.max_pool(jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0))), 3, 2, 0)
    else:
      x = blocks.max_pool(x, 3, 2, 1)
    out["stem"] = x
    prev = width
    for s, (depth, c) in enumerate(zip(self.depths, self.channels)):
      features = make_divisible(c * self.width_factor)
      for b in range(depth):
        stride = 2 if s > 0 and b == 0 else 1
        proj = b == 0 and (not self.basic or stride != 1 or prev != features)
        x = PreActBlock(features, stride, proj, self.bottle_ratio, self.groups, self.gn_eps,
                        self.ws_eps, self.basic, self.conv_kind, self.norm, self.avg_down,
                        self.dtype, self.precision, name=f"stage{s}_{b}")(x)
        prev = features
      out[f"stage{s + 1}"] = x
    x = _norm_act(self.norm, self.groups, self.gn_eps, "norm")(x)
    x = out["pre_logits"] = blocks.global_avg_pool(x)
    if self.num_classes:
      x = out["logits"] = nn.Dense(self.num_classes, precision=self.precision, name="head")(x)
    return x, out


def Model(num_classes: Optional[int] = 1000, *, variant: str, **kw) -> ResNetV2:
  """`Model(1000, variant="resnetv2_50x1_bit")`; `kw` overrides ARCHS fields (e.g. dtype)."""
  if variant not in ARCHS:
    raise ValueError(f"Unknown ResNetV2 variant {variant!r}; known: {sorted(ARCHS)}.")
  return ResNetV2(num_classes, **{**ARCHS[variant], **kw})


def load(init_params, init_file: str, model_cfg: Optional[Mapping[str, Any]] = None,
         dont_load: Sequence[str] = ()) -> dict:
  """timm ResNetV2 state dict (.safetensors / .pth) -> params on `init_params`'s tree (arrays
  or ShapeDtypeStructs). A model without a head (num_classes=None) drops the file's
  `head.fc`; other mismatches raise CheckpointError naming the key and the file."""
  del model_cfg   # timm is the only source
  init_params = jax.device_get(init_params)
  sd = readers.read_state_dict(init_file, hint=DOWNLOAD_HINT)
  where: dict[str, str] = {}
  flat = convert_resnetv2.convert(sd, source=init_file, hint=DOWNLOAD_HINT, where=where)
  return convert_resnet.merge(flat, init_params, init_file, DOWNLOAD_HINT, dont_load, sd=sd,
                              where=where,
                              torch_module=convert_resnetv2.torch_module)
