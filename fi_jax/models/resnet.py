"""ResNet / ResNeXt / Wide-ResNet (torchvision, and timm's `resnet.py` family) in Flax.

One module covers torchvision's ResNet V1.5 (the stride on the bottleneck's 3x3 conv; the V1
and V2 weights share it) and timm's ResNet with its stem / downsample options: the 7x7 stem,
the 'deep' stem of three 3x3 convs (timm `stem_type='deep'`, 'c' / 's' / 'd' variants, and
'deep_tiered'), and the average-pool shortcut (`avg_down=True`, 'd' variants: AvgPool2d(2,
ceil_mode, count_include_pad=False) -> 1x1 conv -> BN). BatchNorm runs on its running
statistics, which live in `params` (blocks.BatchNorm); there is no dropout or drop path.

`Model(1000, variant="resnet50")`; `apply({"params": p}, images_nhwc)` returns
`(logits, out)` with out["pre_logits"] = the global-average-pooled last stage (the `fc`
input), out["stem"] (after the max pool) and out["stage1".."stage4"].
`load(init, file)` reads torchvision or timm state dicts (.pth / .safetensors): both use the
same key names (conv1 / bn1 / layer{1-4} / fc), see fi_jax.models.convert.resnet.
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

_BOTTLENECK, _BASIC = "bottleneck", "basic"
_DEEP = dict(stem="deep", stem_width=32)
_D = dict(stem="deep", stem_width=32, avg_down=True)
_T = dict(stem="deep_tiered", stem_width=32, avg_down=True)

# variant -> ResNet fields (timm's and torchvision's constructors, same names where shared).
ARCHS: dict[str, dict] = {
    "resnet18": dict(block=_BASIC, depths=(2, 2, 2, 2)),
    "resnet34": dict(block=_BASIC, depths=(3, 4, 6, 3)),
    "resnet26": dict(depths=(2, 2, 2, 2)),
    "resnet50": dict(depths=(3, 4, 6, 3)),
    "resnet101": dict(depths=(3, 4, 23, 3)),
    "resnet152": dict(depths=(3, 8, 36, 3)),
    "resnet200": dict(depths=(3, 24, 36, 3)),
    "wide_resnet50_2": dict(depths=(3, 4, 6, 3), width_per_group=128),
    "wide_resnet101_2": dict(depths=(3, 4, 23, 3), width_per_group=128),
    "resnext50_32x4d": dict(depths=(3, 4, 6, 3), groups=32, width_per_group=4),
    "resnext101_32x4d": dict(depths=(3, 4, 23, 3), groups=32, width_per_group=4),
    "resnext101_32x8d": dict(depths=(3, 4, 23, 3), groups=32, width_per_group=8),
    "resnext101_64x4d": dict(depths=(3, 4, 23, 3), groups=64, width_per_group=4),
    # timm stem / shortcut variants
    "resnet50c": dict(depths=(3, 4, 6, 3), **_DEEP),
    "resnet50s": dict(depths=(3, 4, 6, 3), stem="deep", stem_width=64),
    "resnet18d": dict(block=_BASIC, depths=(2, 2, 2, 2), **_D),
    "resnet34d": dict(block=_BASIC, depths=(3, 4, 6, 3), **_D),
    "resnet26d": dict(depths=(2, 2, 2, 2), **_D),
    "resnet50d": dict(depths=(3, 4, 6, 3), **_D),
    "resnet101d": dict(depths=(3, 4, 23, 3), **_D),
    "resnet152d": dict(depths=(3, 8, 36, 3), **_D),
    "resnet200d": dict(depths=(3, 24, 36, 3), **_D),
    "resnext50d_32x4d": dict(depths=(3, 4, 6, 3), groups=32, width_per_group=4, **_D),
    "resnet101c": dict(depths=(3, 4, 23, 3), **_DEEP),
    "resnet152c": dict(depths=(3, 8, 36, 3), **_DEEP),
    "resnet101s": dict(depths=(3, 4, 23, 3), stem="deep", stem_width=64),
    "resnet152s": dict(depths=(3, 8, 36, 3), stem="deep", stem_width=64),
    "resnext101_32x16d": dict(depths=(3, 4, 23, 3), groups=32, width_per_group=16),
    "resnext101_32x32d": dict(depths=(3, 4, 23, 3), groups=32, width_per_group=32),
    # timm 't' variants: the tiered deep stem (24, 32, 64) and avg-pool shortcuts
    "resnet10t": dict(block=_BASIC, depths=(1, 1, 1, 1), **_T),
    "resnet14t": dict(depths=(1, 1, 1, 1), **_T),
    "resnet26t": dict(depths=(2, 2, 2, 2), **_T),
    # timm SE-ResNe(X)ts: Squeeze-Excitation after each block's last BN
    "seresnet50": dict(depths=(3, 4, 6, 3), se=True),
    "seresnet152d": dict(depths=(3, 8, 36, 3), se=True, **_D),
    "seresnext26d_32x4d": dict(depths=(2, 2, 2, 2), groups=32, width_per_group=4, se=True, **_D),
    "seresnext26t_32x4d": dict(depths=(2, 2, 2, 2), groups=32, width_per_group=4, se=True, **_T),
    "seresnext50_32x4d": dict(depths=(3, 4, 6, 3), groups=32, width_per_group=4, se=True),
    "seresnext101_32x4d": dict(depths=(3, 4, 23, 3), groups=32, width_per_group=4, se=True),
    "seresnext101_32x8d": dict(depths=(3, 4, 23, 3), groups=32, width_per_group=8, se=True),
    "seresnext101_64x4d": dict(depths=(3, 4, 23, 3), groups=64, width_per_group=4, se=True),
    "seresnext101d_32x8d": dict(depths=(3, 4, 23, 3), groups=32, width_per_group=8, se=True,
                                **_D),
}

# timm architectures this module builds: all of ARCHS that timm publishes weights for.
TIMM_MODELS = tuple(a for a in ARCHS if a in pretrained.TIMM_TAGS_BY_MODEL)

# Published weights -> variant, eval transform (as a pp string), file. torchvision's are
# also on the HF hub as timm/<arch>.tv_in1k / .tv2_in1k (the same tensors).
_tv = pretrained.torchvision
PRETRAINED: dict[str, dict] = {
    **_tv("resnet18.IMAGENET1K_V1", "resnet18-f37072fd.pth"),
    **_tv("resnet34.IMAGENET1K_V1", "resnet34-b627a593.pth"),
    **_tv("resnet50.IMAGENET1K_V1", "resnet50-0676ba61.pth"),
    **_tv("resnet50.IMAGENET1K_V2", "resnet50-11ad3fa6.pth", resize=232),
    **_tv("resnet101.IMAGENET1K_V1", "resnet101-63fe2227.pth"),
    **_tv("resnet101.IMAGENET1K_V2", "resnet101-cd907fc2.pth", resize=232),
    **_tv("resnet152.IMAGENET1K_V1", "resnet152-394f9c45.pth"),
    **_tv("resnet152.IMAGENET1K_V2", "resnet152-f82ba261.pth", resize=232),
    **_tv("wide_resnet50_2.IMAGENET1K_V1", "wide_resnet50_2-95faca4d.pth"),
    **_tv("wide_resnet50_2.IMAGENET1K_V2", "wide_resnet50_2-9ba9bcbe.pth", resize=232),
    **_tv("wide_resnet101_2.IMAGENET1K_V1", "wide_resnet101_2-32ee1156.pth"),
    **_tv("wide_resnet101_2.IMAGENET1K_V2", "wide_resnet101_2-d733dc28.pth", resize=232),
    **_tv("resnext50_32x4d.IMAGENET1K_V1", "resnext50_32x4d-7cdf4587.pth"),
    **_tv("resnext50_32x4d.IMAGENET1K_V2", "resnext50_32x4d-1a0047aa.pth", resize=232),
    **_tv("resnext101_32x8d.IMAGENET1K_V1", "resnext101_32x8d-8ba56ff5.pth"),
    **_tv("resnext101_32x8d.IMAGENET1K_V2", "resnext101_32x8d-110c445d.pth", resize=232),
    **_tv("resnext101_64x4d.IMAGENET1K_V1", "resnext101_64x4d-173b62eb.pth", resize=232),
    # every timm tag of these architectures (timm and torchvision share the key layout)
    **pretrained.timm_tags(TIMM_MODELS),
}

DOWNLOAD_HINT = ("ResNet weights: torchvision's https://download.pytorch.org/models/<arch>-<hash>"
                 ".pth or timm's https://huggingface.co/timm/<arch>.<tag> model.safetensors "
                 "(see fi_jax.models.resnet.PRETRAINED)")


def se_channels(channels: int) -> int:
  """timm SEModule's reduction width: make_divisible(channels / 16, 8) (no round-up)."""
  return max(8, int(channels / 16 + 4) // 8 * 8)


class SqueezeExcite(nn.Module):
  """timm SEModule (attn_layer='se'): x * sigmoid(fc2(relu(fc1(mean_hw(x))))), 1x1 convs with
  bias, `se_channels(C)` wide."""
  dtype: str = "float32"
  precision: Any = blocks.HIGHEST

  @nn.compact
  def __call__(self, x):
    conv = functools.partial(blocks.conv, use_bias=True, dtype=blocks.compute_dtype(self.dtype),
                             precision=self.precision)
    s = jnp.mean(x, axis=(1, 2), keepdims=True)
    s = conv(x.shape[-1], 1, name="fc2")(nn.relu(conv(se_channels(x.shape[-1]), 1,
                                                      name="fc1")(s)))
    return x * nn.sigmoid(s)


class BasicBlock(nn.Module):
  """3x3 (stride) -> BN -> ReLU -> 3x3 -> BN, + shortcut, ReLU (ResNet-18/34)."""
  planes: int
  stride: int = 1
  shortcut: Optional[str] = None   # None (identity) | "conv" | "avg"
  se: bool = False                 # timm attn_layer='se' after the last BN
  bn_eps: float = 1e-5
  dtype: str = "float32"
  precision: Any = blocks.HIGHEST

  @nn.compact
  def __call__(self, x):
    conv = functools.partial(blocks.conv, dtype=blocks.compute_dtype(self.dtype),
                             precision=self.precision)
    y = nn.relu(blocks.BatchNorm(self.bn_eps, name="bn1")(
        conv(self.planes, 3, self.stride, name="conv1")(x)))
    y = blocks.BatchNorm(self.bn_eps, name="bn2")(conv(self.planes, 3, name="conv2")(y))
    if self.se:
      y = SqueezeExcite(self.dtype, self.precision, name="se")(y)
    return nn.relu(y + _shortcut(self, x, self.planes, conv))


class Bottleneck(nn.Module):
  """1x1 -> 3x3 (stride, groups) -> 1x1 (4 * planes), BN + ReLU between, + shortcut, ReLU."""
  planes: int
  stride: int = 1
  shortcut: Optional[str] = None
  groups: int = 1
  width_per_group: int = 64
  se: bool = False
  bn_eps: float = 1e-5
  dtype: str = "float32"
  precision: Any = blocks.HIGHEST

  @nn.compact
  def __call__(self, x):
    conv = functools.partial(blocks.conv, dtype=blocks.compute_dtype(self.dtype),
                             precision=self.precision)
    bn = lambda name: blocks.BatchNorm(self.bn_eps, name=name)
    width = int(self.planes * self.width_per_group / 64) * self.groups
    y = nn.relu(bn("bn1")(conv(width, 1, name="conv1")(x)))
    y = nn.relu(bn("bn2")(conv(width, 3, self.stride, groups=self.groups, name="conv2")(y)))
    y = bn("bn3")(conv(4 * self.planes, 1, name="conv3")(y))
    if self.se:
      y = SqueezeExcite(self.dtype, self.precision, name="se")(y)
    return nn.relu(y + _shortcut(self, x, 4 * self.planes, conv))


def _shortcut(block: nn.Module, x, features: int, conv):
  """Identity, 1x1 conv (stride) + BN (torchvision), or avg-pool + 1x1 conv + BN (timm 'd')."""
  if block.shortcut is None:
    return x
  stride = block.stride
  if block.shortcut == "avg":
    if stride > 1:
      x = blocks.avg_pool_ceil(x, 2, stride)
    stride = 1
  x = conv(features, 1, stride, name="downsample_conv")(x)
  return blocks.BatchNorm(block.bn_eps, name="downsample_bn")(x)


class ResNet(nn.Module):
  """Stem -> 4 stages of blocks -> global average pool -> "head" (nn.Dense)."""
  num_classes: Optional[int] = 1000
  block: str = _BOTTLENECK          # "bottleneck" | "basic"
  depths: Sequence[int] = (3, 4, 6, 3)
  widths: Sequence[int] = (64, 128, 256, 512)   # planes per stage (x4 out for bottlenecks)
  groups: int = 1                   # ResNeXt cardinality
  width_per_group: int = 64         # 128: Wide ResNet; ResNeXt 32x4d: 4
  stem: str = "7x7"                 # "7x7" | "deep" | "deep_tiered" (timm stem_type)
  stem_width: int = 64              # 7x7: its channels; deep: the first 3x3s' (out: 2x)
  avg_down: bool = False
  se: bool = False                  # timm's SE-ResNets (block_args attn_layer='se')
  bn_eps: float = 1e-5
  dtype: str = "float32"
  precision: Any = blocks.HIGHEST

  @nn.compact
  def __call__(self, images, *, train: bool = False):
    del train   # inference only
    if self.block not in (_BASIC, _BOTTLENECK):
      raise ValueError(f"block must be {_BASIC!r} or {_BOTTLENECK!r}, got {self.block!r}.")
    if self.stem not in ("7x7", "deep", "deep_tiered"):
      raise ValueError(f"stem must be '7x7', 'deep' or 'deep_tiered', got {self.stem!r}.")
    cdt = blocks.compute_dtype(self.dtype)
    conv = functools.partial(blocks.conv, dtype=cdt, precision=self.precision)
    bn = lambda name: blocks.BatchNorm(self.bn_eps, name=name)
    out = {}
    x = jnp.asarray(images, cdt)
    if self.stem == "7x7":
      inplanes = self.stem_width
      x = conv(inplanes, 7, 2, name="conv1")(x)
    else:
      w = self.stem_width
      chs = (3 * (w // 4), w) if self.stem == "deep_tiered" else (w, w)
      inplanes = 2 * w
      x = nn.relu(bn("stem_bn1")(conv(chs[0], 3, 2, name="stem_conv1")(x)))
      x = nn.relu(bn("stem_bn2")(conv(chs[1], 3, name="stem_conv2")(x)))
      x = conv(inplanes, 3, name="conv1")(x)
    x = nn.relu(bn("bn1")(x))
    x = out["stem"] = blocks.max_pool(x, 3, 2, 1)

    expansion = 4 if self.block == _BOTTLENECK else 1
    for s, (depth, planes) in enumerate(zip(self.depths, self.widths)):
      for b in range(depth):
        stride = 2 if s > 0 and b == 0 else 1
        shortcut = None
        if b == 0 and (stride != 1 or inplanes != planes * expansion):
          shortcut = "avg" if self.avg_down else "conv"
        kw = dict(planes=planes, stride=stride, shortcut=shortcut, se=self.se, bn_eps=self.bn_eps,
                  dtype=self.dtype, precision=self.precision, name=f"layer{s + 1}_{b}")
        if self.block == _BOTTLENECK:
          x = Bottleneck(groups=self.groups, width_per_group=self.width_per_group, **kw)(x)
        else:
          if self.groups != 1 or self.width_per_group != 64:
            raise ValueError("BasicBlock ResNets need groups=1 and width_per_group=64.")
          x = BasicBlock(**kw)(x)
        inplanes = planes * expansion
      out[f"stage{s + 1}"] = x

    x = out["pre_logits"] = blocks.global_avg_pool(x)
    if self.num_classes:
      x = out["logits"] = nn.Dense(self.num_classes, precision=self.precision, name="head")(x)
    return x, out


def Model(num_classes: Optional[int] = 1000, *, variant: str, **kw) -> ResNet:
  """`Model(1000, variant="resnet50")`; `kw` overrides ARCHS fields (e.g. dtype)."""
  if variant not in ARCHS:
    raise ValueError(f"Unknown ResNet variant {variant!r}; known: {sorted(ARCHS)}.")
  return ResNet(num_classes, **{**ARCHS[variant], **kw})


def load(init_params, init_file: str, model_cfg: Optional[Mapping[str, Any]] = None,
         dont_load: Sequence[str] = ()) -> dict:
  """torchvision / timm ResNet state dict (.pth / .safetensors) -> params on `init_params`'s
  tree (arrays or ShapeDtypeStructs). The two libraries share the key layout, so the source
  needs no flag (`model_cfg["source"]` is accepted and ignored). A model without a head
  (num_classes=None) drops the file's `fc`; other mismatches raise CheckpointError."""
  del model_cfg
  init_params = jax.device_get(init_params)
  sd = readers.read_state_dict(init_file, hint=DOWNLOAD_HINT)
  where: dict[str, str] = {}
  flat = convert_resnet.convert(sd, source=init_file, hint=DOWNLOAD_HINT, where=where)
  return convert_resnet.merge(flat, init_params, init_file, DOWNLOAD_HINT, dont_load, sd=sd,
                              where=where)
