"""timm's RegNetZ models (timm `byobnet.py`: regnetz_b16 / c16 / d32 / d8 / e8 and the EvoNorm
`_evos` variants) in Flax.

timm builds them with its "bring your own blocks" ByobNet from a ByoModelCfg (timm 1.0.x,
`model_cfgs['regnetz_*']`); ARCHS holds those configs as data. The network:

* stem: `3x3` (one 3x3 stride-2 conv-norm-act), `tiered` (3x3 convs of 3c/8, c/2, c with
  strides 2, 1, 2) or `deep` (three 3x3 convs of c, strides 2, 1, 2); no pool;
* 4 stages of timm BottleneckBlocks with `bottle_in=True, linear_out=True`: 1x1 conv-norm-act
  to mid = make_divisible(input width * bottle ratio), 3x3 grouped conv-norm-act (groups =
  mid / group size, the stage's stride on its first block), Squeeze-Excitation on mid (1x1
  convs with bias, reduction make_divisible(mid / 4, round_limit=0), ReLU, sigmoid gate), 1x1
  conv-norm (no act) to the stage width, plus the input where the shape is unchanged (no
  shortcut at all where it changes: `downsample=''`), no activation after the sum;
* a final 1x1 conv-norm-act to `num_features`, global average pool, the `head` Dense.

conv-norm-act: an eval-mode BatchNorm (eps 1e-5) + SiLU, or (`norm="evos"`) EvoNorm2dS0a with
groups of 16 channels (eps 1e-3: x * sigmoid(v * x) / group_std(x) * weight + bias; without
the activation (conv3, no `v`): x / group_std(x) * weight + bias). Flax names follow timm's
(`stem/conv1/conv`, `stages_{s}_{b}/conv2_kxk/bn`, `stages_{s}_{b}/attn/fc1`,
`final_conv/conv`, `head`), so the key map (fi_jax.models.convert.byobnet) is mechanical.

`Model(1000, variant="regnetz_d8")`; `apply({"params": p}, images_nhwc)` returns `(logits,
out)`: out["pre_logits"] (the pooled final conv = the `head.fc` input), out["stem"],
out["stage1".."stage4"]. Eval transforms: timm's pretrained_cfg facts (`_timm_tags.py`).
"""
from __future__ import annotations

import functools
from typing import Any, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fi_jax.models import _blocks as blocks
from fi_jax.models import _pretrained as pretrained
from fi_jax.models.convert import byobnet as convert_byobnet
from fi_jax.models.convert import readers
from fi_jax.models.convert import resnet as convert_resnet
from fi_jax.models.resnetv2 import EvoNormS0, make_divisible


def _cfg(stem_type, stem_chs, depths, widths, strides, group_size, bottle_ratio,
         num_features, norm="batch") -> dict:
  return dict(stem_type=stem_type, stem_chs=stem_chs, depths=depths, widths=widths,
              strides=strides, group_size=group_size, bottle_ratio=bottle_ratio,
              num_features=num_features, norm=norm)


_B = dict(depths=(2, 6, 12, 2), widths=(48, 96, 192, 288), strides=(2, 2, 2, 2))
_D = dict(depths=(3, 6, 12, 3), widths=(64, 128, 256, 384), strides=(1, 2, 2, 2))

# timm model_cfgs (byobnet.py) of the RegNetZs with ImageNet-1k weights
ARCHS: dict[str, dict] = {
    "regnetz_b16": _cfg("3x3", 32, **_B, group_size=16, bottle_ratio=3, num_features=1536),
    "regnetz_c16": _cfg("3x3", 32, **_B, group_size=16, bottle_ratio=4, num_features=1536),
    "regnetz_c16_evos": _cfg("3x3", 32, **_B, group_size=16, bottle_ratio=4,
                             num_features=1536, norm="evos"),
    "regnetz_d32": _cfg("tiered", 64, **_D, group_size=32, bottle_ratio=4, num_features=1792),
    "regnetz_d8": _cfg("tiered", 64, **_D, group_size=8, bottle_ratio=4, num_features=1792),
    "regnetz_d8_evos": _cfg("deep", 64, **_D, group_size=8, bottle_ratio=4, num_features=1792,
                            norm="evos"),
    "regnetz_e8": _cfg("tiered", 64, (3, 8, 16, 3), (96, 192, 384, 512), (1, 2, 2, 2),
                       group_size=8, bottle_ratio=4, num_features=2048),
}

