"""Perception Encoder PE-Core (Meta, 2025) in Flax: both towers, loading the released weights.

The official implementation is facebookresearch/perception_models @ 3e352cc
(`core/vision_encoder/pe.py`, `rope.py`, `config.py`, `transforms.py`, `tokenizer.py`); timm
1.0.31 runs the vision tower as `Eva` (`vit_pe_core_*`) and open_clip 3.3.0 the whole model as
`PE-Core-*` (a timm trunk and its own text transformer). This module reproduces the official
forward:

Vision tower (`VisionTower`): patch conv without bias; a class token in front (every PE-Core
but G/14); the learned absolute position embedding (covering the class token when there is
one) is resized to the input's patch grid per call with torch's
`F.interpolate(mode="bilinear", align_corners=False)` (no antialias) on the patch part, the
class slot unchanged; `ln_pre`; pre-LN blocks (exact GELU, LayerNorm eps 1e-5, optional layer
scale: PE-Core has none, PE-Spatial/Lang G do) whose attention applies **2-D RoPE** to every
query and key: per head, head_dim/4 frequencies 1/10000^(i/(head_dim/4)), each repeated for an
interleaved channel pair ((x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin)), channels
[column bands | row bands]; positions are the patch (row, column) indices, plus 1 when there
is a class token, which then has angle 0 (no rotation). After the blocks `ln_post` normalises
every token, the **attention pooling** head (one learned probe, nn.MultiheadAttention with
`attn_pooler_heads` = 8 heads, then x + MLP(LayerNorm(x)), MLP ratio 4) pools them, and `proj`
(no bias) maps to the embedding.

Text tower: the official `TextTransformer` is CLIP's (`clip.TextTower`: causal mask, EOT =
argmax pooling, `ln_final`, `text_projection` without bias) with exact GELU and a context of
32 tokens (72 for G/14); its tokenizer is CLIP's BPE (`clip_tokenizer.Tokenizer`, "lower"
cleaning) at that length.

`apply({'params': p}, images, texts)` returns `(zimg, ztxt, out)` with L2-normalised
embeddings as `clip.Model`; `out["pre_logits"]` is the normalised image embedding and the
zero-shot head is CLIP's (`predictor`). With `local_tokens=True` the image tower also returns
`out["img/local"]`: GL-MCM's local features, here each ln_post'ed patch token passed alone
through the attention pooling head (the pool of a one-token image: the value / output
projections and the MLP residual) and `proj`, the analogue of CLIP's value path for a model
that pools by attention.

Parameter tree:
  img/embedding/kernel (P,P,3,W)  [img/cls (1,1,W)]  img/pos_embedding (1,[1+]N,W)  img/ln_pre
  img/Transformer/encoderblock_{i}/{LayerNorm_0, MultiHeadDotProductAttention_0, LayerNorm_1,
    MlpBlock_0, [LayerScale_0, LayerScale_1]}   img/Transformer/encoder_norm (= ln_post)
  img/MAPHead_0/{probe, MultiHeadDotProductAttention_0, LayerNorm_0, MlpBlock_0}
  img/head/kernel (W,E) (= proj)
  txt/... (clip.TextTower)  t (1,) = logit_scale
Key maps for the official, open_clip and timm layouts: `convert/pe_core.py`; releases and
their preprocessing (squash resize to the input size, bilinear; mean = std = 0.5):
`_releases.PE_CORE_CHECKPOINTS`.
"""
from __future__ import annotations

import functools
import re
from typing import Any, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.models import _posemb as posemb
from fi_jax.models import _releases as releases
from fi_jax.models import clip, vit, zero_shot_head
from fi_jax.models._checkpoints import CheckpointError, flatten, recover_tree
from fi_jax.models.convert import pe_core as convert
from fi_jax.models.convert import readers
from fi_jax.models.convert import torch_layers as tl

