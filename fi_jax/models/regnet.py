"""torchvision's and timm's RegNetX / RegNetY in Flax (incl. the SWAG RegNetY weights OpenOOD
reports on).

Stem (3x3 stride-2 conv, BN, ReLU) -> 4 stages of residual bottleneck blocks -> global
average pool -> "head". A block: 1x1 conv -> BN -> ReLU -> 3x3 grouped conv (stride on the
first block of a stage) -> BN -> ReLU -> [Squeeze-Excitation, RegNetY only] -> 1x1 conv ->
BN, plus the input (through a 1x1 conv + BN where the shape changes), then ReLU. Widths per
stage come from torchvision's `BlockParams.from_init_params`, tabulated in ARCHS.

`Model(1000, variant="regnet_y_16gf")`; `apply({"params": p}, images_nhwc)` returns
`(logits, out)`: out["pre_logits"] (the pooled last stage = the `fc` input), out["stem"],
out["stage1".."stage4"]. `load(init, file)` reads torchvision's and timm's state dicts
(fi_jax.models.convert.regnet; the layout is read off the keys). timm's regnetx_* /
regnety_* models are the same network (3x3 stride-2 stem of 32, post-activation bottlenecks
with ReLU, SE of a quarter of the block's input width, 1x1 conv + BN shortcuts; checked with
timm 1.0.31 on the meta device): TIMM_ARCHS tabulates their stage depths / widths / group
widths. timm's RegNetV (regnetv_040 / 064: pre-activation RegNetY, SiLU) and RegNetZ-040
(x4 inverted bottlenecks, SiLU, no shortcut where the shape changes, no activation after the
sums) are Block / RegNet options (`preact`, `act`, `shortcut`, `linear_out`,
`num_features`). Eval transforms: PRETRAINED (the SWAG end-to-end weights are evaluated at 384 px,
bicubic; timm's from its pretrained_cfg facts).
"""
from __future__ import annotations

import functools
from typing import Any, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fi_jax.models import _blocks as blocks
from fi_jax.models import _pretrained as pretrained
from fi_jax.models._pretrained import torchvision as _tv
from fi_jax.models.convert import readers
from fi_jax.models.convert import regnet as convert_regnet
from fi_jax.models.convert import resnet as convert_resnet

# variant -> RegNet fields: torchvision's BlockParams.from_init_params(depth, w_0, w_a, w_m,
# group_width, se_ratio), expanded per stage (all strides 2, bottleneck multiplier 1).
ARCHS: dict[str, dict] = {
    "regnet_y_400mf": dict(depths=(1, 3, 6, 6), widths=(48, 104, 208, 440),
                           group_widths=(8, 8, 8, 8), se_ratio=0.25),
    "regnet_y_800mf": dict(depths=(1, 3, 8, 2), widths=(64, 144, 320, 784),
                           group_widths=(16, 16, 16, 16), se_ratio=0.25),
    "regnet_y_1_6gf": dict(depths=(2, 6, 17, 2), widths=(48, 120, 336, 888),
                           group_widths=(24, 24, 24, 24), se_ratio=0.25),
    "regnet_y_3_2gf": dict(depths=(2, 5, 13, 1), widths=(72, 216, 576, 1512),
                           group_widths=(24, 24, 24, 24), se_ratio=0.25),
    "regnet_y_8gf": dict(depths=(2, 4, 10, 1), widths=(224, 448, 896, 2016),
                         group_widths=(56, 56, 56, 56), se_ratio=0.25),
    "regnet_y_16gf": dict(depths=(2, 4, 11, 1), widths=(224, 448, 1232, 3024),
                          group_widths=(112, 112, 112, 112), se_ratio=0.25),
    "regnet_y_32gf": dict(depths=(2, 5, 12, 1), widths=(232, 696, 1392, 3712),
                          group_widths=(232, 232, 232, 232), se_ratio=0.25),
    "regnet_y_128gf": dict(depths=(2, 7, 17, 1), widths=(528, 1056, 2904, 7392),
                           group_widths=(264, 264, 264, 264), se_ratio=0.25),
    "regnet_x_400mf": dict(depths=(1, 2, 7, 12), widths=(32, 64, 160, 400),
                           group_widths=(16, 16, 16, 16)),
    "regnet_x_800mf": dict(depths=(1, 3, 7, 5), widths=(64, 128, 288, 672),
                           group_widths=(16, 16, 16, 16)),
    "regnet_x_1_6gf": dict(depths=(2, 4, 10, 2), widths=(72, 168, 408, 912),
                           group_widths=(24, 24, 24, 24)),
    "regnet_x_3_2gf": dict(depths=(2, 6, 15, 2), widths=(96, 192, 432, 1008),
                           group_widths=(48, 48, 48, 48)),
    "regnet_x_8gf": dict(depths=(2, 5, 15, 1), widths=(80, 240, 720, 1920),
                         group_widths=(80, 120, 120, 120)),
    "regnet_x_16gf": dict(depths=(2, 6, 13, 1), widths=(256, 512, 896, 2048),
                          group_widths=(128, 128, 128, 128)),
    "regnet_x_32gf": dict(depths=(2, 7, 13, 1), widths=(336, 672, 1344, 2520),
                          group_widths=(168, 168, 168, 168)),
}


