"""ConvNeXt (v1) in Flax, loading torchvision's, timm's and the official (ConvNeXt, DINOv3) weights.

`Model(1000, variant="convnext_tiny")` builds: a 4x4/4 patchify conv + LayerNorm stem, four
stages of ConvNeXt blocks (depthwise 7x7 conv -> LayerNorm -> Linear 4x -> exact GELU -> Linear
-> per-channel layer scale, plus the residual) with a LayerNorm + 2x2/2 conv between stages,
then global average pooling, a LayerNorm and the linear `head`. torchvision's and timm's models
compute the same function (LayerNorm eps 1e-6 everywhere) under different parameter names;
`load` reads either layout.

`apply({"params": p}, images_nhwc)` returns `(logits, out)`: out["pre_logits"] is the
normalised pooled feature the head reads (torchvision: the classifier Linear's input; timm:
`forward_head(x, pre_logits=True)`); out["stem"] and out["stage0".."stage3"] are NHWC maps.

DINOv3 ConvNeXt (facebookresearch/dinov3 at 6876159, `dinov3/models/convnext.py`): the same
network without a classifier; its output `x_norm_clstoken` is the final LayerNorm (`norm`) of
the spatial mean of the last stage, i.e. `out["pre_logits"]` here (a headless model:
num_classes 0, logits = pre_logits). DINOv3 publishes no linear classifier for its ConvNeXts
(its only ImageNet-1k linear head, `dinov3_vit7b16_lc`, is for the ViT-7B).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fi_jax.data import preprocess
from fi_jax.models import _blocks
from fi_jax.models import _pretrained as pretrained
from fi_jax.models.convert import convnext as convert
from fi_jax.models.convert import readers

# variant: module keyword arguments (ConvNeXt paper, Table 9; same in torchvision and timm).
ARCHS: dict[str, dict] = {
    "convnext_tiny": dict(depths=(3, 3, 9, 3), dims=(96, 192, 384, 768)),
    "convnext_small": dict(depths=(3, 3, 27, 3), dims=(96, 192, 384, 768)),
    "convnext_base": dict(depths=(3, 3, 27, 3), dims=(128, 256, 512, 1024)),
    "convnext_large": dict(depths=(3, 3, 27, 3), dims=(192, 384, 768, 1536)),
    "convnext_xlarge": dict(depths=(3, 3, 27, 3), dims=(256, 512, 1024, 2048)),   # timm only
    # timm's small ones (conv_mlp=True: the MLP as 1x1 convs, the same function)
    "convnext_atto": dict(depths=(2, 2, 6, 2), dims=(40, 80, 160, 320)),
    "convnext_femto": dict(depths=(2, 2, 6, 2), dims=(48, 96, 192, 384)),
    "convnext_pico": dict(depths=(2, 2, 6, 2), dims=(64, 128, 256, 512)),
    "convnext_nano": dict(depths=(2, 2, 8, 2), dims=(80, 160, 320, 640)),
}
_TIMM_OPTIONS = {   # timm 1.0.31 `models/convnext.py`: the same blocks with other stems, norms, heads
    "convnext_atto_ols": ("convnext_atto", dict(stem="overlap_tiered")),
    "convnext_femto_ols": ("convnext_femto", dict(stem="overlap_tiered")),
    "convnext_pico_ols": ("convnext_pico", dict(stem="overlap_tiered")),
    "convnext_nano_ols": ("convnext_nano", dict(stem="overlap")),
    "convnext_tiny_hnf": ("convnext_tiny", dict(head_norm_first=True)),
    "convnext_large_mlp": ("convnext_large", dict(head_hidden=1536)),
}
ARCHS.update({name: {**ARCHS[base], **opts} for name, (base, opts) in _TIMM_OPTIONS.items()})
ARCHS.update({
    "convnext_zepto_rms": dict(depths=(2, 2, 4, 2), dims=(32, 64, 128, 256), norm="simplenorm"),
    "convnext_zepto_rms_ols": dict(depths=(2, 2, 4, 2), dims=(32, 64, 128, 256),
                                   norm="simplenorm", stem="overlap_act"),
    "convnext_xxlarge": dict(depths=(3, 4, 30, 3), dims=(384, 768, 1536, 3072), eps=1e-5),
    # timm's test models (160 px)
    "test_convnext": dict(depths=(1, 2, 4, 2), dims=(24, 32, 48, 64), eps=1e-5, act="gelu_tanh"),
    "test_convnext2": dict(depths=(1, 1, 1, 1), dims=(32, 64, 96, 128), eps=1e-5,
                           act="gelu_tanh"),
    "test_convnext3": dict(depths=(1, 1, 1, 1), dims=(32, 64, 96, 128), eps=1e-5,
                           kernel_sizes=(7, 5, 5, 3), act="silu"),
})
# DINOv3's distilled ConvNeXts (facebookresearch/dinov3 at 6876159, `dinov3/models/convnext.py`
# `convnext_sizes`): the v1 architecture; the official files are headless (`norm` = head_norm).
ARCHS.update({f"dinov3_convnext_{s}": ARCHS[f"convnext_{s}"]
              for s in ("tiny", "small", "base", "large")})

def _tv_pp(resize: int) -> str:
  # torchvision ImageClassification: Resize(resize, bilinear) + CenterCrop(224), ImageNet stats.
  return preprocess.torchvision_pp(resize, 224, "bilinear")


def _pretrained() -> dict[str, dict]:
  table = {}
  tv = {"tiny": ("983f1562", 236), "small": ("0c510722", 230), "base": ("6075fbad", 232),
        "large": ("ea097f82", 232)}
  for size, (sha, resize) in tv.items():
    table[f"torchvision/convnext_{size}.IMAGENET1K_V1"] = dict(
        variant=f"convnext_{size}", source="torchvision", num_classes=1000, pp=_tv_pp(resize),
        input_size=224, url=f"https://download.pytorch.org/models/convnext_{size}-{sha}.pth")
  # every timm tag of the four sizes (fb_in1k, fb_in22k[_ft_in1k[_384]], in12k_ft_in1k, ...;
  # convnext_<size>.dinov3_lvd1689m: DINOv3's ConvNeXts converted by timm, headless)
  table.update(pretrained.timm_tags([a for a in ARCHS if not a.startswith("dinov3_")]))
  # DINOv3's official ConvNeXt files (facebookresearch/dinov3 hub/backbones.py): headless, the
  # official classification eval transform (as for the DINOv3 ViTs).
  for size, sha in (("tiny", "21b726bb"), ("small", "296db49d"), ("base", "801f2ba9"),
                    ("large", "61fa432d")):
    m = f"dinov3_convnext_{size}"
    table[f"dinov3/{m}.lvd1689m"] = dict(
        variant=m, source="fb", num_classes=0, input_size=224,
        pp=preprocess.torchvision_pp(256, 224, "bicubic"),
        url=f"https://dl.fbaipublicfiles.com/dinov3/{m}/{m}_pretrain_lvd1689m-{sha}.pth")
  return table


# Published weights: torchvision's IMAGENET1K_V1 and every timm tag of ARCHS (pp from
# torchvision's weights `transforms` and timm's pretrained_cfg facts, `_timm_tags`).
PRETRAINED: dict[str, dict] = _pretrained()


def _layer_norm(name: str, eps: float) -> nn.LayerNorm:
  # Two-pass variance as torch computes it; always in float32.
  return nn.LayerNorm(epsilon=eps, use_fast_variance=False, dtype=jnp.float32, name=name)


class GlobalResponseNorm(nn.Module):
  """ConvNeXt V2's GRN on NHWC maps: x + bias + weight * x * n, where n is each channel's
  spatial L2 norm divided by its mean over the channels (+ eps); params `weight`, `bias` (C,).

  The spatial sums of squares are a product with a vector of ones: XLA:CPU fuses a plain sum
  over the spatial axes with its producer into a loop that strides across the channels (with
  its tree-reduction rewrite off, as in the forward step: ConvNeXt V2-T 2.86 s against 2.37 s a
  batch of 32)."""
  eps: float = 1e-6

  @nn.compact
  def __call__(self, x):
    c = x.shape[-1]
    weight = self.param("weight", nn.initializers.zeros, (c,), jnp.float32)
    bias = self.param("bias", nn.initializers.zeros, (c,), jnp.float32)
    x32 = x.astype(jnp.float32)
    b, h, w, _ = x32.shape
    squares = jnp.einsum("bsc,s->bc", jnp.square(x32).reshape(b, h * w, c),
                         jnp.ones((h * w,), jnp.float32), precision=_blocks.HIGHEST)
    norm = jnp.sqrt(squares)[:, None, None]
    n = norm / (jnp.mean(norm, axis=-1, keepdims=True) + self.eps)
    return (x32 + (bias + weight * (x32 * n))).astype(x.dtype)


class SimpleNorm(nn.Module):
  """timm's `SimpleNorm` / `SimpleNorm2d` (the `_rms` ConvNeXts' norm) over the last axis:
  x * rsqrt(var(x) + eps) * scale, with torch.var's unbiased (n - 1) variance about the mean
  but no mean subtraction from x; param `scale` (C,), no bias."""
  eps: float = 1e-6

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), jnp.float32)
    x32 = x.astype(jnp.float32)
    var = jnp.var(x32, axis=-1, keepdims=True, ddof=1)
    return x32 * jax.lax.rsqrt(var + self.eps) * scale


def _norm(kind: str, name: str, eps: float) -> nn.Module:
  """"layernorm" (every ConvNeXt but the `_rms` ones) or "simplenorm"; float32 output."""
  if kind == "layernorm":
    return _layer_norm(name, eps)
  if kind == "simplenorm":
    return SimpleNorm(eps, name=name)
  raise ValueError(f"ConvNeXt norm must be 'layernorm' or 'simplenorm', got {kind!r}.")


_ACTS = {"gelu": _blocks.gelu_exact,
         "gelu_tanh": lambda x: nn.gelu(x, approximate=True), "silu": nn.silu}


def _act(name: str):
  if name not in _ACTS:
    raise ValueError(f"ConvNeXt activation must be one of {sorted(_ACTS)}, got {name!r}.")
  return _ACTS[name]


def make_divisible(v: float, divisor: int = 8) -> int:
  """timm's `make_divisible` (round to a multiple of `divisor`, at least `divisor`, never
  below 90% of v)."""
  new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
  return new_v + divisor if new_v < 0.9 * v else new_v


class Block(nn.Module):
  """dwconv kxk -> norm -> Dense 4x -> act -> [GRN] -> Dense -> [layer scale], + input.
  ConvNeXt v1: layer scale, no GRN; ConvNeXt V2: GRN, no layer scale. Defaults (7x7, LayerNorm,
  exact GELU) are every released ConvNeXt's but timm's `_rms` / `test_convnext*` ones."""
  dim: int
  eps: float = 1e-6
  dtype: Any = jnp.float32
  precision: Any = jax.lax.Precision.HIGHEST
  grn: bool = False
  layer_scale: bool = True
  kernel_size: int = 7
  norm: str = "layernorm"
  act: str = "gelu"

  @nn.compact
  def __call__(self, x):
    k, pad = self.kernel_size, (self.kernel_size - 1) // 2
    y = _blocks.DepthwiseConv((k, k), padding=((pad, pad), (pad, pad)), dtype=self.dtype,
                              precision=self.precision, name="dwconv")(x)
    y = _norm(self.norm, "norm", self.eps)(y).astype(self.dtype)
    y = nn.Dense(4 * self.dim, dtype=self.dtype, precision=self.precision, name="fc1")(y)
    y = _act(self.act)(y)
    if self.grn:
      y = GlobalResponseNorm(name="grn")(y)
    y = nn.Dense(self.dim, dtype=self.dtype, precision=self.precision, name="fc2")(y)
    if self.layer_scale:
      scale = self.param("layer_scale", nn.initializers.constant(1e-6), (self.dim,), jnp.float32)
      y = scale.astype(self.dtype) * y
    return x + y


STEMS = ("patch", "overlap", "overlap_tiered", "overlap_act")


class _Model(nn.Module):
  """ConvNeXt v1 (`grn=False, layer_scale=True`) or V2 (`grn=True, layer_scale=False`); the
  param tree is the same whichever library the weights come from.

  timm's options: `stem` "patch" (4x4/4 conv, the default) or "overlap[_tiered|_act]" (two
  3x3/2 convs `stem_mid` -> `stem`, the first to dims[0] // 2 rounded to 8 when tiered, an
  activation between them with `_act`); `norm` "layernorm" / "simplenorm" (every norm of the
  network); `act` of the block MLPs; per-stage `kernel_sizes`; `head_norm_first` (the norm
  `norm_pre` on the map before pooling, no norm after); `head_hidden` (a Dense + exact GELU
  `head_hidden` between the pooled norm and the head, timm's MLP head: pre_logits is its
  output)."""
  num_classes: Optional[int] = 1000
  depths: Sequence[int] = (3, 3, 9, 3)
  dims: Sequence[int] = (96, 192, 384, 768)
  eps: float = 1e-6
  grn: bool = False
  layer_scale: bool = True
  stem: str = "patch"
  norm: str = "layernorm"
  act: str = "gelu"
  kernel_sizes: Sequence[int] = (7, 7, 7, 7)
  head_norm_first: bool = False
  head_hidden: Optional[int] = None
  dtype: str = "float32"
  precision: Any = jax.lax.Precision.HIGHEST

  @nn.compact
  def __call__(self, image, *, train: bool = False):
    del train   # inference only: no stochastic depth
    if self.stem not in STEMS:
      raise ValueError(f"ConvNeXt stem must be one of {STEMS}, got {self.stem!r}.")
    if self.head_norm_first and self.head_hidden:
      raise ValueError("ConvNeXt: head_norm_first and head_hidden exclude each other (timm).")
    dt = jnp.dtype(self.dtype)
    kw = dict(dtype=dt, precision=self.precision)
    out = {}
    x = jnp.asarray(image, dt)
    if self.stem == "patch":
      x = nn.Conv(self.dims[0], (4, 4), strides=(4, 4), padding="VALID", name="stem", **kw)(x)
    else:
      mid = make_divisible(self.dims[0] // 2) if "tiered" in self.stem else self.dims[0]
      x = nn.Conv(mid, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)), name="stem_mid",
                  **kw)(x)
      if "act" in self.stem:
        x = _act(self.act)(x)
      x = nn.Conv(self.dims[0], (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)), name="stem",
                  **kw)(x)
    x = out["stem"] = _norm(self.norm, "stem_norm", self.eps)(x).astype(dt)
    for i, (depth, dim) in enumerate(zip(self.depths, self.dims)):
      if i > 0:
        x = _norm(self.norm, f"downsample{i}_norm", self.eps)(x).astype(dt)
        x = nn.Conv(dim, (2, 2), strides=(2, 2), padding="VALID", name=f"downsample{i}", **kw)(x)
      for j in range(depth):
        x = Block(dim, self.eps, grn=self.grn, layer_scale=self.layer_scale,
                  kernel_size=self.kernel_sizes[i], norm=self.norm, act=self.act,
                  name=f"stage{i}_block{j}", **kw)(x)
      out[f"stage{i}"] = x
    if self.head_norm_first:
      x = _norm(self.norm, "norm_pre", self.eps)(x)
      x = out["pre_logits"] = jnp.mean(x.astype(jnp.float32), axis=(1, 2))
    else:
      x = jnp.mean(x.astype(jnp.float32), axis=(1, 2))
      x = _norm(self.norm, "head_norm", self.eps)(x)
      if self.head_hidden:
        x = nn.Dense(self.head_hidden, name="head_hidden", **kw)(x.astype(dt))
        x = _blocks.gelu_exact(x.astype(jnp.float32))
      out["pre_logits"] = x
    if self.num_classes:
      x = out["logits"] = nn.Dense(self.num_classes, name="head", **kw)(x.astype(dt)).astype(
          jnp.float32)
    return x, out


def _arch(variant: str) -> dict:
  name = variant.split(".")[0]   # timm names may carry a pretrained tag: convnext_tiny.fb_in1k
  if name not in ARCHS:
    raise ValueError(f"Unknown ConvNeXt variant {variant!r}; known: {sorted(ARCHS)}.")
  return ARCHS[name]


def Model(num_classes: Optional[int] = 1000, *, variant: str, **kw) -> _Model:
  """`Model(1000, variant="convnext_tiny")`; `kw` overrides ARCHS (depths, dims, dtype...).
  A `source` key (which layout `load` reads) is accepted and ignored: both compute the same."""
  kw.pop("source", None)
  return _Model(num_classes, **{**_arch(variant), **kw})


def load(init_params, init_file: str, model_cfg: Optional[Mapping] = None) -> dict:
  """torchvision (features.* / classifier.*), timm (stem.* / stages.* / head.*) or official
  (downsample_layers.* / stages.<i>.<j>.*) ConvNeXt v1 / V2 weights from .pth or .safetensors
  onto `init_params` (arrays or ShapeDtypeStructs).

  The layout is read off the keys unless `model_cfg["source"]` says "torchvision" / "timm" /
  "fb".
  """
  sd = readers.read_state_dict(init_file, hint=convert.HINT)
  return convert.convert(sd, init_params, source=(model_cfg or {}).get("source"),
                         file=init_file)