# Official configs (perception_models core/vision_encoder/config.py): image (width, depth,
# heads, mlp_dim, patch, class token), text (width, depth, heads, context), embedding dim.
_VARIANTS = {
    "T/16": ((192, 12, 3, 768, 16, True), (512, 12, 8, 32), 512),
    "S/16": ((384, 12, 6, 1536, 16, True), (512, 12, 8, 32), 512),
    "B/16": ((768, 12, 12, 3072, 16, True), (1024, 24, 16, 32), 1024),
    "L/14": ((1024, 24, 16, 4096, 14, True), (1024, 24, 16, 32), 1024),
    "G/14": ((1536, 50, 16, 8960, 14, False), (1280, 24, 20, 72), 1280),
}


def decode_variant(variant: Optional[str]) -> dict:
  """'B/16' -> dict(image=..., text=..., out_dim=...) (the official PE-Core configs)."""
  if variant is None:
    return {}
  if variant not in _VARIANTS:
    raise ValueError(f"Unknown PE-Core variant {variant!r}; known: {sorted(_VARIANTS)}.")
  (w, d, h, m, p, cls), (tw, td, th, ctx), e = _VARIANTS[variant]
  return dict(image=dict(width=w, depth=d, num_heads=h, mlp_dim=m, patch_size=p, class_token=cls),
              text=dict(width=tw, depth=td, num_heads=th, context_length=ctx), out_dim=e)


# ----------------------------------------------------------------------------- position

def rope_angles(h: int, w: int, head_dim: int, class_token: bool,
                theta: float = 10_000.) -> np.ndarray:
  """((1 if class_token) + h*w, head_dim) float32 RoPE angles of PE's `Rope2D`: per axis
  head_dim/4 frequencies 1/theta^(2i / (head_dim/2)), each repeated twice (interleaved pairs),
  laid out [column bands | row bands]; positions start at 1 with a class token, whose own
  angles are 0."""
  if head_dim % 4:
    raise ValueError(f"2-D RoPE needs a head dim divisible by 4, got {head_dim}.")
  half = head_dim // 2
  freqs = np.float32(1.0) / (np.float32(theta) ** (np.arange(0, half, 2, dtype=np.float32) / half))
  offset = 1 if class_token else 0
  rows = np.arange(h, dtype=np.float32) + offset
  cols = np.arange(w, dtype=np.float32) + offset
  ang_y = np.repeat(rows[:, None] * freqs, 2, axis=-1)          # (h, half)
  ang_x = np.repeat(cols[:, None] * freqs, 2, axis=-1)          # (w, half)
  grid = np.concatenate([np.broadcast_to(ang_x[None], (h, w, half)),
                         np.broadcast_to(ang_y[:, None], (h, w, half))], axis=-1)
  grid = grid.reshape(h * w, head_dim)
  if class_token:
    grid = np.concatenate([np.zeros((1, head_dim), np.float32), grid])
  return grid.astype(np.float32)


def apply_rope(x: jax.Array, sin: jax.Array, cos: jax.Array) -> jax.Array:
  """Interleaved rotation of the last axis: pairs (x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin)."""
  pairs = x.reshape(*x.shape[:-1], -1, 2)
  rotated = jnp.stack([-pairs[..., 1], pairs[..., 0]], axis=-1).reshape(x.shape)
  return x * cos + rotated * sin


def bilinear_matrix(n_in: int, n_out: int) -> np.ndarray:
  """(n_out, n_in) weights of torch's F.interpolate(mode='bilinear', align_corners=False,
  antialias=False) along one axis (source index clamped at 0, the upper tap at n_in - 1)."""
  scale = n_in / n_out
  w = np.zeros((n_out, n_in))
  for i in range(n_out):
    src = max(scale * (i + 0.5) - 0.5, 0.0)
    i0 = min(int(np.floor(src)), n_in - 1)
    i1 = min(i0 + 1, n_in - 1)
    t = src - i0
    w[i, i0] += 1.0 - t
    w[i, i1] += t
  return w