PRETRAINED: dict[str, dict] = {**pretrained.timm_tags(list(ARCHS))}

DOWNLOAD_HINT = ("RegNetZ weights: timm's https://huggingface.co/timm/regnetz_<size>.<tag> "
                 "model.safetensors (see fi_jax.models.byobnet.PRETRAINED)")

EVONORM_GROUP_SIZE = 16


class ConvNormAct(nn.Module):
  """timm ConvNormAct: a bias-free conv (symmetric padding (k - 1) // 2), then `bn`: an
  eval-mode BatchNorm (+ SiLU) or EvoNorm2dS0a (its own non-linearity when `apply_act`)."""
  features: int
  kernel: int
  stride: int = 1
  groups: int = 1
  apply_act: bool = True
  norm: str = "batch"
  dtype: str = "float32"
  precision: Any = blocks.HIGHEST

  @nn.compact
  def __call__(self, x):
    x = blocks.conv(self.features, self.kernel, self.stride, groups=self.groups,
                    dtype=blocks.compute_dtype(self.dtype), precision=self.precision,
                    name="conv")(x)
    if self.norm == "evos":
      if self.features % EVONORM_GROUP_SIZE:
        raise ValueError(f"EvoNorm2dS0a takes groups of {EVONORM_GROUP_SIZE} channels; a "
                         f"conv of {self.features} channels does not divide into them.")
      return EvoNormS0(self.features // EVONORM_GROUP_SIZE, 1e-3, apply_act=self.apply_act,
                       name="bn")(x)
    x = blocks.BatchNorm(1e-5, name="bn")(x)
    return nn.silu(x) if self.apply_act else x


class SqueezeExcite(nn.Module):
  """timm SEModule: x * sigmoid(fc2(relu(fc1(mean_hw(x))))), 1x1 convs with bias."""
  reduced: int
  dtype: str = "float32"
  precision: Any = blocks.HIGHEST

  @nn.compact
  def __call__(self, x):
    conv = functools.partial(blocks.conv, use_bias=True, dtype=blocks.compute_dtype(self.dtype),
                             precision=self.precision)
    s = jnp.mean(x, axis=(1, 2), keepdims=True)
    s = conv(x.shape[-1], 1, name="fc2")(nn.relu(conv(self.reduced, 1, name="fc1")(s)))
    return x * nn.sigmoid(s)


