"""EfficientNet (B0-B7) and EfficientNetV2 (S/M/L) as in torchvision and timm, and the other
models timm builds from its arch strings (MnasNet, MobileNet V1-V4, MixNet, EfficientNet-Lite /
-EdgeTPU / -CondConv / -X, FBNet, LCNet, TinyNet, ...: `_efficientnet_defs`), in Flax.

One module covers both libraries: a stem conv, stages of blocks, a 1x1 head conv, global
average pooling and the `head` Dense (MobileNetV3 / V4: pooling before the head conv; see
`_Model`). The blocks use timm's vocabulary (torchvision builds the first four kinds under
other names; the arch-string models add options and the 'uir' / 'mqa' kinds, see `MBBlock` and
`_efficientnet_defs`):

  'ds' depthwise-separable  conv_dw(k, s) bn1 act | se | conv_pw bn2   (MBConv, expand 1)
  'ir' inverted residual    conv_pw bn1 act | conv_dw(k, s) bn2 act | se | conv_pwl bn3  (MBConv)
  'er' edge residual        conv_exp(k, s) bn1 act | se | conv_pwl bn2   (FusedMBConv)
  'cn' conv-bn-act          conv(k, s) bn1 act   (FusedMBConv, expand 1)

with a residual when the block keeps stride 1 and width (and, for 'cn', when asked). Each
variant's block list comes from the libraries' architecture tables (below) and their width /
depth rounding; `ARCHS` holds the result. timm's `tf_` ports pad like TensorFlow ("SAME":
asymmetric, input-size dependent) and use BatchNorm eps 1e-3; torchvision uses eps 1e-5 for
B0-B4 and 1e-3 for B5-B7 and V2.

BatchNorm runs on the stored running statistics, which live in `params` (`scale`, `bias`,
`mean`, `var`). `apply({'params': p}, images_nhwc)` returns `(logits, out)` with
`out['pre_logits']` the pooled features fed to the classifier.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.data import preprocess
from fi_jax.models import _blocks
from fi_jax.models import _checkpoints as checkpoints
from fi_jax.models import _efficientnet_defs as defs
from fi_jax.models import _pretrained as pretrained
from fi_jax.models.convert import efficientnet as convert
from fi_jax.models.convert import readers

# One block: (kind, kernel, stride, in_chs, mid_chs, out_chs, se_chs, residual[, opts]) (opts:
# see fi_jax/models/_efficientnet_defs.py).
Block = tuple


# ----------------------------------------------------------------------------- architectures

def make_divisible(v: float, divisor: int = 8, round_limit: float = 0.9) -> int:
  """Nearest multiple of `divisor` (at least `divisor`), never below round_limit * v."""
  new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
  return new_v + divisor if new_v < round_limit * v else new_v


# torchvision rows: (fused, expand_ratio, kernel, stride, in_chs, out_chs, num_layers).
_TV_B = ((0, 1, 3, 1, 32, 16, 1), (0, 6, 3, 2, 16, 24, 2), (0, 6, 5, 2, 24, 40, 2),
         (0, 6, 3, 2, 40, 80, 3), (0, 6, 5, 1, 80, 112, 3), (0, 6, 5, 2, 112, 192, 4),
         (0, 6, 3, 1, 192, 320, 1))
_TV_V2 = {
    "s": ((1, 1, 3, 1, 24, 24, 2), (1, 4, 3, 2, 24, 48, 4), (1, 4, 3, 2, 48, 64, 4),
          (0, 4, 3, 2, 64, 128, 6), (0, 6, 3, 1, 128, 160, 9), (0, 6, 3, 2, 160, 256, 15)),
    "m": ((1, 1, 3, 1, 24, 24, 3), (1, 4, 3, 2, 24, 48, 5), (1, 4, 3, 2, 48, 80, 5),
          (0, 4, 3, 2, 80, 160, 7), (0, 6, 3, 1, 160, 176, 14), (0, 6, 3, 2, 176, 304, 18),
          (0, 6, 3, 1, 304, 512, 5)),
    "l": ((1, 1, 3, 1, 32, 32, 4), (1, 4, 3, 2, 32, 64, 7), (1, 4, 3, 2, 64, 96, 7),
          (0, 4, 3, 2, 96, 192, 10), (0, 6, 3, 1, 192, 224, 19), (0, 6, 3, 2, 224, 384, 25),
          (0, 6, 3, 1, 384, 640, 7)),
}
# (width, depth) multipliers of B0..B7 (torchvision and timm agree).
_B_SCALES = ((1.0, 1.0), (1.0, 1.1), (1.1, 1.2), (1.2, 1.4), (1.4, 1.8), (1.6, 2.2),
             (1.8, 2.6), (2.0, 3.1))


def torchvision_arch(rows: Sequence[Sequence], width_mult: float = 1.0, depth_mult: float = 1.0,
                     last_channel: Optional[int] = None, bn_eps: float = 1e-5) -> dict:
  """Module kwargs of torchvision's `EfficientNet(inverted_residual_setting, ...)`.

  `rows`: (fused, expand_ratio, kernel, stride, in_chs, out_chs, num_layers) per stage as in
  torchvision's MBConvConfig / FusedMBConvConfig (width/depth multipliers only apply to
  MBConv rows, as there). SE squeezes to max(1, block input // 4) channels.
  """
  stages = []
  for fused, exp, k, s, cin, cout, n in rows:
    if not fused:
      cin, cout = make_divisible(cin * width_mult), make_divisible(cout * width_mult)
      n = int(math.ceil(n * depth_mult))
    blocks = []
    for i in range(n):
      c_in, stride = (cin, s) if i == 0 else (cout, 1)
      mid = make_divisible(c_in * exp)
      res = stride == 1 and c_in == cout
      if fused:
        kind = "er" if mid != c_in else "cn"
        blocks.append((kind, k, stride, c_in, mid, cout, 0, res))
      else:
        kind = "ir" if mid != c_in else "ds"
        blocks.append((kind, k, stride, c_in, mid, cout, max(1, c_in // 4), res))
    stages.append(tuple(blocks))
  stem = stages[0][0][3]
  head = last_channel if last_channel is not None else 4 * stages[-1][-1][5]
  return dict(stem_chs=stem, stages=tuple(stages), head_chs=head, bn_eps=bn_eps, same_pad=False)


# timm arch defs: (kind, repeats, kernel, stride, exp_ratio, out_chs, se_ratio, skip) per stage;
# plus stem size, head size (None: no head conv), whether the multiplier rounds the head, and
# make_divisible's round_limit.
_TIMM_B = (("ds", 1, 3, 1, 1, 16, .25, None), ("ir", 2, 3, 2, 6, 24, .25, None),
           ("ir", 2, 5, 2, 6, 40, .25, None), ("ir", 3, 3, 2, 6, 80, .25, None),
           ("ir", 3, 5, 1, 6, 112, .25, None), ("ir", 4, 5, 2, 6, 192, .25, None),
           ("ir", 1, 3, 1, 6, 320, .25, None))
_TIMM_V2_S = (("cn", 2, 3, 1, 1, 24, 0, True), ("er", 4, 3, 2, 4, 48, 0, None),
              ("er", 4, 3, 2, 4, 64, 0, None), ("ir", 6, 3, 2, 4, 128, .25, None),
              ("ir", 9, 3, 1, 6, 160, .25, None), ("ir", 15, 3, 2, 6, 256, .25, None))
_TIMM_DEFS = {
    "efficientnet": dict(rows=_TIMM_B, stem=32, head=1280, round_head=True, round_limit=0.9),
    "efficientnetv2_s": dict(rows=_TIMM_V2_S, stem=24, head=1280, round_head=True,
                             round_limit=0.9),
    "efficientnetv2_rw": dict(rows=(("er", 2, 3, 1, 1, 24, 0, None),) + _TIMM_V2_S[1:-1]
                              + (("ir", 15, 3, 2, 6, 272, .25, None),),
                              stem=24, head=1792, round_head=True, round_limit=0.9),
    "efficientnetv2_m": dict(
        rows=(("cn", 3, 3, 1, 1, 24, 0, True), ("er", 5, 3, 2, 4, 48, 0, None),
              ("er", 5, 3, 2, 4, 80, 0, None), ("ir", 7, 3, 2, 4, 160, .25, None),
              ("ir", 14, 3, 1, 6, 176, .25, None), ("ir", 18, 3, 2, 6, 304, .25, None),
              ("ir", 5, 3, 1, 6, 512, .25, None)),
        stem=24, head=1280, round_head=False, round_limit=0.9),
    "efficientnetv2_l": dict(
        rows=(("cn", 4, 3, 1, 1, 32, 0, True), ("er", 7, 3, 2, 4, 64, 0, None),
              ("er", 7, 3, 2, 4, 96, 0, None), ("ir", 10, 3, 2, 4, 192, .25, None),
              ("ir", 19, 3, 1, 6, 224, .25, None), ("ir", 25, 3, 2, 6, 384, .25, None),
              ("ir", 7, 3, 1, 6, 640, .25, None)),
        stem=32, head=1280, round_head=False, round_limit=0.9),
    "efficientnetv2_base": dict(
        rows=(("cn", 1, 3, 1, 1, 16, 0, True), ("er", 2, 3, 2, 4, 32, 0, None),
              ("er", 2, 3, 2, 4, 48, 0, None), ("ir", 3, 3, 2, 4, 96, .25, None),
              ("ir", 5, 3, 1, 6, 112, .25, None), ("ir", 8, 3, 2, 6, 192, .25, None)),
        stem=32, head=1280, round_head=True, round_limit=0.0),
}


def timm_arch(family: str, channel_multiplier: float = 1.0,
              depth_multiplier: float | Sequence[float] = 1.0, tf: bool = False) -> dict:
  """Module kwargs of timm's `_gen_<family>(channel_multiplier, depth_multiplier)`; `tf`: the
  `tf_` ports (TensorFlow "SAME" padding, BatchNorm eps 1e-3).

  Repeats scale by ceil, widths by make_divisible(c * multiplier, 8) (stem included), and SE
  squeezes to round(mid * se_ratio / exp_ratio) channels, all as timm computes them.
  """
  if family not in _TIMM_DEFS:
    raise ValueError(f"Unknown timm EfficientNet family {family!r}; known: {sorted(_TIMM_DEFS)}.")
  d = _TIMM_DEFS[family]
  rows = d["rows"]
  depths = (tuple(depth_multiplier) if isinstance(depth_multiplier, (tuple, list))
            else (depth_multiplier,) * len(rows))
  chs = lambda c: make_divisible(c * channel_multiplier, 8, d["round_limit"])
  stem = chs(d["stem"])
  cin, stages = stem, []
  for (kind, r, k, s, exp, cout, se, skip), dm in zip(rows, depths):
    cout = chs(cout)
    blocks = []
    for i in range(int(math.ceil(r * dm))):
      stride = s if i == 0 else 1
      mid = cin if kind in ("ds", "cn") else make_divisible(cin * float(exp))
      se_chs = round(mid * (se / float(exp))) if se else 0
      res = stride == 1 and cin == cout and (skip is True if kind == "cn" else skip is not False)
      blocks.append((kind, k, stride, cin, mid, cout, se_chs, res))
      cin = cout
    stages.append(tuple(blocks))
  head = d["head"] and (chs(d["head"]) if d["round_head"] else d["head"])
  return dict(stem_chs=stem, stages=tuple(stages), head_chs=head,
              bn_eps=1e-3 if tf else 1e-5, same_pad=tf)


def _archs() -> dict[str, dict]:
  archs = {}
  for i, (w, dm) in enumerate(_B_SCALES):
    eps = 1e-3 if i >= 5 else 1e-5     # torchvision: B5-B7 were ported from TF (lukemelas)
    archs[f"efficientnet_b{i}"] = {**torchvision_arch(_TV_B, w, dm, bn_eps=eps),
                                   "source": "torchvision"}
    archs[f"timm/efficientnet_b{i}"] = {**timm_arch("efficientnet", w, dm), "source": "timm"}
    archs[f"timm/tf_efficientnet_b{i}"] = {**timm_arch("efficientnet", w, dm, tf=True),
                                           "source": "timm"}
  # timm's larger TF ports (EfficientNet paper's B8 and Noisy Student's L2)
  for name, (w, dm) in (("b8", (2.2, 3.6)), ("l2", (4.3, 5.3))):
    archs[f"timm/tf_efficientnet_{name}"] = {**timm_arch("efficientnet", w, dm, tf=True),
                                             "source": "timm"}
  for s in "sml":
    archs[f"efficientnet_v2_{s}"] = {**torchvision_arch(_TV_V2[s], last_channel=1280,
                                                        bn_eps=1e-3), "source": "torchvision"}
    archs[f"timm/efficientnetv2_{s}"] = {**timm_arch(f"efficientnetv2_{s}"), "source": "timm"}
    archs[f"timm/tf_efficientnetv2_{s}"] = {**timm_arch(f"efficientnetv2_{s}", tf=True),
                                            "source": "timm"}
  archs["timm/efficientnetv2_rw_t"] = {**timm_arch("efficientnetv2_s", 0.8, 0.9), "source": "timm"}
  archs["timm/efficientnetv2_rw_s"] = {**timm_arch("efficientnetv2_rw"), "source": "timm"}
  archs["timm/efficientnetv2_rw_m"] = {
      **timm_arch("efficientnetv2_rw", 1.2, (1.2,) * 4 + (1.6,) * 2), "source": "timm"}
  for i, (w, dm) in enumerate(_B_SCALES[:4]):
    archs[f"timm/tf_efficientnetv2_b{i}"] = {**timm_arch("efficientnetv2_base", w, dm, tf=True),
                                             "source": "timm"}
  # the rest of timm's arch-def built models (MnasNet, MobileNet V1-V4, MixNet, Lite, EdgeTPU,
  # FBNet, LCNet, TinyNet, ...): fi_jax.models._efficientnet_defs
  for name in defs.GENERATORS:
    archs[f"timm/{name}"] = {**defs.timm_model_arch(name), "source": "timm"}
  for name in defs.PRUNED:
    archs[f"timm/{name}"] = {**defs.pruned_arch(name), "source": "timm"}
  return archs


# Variant -> module kwargs ("source" is for `load`, not the module). torchvision names as in
# torchvision.models ("efficientnet_b0", "efficientnet_v2_s"); timm names with a "timm/" prefix
# (timm's efficientnet_b* widths equal torchvision's, but the tf_ ports pad differently).
ARCHS: dict[str, dict] = _archs()


# ----------------------------------------------------------------------------- pretrained

_IN_MEAN, _IN_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
_HALF = (0.5, 0.5, 0.5)


def _tv(variant: str, file: str, crop: int, resize: int, method: str, mean=_IN_MEAN,
        std=_IN_STD) -> dict:
  return dict(variant=variant, source="torchvision", num_classes=1000, input_size=crop,
              pp=preprocess.torchvision_pp(resize, crop, method, mean, std),
              url=f"https://download.pytorch.org/models/{file}")


# Published checkpoints: torchvision weight enums (transforms: resize_size, crop_size,
# interpolation) and timm pretrained_cfg (input_size, crop_pct, crop_mode, mean/std).
PRETRAINED: dict[str, dict] = {
    "torchvision/efficientnet_b0.IMAGENET1K_V1": _tv(
        "efficientnet_b0", "efficientnet_b0_rwightman-7f5810bc.pth", 224, 256, "bicubic"),
    "torchvision/efficientnet_b1.IMAGENET1K_V1": _tv(
        "efficientnet_b1", "efficientnet_b1_rwightman-bac287d4.pth", 240, 256, "bicubic"),
    "torchvision/efficientnet_b1.IMAGENET1K_V2": _tv(
        "efficientnet_b1", "efficientnet_b1-c27df63c.pth", 240, 255, "bilinear"),
    "torchvision/efficientnet_b2.IMAGENET1K_V1": _tv(
        "efficientnet_b2", "efficientnet_b2_rwightman-c35c1473.pth", 288, 288, "bicubic"),
    "torchvision/efficientnet_b3.IMAGENET1K_V1": _tv(
        "efficientnet_b3", "efficientnet_b3_rwightman-b3899882.pth", 300, 320, "bicubic"),
    "torchvision/efficientnet_b4.IMAGENET1K_V1": _tv(
        "efficientnet_b4", "efficientnet_b4_rwightman-23ab8bcd.pth", 380, 384, "bicubic"),
    "torchvision/efficientnet_b5.IMAGENET1K_V1": _tv(
        "efficientnet_b5", "efficientnet_b5_lukemelas-1a07897c.pth", 456, 456, "bicubic"),
    "torchvision/efficientnet_b6.IMAGENET1K_V1": _tv(
        "efficientnet_b6", "efficientnet_b6_lukemelas-24a108a5.pth", 528, 528, "bicubic"),
    "torchvision/efficientnet_b7.IMAGENET1K_V1": _tv(
        "efficientnet_b7", "efficientnet_b7_lukemelas-c5b4e57e.pth", 600, 600, "bicubic"),
    "torchvision/efficientnet_v2_s.IMAGENET1K_V1": _tv(
        "efficientnet_v2_s", "efficientnet_v2_s-dd5fe13b.pth", 384, 384, "bilinear"),
    "torchvision/efficientnet_v2_m.IMAGENET1K_V1": _tv(
        "efficientnet_v2_m", "efficientnet_v2_m-dc08266a.pth", 480, 480, "bilinear"),
    "torchvision/efficientnet_v2_l.IMAGENET1K_V1": _tv(
        "efficientnet_v2_l", "efficientnet_v2_l-59c71312.pth", 480, 480, "bicubic", _HALF, _HALF),
    # every timm tag of the timm architectures (ARCHS names them "timm/<model>")
    **pretrained.timm_tags({a.split("/", 1)[1]: a for a in ARCHS if a.startswith("timm/")
                            and a.split("/", 1)[1] in pretrained.TIMM_TAGS_BY_MODEL}),
}


# ----------------------------------------------------------------------------- modules

_ACTS = {"relu": nn.relu, "relu6": nn.relu6, "silu": nn.silu, "hard_swish": nn.hard_swish,
         "hard_sigmoid": nn.hard_sigmoid, "sigmoid": nn.sigmoid,
         "gelu": _blocks.gelu_exact}


def activation(x, act):
  """`act`: a name of `_ACTS` (torch's definitions: hard_swish = x * relu6(x + 3) / 6, gelu
  exact), True for SiLU, or None / False for none."""
  if act is True:
    return nn.silu(x)
  if not act:
    return x
  if act not in _ACTS:
    raise ValueError(f"Unknown activation {act!r}; known: {sorted(_ACTS)}.")
  return _ACTS[act](x)


def _split(n: int, parts: int) -> list[int]:
  """timm MixedConv2d's channel split: equal parts, the remainder to the first."""
  split = [n // parts] * parts
  split[0] += n - sum(split)
  return split


def conv(x, features: int, kernel, stride: int = 1, groups: int = 1, *, name: str,
         same_pad: bool = False, bias: bool = False, dtype: Any = jnp.float32,
         precision: Any = jax.lax.Precision.HIGHEST):
  """A timm `create_conv2d` conv as param `name` of the calling module. `groups=-1`:
  depthwise. A tuple `kernel` is timm's MixedConv2d: input and output channels split into
  len(kernel) parts (`_split`), part i convolved with kernel[i] (depthwise or dense) as param
  `<name>_<i>`, the results concatenated. Padding: TensorFlow "SAME" for the tf_ ports, else
  PyTorch's symmetric ((stride - 1) + (kernel - 1)) // 2."""
  if isinstance(kernel, (tuple, list)):
    ins, outs = _split(x.shape[-1], len(kernel)), _split(features, len(kernel))
    parts = jnp.split(x, list(np.cumsum(ins)[:-1]), axis=-1)
    return jnp.concatenate([
        conv(p, o, k, stride, groups, name=f"{name}_{i}", same_pad=same_pad, bias=bias,
             dtype=dtype, precision=precision)
        for i, (p, o, k) in enumerate(zip(parts, outs, kernel))], axis=-1)
  if same_pad:     # TensorFlow SAME: lax puts total // 2 before, the rest after (as TF)
    pad = "SAME"
  else:
    p = ((stride - 1) + (kernel - 1)) // 2
    pad = ((p, p), (p, p))
  if groups == -1 and features == x.shape[-1]:   # depthwise: fast on XLA:CPU too
    return _blocks.DepthwiseConv((kernel, kernel), (stride, stride), pad, use_bias=bias,
                                 dtype=dtype, precision=precision, name=name)(x)
  return nn.Conv(features, (kernel, kernel), (stride, stride), pad,
                 feature_group_count=x.shape[-1] if groups == -1 else groups, use_bias=bias,
                 dtype=dtype, param_dtype=jnp.float32, precision=precision, name=name)(x)


def anti_alias(x, kind: str, stride: int):
  """timm's anti-aliased downsampling after a strided conv's norm and activation (the conv
  then runs at stride 1): "avg" AvgPool2d(stride), "blurpc" BlurPool2d (binomial 3x3 filter,
  zero padding 1, depthwise, strided)."""
  if kind == "avg":
    return nn.avg_pool(x, (stride, stride), strides=(stride, stride))
  if kind == "blurpc":
    f = np.array([1.0, 2.0, 1.0]) / 4
    kernel = jnp.broadcast_to(jnp.asarray(np.outer(f, f), jnp.float32)[:, :, None, None],
                              (3, 3, 1, x.shape[-1]))
    y = _blocks.shifted_depthwise(x, kernel, (stride, stride), ((1, 1), (1, 1)))
    return y.astype(x.dtype)
  raise ValueError(f"Unknown anti-aliasing {kind!r}; use 'avg' or 'blurpc'.")


class EvoNormS0(nn.Module):
  """timm's EvoNorm2dS0: x * sigmoid(v * x) / group_std(x) * scale + bias (with `act`), else
  only the affine scale and bias."""
  groups: int
  eps: float = 1e-5
  act: bool = True

  @nn.compact
  def __call__(self, x):
    c, dtype = x.shape[-1], x.dtype
    scale = self.param("scale", nn.initializers.ones, (c,), jnp.float32)
    bias = self.param("bias", nn.initializers.zeros, (c,), jnp.float32)
    if self.act:
      v = self.param("v", nn.initializers.ones, (c,), jnp.float32)
      xf = x.astype(jnp.float32)
      g = xf.reshape(x.shape[:-1] + (self.groups, c // self.groups))
      std = jnp.sqrt(jnp.var(g, axis=(1, 2, 4), keepdims=True) + self.eps)
      x = (xf * nn.sigmoid(xf * v) / jnp.broadcast_to(std, g.shape).reshape(x.shape))
    return (x * scale + bias).astype(dtype)


def norm_act(x, norm: str, eps: float, act: Any, name: str):
  """Norm layer `name` then `activation(act)`. `norm`: "bn" (BatchNorm, running statistics),
  or timm's normalisations of its test models: "gn<g>" GroupNormAct with <g> channels per
  group, "ln" LayerNormAct2d (over channels), "evos<g>" EvoNorm2dS0 (its own nonlinearity in
  place of `act`)."""
  if norm == "bn":
    return activation(_blocks.BatchNorm(eps, name=name)(x), act)
  if norm == "ln":
    return activation(nn.LayerNorm(eps, param_dtype=jnp.float32, name=name)(x), act)
  if norm.startswith("gn"):
    y = nn.GroupNorm(x.shape[-1] // int(norm[2:]), epsilon=eps, param_dtype=jnp.float32,
                     name=name)(x)
    return activation(y, act)
  if norm.startswith("evos"):
    return EvoNormS0(x.shape[-1] // int(norm[4:]), eps, bool(act), name=name)(x)
  raise ValueError(f"Unknown norm {norm!r}; use bn, ln, gn<group size> or evos<group size>.")


def conv_bn(x, features: int, kernel=1, stride: int = 1, groups: int = 1,
            act: Any = True, *, conv_name: str, bn_name: str, bn_eps: float = 1e-5,
            same_pad: bool = False, aa: Optional[str] = None, norm: str = "bn",
            dtype: Any = jnp.float32, precision: Any = jax.lax.Precision.HIGHEST):
  """`conv` (no bias) -> `norm_act` (BatchNorm, `activation(act)`, True: SiLU), as sibling
  params `conv_name`, `bn_name` of the calling module; with `aa` a strided conv runs at stride
  1 and `anti_alias` downsamples after the activation."""
  use_aa = aa is not None and stride > 1
  x = conv(x, features, kernel, 1 if use_aa else stride, groups, name=conv_name,
           same_pad=same_pad, dtype=dtype, precision=precision)
  x = norm_act(x, norm, bn_eps, act, bn_name)
  return anti_alias(x, aa, stride) if use_aa else x


class CondConv(nn.Module):
  """timm's CondConv2d: a conv whose kernel is a per-sample mix of `experts` kernels,
  sum_e routing[b, e] * kernel[e]. `kernel` keeps timm's layout [experts, out * in / groups *
  kh * kw] (torch's (out, in / groups, kh, kw) order flattened). The 1x1 convs run as
  per-sample matmuls, the depthwise ones as shifted slices times per-sample weights (as
  `_blocks.DepthwiseConv`, accumulated in float32)."""
  features: int
  kernel_size: int
  stride: int = 1
  groups: int = 1
  experts: int = 1
  same_pad: bool = False
  dtype: Any = jnp.float32
  precision: Any = jax.lax.Precision.HIGHEST

  @nn.compact
  def __call__(self, x, routing):
    k, cin = self.kernel_size, x.shape[-1]
    groups = cin if self.groups == -1 else self.groups
    shape = (self.features, cin // groups, k, k)
    kernel = self.param("kernel", nn.initializers.lecun_normal(),
                        (self.experts, int(np.prod(shape))), jnp.float32)
    w = jnp.einsum("be,ek->bk", routing, kernel, precision=self.precision)
    w = w.reshape((-1,) + shape).transpose(0, 3, 4, 2, 1)   # [B, kh, kw, in / groups, out]
    p = ((self.stride - 1) + (k - 1)) // 2
    pad = "SAME" if self.same_pad else ((p, p), (p, p))
    if k == 1 and groups == 1 and self.stride == 1:   # pointwise: a per-sample matmul
      return jnp.einsum("bhwc,bco->bhwo", x.astype(self.dtype), w[:, 0, 0].astype(self.dtype),
                        precision=self.precision)
    if groups == cin == self.features:   # depthwise: shifted slices times per-sample weights
      (pt, pb), (pl, pr) = _blocks._pads(x.shape[1:3], (k, k), (self.stride,) * 2, pad)
      xp = jnp.pad(x.astype(jnp.float32), ((0, 0), (pt, pb), (pl, pr), (0, 0)))
      oh, ow = (xp.shape[1] - k) // self.stride + 1, (xp.shape[2] - k) // self.stride + 1
      sl = lambda i, n: slice(i, i + (n - 1) * self.stride + 1, self.stride)
      y = sum(xp[:, sl(i, oh), sl(j, ow), :] * w[:, i, j, 0][:, None, None, :].astype(jnp.float32)
              for i in range(k) for j in range(k))
      return y.astype(self.dtype)
    raise ValueError(f"CondConv is ported for 1x1 stride-1 and depthwise convs (timm's "
                     f"CondConvResidual), not kernel {k}, stride {self.stride}, groups {groups}.")


class SqueezeExcite(nn.Module):
  """x * gate(conv_expand(act(conv_reduce(mean_hw(x))))) (timm's defaults: SiLU, sigmoid)."""
  reduced: int
  dtype: Any = jnp.float32
  precision: Any = jax.lax.Precision.HIGHEST
  act: str = "silu"
  gate: str = "sigmoid"

  @nn.compact
  def __call__(self, x):
    conv = lambda c, name: nn.Conv(c, (1, 1), dtype=self.dtype, param_dtype=jnp.float32,
                                   precision=self.precision, name=name)
    s = jnp.mean(x.astype(jnp.float32), axis=(1, 2), keepdims=True).astype(x.dtype)
    s = conv(x.shape[-1], "conv_expand")(activation(conv(self.reduced, "conv_reduce")(s),
                                                    self.act))
    return x * activation(s, self.gate)


class GlobalContext(nn.Module):
  """timm's GlobalContext attention in SE's place (fuse_scale): context = the softmax(
  conv_attn(x))-weighted mean over positions; x * gate(fc2(act(LayerNorm(fc1(context)))))."""
  reduced: int
  dtype: Any = jnp.float32
  precision: Any = jax.lax.Precision.HIGHEST
  act: str = "silu"
  gate: str = "sigmoid"

  @nn.compact
  def __call__(self, x):
    conv = lambda c, name: nn.Conv(c, (1, 1), dtype=jnp.float32, param_dtype=jnp.float32,
                                   precision=self.precision, name=name)
    b, h, w, c = x.shape
    xf = x.astype(jnp.float32)
    attn = jax.nn.softmax(conv(1, "conv_attn")(xf).reshape(b, h * w), axis=-1)
    ctx = jnp.einsum("bl,blc->bc", attn, xf.reshape(b, h * w, c),
                     precision=self.precision)[:, None, None, :]
    y = nn.LayerNorm(1e-6, param_dtype=jnp.float32, name="mlp_scale_norm")(
        conv(self.reduced, "mlp_scale_fc1")(ctx))
    y = conv(c, "mlp_scale_fc2")(activation(y, self.act))
    return x * activation(y, self.gate).astype(x.dtype)


class MBBlock(nn.Module):
  """One block of timm's vocabulary (see the module docstring and
  `fi_jax.models._efficientnet_defs` for `opts`); parameter names as timm's, with a dotted
  sub-layer path joined by '_' (timm `conv_dw.0` -> `conv_dw_0`, `pw_exp.bn` -> `pw_exp_bn`)."""
  kind: str
  kernel: Any
  stride: int
  mid: int
  out: int
  se: int
  residual: bool
  bn_eps: float = 1e-5
  same_pad: bool = False
  dtype: Any = jnp.float32
  precision: Any = jax.lax.Precision.HIGHEST
  act: str = "silu"
  se_gate: str = "sigmoid"
  se_act: Optional[str] = None
  opts: tuple = ()
  aa: Optional[str] = None
  norm: str = "bn"
  se_kind: str = "se"

  @nn.compact
  def __call__(self, x):
    o = dict(self.opts)
    act = o.get("act", self.act)
    kw = dict(bn_eps=self.bn_eps, same_pad=self.same_pad, dtype=self.dtype,
              precision=self.precision, norm=self.norm)
    attn = GlobalContext if self.se_kind == "gc" else SqueezeExcite
    se = lambda y: (attn(self.se, self.dtype, self.precision, self.se_act or act,
                         self.se_gate, name="se")(y) if self.se else y)
    k, s, kind = self.kernel, self.stride, self.kind
    aa = dict(aa=self.aa)   # timm passes its aa_layer to a block's strided spatial conv
    groups = o.get("groups", -1 if kind in ("ds", "ir", "uir") else 1)
    exp_k, pw_k = o.get("exp_k", 1), o.get("pw_k", 1)
    y = x
    if kind == "ds" and o.get("s2d"):   # space-to-depth start: convs padded "SAME"
      same = {**kw, "same_pad": True}
      y = conv_bn(y, self.mid, 2, 2, act=act, conv_name="conv_s2d", bn_name="bn_s2d", **same)
      y = conv_bn(y, self.mid, k, 1, groups, act, conv_name="conv_dw", bn_name="bn1", **same)
      y = conv_bn(se(y), self.out, pw_k, act=o.get("pw_act", False) and act,
                  conv_name="conv_pw", bn_name="bn2", **kw)
    elif kind == "ds":
      y = conv_bn(y, self.mid, k, s, groups, act, conv_name="conv_dw", bn_name="bn1", **aa, **kw)
      y = conv_bn(se(y), self.out, pw_k, act=o.get("pw_act", False) and act,
                  conv_name="conv_pw", bn_name="bn2", **kw)
    elif kind == "ir" and o.get("experts"):   # timm CondConvResidual
      y = self._cond_conv(x, o["experts"], act, se)
    elif kind == "ir":
      y = conv_bn(y, self.mid, exp_k, act=act, conv_name="conv_pw", bn_name="bn1", **kw)
      y = conv_bn(y, self.mid, k, s, groups, act, conv_name="conv_dw", bn_name="bn2", **aa, **kw)
      y = conv_bn(se(y), self.out, pw_k, act=False, conv_name="conv_pwl", bn_name="bn3", **kw)
    elif kind == "er":
      y = conv_bn(y, self.mid, k, s, groups, act, conv_name="conv_exp", bn_name="bn1", **aa,
                  **kw)
      y = conv_bn(se(y), self.out, pw_k, act=False, conv_name="conv_pwl", bn_name="bn2", **kw)
    elif kind == "cn":
      y = conv_bn(y, self.out, k, s, groups, act, conv_name="conv", bn_name="bn1", **aa, **kw)
    elif kind == "uir":   # timm UniversalInvertedResidual (MobileNetV4)
      k0, k1 = o.get("k_start", 0), o.get("k_end", 0)
      if k0:
        y = conv_bn(y, y.shape[-1], k0, 1 if k else s, groups, False,
                    conv_name="dw_start_conv", bn_name="dw_start_bn", **aa, **kw)
      y = conv_bn(y, self.mid, 1, act=act, conv_name="pw_exp_conv", bn_name="pw_exp_bn", **kw)
      if k:
        y = conv_bn(y, self.mid, k, s, groups, act, conv_name="dw_mid_conv",
                    bn_name="dw_mid_bn", **aa, **kw)
      y = conv_bn(y, self.out, 1, act=False, conv_name="pw_proj_conv", bn_name="pw_proj_bn",
                  **kw)
      if k1:
        y = conv_bn(y, self.out, k1, 1 if k0 or k else s, groups, False,
                    conv_name="dw_end_conv", bn_name="dw_end_bn", **kw)
    elif kind == "mqa":   # timm MobileAttention with MultiQueryAttention2d (MobileNetV4)
      y = _blocks.BatchNorm(self.bn_eps, name="norm")(y)
      y = self._mqa(y, o, k)
    else:
      raise ValueError(f"Unknown EfficientNet block kind {kind!r}; use ds, ir, er, cn, uir "
                       "or mqa.")
    if o.get("layer_scale"):
      y = y * self.param("layer_scale", nn.initializers.ones, (self.out,), jnp.float32
                         ).astype(y.dtype)
    return y + x if self.residual else y

  def _cond_conv(self, x, experts, act, se):
    """conv_pw, conv_dw, conv_pwl as CondConvs sharing one routing: sigmoid(routing_fn(mean
    of the block input))."""
    pooled = jnp.mean(x.astype(jnp.float32), axis=(1, 2))
    routing = nn.sigmoid(nn.Dense(experts, param_dtype=jnp.float32, precision=self.precision,
                                  name="routing_fn")(pooled))
    kw = dict(experts=experts, same_pad=self.same_pad, dtype=self.dtype, precision=self.precision)
    bn = lambda y, name, a: activation(_blocks.BatchNorm(self.bn_eps, name=name)(y), a)
    y = bn(CondConv(self.mid, 1, name="conv_pw", **kw)(x, routing), "bn1", act)
    y = bn(CondConv(self.mid, self.kernel, self.stride, -1, name="conv_dw", **kw)(y, routing),
           "bn2", act)
    return bn(CondConv(self.out, 1, name="conv_pwl", **kw)(se(y), routing), "bn3", False)

  def _mqa(self, x, o, k):
    """Multi-query attention over all positions: per-head queries, one shared key and value
    head (optionally from a depthwise-strided copy of the input), timm's channel order."""
    cv = lambda y, c, name: conv(y, c, 1, name=name, dtype=self.dtype, precision=self.precision)
    heads, dk, stride = o["heads"], o["key_dim"], o.get("kv_stride", 1)
    b, h, w, _ = x.shape

    def kv(name):
      y = x
      if stride > 1:
        y = conv(y, y.shape[-1], k, stride, -1, name=f"attn_{name}_down_conv",
                 same_pad=self.same_pad, dtype=self.dtype, precision=self.precision)
        y = _blocks.BatchNorm(self.bn_eps, name=f"attn_{name}_norm")(y)
      y = cv(y, dk, f"attn_{name}_proj")
      return y.reshape(b, -1, dk).astype(jnp.float32)

    q = cv(x, heads * dk, "attn_query_proj").reshape(b, h * w, heads, dk).astype(jnp.float32)
    keys, values = kv("key"), kv("value")
    logits = jnp.einsum("blhd,bpd->bhlp", q * dk ** -0.5, keys, precision=self.precision)
    attn = jax.nn.softmax(logits, axis=-1)
    y = jnp.einsum("bhlp,bpd->blhd", attn, values, precision=self.precision)
    y = y.reshape(b, h, w, heads * dk).astype(x.dtype)
    return cv(y, self.out, "attn_output_proj")


class _Model(nn.Module):
  """Stem, stages of `MBBlock`s and a head (see the module docstring). `head`: "conv" (timm
  EfficientNet, torchvision: conv-BN-act, then pooling), "pool_conv" (timm MobileNetV3: pooling,
  then a 1x1 conv (+bias) and the activation) or "pool_conv_bn" (MobileNetV4: pooling, conv,
  BN, activation); `head_chs` 0 / None: no head conv."""
  num_classes: Optional[int] = 1000
  stem_chs: int = 32
  stages: Sequence[Sequence[Block]] = ()
  head_chs: Optional[int] = 1280
  bn_eps: float = 1e-5
  same_pad: bool = False
  dtype: str = "float32"
  precision: Any = jax.lax.Precision.HIGHEST
  act: str = "silu"
  stem_kernel: int = 3
  head: str = "conv"
  head_bias: bool = True
  se_gate: str = "sigmoid"
  se_act: Optional[str] = None
  aa: Optional[str] = None
  norm: str = "bn"
  se_kind: str = "se"

  @nn.compact
  def __call__(self, images, train: bool = False):
    del train   # inference only: running BN statistics, no dropout / stochastic depth
    dtype = jnp.dtype(self.dtype)
    kw = dict(bn_eps=self.bn_eps, same_pad=self.same_pad, dtype=dtype, precision=self.precision,
              norm=self.norm)
    out = {}
    x = jnp.asarray(images, jnp.float32).astype(dtype)
    x = out["stem"] = conv_bn(x, self.stem_chs, self.stem_kernel, 2, act=self.act,
                              conv_name="stem_conv", bn_name="stem_bn", **kw)
    for i, stage in enumerate(self.stages):
      for j, (kind, k, s, cin, mid, cout, se, res, *opts) in enumerate(stage):
        if x.shape[-1] != cin:
          raise ValueError(f"Block {i}.{j} expects {cin} input channels, got {x.shape[-1]}.")
        x = MBBlock(kind, k, s, mid, cout, se, res, act=self.act, se_gate=self.se_gate,
                    se_act=self.se_act, opts=opts[0] if opts else (), aa=self.aa,
                    se_kind=self.se_kind,
                    name=f"blocks_{i}_{j}", **kw)(x)
      out[f"stage{i}"] = x
    if self.head not in ("conv", "pool_conv", "pool_conv_bn"):
      raise ValueError(f"Unknown head {self.head!r}; use conv, pool_conv or pool_conv_bn.")
    if self.head_chs and self.head == "conv":
      x = conv_bn(x, self.head_chs, act=self.act, conv_name="head_conv", bn_name="head_bn",
                  **kw)
    out["features"] = x
    x = jnp.mean(x.astype(jnp.float32), axis=(1, 2))
    if self.head_chs and self.head != "conv":
      y = x.astype(dtype)[:, None, None, :]
      if self.head == "pool_conv":
        y = conv(y, self.head_chs, 1, name="head_conv", bias=self.head_bias, dtype=dtype,
                 precision=self.precision)
      else:
        y = _blocks.BatchNorm(self.bn_eps, name="head_norm")(
            conv(y, self.head_chs, 1, name="head_conv", dtype=dtype, precision=self.precision))
      x = activation(y, self.act)[:, 0, 0, :].astype(jnp.float32)
    out["pre_logits"] = x
    if self.num_classes:
      x = nn.Dense(self.num_classes, dtype=dtype, param_dtype=jnp.float32,
                   precision=self.precision, name="head")(x.astype(dtype))
      x = out["logits"] = x.astype(jnp.float32)
    return x, out


def Model(num_classes: Optional[int] = 1000, *, variant: Optional[str] = None,
          **kw) -> _Model:
  """`Model(1000, variant="efficientnet_b0")` (torchvision) or `variant="timm/tf_efficientnet_b0"`;
  without a variant, `kw` gives the architecture (from `torchvision_arch` / `timm_arch`)."""
  if variant is not None:
    if variant not in ARCHS:
      raise ValueError(f"Unknown EfficientNet variant {variant!r}; known: {sorted(ARCHS)}.")
    arch = {k: v for k, v in ARCHS[variant].items() if k != "source"}
    kw = {**arch, **kw}
  kw.pop("source", None)
  return _Model(num_classes, **kw)


# ----------------------------------------------------------------------------- loading

DOWNLOAD_HINT = ("EfficientNet weights: a torchvision state dict (download.pytorch.org/models/"
                 "efficientnet_*.pth) or a timm one (huggingface.co/timm/<name>/"
                 "model.safetensors); efficientnet.PRETRAINED names the variant of each file")


def load(init_params, init_file: str, model_cfg: Optional[Mapping[str, Any]] = None,
         dont_load: Sequence[str] = ()) -> dict:
  """Reads a torchvision or timm EfficientNet state dict (.pth / .bin / .safetensors), converts
  it and merges it onto `init_params` (every key and shape checked). The layout is detected
  from the keys unless `model_cfg["source"]` says "torchvision" or "timm"."""
  init_params = jax.device_get(init_params)
  sd = readers.read_state_dict(init_file, hint=DOWNLOAD_HINT)
  source = (model_cfg or {}).get("source")
  if source is None and (model_cfg or {}).get("variant") in ARCHS:
    source = ARCHS[model_cfg["variant"]]["source"]
  tree = convert.convert(sd, source=source, file=init_file, hint=DOWNLOAD_HINT)
  return checkpoints.merge_params(tree, init_params, dont_load, source=init_file,
                                  hint=DOWNLOAD_HINT)