def _timm(depths, widths, group_width, se: bool) -> dict:
  gws = group_width if isinstance(group_width, tuple) else (group_width,) * 4
  return dict(depths=depths, widths=widths, group_widths=gws, **({"se_ratio": 0.25} if se else {}))


# timm's RegNetX / RegNetY (generate_regnet of each model's RegNetCfg, expanded per stage;
# `_tv` ones are torchvision's widths re-published by timm).
TIMM_ARCHS: dict[str, dict] = {
    "regnetx_002": _timm((1, 1, 4, 7), (24, 56, 152, 368), 8, False),
    "regnetx_004": _timm((1, 2, 7, 12), (32, 64, 160, 384), 16, False),
    "regnetx_004_tv": _timm((1, 2, 7, 12), (32, 64, 160, 400), 16, False),
    "regnetx_006": _timm((1, 3, 5, 7), (48, 96, 240, 528), 24, False),
    "regnetx_008": _timm((1, 3, 7, 5), (64, 128, 288, 672), 16, False),
    "regnetx_016": _timm((2, 4, 10, 2), (72, 168, 408, 912), 24, False),
    "regnetx_032": _timm((2, 6, 15, 2), (96, 192, 432, 1008), 48, False),
    "regnetx_040": _timm((2, 5, 14, 2), (80, 240, 560, 1360), 40, False),
    "regnetx_064": _timm((2, 4, 10, 1), (168, 392, 784, 1624), 56, False),
    "regnetx_080": _timm((2, 5, 15, 1), (80, 240, 720, 1920), (80, 120, 120, 120), False),
    "regnetx_120": _timm((2, 5, 11, 1), (224, 448, 896, 2240), 112, False),
    "regnetx_160": _timm((2, 6, 13, 1), (256, 512, 896, 2048), 128, False),
    "regnetx_320": _timm((2, 7, 13, 1), (336, 672, 1344, 2520), 168, False),
    "regnety_002": _timm((1, 1, 4, 7), (24, 56, 152, 368), 8, True),
    "regnety_004": _timm((1, 3, 6, 6), (48, 104, 208, 440), 8, True),
    "regnety_006": _timm((1, 3, 7, 4), (48, 112, 256, 608), 16, True),
    "regnety_008": _timm((1, 3, 8, 2), (64, 128, 320, 768), 16, True),
    "regnety_008_tv": _timm((1, 3, 8, 2), (64, 144, 320, 784), 16, True),
    "regnety_016": _timm((2, 6, 17, 2), (48, 120, 336, 888), 24, True),
    "regnety_032": _timm((2, 5, 13, 1), (72, 216, 576, 1512), 24, True),
    "regnety_040": _timm((2, 6, 12, 2), (128, 192, 512, 1088), 64, True),
    "regnety_064": _timm((2, 7, 14, 2), (144, 288, 576, 1296), 72, True),
    "regnety_080": _timm((2, 4, 10, 1), (168, 448, 896, 2016), 56, True),
    "regnety_080_tv": _timm((2, 4, 10, 1), (224, 448, 896, 2016), 56, True),
    "regnety_120": _timm((2, 5, 11, 1), (224, 448, 896, 2240), 112, True),
    "regnety_160": _timm((2, 4, 11, 1), (224, 448, 1232, 3024), 112, True),
    "regnety_320": _timm((2, 5, 12, 1), (232, 696, 1392, 3712), 232, True),
    "regnety_640": _timm((2, 5, 12, 1), (328, 984, 1968, 4920), 328, True),
    "regnety_1280": _timm((2, 7, 17, 1), (528, 1056, 2904, 7392), 264, True),
    "regnety_2560": _timm((2, 7, 17, 1), (746, 1492, 4103, 10444), 373, True),
    # RegNetV: pre-activation RegNetY with SiLU (no final norm: an activation only)
    "regnetv_040": dict(_timm((2, 6, 12, 2), (128, 192, 512, 1088), 64, True), act="silu",
                        preact=True),
    "regnetv_064": dict(_timm((2, 7, 14, 2), (144, 288, 576, 1296), 72, True), act="silu",
                        preact=True, shortcut="avg"),
    # RegNetZ: inverted bottlenecks (x4), SiLU, no shortcut where the shape changes, no
    # activation after the residual sum; the final activation (or a 1x1 conv-BN-SiLU)
    "regnetz_040": dict(_timm((2, 6, 14, 6), (48, 104, 240, 528), 8, True), act="silu",
                        bottleneck_multiplier=4.0, shortcut="none", linear_out=True),
    "regnetz_040_h": dict(_timm((2, 6, 14, 6), (48, 104, 240, 528), 8, True), act="silu",
                          bottleneck_multiplier=4.0, shortcut="none", linear_out=True,
                          num_features=1536),
}
ARCHS.update(TIMM_ARCHS)