class Bottleneck(nn.Module):
  """timm BottleneckBlock(bottle_in=True, linear_out=True, downsample='') with SE."""
  width: int
  stride: int
  group_size: int
  bottle_ratio: float
  norm: str = "batch"
  dtype: str = "float32"
  precision: Any = blocks.HIGHEST

  @nn.compact
  def __call__(self, x):
    cna = functools.partial(ConvNormAct, norm=self.norm, dtype=self.dtype,
                            precision=self.precision)
    width_in = x.shape[-1]
    mid = make_divisible(width_in * self.bottle_ratio)
    if mid % self.group_size:
      raise ValueError(f"RegNetZ block: mid width {mid} is not divisible by the group size "
                       f"{self.group_size}.")
    y = cna(mid, 1, name="conv1_1x1")(x)
    y = cna(mid, 3, self.stride, groups=mid // self.group_size, name="conv2_kxk")(y)
    reduced = max(8, int(mid * 0.25 + 4) // 8 * 8)   # make_divisible(.., round_limit=0)
    y = SqueezeExcite(reduced, self.dtype, self.precision, name="attn")(y)
    y = cna(self.width, 1, apply_act=False, name="conv3_1x1")(y)
    if width_in == self.width and self.stride == 1:
      y = y + x
    return y


class Stem(nn.Module):
  """timm Stem without a pool: 3x3 conv-norm-acts `conv1..3` of `chs`, strides 2, 1, 2."""
  chs: Sequence[int]
  norm: str = "batch"
  dtype: str = "float32"
  precision: Any = blocks.HIGHEST

  @nn.compact
  def __call__(self, x):
    for i, (ch, stride) in enumerate(zip(self.chs, (2, 1, 2))):
      x = ConvNormAct(ch, 3, stride, norm=self.norm, dtype=self.dtype,
                      precision=self.precision, name=f"conv{i + 1}")(x)
    return x


class ByobNet(nn.Module):
  """timm ByobNet restricted to the RegNetZ configs (see the module docstring)."""
  num_classes: Optional[int] = 1000
  stem_type: str = "3x3"          # "3x3" | "tiered" | "deep"
  stem_chs: int = 32
  depths: Sequence[int] = (2, 6, 12, 2)
  widths: Sequence[int] = (48, 96, 192, 288)
  strides: Sequence[int] = (2, 2, 2, 2)
  group_size: int = 16
  bottle_ratio: float = 3.0
  num_features: int = 1536
  norm: str = "batch"             # "batch" (BatchNorm + SiLU) | "evos" (EvoNorm2dS0a)
  dtype: str = "float32"
  precision: Any = blocks.HIGHEST

  @nn.compact
  def __call__(self, images, *, train: bool = False):
    del train   # inference only
    if self.stem_type not in ("3x3", "tiered", "deep") or self.norm not in ("batch", "evos"):
      raise ValueError(f"stem_type must be '3x3', 'tiered' or 'deep' and norm 'batch' or "
                       f"'evos'; got {self.stem_type!r}, {self.norm!r}.")
    if not len(self.depths) == len(self.widths) == len(self.strides):
      raise ValueError(f"depths, widths and strides need one entry per stage; got "
                       f"{self.depths}, {self.widths}, {self.strides}.")
    cna = functools.partial(ConvNormAct, norm=self.norm, dtype=self.dtype,
                            precision=self.precision)
    out = {}
    x = jnp.asarray(images, blocks.compute_dtype(self.dtype))
    c = self.stem_chs
    if self.stem_type == "3x3":
      x = cna(c, 3, 2, name="stem")(x)
    else:
      chs = (3 * c // 8, c // 2, c) if self.stem_type == "tiered" else (c, c, c)
      x = Stem(chs, self.norm, self.dtype, self.precision, name="stem")(x)
    out["stem"] = x
    for s, (depth, width, stride) in enumerate(zip(self.depths, self.widths, self.strides)):
      for b in range(depth):
        x = Bottleneck(width, stride if b == 0 else 1, self.group_size, self.bottle_ratio,
                       self.norm, self.dtype, self.precision, name=f"stages_{s}_{b}")(x)
      out[f"stage{s + 1}"] = x
    x = cna(self.num_features, 1, name="final_conv")(x)
    x = out["pre_logits"] = blocks.global_avg_pool(x)
    if self.num_classes:
      x = out["logits"] = nn.Dense(self.num_classes, precision=self.precision, name="head")(x)
    return x, out


def Model(num_classes: Optional[int] = 1000, *, variant: str, **kw) -> ByobNet:
  """`Model(1000, variant="regnetz_d8")`; `kw` overrides ARCHS fields (e.g. dtype)."""
  if variant not in ARCHS:
    raise ValueError(f"Unknown RegNetZ (byobnet) variant {variant!r}; known: {sorted(ARCHS)}.")
  return ByobNet(num_classes, **{**ARCHS[variant], **kw})


def load(init_params, init_file: str, model_cfg: Optional[Mapping[str, Any]] = None,
         dont_load: Sequence[str] = ()) -> dict:
  """timm ByobNet (RegNetZ) state dict (.safetensors / .pth) -> params on `init_params`'s
  tree (arrays or ShapeDtypeStructs). A model without a head (num_classes=None) drops the
  file's `head.fc`; other mismatches raise CheckpointError naming the key and the file."""
  del model_cfg   # timm is the only source
  init_params = jax.device_get(init_params)
  sd = readers.read_state_dict(init_file, hint=DOWNLOAD_HINT)
  where: dict[str, str] = {}
  flat = convert_byobnet.convert(sd, source=init_file, hint=DOWNLOAD_HINT, where=where)
  return convert_resnet.merge(flat, init_params, init_file, DOWNLOAD_HINT, dont_load, sd=sd,
                              where=where, torch_module=convert_byobnet.torch_module)