def resize_posemb(pos: jax.Array, grid_hw: Sequence[int], prefix: int) -> jax.Array:
  """(1, prefix + M*M, C) -> (1, prefix + h*w, C): PE's `_sample_abs_posemb` (bilinear,
  align_corners=False, no antialias; identity when the grid already matches)."""
  h, w = grid_hw
  n = pos.shape[1] - prefix
  m = int(round(np.sqrt(n)))
  if m * m != n:
    raise ValueError(f"Position embedding with {n} patch entries is not a square grid.")
  if (h, w) == (m, m):
    return pos
  rh = jnp.asarray(bilinear_matrix(m, h), pos.dtype)
  rw = jnp.asarray(bilinear_matrix(m, w), pos.dtype)
  grid = jnp.einsum("yh,xw,hwc->yxc", rh, rw, pos[0, prefix:].reshape(m, m, -1),
                    precision=jax.lax.Precision.HIGHEST)
  return jnp.concatenate([pos[:, :prefix], grid.reshape(1, h * w, -1)], axis=1)


def _rope_attention(query, key, value, *, sin, cos, **kw):
  """vit.heads_first_attention with RoPE on the queries and keys ([b, s, h, d] layout)."""
  rot = lambda t: apply_rope(t, sin[:, None, :], cos[:, None, :]).astype(t.dtype)
  return vit.heads_first_attention(rot(query), rot(key), value, **kw)


# ----------------------------------------------------------------------------- towers

class Block(nn.Module):
  """Pre-LN block with RoPE self-attention: x + [LS](MHA(LN(x))); x + [LS](MLP(LN(x)))."""
  mlp_dim: Optional[int] = None
  num_heads: int = 12
  act: str = "gelu_exact"
  ln_eps: float = 1e-5
  layerscale: Optional[float] = None
  dtype_mm: str = "float32"

  @nn.compact
  def __call__(self, x, sin, cos):
    out = {}
    attn = nn.MultiHeadDotProductAttention(
        num_heads=self.num_heads, dtype=self.dtype_mm,
        attention_fn=functools.partial(_rope_attention, sin=sin, cos=cos),
        name="MultiHeadDotProductAttention_0")
    y = nn.LayerNorm(epsilon=self.ln_eps, name="LayerNorm_0")(x)
    y = out["sa"] = attn(y, y)
    if self.layerscale is not None:
      y = vit.LayerScale(self.layerscale, name="LayerScale_0")(y)
    x = out["+sa"] = x + y
    y = nn.LayerNorm(epsilon=self.ln_eps, name="LayerNorm_1")(x)
    y = out["mlp"] = vit.MlpBlock(mlp_dim=self.mlp_dim, act=self.act, dtype_mm=self.dtype_mm,
                                  name="MlpBlock_0")(y)
    if self.layerscale is not None:
      y = vit.LayerScale(self.layerscale, name="LayerScale_1")(y)
    x = out["+mlp"] = x + y
    return x, out


class Encoder(nn.Module):
  """`depth` RoPE blocks (`encoderblock_{i}`) + `encoder_norm` (= ln_post, on every token)."""
  depth: int
  mlp_dim: Optional[int] = None
  num_heads: int = 12
  act: str = "gelu_exact"
  ln_eps: float = 1e-5
  layerscale: Optional[float] = None
  dtype_mm: str = "float32"

  @nn.compact
  def __call__(self, x, sin, cos):
    out = {}
    for i in range(self.depth):
      x, out[f"block{i:02d}"] = Block(
          mlp_dim=self.mlp_dim, num_heads=self.num_heads, act=self.act, ln_eps=self.ln_eps,
          layerscale=self.layerscale, dtype_mm=self.dtype_mm, name=f"encoderblock_{i}")(x, sin, cos)
    out["pre_ln"] = x
    return nn.LayerNorm(epsilon=self.ln_eps, name="encoder_norm")(x), out


