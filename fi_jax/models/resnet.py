"""ResNet / ResNeXt / Wide-ResNet (torchvision, and timm's `resnet.py` family) in Flax.

One module covers torchvision's ResNet V1.5 (the stride on the bottleneck's 3x3 conv; the V1
and V2 weights share it) and timm's ResNet with its stem / downsample options: the 7x7 stem,
the 'deep' stem of three 3x3 convs (timm `stem_type='deep'`, 'c' / 's' / 'd' variants, and
'deep_tiered'), and the average-pool shortcut (`avg_down=True`, 'd' variants: AvgPool2d(2,
ceil_mode, count_include_pad=False) -> 1x1 conv -> BN). BatchNorm runs on its running
statistics, which live in `params` (blocks.BatchNorm); there is no dropout or drop path.

timm's options on the same skeleton (timm 1.0 `models/resnet.py`, `senet.py`, `res2net.py`,
`resnest.py`, `sknet.py`):
the block attention (`attn`: 'se' = SEModule, 'eca' = EcaModule: a k-tap 1-D conv across the
pooled channels, k from the channel count), anti-aliased stride-2 steps (`aa`: 'avg' = a 2x2
average pool, 'blur' = BlurPool2d, the [1, 2, 1] binomial filter with reflect padding, in
place of the strided 3x3 conv's stride and of the stem's max pool), ResNet-RS's 3x3 stride-2
conv in place of the stem pool (`stem_pool='conv'`), GroupNorm(32) everywhere a BN would be
(`norm='group'`), SENet-154's halved first 1x1 (`reduce_first`) and 3x3 projection shortcuts
(`down_kernel`), Res2Net's split bottleneck (`block='res2'`, `res2_scale` groups of
`width_per_group * planes / 64` channels: the i-th goes through a 3x3 conv after adding the
previous one's output, the last passes through (a 3x3 average pool on a stage's first block)),
ResNeSt's split-attention bottleneck (`block='resnest'`, `radix`, `avd_first`), SKNet's
selective-kernel blocks (`block='sk'` / `'sk_basic'`: a 3x3 and a dilation-2 3x3 path mixed by
a softmax attention; their ConvNormAct layers are `conv` / `bn` submodules, as in timm),
a different block kind per stage (`block` a tuple) and timm's legacy SENets (`legacy_se`:
SE of channels // 16, after the BasicBlock's second ReLU; `stride_in_1x1`: the stride on the
bottleneck's first 1x1 conv; `stem_pool='max_ceil'`: MaxPool2d(3, 2, ceil_mode=True)).

`Model(1000, variant="resnet50")`; `apply({"params": p}, images_nhwc)` returns
`(logits, out)` with out["pre_logits"] = the global-average-pooled last stage (the `fc`
input), out["stem"] (after the max pool) and out["stage1".."stage4"].
`load(init, file)` reads torchvision or timm state dicts (.pth / .safetensors): both use the
same key names (conv1 / bn1 / layer{1-4} / fc), timm's legacy SENets theirs (layer0 /
se_module / last_linear), see fi_jax.models.convert.resnet.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fi_jax.models import _blocks as blocks
from fi_jax.models import _pretrained as pretrained
from fi_jax.models import resnetv2
from fi_jax.models.convert import readers
from fi_jax.models.convert import resnet as convert_resnet

_BOTTLENECK, _BASIC, _RES2, _RESNEST = "bottleneck", "basic", "res2", "resnest"
_SK, _SK_BASIC = "sk", "sk_basic"   # SKNet
_DEEP = dict(stem="deep", stem_width=32)
_D = dict(stem="deep", stem_width=32, avg_down=True)
_T = dict(stem="deep_tiered", stem_width=32, avg_down=True)
_RS = dict(stem_pool="conv", attn="se", se_reduction=4, **_D)     # ResNet-RS
_LEGACY = dict(attn="se", legacy_se=True, stem_pool="max_ceil")   # timm senet.py
_LEGACY_BOTTLENECK = dict(stride_in_1x1=True, **_LEGACY)          # SEResNetBottleneck

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
    "seresnet50": dict(depths=(3, 4, 6, 3), attn="se"),
    "seresnet152d": dict(depths=(3, 8, 36, 3), attn="se", **_D),
    "seresnext26d_32x4d": dict(depths=(2, 2, 2, 2), groups=32, width_per_group=4, attn="se", **_D),
    "seresnext26t_32x4d": dict(depths=(2, 2, 2, 2), groups=32, width_per_group=4, attn="se", **_T),
    "seresnext50_32x4d": dict(depths=(3, 4, 6, 3), groups=32, width_per_group=4, attn="se"),
    "seresnext101_32x4d": dict(depths=(3, 4, 23, 3), groups=32, width_per_group=4, attn="se"),
    "seresnext101_32x8d": dict(depths=(3, 4, 23, 3), groups=32, width_per_group=8, attn="se"),
    "seresnext101_64x4d": dict(depths=(3, 4, 23, 3), groups=64, width_per_group=4, attn="se"),
    "seresnext101d_32x8d": dict(depths=(3, 4, 23, 3), groups=32, width_per_group=8, attn="se",
                                **_D),
    "senet154": dict(depths=(3, 8, 36, 3), groups=64, width_per_group=4, stem="deep",
                     stem_width=64, down_kernel=3, reduce_first=2, attn="se"),
    # ECA-ResNets: EcaModule after each block's last BN
    "ecaresnet26t": dict(depths=(2, 2, 2, 2), attn="eca", **_T),
    "ecaresnet50d": dict(depths=(3, 4, 6, 3), attn="eca", **_D),
    "ecaresnet50t": dict(depths=(3, 4, 6, 3), attn="eca", **_T),
    "ecaresnet101d": dict(depths=(3, 4, 23, 3), attn="eca", **_D),
    "ecaresnet269d": dict(depths=(3, 30, 48, 8), attn="eca", **_D),
    # pruned ones (timm models/_pruned/ecaresnet{50,101}d_pruned.txt): per stage (conv3
    # width, (conv1, conv2) widths per block); ECA keeps the unpruned width's kernel
    "ecaresnet50d_pruned": dict(depths=(3, 4, 6, 3), attn="eca", **_D, pruned=(
        (19, ((47, 18), (52, 22), (64, 35))),
        (171, ((85, 37), (107, 80), (120, 85), (125, 87))),
        (818, ((198, 126), (255, 232), (256, 233), (253, 235), (256, 225), (256, 239))),
        (2022, ((492, 237), (512, 500), (512, 490))))),
    "ecaresnet101d_pruned": dict(depths=(3, 4, 23, 3), attn="eca", **_D, pruned=(
        (26, ((45, 25), (53, 20), (60, 27))),
        (142, ((81, 24), (93, 49), (102, 54), (122, 78))),
        (278, ((101, 25), (239, 160), (234, 156), (250, 176), (253, 191), (251, 175),
               (230, 128), (244, 154), (244, 159), (238, 97), (244, 149), (253, 181),
               (245, 119), (255, 216), (256, 201), (253, 149), (254, 141), (256, 190),
               (256, 217), (255, 156), (256, 155), (256, 232), (256, 214))),
        (2042, ((499, 289), (512, 512), (512, 502))))),
    "ecaresnetlight": dict(depths=(1, 1, 11, 3), avg_down=True, attn="eca"),   # 7x7 stem
    # anti-aliased: 2x2 average pool ('aa') or BlurPool2d ('blur') for the stride-2 steps
    "resnetaa50": dict(depths=(3, 4, 6, 3), aa="avg"),
    "resnetaa50d": dict(depths=(3, 4, 6, 3), aa="avg", **_D),
    "resnetaa101d": dict(depths=(3, 4, 23, 3), aa="avg", **_D),
    "seresnextaa101d_32x8d": dict(depths=(3, 4, 23, 3), groups=32, width_per_group=8, aa="avg",
                                  attn="se", **_D),
    "seresnextaa201d_32x8d": dict(depths=(3, 24, 36, 4), groups=32, width_per_group=8,
                                  aa="avg", attn="se", stem="deep", stem_width=64,
                                  avg_down=True),
    "resnetblur50": dict(depths=(3, 4, 6, 3), aa="blur"),
    "resnet50_gn": dict(depths=(3, 4, 6, 3), norm="group"),
    # ResNet-RS: 'd' stem and shortcuts, a 3x3 stride-2 conv for the stem pool, SE of C / 4
    "resnetrs50": dict(depths=(3, 4, 6, 3), **_RS),
    "resnetrs101": dict(depths=(3, 4, 23, 3), **_RS),
    "resnetrs152": dict(depths=(3, 8, 36, 3), **_RS),
    "resnetrs200": dict(depths=(3, 24, 36, 3), **_RS),
    "resnetrs270": dict(depths=(4, 29, 53, 4), **_RS),
    "resnetrs350": dict(depths=(4, 36, 72, 4), **_RS),
    "resnetrs420": dict(depths=(4, 44, 87, 4), **_RS),
    "test_resnet": dict(block=(_BASIC, _BASIC, _BOTTLENECK, _BASIC), depths=(1, 1, 1, 1),
                        widths=(32, 48, 48, 96), stem="deep", stem_width=16, avg_down=True),
    # timm's legacy SENets (senet.py)
    "legacy_seresnet18": dict(block=_BASIC, depths=(2, 2, 2, 2), **_LEGACY),
    "legacy_seresnet34": dict(block=_BASIC, depths=(3, 4, 6, 3), **_LEGACY),
    "legacy_seresnet50": dict(depths=(3, 4, 6, 3), **_LEGACY_BOTTLENECK),
    "legacy_seresnet101": dict(depths=(3, 4, 23, 3), **_LEGACY_BOTTLENECK),
    "legacy_seresnet152": dict(depths=(3, 8, 36, 3), **_LEGACY_BOTTLENECK),
    "legacy_seresnext26_32x4d": dict(depths=(2, 2, 2, 2), groups=32, width_per_group=4,
                                     **_LEGACY),
    "legacy_seresnext50_32x4d": dict(depths=(3, 4, 6, 3), groups=32, width_per_group=4,
                                     **_LEGACY),
    "legacy_seresnext101_32x4d": dict(depths=(3, 4, 23, 3), groups=32, width_per_group=4,
                                      **_LEGACY),
    "legacy_senet154": dict(depths=(3, 8, 36, 3), groups=64, width_per_group=4, stem="deep",
                            stem_width=64, down_kernel=3, reduce_first=2, **_LEGACY),
    # Res2Net / Res2NeXt (res2net.py: timm's ResNet with Bottle2neck blocks)
    "res2net50_26w_4s": dict(block=_RES2, depths=(3, 4, 6, 3), width_per_group=26),
    "res2net101_26w_4s": dict(block=_RES2, depths=(3, 4, 23, 3), width_per_group=26),
    "res2net50_26w_6s": dict(block=_RES2, depths=(3, 4, 6, 3), width_per_group=26,
                             res2_scale=6),
    "res2net50_26w_8s": dict(block=_RES2, depths=(3, 4, 6, 3), width_per_group=26,
                             res2_scale=8),
    "res2net50_48w_2s": dict(block=_RES2, depths=(3, 4, 6, 3), width_per_group=48,
                             res2_scale=2),
    "res2net50_14w_8s": dict(block=_RES2, depths=(3, 4, 6, 3), width_per_group=14,
                             res2_scale=8),
    "res2next50": dict(block=_RES2, depths=(3, 4, 6, 3), groups=8, width_per_group=4),
    "res2net50d": dict(block=_RES2, depths=(3, 4, 6, 3), width_per_group=26, **_D),
    "res2net101d": dict(block=_RES2, depths=(3, 4, 23, 3), width_per_group=26, **_D),
    # SKNet (sknet.py: timm's ResNet with SelectiveKernel blocks)
    "skresnet18": dict(block=_SK_BASIC, depths=(2, 2, 2, 2), sk_rd=(1 / 8, 16)),
    "skresnet34": dict(block=_SK_BASIC, depths=(3, 4, 6, 3), sk_rd=(1 / 8, 16)),
    "skresnext50_32x4d": dict(block=_SK, depths=(3, 4, 6, 3), groups=32, width_per_group=4,
                              sk_rd=(1 / 16, 32), sk_split_input=False),
    # ResNeSt (resnest.py: timm's ResNet with ResNestBottleneck blocks)
    "resnest14d": dict(block=_RESNEST, depths=(1, 1, 1, 1), **_D),
    "resnest26d": dict(block=_RESNEST, depths=(2, 2, 2, 2), **_D),
    "resnest50d": dict(block=_RESNEST, depths=(3, 4, 6, 3), **_D),
    "resnest101e": dict(block=_RESNEST, depths=(3, 4, 23, 3), stem="deep", stem_width=64,
                        avg_down=True),
    "resnest200e": dict(block=_RESNEST, depths=(3, 24, 36, 3), stem="deep", stem_width=64,
                        avg_down=True),
    "resnest269e": dict(block=_RESNEST, depths=(3, 30, 48, 8), stem="deep", stem_width=64,
                        avg_down=True),
    "resnest50d_4s2x40d": dict(block=_RESNEST, depths=(3, 4, 6, 3), groups=2,
                               width_per_group=40, radix=4, avd_first=True, **_D),
    "resnest50d_1s4x24d": dict(block=_RESNEST, depths=(3, 4, 6, 3), groups=4,
                               width_per_group=24, radix=1, avd_first=True, **_D),
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

# timm's legacy SENets are not on the HF hub: timm downloads their GitHub release .pth files
# (timm 1.0 models/senet.py default_cfgs).
_GH = "https://github.com/rwightman/pytorch-image-models/releases/download/"
LEGACY_SENET_URLS = {
    "legacy_senet154.in1k": _GH + "v0.1-weights/legacy_senet154-e9eb9fe6.pth",
    "legacy_seresnet18.in1k": _GH + "v0.1-weights/seresnet18-4bb0ce65.pth",
    "legacy_seresnet34.in1k": _GH + "v0.1-weights/seresnet34-a4004e63.pth",
    "legacy_seresnet50.in1k": _GH + "v0.1-cadene/se_resnet50-ce0d4300.pth",
    "legacy_seresnet101.in1k": _GH + "v0.1-cadene/se_resnet101-7e38fcc6.pth",
    "legacy_seresnet152.in1k": _GH + "v0.1-cadene/se_resnet152-d17c99b7.pth",
    "legacy_seresnext26_32x4d.in1k": _GH + "v0.1-weights/seresnext26_32x4d-65ebdb501.pth",
    "legacy_seresnext50_32x4d.in1k": _GH + "v0.1-weights/legacy_se_resnext50_32x4d-f3651bad.pth",
    "legacy_seresnext101_32x4d.in1k":
        _GH + "v0.1-weights/legacy_se_resnext101_32x4d-37725eac.pth",
}
for _tag, _url in LEGACY_SENET_URLS.items():
  PRETRAINED[f"timm/{_tag}"] = dict(PRETRAINED[f"timm/{_tag}"], url=_url)

DOWNLOAD_HINT = ("ResNet weights: torchvision's https://download.pytorch.org/models/<arch>-<hash>"
                 ".pth or timm's https://huggingface.co/timm/<arch>.<tag> model.safetensors "
                 "(the legacy SENets: GitHub release .pth files; see "
                 "fi_jax.models.resnet.PRETRAINED)")


def se_channels(channels: int, reduction: int = 16, legacy: bool = False) -> int:
  """The SE bottleneck width: timm SEModule's make_divisible(channels / reduction, 8) (no
  round-up), or the legacy SENets' channels // reduction."""
  if legacy:
    return channels // reduction
  return max(8, int(channels / reduction + 4) // 8 * 8)


def eca_kernel_size(channels: int) -> int:
  """timm EcaModule's adaptive kernel size (gamma 2, beta 1): the odd t = |log2 C + 1| / 2,
  at least 3."""
  t = int(abs(math.log(channels, 2) + 1) / 2)
  return max(t if t % 2 else t + 1, 3)


@dataclasses.dataclass(frozen=True)
class BlockOptions:
  """What timm's ResNet variants change inside a block (see the module docstring)."""
  attn: Optional[str] = None     # None | "se" | "eca"
  se_reduction: int = 16
  legacy_se: bool = False        # senet.py: SE of C // 16, after the BasicBlock's 2nd ReLU
  aa: Optional[str] = None       # None | "avg" | "blur": anti-aliased stride-2 steps
  norm: str = "batch"            # "batch" | "group" (GroupNorm, 32 groups)
  reduce_first: int = 1          # the first 1x1's width = width // reduce_first
  stride_in_1x1: bool = False
  down_kernel: int = 1           # projection shortcut kernel on strided blocks
  res2_scale: int = 4
  bn_eps: float = 1e-5
  radix: int = 2                 # ResNeSt split attention
  avd_first: bool = False        # ResNeSt: the strided 3x3 average pool before the 3x3 conv
  sk_rd: tuple[float, int] = (1 / 16, 8)   # SKNet: attention width ratio, divisor
  sk_split_input: bool = True    # SKNet: each kernel path sees its half of the input channels


def norm_layer(opts: BlockOptions, name: str) -> nn.Module:
  """BatchNorm (running statistics) or GroupNorm(32) without activation."""
  if opts.norm == "group":
    return resnetv2.GroupNormAct(32, opts.bn_eps, relu=False, name=name)
  return blocks.BatchNorm(opts.bn_eps, name=name)


def anti_alias(kind: str, x):
  """timm's stride-2 anti-aliasing: AvgPool2d(2) ('avg') or BlurPool2d(filt_size=3) ('blur':
  reflect padding 1, the [1, 2, 1] / 4 filter on both axes, stride 2)."""
  if kind == "avg":
    return nn.avg_pool(x, (2, 2), strides=(2, 2), padding="VALID")
  p = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), mode="reflect")
  for axis in (1, 2):
    n = (p.shape[axis] - 3) // 2 + 1
    taps = [jax.lax.slice_in_dim(p, i, i + 2 * (n - 1) + 1, 2, axis) for i in range(3)]
    p = 0.25 * taps[0] + 0.5 * taps[1] + 0.25 * taps[2]
  return p