# Published weights -> variant, eval transform (pp string), file: torchvision's enums, then
# every timm tag of TIMM_ARCHS.
PRETRAINED: dict[str, dict] = {
    **_tv("regnet_y_400mf.IMAGENET1K_V1", "regnet_y_400mf-c65dace8.pth"),
    **_tv("regnet_y_400mf.IMAGENET1K_V2", "regnet_y_400mf-e6988f5f.pth", resize=232),
    **_tv("regnet_y_800mf.IMAGENET1K_V1", "regnet_y_800mf-1b27b58c.pth"),
    **_tv("regnet_y_800mf.IMAGENET1K_V2", "regnet_y_800mf-58fc7688.pth", resize=232),
    **_tv("regnet_y_1_6gf.IMAGENET1K_V1", "regnet_y_1_6gf-b11a554e.pth"),
    **_tv("regnet_y_1_6gf.IMAGENET1K_V2", "regnet_y_1_6gf-0d7bc02a.pth", resize=232),
    **_tv("regnet_y_3_2gf.IMAGENET1K_V1", "regnet_y_3_2gf-b5a9779c.pth"),
    **_tv("regnet_y_3_2gf.IMAGENET1K_V2", "regnet_y_3_2gf-9180c971.pth", resize=232),
    **_tv("regnet_y_8gf.IMAGENET1K_V1", "regnet_y_8gf-d0d0e4a8.pth"),
    **_tv("regnet_y_8gf.IMAGENET1K_V2", "regnet_y_8gf-dc2b1b54.pth", resize=232),
    **_tv("regnet_y_16gf.IMAGENET1K_V1", "regnet_y_16gf-9e6ed7dd.pth"),
    **_tv("regnet_y_16gf.IMAGENET1K_V2", "regnet_y_16gf-3e4a00f9.pth", resize=232),
    **_tv("regnet_y_16gf.IMAGENET1K_SWAG_E2E_V1", "regnet_y_16gf_swag-43afe44d.pth",
          resize=384, crop=384, interp="bicubic"),
    **_tv("regnet_y_16gf.IMAGENET1K_SWAG_LINEAR_V1", "regnet_y_16gf_lc_swag-f3ec0043.pth",
          resize=224, interp="bicubic"),
    **_tv("regnet_y_32gf.IMAGENET1K_V1", "regnet_y_32gf-4dee3f7a.pth"),
    **_tv("regnet_y_32gf.IMAGENET1K_V2", "regnet_y_32gf-8db6d4b5.pth", resize=232),
    **_tv("regnet_y_32gf.IMAGENET1K_SWAG_E2E_V1", "regnet_y_32gf_swag-04fdfa75.pth",
          resize=384, crop=384, interp="bicubic"),
    **_tv("regnet_y_32gf.IMAGENET1K_SWAG_LINEAR_V1", "regnet_y_32gf_lc_swag-e1583746.pth",
          resize=224, interp="bicubic"),
    **_tv("regnet_y_128gf.IMAGENET1K_SWAG_E2E_V1", "regnet_y_128gf_swag-c8ce3e52.pth",
          resize=384, crop=384, interp="bicubic"),
    **_tv("regnet_y_128gf.IMAGENET1K_SWAG_LINEAR_V1", "regnet_y_128gf_lc_swag-cbe8ce12.pth",
          resize=224, interp="bicubic"),
    **_tv("regnet_x_400mf.IMAGENET1K_V1", "regnet_x_400mf-adf1edd5.pth"),
    **_tv("regnet_x_400mf.IMAGENET1K_V2", "regnet_x_400mf-62229a5f.pth", resize=232),
    **_tv("regnet_x_800mf.IMAGENET1K_V1", "regnet_x_800mf-ad17e45c.pth"),
    **_tv("regnet_x_800mf.IMAGENET1K_V2", "regnet_x_800mf-94a99ebd.pth", resize=232),
    **_tv("regnet_x_1_6gf.IMAGENET1K_V1", "regnet_x_1_6gf-e3633e7f.pth"),
    **_tv("regnet_x_1_6gf.IMAGENET1K_V2", "regnet_x_1_6gf-a12f2b72.pth", resize=232),
    **_tv("regnet_x_3_2gf.IMAGENET1K_V1", "regnet_x_3_2gf-f342aeae.pth"),
    **_tv("regnet_x_3_2gf.IMAGENET1K_V2", "regnet_x_3_2gf-7071aa85.pth", resize=232),
    **_tv("regnet_x_8gf.IMAGENET1K_V1", "regnet_x_8gf-03ceed89.pth"),
    **_tv("regnet_x_8gf.IMAGENET1K_V2", "regnet_x_8gf-2b70d774.pth", resize=232),
    **_tv("regnet_x_16gf.IMAGENET1K_V1", "regnet_x_16gf-2007eb11.pth"),
    **_tv("regnet_x_16gf.IMAGENET1K_V2", "regnet_x_16gf-ba3796d7.pth", resize=232),
    **_tv("regnet_x_32gf.IMAGENET1K_V1", "regnet_x_32gf-9d47f8d0.pth"),
    **_tv("regnet_x_32gf.IMAGENET1K_V2", "regnet_x_32gf-6eb8fdc6.pth", resize=232),
    **pretrained.timm_tags(list(TIMM_ARCHS)),
}

