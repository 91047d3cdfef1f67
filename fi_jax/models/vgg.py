"""VGG in Flax, loading timm's `vgg*` weights (torchvision's VGG weights in timm's layout).

timm 1.0.31 `models/vgg.py`: `features` = 3x3 convs (padding 1, bias) each followed by ReLU
(`_bn`: conv -> BatchNorm (eps 1e-5, eval statistics) -> ReLU) and 2x2/2 max pools ('M'); then
timm's `ConvMlp` pre-logits: `fc1` a 7x7 conv without padding (torchvision's first Linear on
the 7x7 map, reshaped) -> ReLU -> `fc2` a 1x1 conv -> ReLU, where a map smaller than 7 is first
adaptive-average-pooled up to 7 on that side; then global average pooling (the pre-logits, 4096)
and the linear `head`. At 224 px the map is exactly 7x7 and this is torchvision's VGG.

`apply({"params": p}, images_nhwc)` returns `(logits, out)`: out["pre_logits"] is timm's
`forward_head(x, pre_logits=True)`; out["stage0".."stage4"] the map after each max pool
(NHWC, for the layer detectors), out["features"] the last of them.
Param names follow timm's indices: `features_<i>` (conv or BatchNorm at `features.<i>`),
`pre_logits_fc1`, `pre_logits_fc2`, `head`.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.models import _blocks as blocks
from fi_jax.models import _pretrained as pretrained
from fi_jax.models.convert import readers
from fi_jax.models.convert import vgg as convert

HIGHEST = jax.lax.Precision.HIGHEST

# timm's `cfgs` (Simonyan & Zisserman 2015, Table 1 configurations A, B, D, E).
CFGS: dict[str, tuple[Union[int, str], ...]] = {
    "vgg11": (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    "vgg13": (64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    "vgg16": (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512,
              "M"),
    "vgg19": (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512,
              512, 512, 512, "M"),
}
ARCHS: dict[str, dict] = {
    **{name: dict(cfg=cfg, batch_norm=False) for name, cfg in CFGS.items()},
    **{f"{name}_bn": dict(cfg=cfg, batch_norm=True) for name, cfg in CFGS.items()},
}

# every timm tag of ARCHS (tv_in1k: torchvision's weights; pp from timm's pretrained_cfg)
PRETRAINED: dict[str, dict] = pretrained.timm_tags(list(ARCHS))


def _adaptive_matrix(n_in: int, n_out: int) -> np.ndarray:
  """(n_out, n_in) averaging weights of torch's adaptive_avg_pool over one axis (window i:
  [floor(i n_in / n_out), ceil((i + 1) n_in / n_out)))."""
  m = np.zeros((n_out, n_in), np.float32)
  for i in range(n_out):
    lo, hi = (i * n_in) // n_out, -((-(i + 1) * n_in) // n_out)
    m[i, lo:hi] = 1.0 / (hi - lo)
  return m


def adaptive_avg_pool(x: jax.Array, size: tuple[int, int]) -> jax.Array:
  """torch's F.adaptive_avg_pool2d on NHWC (separable: rows then columns)."""
  rows = jnp.asarray(_adaptive_matrix(x.shape[1], size[0]))
  cols = jnp.asarray(_adaptive_matrix(x.shape[2], size[1]))
  return jnp.einsum("ih,jw,bhwc->bijc", rows, cols, x.astype(jnp.float32),
                    precision=HIGHEST).astype(x.dtype)


class _Model(nn.Module):
  num_classes: Optional[int] = 1000
  cfg: Sequence[Union[int, str]] = CFGS["vgg11"]
  batch_norm: bool = False
  hidden: int = 4096
  mlp_kernel: int = 7
  dtype: str = "float32"
  precision: Any = HIGHEST

  @nn.compact
  def __call__(self, image, *, train: bool = False):
    del train   # inference only (dropout off, BatchNorm statistics)
    dt = blocks.compute_dtype(self.dtype)
    kw = dict(dtype=dt, precision=self.precision)
    x = jnp.asarray(image, dt)
    idx = stage = 0
    out = {}
    for v in self.cfg:
      if v == "M":
        x = out[f"stage{stage}"] = nn.max_pool(x, (2, 2), strides=(2, 2))
        idx, stage = idx + 1, stage + 1
        continue
      x = blocks.conv(int(v), 3, use_bias=True, name=f"features_{idx}", **kw)(x)
      if self.batch_norm:
        x = blocks.BatchNorm(1e-5, name=f"features_{idx + 1}")(x)
      x = nn.relu(x)
      idx += 3 if self.batch_norm else 2
    out["features"] = x
    k = self.mlp_kernel
    if x.shape[1] < k or x.shape[2] < k:
      x = adaptive_avg_pool(x, (max(k, x.shape[1]), max(k, x.shape[2])))
    x = nn.relu(nn.Conv(self.hidden, (k, k), padding="VALID", name="pre_logits_fc1",
                        **kw)(x))
    x = nn.relu(nn.Conv(self.hidden, (1, 1), name="pre_logits_fc2", **kw)(x))
    x = out["pre_logits"] = blocks.global_avg_pool(x)
    if self.num_classes:
      x = out["logits"] = nn.Dense(self.num_classes, name="head", **kw)(x.astype(dt)).astype(
          jnp.float32)
    return x, out


def Model(num_classes: Optional[int] = 1000, *, variant: str, **kw) -> _Model:
  """`Model(1000, variant="vgg16_bn")`; `kw` overrides ARCHS (cfg, batch_norm, hidden, dtype)."""
  kw.pop("source", None)
  name = variant.split(".")[0]
  if name not in ARCHS:
    raise ValueError(f"Unknown VGG variant {variant!r}; known: {sorted(ARCHS)}.")
  return _Model(num_classes, **{**ARCHS[name], **kw})


def load(init_params, init_file: str, model_cfg: Optional[Mapping] = None) -> dict:
  """timm VGG weights (.safetensors / .pth) onto `init_params` (arrays or shapes)."""
  del model_cfg
  sd = readers.read_state_dict(init_file, hint=convert.HINT)
  return convert.convert(sd, init_params, file=init_file)
