"""DenseNet in Flax, loading timm's `densenet*` weights (torchvision's DenseNets in timm's layout).

timm 1.0.31 `models/densenet.py` (Huang et al. 2017): a stem (7x7/2 conv -> BN+ReLU -> 3x3/2
max pool; `densenetblur121d`: the "deep" stem of three 3x3 convs (/2, 1, 1) each with BN+ReLU,
then a 3x3/1 max pool and a blur pool (binomial [1, 2, 1]^2 / 16 depthwise filter, reflect
padding 1, stride 2; Zhang 2019)); dense blocks whose layers read the concatenation of every
earlier map: BN+ReLU -> 1x1 conv (bn_size * growth) -> BN+ReLU -> 3x3 conv (growth), appended;
transitions BN+ReLU -> 1x1 conv (half the channels) -> 2x2/2 average pool; a final BN+ReLU
(`norm5`), global average pooling (the pre-logits) and the linear `head`. Convs have no bias;
BatchNorm eps 1e-5, eval statistics.

`apply({"params": p}, images_nhwc)` returns `(logits, out)`: out["pre_logits"] is timm's
`forward_head(x, pre_logits=True)`; out["stem"] (after the stem's pool) and out["stage0"..
"stage3"] (after each dense block and its transition; NHWC, for the layer detectors),
out["features"] the map after `norm5`. Param names
are timm's module names under `features.` with "." -> "_" (`denseblock1_denselayer1_conv1`,
`transition1_norm`, `norm5`, ...), and `head` for `classifier`.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.models import _blocks as blocks
from fi_jax.models import _pretrained as pretrained
from fi_jax.models.convert import densenet as convert
from fi_jax.models.convert import readers

HIGHEST = jax.lax.Precision.HIGHEST

ARCHS: dict[str, dict] = {
    "densenet121": dict(growth_rate=32, block_config=(6, 12, 24, 16)),
    "densenet161": dict(growth_rate=48, block_config=(6, 12, 36, 24)),
    "densenet169": dict(growth_rate=32, block_config=(6, 12, 32, 32)),
    "densenet201": dict(growth_rate=32, block_config=(6, 12, 48, 32)),
    "densenetblur121d": dict(growth_rate=32, block_config=(6, 12, 24, 16), deep_stem=True,
                             blur_stem=True),
}

# every timm tag of ARCHS (tv_in1k: torchvision's weights; ra_in1k: timm's; pp from timm's
# pretrained_cfg)
PRETRAINED: dict[str, dict] = pretrained.timm_tags(list(ARCHS))


def blur_pool(x: jax.Array) -> jax.Array:
  """timm's BlurPool2d(filt_size=3, stride=2): reflect-pad 1, depthwise [1,2,1]^T[1,2,1] / 16,
  stride 2."""
  x = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), mode="reflect")
  taps = np.array([1.0, 2.0, 1.0], np.float32) / 4.0
  c = x.shape[-1]
  kernel = jnp.asarray(np.tile(np.outer(taps, taps)[:, :, None, None], (1, 1, 1, c)), x.dtype)
  return jax.lax.conv_general_dilated(
      x, kernel, (2, 2), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"),
      feature_group_count=c, precision=HIGHEST)


class _Model(nn.Module):
  num_classes: Optional[int] = 1000
  growth_rate: int = 32
  block_config: Sequence[int] = (6, 12, 24, 16)
  bn_size: int = 4
  deep_stem: bool = False
  blur_stem: bool = False
  dtype: str = "float32"
  precision: Any = HIGHEST

  @nn.compact
  def __call__(self, image, *, train: bool = False):
    del train   # inference only (BatchNorm statistics, no dropout)
    dt = blocks.compute_dtype(self.dtype)
    kw = dict(dtype=dt, precision=self.precision)

    def bn_relu(name, x):
      return nn.relu(blocks.BatchNorm(1e-5, name=name)(x))

    x = jnp.asarray(image, dt)
    g = self.growth_rate
    if self.deep_stem:
      for i, (ch, stride) in enumerate(((g, 2), (g, 1), (2 * g, 1))):
        x = blocks.conv(ch, 3, stride, name=f"conv{i}", **kw)(x)
        x = bn_relu(f"norm{i}", x)
    else:
      x = blocks.conv(2 * g, 7, 2, name="conv0", **kw)(x)
      x = bn_relu("norm0", x)
    if self.blur_stem:
      x = blur_pool(blocks.max_pool(x, 3, 1, 1))
    else:
      x = blocks.max_pool(x, 3, 2, 1)
    out = {"stem": x}
    for b, n_layers in enumerate(self.block_config, start=1):
      for j in range(1, n_layers + 1):
        p = f"denseblock{b}_denselayer{j}"
        y = bn_relu(f"{p}_norm1", x)
        y = blocks.conv(self.bn_size * g, 1, name=f"{p}_conv1", **kw)(y)
        y = bn_relu(f"{p}_norm2", y)
        y = blocks.conv(g, 3, name=f"{p}_conv2", **kw)(y)
        x = jnp.concatenate([x, y], axis=-1)
      if b < len(self.block_config):
        x = bn_relu(f"transition{b}_norm", x)
        x = blocks.conv(x.shape[-1] // 2, 1, name=f"transition{b}_conv", **kw)(x)
        x = nn.avg_pool(x, (2, 2), strides=(2, 2))
      out[f"stage{b - 1}"] = x
    x = out["features"] = bn_relu("norm5", x)
    x = out["pre_logits"] = blocks.global_avg_pool(x)
    if self.num_classes:
      x = out["logits"] = nn.Dense(self.num_classes, name="head", **kw)(x.astype(dt)).astype(
          jnp.float32)
    return x, out


def Model(num_classes: Optional[int] = 1000, *, variant: str, **kw) -> _Model:
  """`Model(1000, variant="densenet121")`; `kw` overrides ARCHS (growth_rate, block_config,
  bn_size, deep_stem, blur_stem, dtype)."""
  kw.pop("source", None)
  name = variant.split(".")[0]
  if name not in ARCHS:
    raise ValueError(f"Unknown DenseNet variant {variant!r}; known: {sorted(ARCHS)}.")
  return _Model(num_classes, **{**ARCHS[name], **kw})


def load(init_params, init_file: str, model_cfg: Optional[Mapping] = None) -> dict:
  """timm DenseNet weights (.safetensors / .pth) onto `init_params` (arrays or shapes)."""
  del model_cfg
  sd = readers.read_state_dict(init_file, hint=convert.HINT)
  return convert.convert(sd, init_params, file=init_file)