def max_pool_ceil(x, kernel: int = 3, stride: int = 2):
  """torch MaxPool2d(kernel, stride, ceil_mode=True), no padding."""
  pads = []
  for n in x.shape[1:3]:
    out = -(-(n - kernel) // stride) + 1
    pads.append((0, (out - 1) * stride + kernel - n))
  return nn.max_pool(x, (kernel, kernel), strides=(stride, stride), padding=tuple(pads))


class SqueezeExcite(nn.Module):
  """timm SEModule (attn_layer='se') and the legacy SENets' SEModule:
  x * sigmoid(fc2(relu(fc1(mean_hw(x))))), 1x1 convs with bias, `se_channels(C)` wide."""
  reduction: int = 16
  legacy: bool = False
  dtype: str = "float32"
  precision: Any = blocks.HIGHEST

  @nn.compact
  def __call__(self, x):
    conv = functools.partial(blocks.conv, use_bias=True, dtype=blocks.compute_dtype(self.dtype),
                             precision=self.precision)
    s = jnp.mean(x, axis=(1, 2), keepdims=True)
    width = se_channels(x.shape[-1], self.reduction, self.legacy)
    s = conv(x.shape[-1], 1, name="fc2")(nn.relu(conv(width, 1, name="fc1")(s)))
    return x * nn.sigmoid(s)


class EfficientChannelAttention(nn.Module):
  """timm EcaModule: x * sigmoid(conv1d(mean_hw(x))) with one k-tap filter (no bias) slid
  across the channels (zero padding (k - 1) / 2), k = eca_kernel_size(`kernel_channels`, by
  default C; a pruned model keeps the unpruned width's k)."""
  dtype: str = "float32"
  precision: Any = blocks.HIGHEST
  kernel_channels: Optional[int] = None

  @nn.compact
  def __call__(self, x):
    k = eca_kernel_size(self.kernel_channels or x.shape[-1])
    s = jnp.mean(x, axis=(1, 2))[..., None]                  # [B, C, 1]: channels as length
    s = nn.Conv(1, (k,), padding=(((k - 1) // 2, (k - 1) // 2),), use_bias=False,
                dtype=blocks.compute_dtype(self.dtype), param_dtype=jnp.float32,
                precision=self.precision, name="conv")(s)
    return x * nn.sigmoid(s[:, None, None, :, 0])


def _attention(opts: BlockOptions, x, dtype, precision, unpruned_channels=None):
  if opts.attn == "se":
    return SqueezeExcite(opts.se_reduction, opts.legacy_se, dtype, precision, name="se")(x)
  if opts.attn == "eca":
    return EfficientChannelAttention(dtype, precision, unpruned_channels, name="se")(x)
  return x


class BasicBlock(nn.Module):
  """3x3 (stride) -> BN -> ReLU -> [aa] -> 3x3 -> BN -> [attn], + shortcut, ReLU
  (ResNet-18/34)."""
  planes: int
  stride: int = 1
  shortcut: Optional[str] = None   # None (identity) | "conv" | "avg"
  opts: BlockOptions = BlockOptions()
  dtype: str = "float32"
  precision: Any = blocks.HIGHEST

  @nn.compact
  def __call__(self, x):
    o = self.opts
    conv = functools.partial(blocks.conv, dtype=blocks.compute_dtype(self.dtype),
                             precision=self.precision)
    use_aa = o.aa is not None and self.stride == 2
    y = nn.relu(norm_layer(o, "bn1")(conv(self.planes, 3, 1 if use_aa else self.stride,
                                           name="conv1")(x)))
    if use_aa:
      y = anti_alias(o.aa, y)
    y = norm_layer(o, "bn2")(conv(self.planes, 3, name="conv2")(y))
    if o.legacy_se:
      y = nn.relu(y)
    y = _attention(o, y, self.dtype, self.precision)
    return nn.relu(y + _shortcut(self, x, self.planes, conv))


class Bottleneck(nn.Module):
  """1x1 -> 3x3 (stride, groups) -> [aa] -> 1x1 (4 * planes), BN + ReLU between, [attn], +
  shortcut, ReLU."""
  planes: int
  stride: int = 1
  shortcut: Optional[str] = None
  groups: int = 1
  width_per_group: int = 64
  opts: BlockOptions = BlockOptions()
  dtype: str = "float32"
  precision: Any = blocks.HIGHEST
  pruned: Optional[tuple[int, int, int]] = None   # (conv1, conv2, conv3) widths of a pruned one

  @nn.compact
  def __call__(self, x):
    o = self.opts
    conv = functools.partial(blocks.conv, dtype=blocks.compute_dtype(self.dtype),
                             precision=self.precision)
    width = int(self.planes * self.width_per_group / 64) * self.groups
    first, out = width // o.reduce_first, 4 * self.planes
    if self.pruned:
      first, width, out = self.pruned
    use_aa = o.aa is not None and self.stride == 2
    s1 = self.stride if o.stride_in_1x1 else 1
    s2 = 1 if (o.stride_in_1x1 or use_aa) else self.stride
    y = nn.relu(norm_layer(o, "bn1")(conv(first, 1, s1, name="conv1")(x)))
    y = nn.relu(norm_layer(o, "bn2")(conv(width, 3, s2, groups=self.groups, name="conv2")(y)))
    if use_aa:
      y = anti_alias(o.aa, y)
    y = norm_layer(o, "bn3")(conv(out, 1, name="conv3")(y))
    y = _attention(o, y, self.dtype, self.precision, 4 * self.planes)
    return nn.relu(y + _shortcut(self, x, out, conv))


class Res2Bottleneck(nn.Module):
  """timm Bottle2neck: 1x1 (scale * w) -> split into `res2_scale` groups of w; group i (i <
  scale - 1) -> 3x3 conv (stride, groups) -> BN -> ReLU after adding the previous group's
  output (not on a stage's first block); the last group as is (3x3 average pool with the
  stride, padding 1, on the first block); concat -> 1x1 -> BN -> [attn], + shortcut, ReLU."""
  planes: int
  stride: int = 1
  shortcut: Optional[str] = None
  groups: int = 1
  width_per_group: int = 26
  opts: BlockOptions = BlockOptions()
  dtype: str = "float32"
  precision: Any = blocks.HIGHEST

  @nn.compact
  def __call__(self, x):
    o = self.opts
    conv = functools.partial(blocks.conv, dtype=blocks.compute_dtype(self.dtype),
                             precision=self.precision)
    width = int(math.floor(self.planes * self.width_per_group / 64)) * self.groups
    first = self.stride > 1 or self.shortcut is not None
    y = nn.relu(norm_layer(o, "bn1")(conv(width * o.res2_scale, 1, name="conv1")(x)))
    parts = jnp.split(y, o.res2_scale, axis=-1)
    outs, sp = [], None
    for i in range(max(1, o.res2_scale - 1)):
      sp = parts[i] if i == 0 or first else sp + parts[i]
      sp = nn.relu(norm_layer(o, f"bns_{i}")(conv(width, 3, self.stride, groups=self.groups,
                                                  name=f"convs_{i}")(sp)))
      outs.append(sp)
    if o.res2_scale > 1:
      last = parts[-1]
      if first:
        last = nn.avg_pool(last, (3, 3), strides=(self.stride, self.stride),
                           padding=((1, 1), (1, 1)), count_include_pad=True)
      outs.append(last)
    y = norm_layer(o, "bn3")(conv(4 * self.planes, 1, name="conv3")(jnp.concatenate(outs, -1)))
    y = _attention(o, y, self.dtype, self.precision)
    return nn.relu(y + _shortcut(self, x, 4 * self.planes, conv))


class SplitAttention(nn.Module):
  """timm SplitAttn (ResNeSt): a 3x3 conv to radix x C (groups x radix groups) -> BN -> ReLU;
  the radix splits summed, pooled -> fc1 (groups) -> BN -> ReLU -> fc2 (groups) -> softmax
  over the radix splits (sigmoid for radix 1) -> the splits' weighted sum."""
  features: int
  stride: int = 1
  groups: int = 1
  radix: int = 2
  bn_eps: float = 1e-5
  dtype: str = "float32"
  precision: Any = blocks.HIGHEST

  @nn.compact
  def __call__(self, x):
    conv = functools.partial(blocks.conv, dtype=blocks.compute_dtype(self.dtype),
                             precision=self.precision)
    c, r, g = self.features, self.radix, self.groups
    attn = max(32, int(x.shape[-1] * r * 0.25 + 4) // 8 * 8)
    attn += 8 if attn < 0.9 * x.shape[-1] * r * 0.25 else 0
    y = nn.relu(blocks.BatchNorm(self.bn_eps, name="bn0")(
        conv(c * r, 3, self.stride, groups=g * r, name="conv")(x)))
    splits = y.reshape(*y.shape[:-1], r, c)
    s = jnp.mean(splits.sum(axis=-2), axis=(1, 2), keepdims=True)
    s = nn.relu(blocks.BatchNorm(self.bn_eps, name="bn1")(
        conv(attn, 1, groups=g, use_bias=True, name="fc1")(s)))
    a = conv(c * r, 1, groups=g, use_bias=True, name="fc2")(s)   # [B, 1, 1, (g, r, c / g)]
    if r == 1:
      return y * nn.sigmoid(a)
    a = jax.nn.softmax(a.reshape(a.shape[0], 1, 1, g, r, c // g), axis=-2)
    a = jnp.swapaxes(a, -3, -2).reshape(a.shape[0], 1, 1, r, c)
    return jnp.sum(splits * a, axis=-2)


class SelectiveKernel(nn.Module):
  """timm SelectiveKernel (kernel_size [3, 5] kept 3x3: dilations 1 and 2): two conv-BN-ReLU
  paths (stride, groups; each on its half of the input with `split_input`), stacked; the
  sum's pooled mean -> fc_reduce -> BN -> ReLU -> fc_select (no biases) -> softmax over the
  paths -> the paths' weighted sum."""
  features: int
  stride: int = 1
  groups: int = 1
  rd: tuple[float, int] = (1 / 16, 8)
  split_input: bool = True
  bn_eps: float = 1e-5
  dtype: str = "float32"
  precision: Any = blocks.HIGHEST

  @nn.compact
  def __call__(self, x):
    c, cdt = self.features, blocks.compute_dtype(self.dtype)
    inputs = jnp.split(x, 2, axis=-1) if self.split_input else [x, x]
    paths = []
    for i, (xi, d) in enumerate(zip(inputs, (1, 2))):
      p = ((self.stride - 1) + 2 * d) // 2
      y = nn.Conv(c, (3, 3), strides=(self.stride,) * 2, padding=((p, p), (p, p)),
                  kernel_dilation=(d, d), feature_group_count=min(c, self.groups),
                  use_bias=False, dtype=cdt, param_dtype=jnp.float32, precision=self.precision,
                  name=f"path{i}_conv")(xi)
      paths.append(nn.relu(blocks.BatchNorm(self.bn_eps, name=f"path{i}_bn")(y)))
    ratio, divisor = self.rd
    v = c * ratio
    attn = max(divisor, int(v + divisor / 2) // divisor * divisor)
    attn += divisor if attn < 0.9 * v else 0
    conv = functools.partial(blocks.conv, dtype=cdt, precision=self.precision)
    s = jnp.mean(paths[0] + paths[1], axis=(1, 2), keepdims=True)
    s = nn.relu(blocks.BatchNorm(self.bn_eps, name="attn_bn")(
        conv(attn, 1, name="attn_fc_reduce")(s)))
    a = conv(2 * c, 1, name="attn_fc_select")(s)
    a = jax.nn.softmax(a.reshape(*a.shape[:-1], 2, c), axis=-2)
    return paths[0] * a[..., 0, :] + paths[1] * a[..., 1, :]


class ConvBN(nn.Module):
  """timm ConvNormAct: conv (no bias) -> BN [-> ReLU], as `conv` / `bn` submodules."""
  features: int
  kernel: int
  stride: int = 1
  relu: bool = True
  bn_eps: float = 1e-5
  dtype: str = "float32"
  precision: Any = blocks.HIGHEST

  @nn.compact
  def __call__(self, x):
    y = blocks.conv(self.features, self.kernel, self.stride, dtype=blocks.compute_dtype(self.dtype),
                    precision=self.precision, name="conv")(x)
    y = blocks.BatchNorm(self.bn_eps, name="bn")(y)
    return nn.relu(y) if self.relu else y


class SelectiveKernelBlock(nn.Module):
  """timm SelectiveKernelBasic (`basic`: SelectiveKernel (stride) -> 3x3 conv -> BN) and
  SelectiveKernelBottleneck (1x1 -> BN -> ReLU -> SelectiveKernel (stride, groups) -> 1x1 ->
  BN), + shortcut, ReLU."""
  planes: int
  stride: int = 1
  shortcut: Optional[str] = None
  groups: int = 1
  width_per_group: int = 64
  opts: BlockOptions = BlockOptions()
  dtype: str = "float32"
  precision: Any = blocks.HIGHEST
  basic: bool = False

  @nn.compact
  def __call__(self, x):
    o = self.opts
    conv = functools.partial(blocks.conv, dtype=blocks.compute_dtype(self.dtype),
                             precision=self.precision)
    sk = functools.partial(SelectiveKernel, rd=o.sk_rd, split_input=o.sk_split_input,
                           bn_eps=o.bn_eps, dtype=self.dtype, precision=self.precision)
    cbn = functools.partial(ConvBN, bn_eps=o.bn_eps, dtype=self.dtype, precision=self.precision)
    if self.basic:
      y = sk(self.planes, self.stride, name="conv1")(x)
      y = cbn(self.planes, 3, relu=False, name="conv2")(y)
      out = self.planes
    else:
      width = int(self.planes * self.width_per_group / 64) * self.groups
      y = cbn(width, 1, name="conv1")(x)
      y = sk(width, self.stride, self.groups, name="conv2")(y)
      out = 4 * self.planes
      y = cbn(out, 1, relu=False, name="conv3")(y)
    return nn.relu(y + _shortcut(self, x, out, conv))


class ResNestBottleneck(nn.Module):
  """timm ResNestBottleneck: 1x1 -> BN -> ReLU -> [avd: 3x3 average pool with the stride,
  before (avd_first) or after the split attention] -> SplitAttention (3x3) -> 1x1 -> BN, +
  shortcut, ReLU."""
  planes: int
  stride: int = 1
  shortcut: Optional[str] = None
  groups: int = 1
  width_per_group: int = 64
  opts: BlockOptions = BlockOptions()
  dtype: str = "float32"
  precision: Any = blocks.HIGHEST

  @nn.compact
  def __call__(self, x):
    o = self.opts
    conv = functools.partial(blocks.conv, dtype=blocks.compute_dtype(self.dtype),
                             precision=self.precision)
    width = int(self.planes * self.width_per_group / 64) * self.groups
    avd = lambda y: nn.avg_pool(y, (3, 3), strides=(self.stride, self.stride),
                                padding=((1, 1), (1, 1)), count_include_pad=True)
    y = nn.relu(norm_layer(o, "bn1")(conv(width, 1, name="conv1")(x)))
    if self.stride > 1 and o.avd_first:
      y = avd(y)
    y = SplitAttention(width, 1, self.groups, o.radix, o.bn_eps, self.dtype, self.precision,
                       name="conv2")(y)
    if self.stride > 1 and not o.avd_first:
      y = avd(y)
    y = norm_layer(o, "bn3")(conv(4 * self.planes, 1, name="conv3")(y))
    return nn.relu(y + _shortcut(self, x, 4 * self.planes, conv))


def _shortcut(block: nn.Module, x, features: int, conv):
  """Identity, conv (stride; `down_kernel` wide on strided blocks) + norm (torchvision), or
  avg-pool + 1x1 conv + norm (timm 'd')."""
  if block.shortcut is None:
    return x
  stride = block.stride
  kernel = block.opts.down_kernel if stride > 1 else 1
  if block.shortcut == "avg":
    if stride > 1:
      x = blocks.avg_pool_ceil(x, 2, stride)
    stride, kernel = 1, 1
  x = conv(features, kernel, stride, name="downsample_conv")(x)
  return norm_layer(block.opts, "downsample_bn")(x)


_BLOCKS = {_BASIC: BasicBlock, _BOTTLENECK: Bottleneck, _RES2: Res2Bottleneck,
           _RESNEST: ResNestBottleneck, _SK: SelectiveKernelBlock,
           _SK_BASIC: functools.partial(SelectiveKernelBlock, basic=True)}


class ResNet(nn.Module):
  """Stem -> 4 stages of blocks -> global average pool -> "head" (nn.Dense)."""
  num_classes: Optional[int] = 1000
  block: Any = _BOTTLENECK          # "bottleneck" | "basic" | "res2", or one per stage
  depths: Sequence[int] = (3, 4, 6, 3)
  widths: Sequence[int] = (64, 128, 256, 512)   # planes per stage (x4 out for bottlenecks)
  groups: int = 1                   # ResNeXt cardinality
  width_per_group: int = 64         # 128: Wide ResNet; ResNeXt 32x4d: 4; Res2Net: 26, ...
  stem: str = "7x7"                 # "7x7" | "deep" | "deep_tiered" (timm stem_type)
  stem_width: int = 64              # 7x7: its channels; deep: the first 3x3s' (out: 2x)
  stem_pool: str = "max"            # "max" | "max_ceil" (legacy SENets) | "conv" (ResNet-RS)
  avg_down: bool = False
  attn: Optional[str] = None        # None | "se" | "eca" (timm block_args attn_layer)
  se_reduction: int = 16
  legacy_se: bool = False
  aa: Optional[str] = None          # None | "avg" | "blur" (timm aa_layer)
  norm: str = "batch"               # "batch" | "group"
  reduce_first: int = 1
  stride_in_1x1: bool = False
  down_kernel: int = 1
  res2_scale: int = 4
  radix: int = 2                    # ResNeSt
  avd_first: bool = False
  sk_rd: tuple[float, int] = (1 / 16, 8)   # SKNet attention width: ratio, divisor
  sk_split_input: bool = True
  # timm's pruned ECA-ResNets: per stage (conv3 width, ((conv1, conv2) width per block, ...))
  pruned: Optional[tuple] = None
  bn_eps: float = 1e-5
  dtype: str = "float32"
  precision: Any = blocks.HIGHEST

  def _check(self) -> tuple[str, ...]:
    kinds = (self.block,) * len(self.depths) if isinstance(self.block, str) else tuple(self.block)
    bad = [k for k in kinds if k not in _BLOCKS]
    if bad or len(kinds) != len(self.depths):
      raise ValueError(f"block must be one of {sorted(_BLOCKS)} or one per stage, got "
                       f"{self.block!r}.")
    for field, value, allowed in (("stem", self.stem, ("7x7", "deep", "deep_tiered")),
                                  ("stem_pool", self.stem_pool, ("max", "max_ceil", "conv")),
                                  ("attn", self.attn, (None, "se", "eca")),
                                  ("aa", self.aa, (None, "avg", "blur")),
                                  ("norm", self.norm, ("batch", "group"))):
      if value not in allowed:
        raise ValueError(f"{field} must be one of {allowed}, got {value!r}.")
    if {_BASIC, _SK_BASIC} & set(kinds) and (self.groups != 1 or self.width_per_group != 64):
      raise ValueError("BasicBlock ResNets need groups=1 and width_per_group=64.")
    if self.pruned and (kinds != (_BOTTLENECK,) * 4 or self.groups != 1
                        or tuple(len(b) for _, b in self.pruned) != tuple(self.depths)):
      raise ValueError("pruned widths need a 4-stage grouped-conv-free bottleneck ResNet with "
                       "one (conv1, conv2) pair per block.")
    if {_RES2, _RESNEST, _SK, _SK_BASIC} & set(kinds) and (self.aa or self.attn
                                                          or self.norm != "batch"):
      raise ValueError("Res2Net / ResNeSt / SKNet blocks take no aa, attn or norm option.")
    return kinds

  @nn.compact
  def __call__(self, images, *, train: bool = False):
    del train   # inference only
    kinds = self._check()
    opts = BlockOptions(self.attn, self.se_reduction, self.legacy_se, self.aa, self.norm,
                        self.reduce_first, self.stride_in_1x1, self.down_kernel,
                        self.res2_scale, self.bn_eps, self.radix, self.avd_first,
                        tuple(self.sk_rd), self.sk_split_input)
    cdt = blocks.compute_dtype(self.dtype)
    conv = functools.partial(blocks.conv, dtype=cdt, precision=self.precision)
    norm = functools.partial(norm_layer, opts)
    out = {}
    x = jnp.asarray(images, cdt)
    if self.stem == "7x7":
      inplanes = self.stem_width
      x = conv(inplanes, 7, 2, name="conv1")(x)
    else:
      w = self.stem_width
      chs = (3 * (w // 4), w) if self.stem == "deep_tiered" else (w, w)
      inplanes = 2 * w
      x = nn.relu(norm("stem_bn1")(conv(chs[0], 3, 2, name="stem_conv1")(x)))
      x = nn.relu(norm("stem_bn2")(conv(chs[1], 3, name="stem_conv2")(x)))
      x = conv(inplanes, 3, name="conv1")(x)
    x = nn.relu(norm("bn1")(x))
    if self.stem_pool == "conv":
      x = conv(inplanes, 3, 1 if self.aa else 2, name="stem_pool_conv")(x)
      if self.aa:
        x = anti_alias(self.aa, x)
      x = nn.relu(norm("stem_pool_bn")(x))
    elif self.aa == "avg":
      x = anti_alias("avg", x)
    elif self.aa == "blur":
      x = anti_alias("blur", blocks.max_pool(x, 3, 1, 1))
    elif self.stem_pool == "max_ceil":
      x = max_pool_ceil(x)
    else:
      x = blocks.max_pool(x, 3, 2, 1)
    out["stem"] = x

    for s, (kind, depth, planes) in enumerate(zip(kinds, self.depths, self.widths)):
      expansion = 1 if kind in (_BASIC, _SK_BASIC) else 4
      for b in range(depth):
        stride = 2 if s > 0 and b == 0 else 1
        shortcut = None
        if b == 0 and (stride != 1 or inplanes != planes * expansion):
          shortcut = "avg" if self.avg_down else "conv"
        kw = dict(planes=planes, stride=stride, shortcut=shortcut, opts=opts, dtype=self.dtype,
                  precision=self.precision, name=f"layer{s + 1}_{b}")
        if kind not in (_BASIC, _SK_BASIC):
          kw.update(groups=self.groups, width_per_group=self.width_per_group)
        if self.pruned:
          kw.update(pruned=(*self.pruned[s][1][b], self.pruned[s][0]))
        x = _BLOCKS[kind](**kw)(x)
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
                              where=where, torch_module=convert_resnet.torch_module_of(sd))