DOWNLOAD_HINT = ("RegNet weights: torchvision's https://download.pytorch.org/models/"
                 "regnet_<x|y>_<size>[_swag|_lc_swag]-<hash>.pth, timm's "
                 "https://huggingface.co/timm/regnet<x|y>_<size>.<tag> model.safetensors (see "
                 "fi_jax.models.regnet.PRETRAINED)")


_ACTS = {"relu": nn.relu, "silu": nn.silu}


class SqueezeExcitation(nn.Module):
  """torchvision SqueezeExcitation: x * sigmoid(fc2(act(fc1(mean_hw(x))))), 1x1 convs (act:
  ReLU, timm's RegNetV / RegNetZ: SiLU)."""
  squeeze: int
  dtype: str = "float32"
  precision: Any = blocks.HIGHEST
  act: str = "relu"

  @nn.compact
  def __call__(self, x):
    conv = functools.partial(blocks.conv, use_bias=True, dtype=blocks.compute_dtype(self.dtype),
                             precision=self.precision)
    s = jnp.mean(x, axis=(1, 2), keepdims=True)
    s = conv(x.shape[-1], 1, name="fc2")(_ACTS[self.act](conv(self.squeeze, 1, name="fc1")(s)))
    return x * nn.sigmoid(s)


class Block(nn.Module):
  """torchvision ResBottleneckBlock (proj + f = a, b, [se], c), and timm's variants of it:
  `preact` (PreBottleneck: BN-act before each conv, the shortcut taken after the first
  BN-act, a bare conv projection), `shortcut` 'avg' (2x2 ceil-mode average pool, then the 1x1
  projection) or 'none' (no residual where the shape changes), `linear_out` (no activation
  after the sum), SiLU (`act`)."""
  width: int
  stride: int
  group_width: int
  bottleneck_multiplier: float = 1.0
  se_ratio: Optional[float] = None
  bn_eps: float = 1e-5
  dtype: str = "float32"
  precision: Any = blocks.HIGHEST
  act: str = "relu"
  preact: bool = False
  shortcut: str = "conv"          # "conv" | "avg" | "none"
  linear_out: bool = False

  @nn.compact
  def __call__(self, x):
    conv = functools.partial(blocks.conv, dtype=blocks.compute_dtype(self.dtype),
                             precision=self.precision)
    bn = lambda name: blocks.BatchNorm(self.bn_eps, name=name)
    act = _ACTS[self.act]
    width_in = x.shape[-1]
    w_b = int(round(self.width * self.bottleneck_multiplier))
    se = (lambda y: SqueezeExcitation(int(round(self.se_ratio * width_in)), dtype=self.dtype,
                                      precision=self.precision, act=self.act, name="se")(y)
          ) if self.se_ratio else (lambda y: y)
    if self.preact:
      x = act(bn("a_bn")(x))
      y = act(bn("b_bn")(conv(w_b, 1, name="a_conv")(x)))
      y = se(conv(w_b, 3, self.stride, groups=w_b // self.group_width, name="b_conv")(y))
      y = conv(self.width, 1, name="c_conv")(act(bn("c_bn")(y)))
    else:
      y = act(bn("a_bn")(conv(w_b, 1, name="a_conv")(x)))
      y = se(act(bn("b_bn")(conv(w_b, 3, self.stride, groups=w_b // self.group_width,
                                 name="b_conv")(y))))
      y = bn("c_bn")(conv(self.width, 1, name="c_conv")(y))
    if width_in != self.width or self.stride != 1:
      if self.shortcut == "none":
        return y if self.linear_out or self.preact else act(y)
      stride = self.stride
      if self.shortcut == "avg":
        x = blocks.avg_pool_ceil(x, 2, stride) if stride > 1 else x
        stride = 1
      x = conv(self.width, 1, stride, name="proj_conv")(x)
      if not self.preact:
        x = bn("proj_bn")(x)
    y = x + y
    return y if self.linear_out or self.preact else act(y)


class RegNet(nn.Module):
  """torchvision RegNet: SimpleStemIN, 4 AnyStages of Blocks, average pool, "head"."""
  num_classes: Optional[int] = 1000
  depths: Sequence[int] = (2, 4, 11, 1)
  widths: Sequence[int] = (224, 448, 1232, 3024)
  group_widths: Sequence[int] = (112, 112, 112, 112)
  bottleneck_multiplier: float = 1.0
  se_ratio: Optional[float] = None
  stem_width: int = 32
  bn_eps: float = 1e-5
  dtype: str = "float32"
  precision: Any = blocks.HIGHEST
  act: str = "relu"               # timm RegNetV / RegNetZ: "silu"
  preact: bool = False            # RegNetV: PreBottlenecks, a bare stem conv, no final norm
  shortcut: str = "conv"          # "conv" | "avg" | "none" (timm RegNetCfg.downsample)
  linear_out: bool = False        # RegNetZ: no activation after the residual sums
  num_features: int = 0           # > 0: a final 1x1 conv-BN-act to this width

  @nn.compact
  def __call__(self, images, *, train: bool = False):
    del train   # inference only
    if not len(self.depths) == len(self.widths) == len(self.group_widths):
      raise ValueError(f"depths, widths and group_widths need one entry per stage; got "
                       f"{self.depths}, {self.widths}, {self.group_widths}.")
    out = {}
    x = jnp.asarray(images, blocks.compute_dtype(self.dtype))
    if self.act not in _ACTS or self.shortcut not in ("conv", "avg", "none"):
      raise ValueError(f"act must be one of {sorted(_ACTS)} and shortcut 'conv', 'avg' or "
                       f"'none'; got {self.act!r}, {self.shortcut!r}.")
    act = _ACTS[self.act]
    conv = functools.partial(blocks.conv, dtype=x.dtype, precision=self.precision)
    x = conv(self.stem_width, 3, 2, name="stem_conv")(x)
    if not self.preact:
      x = act(blocks.BatchNorm(self.bn_eps, name="stem_bn")(x))
    out["stem"] = x
    for s, (depth, width, gw) in enumerate(zip(self.depths, self.widths, self.group_widths)):
      for b in range(depth):
        x = Block(width, 2 if b == 0 else 1, gw, self.bottleneck_multiplier, self.se_ratio,
                  self.bn_eps, self.dtype, self.precision, self.act, self.preact, self.shortcut,
                  self.linear_out, name=f"block{s + 1}_{b}")(x)
      out[f"stage{s + 1}"] = x
    if self.num_features:
      x = act(blocks.BatchNorm(self.bn_eps, name="final_bn")(
          conv(self.num_features, 1, name="final_conv")(x)))
    elif self.linear_out or self.preact:
      x = act(x)
    x = out["pre_logits"] = blocks.global_avg_pool(x)
    if self.num_classes:
      x = out["logits"] = nn.Dense(self.num_classes, precision=self.precision, name="head")(x)
    return x, out


def Model(num_classes: Optional[int] = 1000, *, variant: str, **kw) -> RegNet:
  """`Model(1000, variant="regnet_y_16gf")`; `kw` overrides ARCHS fields (e.g. dtype)."""
  if variant not in ARCHS:
    raise ValueError(f"Unknown RegNet variant {variant!r}; known: {sorted(ARCHS)}.")
  return RegNet(num_classes, **{**ARCHS[variant], **kw})


def load(init_params, init_file: str, model_cfg: Optional[Mapping[str, Any]] = None,
         dont_load: Sequence[str] = ()) -> dict:
  """torchvision or timm RegNet state dict (.pth / .safetensors) -> params on `init_params`'s
  tree (arrays or ShapeDtypeStructs); the layout is read off the keys. A model without a head
  (num_classes=None) drops the file's `fc` / `head.fc`; other mismatches raise
  CheckpointError naming the file's key and the file."""
  del model_cfg   # the layout is read off the keys
  init_params = jax.device_get(init_params)
  sd = readers.read_state_dict(init_file, hint=DOWNLOAD_HINT)
  where: dict[str, str] = {}
  flat = convert_regnet.convert(sd, source=init_file, hint=DOWNLOAD_HINT, where=where)
  torch_module = (convert_regnet.timm_torch_module if convert_regnet.is_timm(sd)
                  else convert_regnet.torch_module)
  return convert_resnet.merge(flat, init_params, init_file, DOWNLOAD_HINT, dont_load, sd=sd,
                              where=where, torch_module=torch_module)
