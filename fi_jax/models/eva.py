"""EVA-02 in Flax, loading timm's `eva02_*` ImageNet weights.

timm's `Eva` as its EVA-02 classifiers configure it: patch conv, a class token in front and a
learned absolute position embedding covering it (`pos_embed`, (1, 1 + h*w, D)), then pre-LN
blocks whose attention applies **2-D rotary position embeddings** (RoPE) to the patch tokens'
queries and keys (not the class token's), with a query / value bias and no key bias; the MLP
is **SwiGLU** (`silu(gate) * x`): fused in one Dense for tiny / small (timm `GluMlp`, gate
first), split into `fc1_g` / `fc1_x` with a LayerNorm on the hidden width (**sub-LN**, timm
`scale_mlp`) for base / large, whose q / k / v are separate Denses. Pooling: mean over the
patch tokens → `fc_norm` = `out["pre_logits"]` → `head`; LayerNorm eps 1e-6. No layer scale.

RoPE ('cat' layout, timm `RotaryEmbeddingCat(in_pixels=False)`): head_dim / 4 frequencies
1 / 10000^(i / (head_dim/4)); positions are the patch indices (row, column) rescaled by
`ref_feat_shape / grid` (EVA's rule: a 336 px fine-tune of a 224 px model sees the 16x16
pre-training grid's coordinates); each (row bands, column bands) angle is applied to an
interleaved pair of channels (x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin). The grid is that
of the input image, so the rotary part needs no parameter; the absolute position embedding is
a parameter of the initialised grid (a file for another grid is refused: initialise the model
at the weights' `input_size`). Facts from timm 1.0.31 (`timm/models/eva.py`,
`timm/layers/pos_embed_sincos.py`, `timm/layers/mlp.py`).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.models import _pretrained as pretrained
from fi_jax.models.beit import attention, layer_norm
from fi_jax.models.convert import eva as convert
from fi_jax.models.convert import readers

HIGHEST = jax.lax.Precision.HIGHEST


def rope_sin_cos(h: int, w: int, head_dim: int, ref_feat_shape: Optional[Sequence[int]] = None,
                 temperature: float = 10_000.) -> tuple[np.ndarray, np.ndarray]:
  """(sin, cos), each (h*w, head_dim) float32, of EVA's axial RoPE in the interleaved layout:
  channels 2i, 2i+1 share the angle of band i, bands [row bands | column bands]."""
  nb = head_dim // 4
  bands = np.float32(1.0) / (np.float32(temperature) ** (np.arange(nb, dtype=np.float32) / nb))
  ty, tx = np.arange(h, dtype=np.float32), np.arange(w, dtype=np.float32)
  if ref_feat_shape is not None:
    ty, tx = ty / h * ref_feat_shape[0], tx / w * ref_feat_shape[1]
  grid = np.stack(np.meshgrid(ty, tx, indexing="ij"), axis=-1)      # (h, w, 2)
  angle = (grid[..., None] * bands).reshape(h * w, 2 * nb)          # [y bands | x bands]
  angle = np.repeat(angle, 2, axis=-1)
  return np.sin(angle).astype(np.float32), np.cos(angle).astype(np.float32)


def apply_rope(x, sin, cos, half: bool = False):
  """Rotation of the last axis. Interleaved (EVA): pairs (x0, x1) -> (x0 cos - x1 sin,
  x1 cos + x0 sin); `half` (DINOv3): the halves [a | b] -> [a cos - b sin | b cos + a sin]."""
  if half:
    a, b = jnp.split(x, 2, axis=-1)
    rotated = jnp.concatenate([-b, a], axis=-1)
  else:
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    rotated = jnp.stack([-pairs[..., 1], pairs[..., 0]], axis=-1).reshape(x.shape)
  return x * cos + rotated * sin


class Attention(nn.Module):
  """Fused (`qkv` + `q_bias`, `v_bias`; no biases with `qkv_bias=False`) or separate
  (`q_proj`, `k_proj` without bias, `v_proj`) projections, RoPE on the tokens after the
  `num_prefix` class / register tokens (`rope_half`: DINOv3's half layout), optional LayerNorm
  on the output (`norm`, timm `scale_attn_inner`), `proj`."""
  num_heads: int
  fused: bool = True
  inner_norm: bool = False
  num_prefix: int = 1
  qkv_bias: bool = True
  rope_half: bool = False
  dtype: Any = jnp.float32
  precision: Any = HIGHEST

  @nn.compact
  def __call__(self, x, sin, cos):
    b, n, d = x.shape
    dense = lambda f, name, bias=True: nn.Dense(f, use_bias=bias, dtype=self.dtype,
                                                precision=self.precision, name=name)
    if self.fused:
      qkv = dense(3 * d, "qkv", bias=False)(x)
      if self.qkv_bias:
        q_bias = self.param("q_bias", nn.initializers.zeros, (d,), jnp.float32)
        v_bias = self.param("v_bias", nn.initializers.zeros, (d,), jnp.float32)
        qkv = qkv + jnp.concatenate([q_bias, jnp.zeros_like(q_bias), v_bias]).astype(qkv.dtype)
      q, k, v = jnp.split(qkv, 3, axis=-1)
    else:
      q, k, v = dense(d, "q_proj")(x), dense(d, "k_proj", bias=False)(x), dense(d, "v_proj")(x)
    q, k, v = (jnp.swapaxes(t.reshape(b, n, self.num_heads, -1), 1, 2) for t in (q, k, v))
    p = self.num_prefix
    rope = lambda t: apply_rope(t, sin, cos, self.rope_half).astype(t.dtype)
    q = jnp.concatenate([q[:, :, :p], rope(q[:, :, p:])], 2)
    k = jnp.concatenate([k[:, :, :p], rope(k[:, :, p:])], 2)
    y = jnp.swapaxes(attention(q, k, v, None, self.precision), 1, 2).reshape(b, n, d)
    if self.inner_norm:
      y = layer_norm("norm")(y).astype(self.dtype)
    return dense(d, "proj")(y)


class Mlp(nn.Module):
  """SwiGLU: `glu` = one `fc1` to [gate | x] (timm GluMlp, gate first), `swiglu` = `fc1_g`,
  `fc1_x` (timm SwiGLU); silu(gate) * x, an optional LayerNorm (`norm`, sub-LN), `fc2`."""
  hidden: int
  kind: str = "glu"
  sub_norm: bool = False
  dtype: Any = jnp.float32
  precision: Any = HIGHEST

  @nn.compact
  def __call__(self, x):
    d = x.shape[-1]
    kw = dict(dtype=self.dtype, precision=self.precision)
    if self.kind == "glu":
      gate, y = jnp.split(nn.Dense(2 * self.hidden, name="fc1", **kw)(x), 2, axis=-1)
    elif self.kind == "swiglu":
      gate, y = nn.Dense(self.hidden, name="fc1_g", **kw)(x), nn.Dense(self.hidden, name="fc1_x",
                                                                       **kw)(x)
    else:
      raise ValueError(f"Unknown EVA MLP kind {self.kind!r}; use 'glu' or 'swiglu'.")
    y = nn.silu(gate) * y
    if self.sub_norm:
      y = layer_norm("norm")(y).astype(self.dtype)
    return nn.Dense(d, name="fc2", **kw)(y)


class Block(nn.Module):
  num_heads: int
  mlp_hidden: int
  fused_qkv: bool = True
  mlp: str = "glu"
  sub_norm: bool = False
  dtype: Any = jnp.float32
  precision: Any = HIGHEST

  @nn.compact
  def __call__(self, x, sin, cos):
    kw = dict(dtype=self.dtype, precision=self.precision)
    y = layer_norm("norm1")(x).astype(self.dtype)
    x = x + Attention(self.num_heads, self.fused_qkv, name="attn", **kw)(y, sin, cos)
    y = layer_norm("norm2")(x).astype(self.dtype)
    return x + Mlp(self.mlp_hidden, self.mlp, self.sub_norm, name="mlp", **kw)(y)


class _Model(nn.Module):
  num_classes: Optional[int] = 1000
  patch_size: int = 14
  width: int = 768
  depth: int = 12
  num_heads: int = 12
  mlp_hidden: int = 2048
  fused_qkv: bool = True
  mlp: str = "glu"
  sub_norm: bool = False
  ref_feat_shape: Optional[Sequence[int]] = (16, 16)
  dtype: str = "float32"
  precision: Any = HIGHEST

  @nn.compact
  def __call__(self, image, *, train: bool = False):
    del train
    dt = jnp.dtype(self.dtype)
    kw = dict(dtype=dt, precision=self.precision)
    p = self.patch_size
    x = nn.Conv(self.width, (p, p), strides=(p, p), padding="VALID", name="patch_embed",
                **kw)(jnp.asarray(image, dt))
    b, h, w, d = x.shape
    cls = self.param("cls_token", nn.initializers.zeros, (1, 1, d), jnp.float32)
    pos = self.param("pos_embed", nn.initializers.normal(0.02), (1, 1 + h * w, d), jnp.float32)
    x = jnp.concatenate([jnp.broadcast_to(cls.astype(dt), (b, 1, d)), x.reshape(b, h * w, d)],
                        axis=1) + pos.astype(dt)
    sin, cos = (jnp.asarray(a, dt) for a in rope_sin_cos(h, w, d // self.num_heads,
                                                          self.ref_feat_shape))
    for i in range(self.depth):
      x = Block(self.num_heads, self.mlp_hidden, self.fused_qkv, self.mlp, self.sub_norm,
                name=f"blocks_{i}", **kw)(x, sin, cos)
    out = {"encoded": x}
    x = out["pre_logits"] = layer_norm("fc_norm")(jnp.mean(x[:, 1:].astype(jnp.float32), 1))
    if self.num_classes:
      x = out["logits"] = nn.Dense(self.num_classes, name="head", **kw)(x.astype(dt)).astype(
          jnp.float32)
    return x, out


# timm's eva02_* model functions: mlp_ratio 4*2/3 (hidden int(D * 8/3)), RoPE reference grid
# 16x16 (224 / 14); tiny / small: fused qkv + GluMlp; base / large: separate q/k/v + SwiGLU
# with sub-LN.
_TS = dict(patch_size=14, fused_qkv=True, mlp="glu", sub_norm=False, ref_feat_shape=(16, 16))
_BL = dict(patch_size=14, fused_qkv=False, mlp="swiglu", sub_norm=True, ref_feat_shape=(16, 16))
_SIZES = {"tiny": dict(width=192, depth=12, num_heads=3, mlp_hidden=512, **_TS),
          "small": dict(width=384, depth=12, num_heads=6, mlp_hidden=1024, **_TS),
          "base": dict(width=768, depth=12, num_heads=12, mlp_hidden=2048, **_BL),
          "large": dict(width=1024, depth=24, num_heads=16, mlp_hidden=2730, **_BL)}
ARCHS: dict[str, dict] = {
    f"eva02_{s}_patch14_{r}": _SIZES[s] for s, r in (
        ("tiny", 224), ("small", 224), ("base", 224), ("large", 224), ("tiny", 336),
        ("small", 336), ("base", 448), ("large", 448))}

_timm = pretrained.timm
# timm's ImageNet classifiers (the mim_* tags without a head are the MIM encoders: not listed);
# OpenAI CLIP mean / std, bicubic, crop_pct 1.0; the in22k-intermediate fine-tunes squash.
PRETRAINED: dict[str, dict] = {
    **_timm("eva02_tiny_patch14_336.mim_in22k_ft_in1k", 336, 1.0, norm="clip"),
    **_timm("eva02_small_patch14_336.mim_in22k_ft_in1k", 336, 1.0, norm="clip"),
    **_timm("eva02_base_patch14_448.mim_in22k_ft_in1k", 448, 1.0, norm="clip"),
    **_timm("eva02_base_patch14_448.mim_in22k_ft_in22k_in1k", 448, 1.0, norm="clip",
            crop_mode="squash"),
    **_timm("eva02_large_patch14_448.mim_in22k_ft_in1k", 448, 1.0, norm="clip"),
    **_timm("eva02_large_patch14_448.mim_m38m_ft_in1k", 448, 1.0, norm="clip"),
    **_timm("eva02_large_patch14_448.mim_in22k_ft_in22k_in1k", 448, 1.0, norm="clip",
            crop_mode="squash"),
    **_timm("eva02_large_patch14_448.mim_m38m_ft_in22k_in1k", 448, 1.0, norm="clip",
            crop_mode="squash"),
}


def Model(num_classes: Optional[int] = 1000, *, variant: str, **kw) -> _Model:
  """`Model(1000, variant="eva02_base_patch14_448")`; `kw` overrides ARCHS (width, depth,
  num_heads, mlp_hidden, patch_size, ref_feat_shape, dtype, ...)."""
  name = variant.split(".")[0]
  if name not in ARCHS:
    raise ValueError(f"Unknown EVA-02 variant {variant!r}; known: {sorted(ARCHS)}.")
  kw.pop("source", None)
  return _Model(num_classes, **{**ARCHS[name], **kw})


def load(init_params, init_file: str, model_cfg: Optional[Mapping] = None) -> dict:
  """timm EVA-02 weights (`model.safetensors` or a .pth state dict) onto `init_params`."""
  sd = readers.read_state_dict(init_file, hint=convert.HINT)
  return convert.convert(sd, init_params, file=init_file)
