"""DINOv3 ViT in Flax, loading timm's `vit_*_dinov3*` files and the official DINOv3 files.

The DINOv3 backbone (Siméoni et al. 2025; facebookresearch/dinov3 at 6876159,
`dinov3/models/vision_transformer.py`; timm 1.0.31 runs it as `Eva` with `rope_type='dinov3'`):
patch conv (16x16), a class token and 4 **storage (register) tokens** in front, **no absolute
position embedding**; pre-LN blocks (LayerNorm eps 1e-5) with **layer scale** on both branches,
fused qkv attention applying **2-D RoPE** to the patch tokens, and a GELU MLP (S, B, L) or a
SwiGLU (`fc1_g`, `fc1_x`; S+, L+, H+); a final LayerNorm `norm` on every token.

RoPE ('half' layout): head_dim/4 periods 100^(2i / (head_dim/2)) (the `rope_periods` param:
the official files store them, rounded to bfloat16, in `rope_embed.periods`; timm files do not,
and the loader fills in the float32 values timm derives); patch-centre coordinates in [-1, 1]
per axis ((i + 0.5) / n * 2 - 1); angle 2π·coord / period, [row | column] angles repeated over
the two halves of each head, (a, b) -> (a cos - b sin, b cos + a sin).

Query / value biases: the official `LinearKMaskedBias` stores one qkv bias and a `bias_mask`
(the key third 0); the loader applies the mask and refuses a non-zero key bias. timm's `_qkvb`
models keep `q_bias` / `v_bias`, the others (whose released biases are all zero) none.

Pooling (`pool`; `out["cls"]` is the class token either way): "token" = the normalised class
token (DINOv3's own output, `x_norm_clstoken`: the official files' default), "avg" = the mean
of the normalised patch tokens (timm's default `global_pool='avg'` for these models: the timm
names' default). The backbones are headless
(`out["pre_logits"]` = the pooled feature; logits = pre_logits), except the 7B's ImageNet-1k
linear classifier.

The 7B (`dinov3_vit7b16`, hub/backbones.py): width 4096, 40 blocks, 32 heads, SwiGLU with
ffn_ratio 3 aligned to 64 (`swiglu_hidden`: 8192), no qkv bias, and an untied training-only
`local_cls_norm` (inference normalises every token with `norm`). Its linear classifier
(`dinov3_vit7b16_lc`, hub/classifiers.py `_LinearClassifierWrapper`): pool "token_avg" =
concat(normalised class token, mean of the normalised patch tokens) (2 * 4096), then `head`
Dense to 1000 classes; the head comes in its own file (`HEAD_FILE`). Preprocessing: timm's
pretrained_cfg (256 px, crop_pct 1.0, bicubic, ImageNet mean / std; SAT-493M weights: their
own mean / std) for timm names; the official classification eval transform (Resize(256,
bicubic), CenterCrop(224), ImageNet mean / std) for the official files.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.data import preprocess
from fi_jax.models import _blocks
from fi_jax.models import _pretrained as pretrained
from fi_jax.models.beit import layer_norm
from fi_jax.models.convert import dinov3 as convert
from fi_jax.models.convert import readers
from fi_jax.models.eva import Attention, Mlp

HIGHEST = jax.lax.Precision.HIGHEST
POOLS = ("avg", "token", "token_avg")


def swiglu_hidden(width: int, ffn_ratio: float, align_to: int = 8) -> int:
  """The official `SwiGLUFFN` hidden width: int(int(width * ffn_ratio) * 2 / 3) rounded up to
  a multiple of `align_to` (8 by default; the 7B's `swiglu64`: 64)."""
  d = int(int(width * ffn_ratio) * 2 / 3)
  return d + (-d % align_to)


def rope_periods(head_dim: int, base: float = 100.0) -> np.ndarray:
  """(head_dim // 4,) float32 periods base^(2i / (head_dim // 2)) (timm / DINOv3)."""
  exponents = 2.0 * np.arange(head_dim // 4, dtype=np.float32) / np.float32(head_dim // 2)
  return (np.float32(base) ** exponents).astype(np.float32)


def rope_sin_cos(h: int, w: int, periods):
  """(sin, cos), each (h*w, 4 * len(periods)): DINOv3's RoPE in the half layout."""
  cy = (jnp.arange(0.5, h, dtype=jnp.float32) / h) * 2.0 - 1.0
  cx = (jnp.arange(0.5, w, dtype=jnp.float32) / w) * 2.0 - 1.0
  coords = jnp.stack(jnp.meshgrid(cy, cx, indexing="ij"), -1).reshape(h * w, 2)
  angles = (2 * math.pi * coords[:, :, None] / periods[None, None, :]).reshape(h * w, -1)
  angles = jnp.concatenate([angles, angles], axis=-1)
  return jnp.sin(angles), jnp.cos(angles)


class GeluMlp(nn.Module):
  hidden: int
  dtype: Any = jnp.float32
  precision: Any = HIGHEST

  @nn.compact
  def __call__(self, x):
    kw = dict(dtype=self.dtype, precision=self.precision)
    y = _blocks.gelu_exact(nn.Dense(self.hidden, name="fc1", **kw)(x))
    return nn.Dense(x.shape[-1], name="fc2", **kw)(y)


class Block(nn.Module):
  num_heads: int
  mlp_hidden: int
  mlp: str = "gelu"
  qkv_bias: bool = False
  num_prefix: int = 5
  ln_eps: float = 1e-5
  dtype: Any = jnp.float32
  precision: Any = HIGHEST

  @nn.compact
  def __call__(self, x, sin, cos):
    d = x.shape[-1]
    kw = dict(dtype=self.dtype, precision=self.precision)
    gamma_1 = self.param("gamma_1", nn.initializers.constant(1e-5), (d,), jnp.float32)
    gamma_2 = self.param("gamma_2", nn.initializers.constant(1e-5), (d,), jnp.float32)
    y = layer_norm("norm1", self.ln_eps)(x).astype(self.dtype)
    y = Attention(self.num_heads, fused=True, num_prefix=self.num_prefix,
                  qkv_bias=self.qkv_bias, rope_half=True, name="attn", **kw)(y, sin, cos)
    x = x + gamma_1.astype(self.dtype) * y
    y = layer_norm("norm2", self.ln_eps)(x).astype(self.dtype)
    if self.mlp == "gelu":
      y = GeluMlp(self.mlp_hidden, name="mlp", **kw)(y)
    else:
      y = Mlp(self.mlp_hidden, "swiglu", name="mlp", **kw)(y)
    return x + gamma_2.astype(self.dtype) * y


class _Model(nn.Module):
  num_classes: Optional[int] = None
  patch_size: int = 16
  width: int = 384
  depth: int = 12
  num_heads: int = 6
  mlp_hidden: int = 1536
  mlp: str = "gelu"
  qkv_bias: bool = False
  num_registers: int = 4
  ln_eps: float = 1e-5
  rope_base: float = 100.0
  pool: str = "avg"
  dtype: str = "float32"
  precision: Any = HIGHEST

  @nn.compact
  def __call__(self, image, *, train: bool = False):
    del train
    if self.pool not in POOLS:
      raise ValueError(f"DINOv3 pool must be 'avg' (timm), 'token' (official backbones) or "
                       f"'token_avg' (the official linear classifier), got {self.pool!r}.")
    dt = jnp.dtype(self.dtype)
    kw = dict(dtype=dt, precision=self.precision)
    p = self.patch_size
    x = nn.Conv(self.width, (p, p), strides=(p, p), padding="VALID", name="patch_embed",
                **kw)(jnp.asarray(image, dt))
    b, h, w, d = x.shape
    cls = self.param("cls_token", nn.initializers.zeros, (1, 1, d), jnp.float32)
    reg = self.param("reg_token", nn.initializers.zeros, (1, self.num_registers, d), jnp.float32)
    head_dim = d // self.num_heads
    periods = self.param("rope_periods", lambda *_: jnp.asarray(rope_periods(
        head_dim, self.rope_base)), (head_dim // 4,))
    prefix = jnp.concatenate([cls, reg], axis=1).astype(dt)
    x = jnp.concatenate([jnp.broadcast_to(prefix, (b,) + prefix.shape[1:]),
                         x.reshape(b, h * w, d)], axis=1)
    sin, cos = (a.astype(dt) for a in rope_sin_cos(h, w, periods.astype(jnp.float32)))
    n_prefix = 1 + self.num_registers
    for i in range(self.depth):
      x = Block(self.num_heads, self.mlp_hidden, self.mlp, self.qkv_bias, n_prefix, self.ln_eps,
                name=f"blocks_{i}", **kw)(x, sin, cos)
    x = out_tokens = layer_norm("norm", self.ln_eps)(x)
    out = {"encoded": out_tokens}
    out["cls"], patch_mean = x[:, 0], jnp.mean(x[:, n_prefix:], 1)
    x = out["pre_logits"] = {"token": out["cls"], "avg": patch_mean,
                             "token_avg": jnp.concatenate([out["cls"], patch_mean], -1)}[self.pool]
    if self.num_classes:
      x = out["logits"] = nn.Dense(self.num_classes, name="head", **kw)(x.astype(dt)).astype(
          jnp.float32)
    return x, out


def _arch(width, depth, heads, hidden, mlp="gelu", qkv_bias=False, pool="avg"):
  return dict(width=width, depth=depth, num_heads=heads, mlp_hidden=hidden, mlp=mlp,
              qkv_bias=qkv_bias, pool=pool)


_SIZES = {"small": (384, 12, 6, 1536, "gelu"), "small_plus": (384, 12, 6, 1536, "swiglu"),
          "base": (768, 12, 12, 3072, "gelu"), "large": (1024, 24, 16, 4096, "gelu"),
          "huge_plus": (1280, 32, 20, 5120, "swiglu")}
# The official 7B (`dinov3_vit7b16`): width 4096, 40 blocks, 32 heads (head_dim 128), SwiGLU
# with ffn_ratio 3 aligned to 64 (hidden 8192), no qkv bias (its LinearKMaskedBias has none).
_7B = (4096, 40, 32, swiglu_hidden(4096, 3, 64), "swiglu")
# timm names (mean pooling, timm's default) and the official hub names (class-token pooling;
# the 7B's linear classifier `dinov3_vit7b16_lc`: class token + patch-token mean).
ARCHS: dict[str, dict] = {
    **{f"vit_{s}_patch16_dinov3": _arch(*a) for s, a in _SIZES.items()},
    **{f"vit_{s}_patch16_dinov3_qkvb": _arch(*a, qkv_bias=True) for s, a in _SIZES.items()},
    **{name: _arch(*_SIZES[s], qkv_bias=True, pool="token") for name, s in (
        ("dinov3_vits16", "small"), ("dinov3_vits16plus", "small_plus"),
        ("dinov3_vitb16", "base"), ("dinov3_vitl16", "large"),
        ("dinov3_vith16plus", "huge_plus"))},
    "dinov3_vit7b16": _arch(*_7B, pool="token"),
    "dinov3_vit7b16_lc": _arch(*_7B, pool="token_avg"),
}

_timm = pretrained.timm
_OFFICIAL = "https://dl.fbaipublicfiles.com/dinov3/{0}/{0}_pretrain_{1}-{2}.pth"
HEAD_FILE = "dinov3_vit7b16_imagenet1k_linear_head-90d8ed92.pth"
HEAD_URL = f"https://dl.fbaipublicfiles.com/dinov3/dinov3_vit7b16/{HEAD_FILE}"
PRETRAINED: dict[str, dict] = {
    **{k: v for s in _SIZES for k, v in _timm(f"vit_{s}_patch16_dinov3.lvd1689m", 256, 1.0,
                                               num_classes=0).items()},
    **{k: v for s in ("small", "small_plus", "base", "large", "huge_plus")
       for k, v in _timm(f"vit_{s}_patch16_dinov3_qkvb.lvd1689m", 256, 1.0,
                         num_classes=0).items()},
    **{f"dinov3/{m}.lvd1689m": dict(
        variant=m, source="dinov3", num_classes=0, input_size=224,
        pp=preprocess.torchvision_pp(256, 224, "bicubic"),
        url=_OFFICIAL.format(m, "lvd1689m", sha)) for m, sha in (
            ("dinov3_vits16", "08c60483"), ("dinov3_vits16plus", "4057cbaa"),
            ("dinov3_vitb16", "73cec8be"), ("dinov3_vitl16", "8aa4cbdd"),
            ("dinov3_vith16plus", "7c1da9a5"), ("dinov3_vit7b16", "a955f4ea"))},
    # hubconf's `dinov3_vit7b16_lc` (ClassifierWeights.IMAGENET1K): the 7B backbone file plus
    # the linear head file; `url` is the head's, `backbone_url` the backbone's.
    "dinov3/dinov3_vit7b16_lc.imagenet1k": dict(
        variant="dinov3_vit7b16_lc", source="dinov3", num_classes=1000, input_size=224,
        pp=preprocess.torchvision_pp(256, 224, "bicubic"), url=HEAD_URL,
        backbone_url=_OFFICIAL.format("dinov3_vit7b16", "lvd1689m", "a955f4ea")),
}


def Model(num_classes: Optional[int] = None, *, variant: str, **kw) -> _Model:
  """`Model(variant="vit_base_patch16_dinov3")` (timm: mean pooling) or
  `Model(variant="dinov3_vitb16")` (official: class-token pooling); `kw` overrides ARCHS
  (width, depth, num_heads, mlp_hidden, mlp, qkv_bias, pool, dtype, ...). `num_classes` 0 /
  None: headless (logits = pre_logits)."""
  name = variant.split(".")[0]
  if name not in ARCHS:
    raise ValueError(f"Unknown DINOv3 variant {variant!r}; known: {sorted(ARCHS)}.")
  kw.pop("source", None)
  return _Model(num_classes or None, **{**ARCHS[name], **kw})


def load(init_params, init_file: Union[str, Mapping[str, str]],
         model_cfg: Optional[Mapping] = None, head: Optional[str] = None) -> dict:
  """timm (`reg_token`, `q_bias` / `v_bias`, `gamma_1`) or official DINOv3
  (`storage_tokens`, `qkv.bias` + `bias_mask`, `ls1.gamma`, `rope_embed.periods`) weights from
  .safetensors / .pth onto `init_params`, told apart by their keys.

  The linear classifier (`dinov3_vit7b16_lc`, a model with `head`) also needs the official head
  file (a bare `nn.Linear(2 * width, 1000)` state dict: `weight`, `bias`): `init_file` =
  {"backbone": backbone file, "head": head file}, or `head=` the head file, or one file holding
  both as the official `_LinearClassifierWrapper.state_dict()` does (`backbone.*`,
  `linear_head.*`)."""
  files = dict(init_file) if isinstance(init_file, Mapping) else {"backbone": init_file}
  if head:
    files["head"] = head
  if set(files) - {"backbone", "head"} or "backbone" not in files:
    raise ValueError(f"DINOv3 init_file dict needs 'backbone' (and optionally 'head'); got "
                     f"keys {sorted(files)}.")
  sd = readers.read_state_dict(files["backbone"], hint=convert.HINT)
  head_sd = (readers.read_state_dict(files["head"], hint=convert.HEAD_HINT)
             if files.get("head") else None)
  return convert.convert(sd, init_params, file=" + ".join(map(str, files.values())),
                         head=head_sd)