class VisionTower(nn.Module):
  """PE vision transformer (see the module docstring)."""
  out_dim: int = 1024
  width: int = 768
  depth: int = 12
  num_heads: int = 12
  mlp_dim: Optional[int] = None
  patch_size: int = 16
  class_token: bool = True
  pool_heads: int = 8
  layerscale: Optional[float] = None
  act: str = "gelu_exact"
  ln_eps: float = 1e-5
  dtype_mm: str = "float32"
  local_tokens: bool = False   # out["local"]: GL-MCM's patch features in the embedding space

  @nn.compact
  def __call__(self, image):
    out = {}
    p, c = self.patch_size, self.width
    x = nn.Conv(c, (p, p), strides=(p, p), padding="VALID", use_bias=False,
                dtype=self.dtype_mm, name="embedding")(jnp.asarray(image, self.dtype_mm))
    n, h, w, _ = x.shape
    x = jnp.reshape(x, (n, h * w, c))
    prefix = int(self.class_token)
    if self.class_token:
      cls = self.param("cls", nn.initializers.normal(c ** -0.5), (1, 1, c), jnp.float32)
      x = jnp.concatenate([jnp.tile(cls.astype(x.dtype), (n, 1, 1)), x], axis=1)
    pos = posemb.posemb_param(self, (1, prefix + h * w, c), c ** -0.5)
    x = out["with_posemb"] = x + resize_posemb(pos, (h, w), prefix).astype(x.dtype)
    x = nn.LayerNorm(epsilon=self.ln_eps, name="ln_pre")(x)
    angles = rope_angles(h, w, c // self.num_heads, self.class_token)
    sin, cos = jnp.asarray(np.sin(angles), x.dtype), jnp.asarray(np.cos(angles), x.dtype)
    x, out["encoder"] = Encoder(
        depth=self.depth, mlp_dim=self.mlp_dim, num_heads=self.num_heads, act=self.act,
        ln_eps=self.ln_eps, layerscale=self.layerscale, dtype_mm=self.dtype_mm,
        name="Transformer")(x, sin, cos)
    out["encoded"] = x
    pool = vit.MAPHead(num_heads=self.pool_heads, act=self.act, ln_eps=self.ln_eps,
                       name="MAPHead_0")
    x = out["head_input"] = pool(x)
    head = nn.Dense(self.out_dim, use_bias=False, name="head")
    x = out["logits"] = head(x)
    if self.local_tokens:   # each patch token pooled alone (attention over one key)
      patches = out["encoded"][:, prefix:]
      single = pool(patches.reshape(-1, 1, c)).reshape(n, h * w, c)
      out["local"] = head(single)
    return x, out


class _Model(nn.Module):
  """Both towers + learned log logit scale `t`, returning (zimg, ztxt, out) as clip.Model."""
  out_dim: int = 1024
  image: Optional[Mapping[str, Any]] = None
  text: Optional[Mapping[str, Any]] = None
  ln_eps: float = 1e-5
  image_size: int = 224
  dtype_mm: str = "float32"
  local_tokens: bool = False   # the image tower's out["local"] (GL-MCM); no extra parameters

  @nn.compact
  def __call__(self, image, text=None, *, train=False):
    del train   # no dropout at inference
    kw = dict(out_dim=self.out_dim, act="gelu_exact", ln_eps=self.ln_eps, dtype_mm=self.dtype_mm)
    img_tower = VisionTower(**kw, local_tokens=self.local_tokens, **dict(self.image or {}),
                            name="img")
    txt_tower = clip.TextTower(**kw, **dict(self.text or {}), name="txt")
    return clip.two_tower_outputs(self, img_tower, txt_tower, image, text)


def Model(variant: Optional[str] = None, **kw) -> _Model:
  """`Model("B/16")`; `image=` / `text=` dicts override single tower fields."""
  kw.pop("num_classes", None)   # the classifier of PE-Core is its zero-shot head
  base = decode_variant(variant)
  for tower in ("image", "text"):
    base[tower] = {**base.get(tower, {}), **dict(kw.pop(tower, None) or {})}
  return _Model(**{**base, **kw})


# ----------------------------------------------------------------------------- loading

def _adopt_posemb(init_params, loaded: np.ndarray, prefix: int, source: str, hint: str):
  """The init tree with img/pos_embedding shaped as the checkpoint's (a square grid after
  `prefix` class slots): the model resizes it to each input's patch grid per call."""
  flat = flatten(init_params)
  init = flat["img/pos_embedding"]
  if loaded.ndim != 3 or loaded.shape[2] != init.shape[2]:
    return init_params          # a different model: merge_params reports the shape mismatch
  n = loaded.shape[1] - prefix
  if n < 1 or int(round(np.sqrt(n))) ** 2 != n:
    raise CheckpointError(
        f"{source}: the position embedding has shape {loaded.shape} but the model expects "
        f"(1, {prefix} + a square grid, {init.shape[2]}) ({'with' if prefix else 'without'} a "
        f"class token: a different variant?). {hint}")
  flat["img/pos_embedding"] = jax.ShapeDtypeStruct(loaded.shape, init.dtype)
  return recover_tree(flat)


def load(init_params, init_file: str, model_cfg: Optional[Mapping[str, Any]] = None,
         dont_load: Sequence[str] = ()) -> dict:
  """Loads a PE-Core checkpoint onto `init_params`: the official `PE-Core-*.pt` (a state
  dict, optionally under 'state_dict' / 'weights' / 'module.'), open_clip's
  `open_clip_model.safetensors` (`PE-Core-*`, both towers) or timm's `vit_pe_core_*`
  `model.safetensors` (the image tower only: refused unless `dont_load` keeps the text tower
  and `t`, e.g. ("txt/.*", "t"), whose values then stay those of `init_params`). The position
  embedding keeps the checkpoint's grid and is resized to each input's patch grid per call, as
  the official code does."""
  del model_cfg   # shapes and head counts come from init_params
  init_params = jax.device_get(init_params)
  hint = releases.PE_CORE_DOWNLOAD_HINT
  sd = readers.read_state_dict(init_file, hint=hint)
  heads = {"img": tl.num_heads(init_params["img"]["Transformer"]),
           "txt": tl.num_heads(init_params["txt"]["Encoder_0"]),
           "pool": tl.num_heads(init_params["img"]["MAPHead_0"])}
  flat = convert.to_flat(sd, heads, init_file)
  if not any(k.startswith("txt/") for k in flat) and not any(
      re.fullmatch(p, "txt/Embed_0/embedding") for p in dont_load):
    raise CheckpointError(
        f"{init_file} holds the image tower only (timm's vit_pe_core_* layout): zero-shot needs "
        f"the text tower too. Use the official PE-Core-*.pt or open_clip's file, or load the "
        f"image tower alone with dont_load=('txt/.*', 't'). {hint}")
  if "img/pos_embedding" in flat:
    prefix = int("cls" in init_params["img"])
    init_params = _adopt_posemb(init_params, np.asarray(flat["img/pos_embedding"]), prefix,
                                init_file, hint)
  return tl.merge_unrolled(init_params, flat, init_file, hint, dont_load)


def predictor(model: _Model, params, config):
  """(predict_fn, Head) for fi_jax.run: the zero-shot head with CLIP's protocol
  (zero_shot_head.predictor, family "clip": CLIP's BPE tokenizer at the text tower's context
  length, OpenAI's 80 templates, logits exp(t) * E.T on the normalised image embedding, which
  is also the features `out['pre_logits']`; GL-MCM's local score from `out["img/local"]`)."""
  return zero_shot_head.predictor(model, params, config, "clip")
