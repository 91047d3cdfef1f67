"""CLIP (OpenAI and OpenCLIP ViT models) in Flax, loading the released PyTorch weights.

`Model(variant="B/16", act="quick_gelu")` builds both towers from big_vision's ViT blocks
(`vit.Encoder`) with CLIP's differences: the class token is prepended *before* the position
embedding (so it has its own posemb slot), `ln_pre` before the blocks, conv stem without bias,
LayerNorm eps 1e-5, QuickGELU or exact GELU, a causal text mask and EOT pooling (the argmax of
the token ids). As in big_vision's two_towers, `apply({'params': p}, images, texts)` returns
`(zimg, ztxt, out)` with L2-normalised embeddings; either input may be None.
`out["pre_logits"]` is the normalised image embedding: with the zero-shot head (class text
embeddings times exp(t)) it gives the logits (see `predictor`).

Parameter tree (big_vision-like names):
  img/embedding/kernel (P,P,3,W)  img/cls (1,1,W)  img/pos_embedding (1,1+N,W)  img/ln_pre
  img/Transformer/encoderblock_{i}/... (vit.Encoder1DBlock)
  img/Transformer/encoder_norm (= ln_post)
  img/head/kernel (W,E) (= visual.proj)
  txt/Embed_0/embedding (V,Wt)  txt/pos_embedding (1,77,Wt)  txt/Encoder_0/encoderblock_{i}/...
  txt/Encoder_0/encoder_norm (= ln_final)  txt/head/kernel (Wt,E) (= text_projection)
  t (1,) = logit_scale (log of the logit multiplier, ~ln 100 for released models)

Activation per checkpoint (wrong choice silently costs accuracy): `quick_gelu` for all OpenAI
weights and OpenCLIP's `*-quickgelu`, `dfn2b`, MetaCLIP tags; `gelu_exact` for LAION-2B and
DataComp tags. See `releases.CLIP_CHECKPOINTS` for files, settings and the matching pp strings;
the state-dict key map is `convert/openclip.py`.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.models import _posemb as posemb
from fi_jax.models import _releases as releases
from fi_jax.models import vit, zero_shot_head
from fi_jax.models.convert import openclip, readers
from fi_jax.models.convert import torch_layers as tl

# OpenCLIP model configs: image (width, depth, heads, mlp_dim, patch), text (width, depth,
# heads), embed dim.  [open_clip model_configs/ViT-*.json]
_VARIANTS = {
    "B/32": ((768, 12, 12, 3072, 32), (512, 12, 8), 512),
    "B/16": ((768, 12, 12, 3072, 16), (512, 12, 8), 512),
    "L/14": ((1024, 24, 16, 4096, 14), (768, 12, 12), 768),
    "H/14": ((1280, 32, 16, 5120, 14), (1024, 24, 16), 1024),
    "g/14": ((1408, 40, 16, 6144, 14), (1024, 24, 16), 1024),
    "bigG/14": ((1664, 48, 16, 8192, 14), (1280, 32, 20), 1280),
}


def decode_variant(variant: Optional[str]) -> dict:
  """'B/16' -> dict(image=..., text=..., out_dim=...) (OpenCLIP's model configs)."""
  if variant is None:
    return {}
  if variant not in _VARIANTS:
    raise ValueError(f"Unknown CLIP variant {variant!r}; known: {sorted(_VARIANTS)}.")
  (w, d, h, m, p), (tw, td, th), e = _VARIANTS[variant]
  return dict(image=dict(width=w, depth=d, num_heads=h, mlp_dim=m, patch_size=p),
              text=dict(width=tw, depth=td, num_heads=th), out_dim=e)


class VisionTower(nn.Module):
  """CLIP ViT: conv stem (no bias), [cls; patches] + posemb, ln_pre, blocks, ln_post, proj."""
  out_dim: int = 512
  width: int = 768
  depth: int = 12
  num_heads: int = 12
  mlp_dim: Optional[int] = None
  patch_size: int = 16
  act: str = "quick_gelu"
  ln_eps: float = 1e-5
  scan: bool = False
  dtype_mm: str = "float32"
  local_tokens: bool = False   # out["local"]: GL-MCM's patch features in the embedding space

  @nn.compact
  def __call__(self, image):
    out = {}
    p = self.patch_size
    x = nn.Conv(self.width, (p, p), strides=(p, p), padding="VALID", use_bias=False,
                dtype=self.dtype_mm, name="embedding")(jnp.asarray(image, self.dtype_mm))
    n, h, w, c = x.shape
    x = jnp.reshape(x, (n, h * w, c))
    cls = self.param("cls", nn.initializers.normal(c ** -0.5), (1, 1, c), jnp.float32)
    x = jnp.concatenate([jnp.tile(cls.astype(x.dtype), (n, 1, 1)), x], axis=1)
    pos = posemb.posemb_param(self, (1, 1 + h * w, c), c ** -0.5)   # any grid; resized per call
    x = out["with_posemb"] = x + posemb.resize_posemb(pos, (h, w), antialias=True).astype(x.dtype)
    x = nn.LayerNorm(epsilon=self.ln_eps, name="ln_pre")(x)
    x, out["encoder"] = vit.Encoder(
        depth=self.depth, mlp_dim=self.mlp_dim, num_heads=self.num_heads, act=self.act,
        ln_eps=self.ln_eps, scan=self.scan, dtype_mm=self.dtype_mm, attention="heads_first",
        value_path=self.local_tokens, name="Transformer")(x)
    out["encoded"] = x
    x = out["head_input"] = x[:, 0]          # ln_post (= encoder_norm) of the class token
    head = nn.Dense(self.out_dim, use_bias=False, name="head")
    x = out["logits"] = head(x)
    if self.local_tokens:   # the patch tokens of the value path, ln_post'ed, projected
      out["local"] = head(out["encoder"].pop("value_path")[:, 1:])
    return x, out


class TextTower(nn.Module):
  """CLIP text transformer: causal blocks, ln_final, EOT (argmax id) pooling, projection."""
  out_dim: int = 512
  width: int = 512
  depth: int = 12
  num_heads: int = 8
  mlp_dim: Optional[int] = None
  vocab_size: int = 49408
  context_length: int = 77
  act: str = "quick_gelu"
  ln_eps: float = 1e-5
  scan: bool = False
  dtype_mm: str = "float32"

  @nn.compact
  def __call__(self, text):
    out = {}
    text = jnp.asarray(text)
    length = text.shape[1]
    if length > self.context_length:
      raise ValueError(f"Text of length {length} is longer than the CLIP context "
                       f"({self.context_length}); tokenize with clip_tokenizer.Tokenizer.")
    x = nn.Embed(self.vocab_size, self.width, embedding_init=nn.initializers.normal(0.02),
                 name="Embed_0")(text).astype(self.dtype_mm)
    pos = self.param("pos_embedding", nn.initializers.normal(0.01),
                     (1, self.context_length, self.width), jnp.float32)
    x = x + pos[:, :length].astype(x.dtype)
    mask = nn.make_causal_mask(text, dtype=jnp.bool_)
    x, out["encoder"] = vit.Encoder(
        depth=self.depth, mlp_dim=self.mlp_dim, num_heads=self.num_heads, act=self.act,
        ln_eps=self.ln_eps, scan=self.scan, dtype_mm=self.dtype_mm, attention="heads_first",
        name="Encoder_0")(x, mask=mask)
    out["encoded"] = x
    eot = jnp.argmax(text, axis=-1)            # EOT (49407) is the largest id
    x = out["head_input"] = jnp.take_along_axis(x, eot[:, None, None], axis=1)[:, 0]
    x = out["logits"] = nn.Dense(self.out_dim, use_bias=False, name="head")(x)
    return x, out


class _Model(nn.Module):
  """Two towers + learned log logit scale `t`, returning (zimg, ztxt, out)."""
  out_dim: int = 512
  image: Optional[Mapping[str, Any]] = None
  text: Optional[Mapping[str, Any]] = None
  act: str = "quick_gelu"
  ln_eps: float = 1e-5
  scan: bool = False
  image_size: int = 224
  dtype_mm: str = "float32"
  local_tokens: bool = False   # the image tower's out["local"] (GL-MCM); no extra parameters

  def _towers(self):
    kw = dict(out_dim=self.out_dim, act=self.act, ln_eps=self.ln_eps, scan=self.scan,
              dtype_mm=self.dtype_mm)
    return (VisionTower(**kw, local_tokens=self.local_tokens, **dict(self.image or {}),
                        name="img"),
            TextTower(**kw, **dict(self.text or {}), name="txt"))

  @nn.compact
  def __call__(self, image, text=None, *, train=False):
    del train  # no dropout in CLIP inference
    img_tower, txt_tower = self._towers()
    return two_tower_outputs(self, img_tower, txt_tower, image, text)


def two_tower_outputs(module: nn.Module, img_tower: nn.Module, txt_tower: nn.Module, image,
                      text) -> tuple[Any, Any, dict]:
  """(zimg, ztxt, out) of a CLIP-style two-tower `module` (CLIP, PE-Core): its learned log logit
  scale `t` (a param of `module`; out["t"] = exp(t)), each given input's L2-normalised embedding
  (None for a missing one) and its tower's outputs under "img/" / "txt/". At init both towers
  run, a missing input replaced by zeros (`module.image_size`, the text tower's context length),
  so that an image-only or text-only init creates every param."""
  out, zimg, ztxt = {}, None, None
  t = module.param("t", nn.initializers.constant(np.log(1 / 0.07)), (1,), jnp.float32)
  out["t"], out["t/parameter"] = jnp.exp(t), t
  if module.is_initializing():
    if image is None:
      image = jnp.zeros((1, module.image_size, module.image_size, 3), jnp.float32)
    if text is None:
      text = jnp.zeros((1, txt_tower.context_length), jnp.int32)
  if image is not None:
    z, img_out = img_tower(image)
    out.update({f"img/{k}": v for k, v in img_out.items()})
    out["img/norm"] = jnp.linalg.norm(z, axis=-1, keepdims=True)
    zimg = out["img/normalized"] = out["pre_logits"] = vit.l2_normalize(z)
  if text is not None:
    z, txt_out = txt_tower(text)
    out.update({f"txt/{k}": v for k, v in txt_out.items()})
    out["txt/norm"] = jnp.linalg.norm(z, axis=-1, keepdims=True)
    ztxt = out["txt/normalized"] = vit.l2_normalize(z)
  return zimg, ztxt, out


def Model(variant: Optional[str] = None, **kw) -> _Model:
  """`Model("B/16", act="quick_gelu")`; `image=`/`text=` dicts override single tower fields."""
  kw.pop("num_classes", None)   # the classifier of a CLIP model is its zero-shot head
  base = decode_variant(variant)
  for tower in ("image", "text"):
    base[tower] = {**base.get(tower, {}), **dict(kw.pop(tower, None) or {})}
  return _Model(**{**base, **kw})


def logits(zimg: jax.Array, ztxt: jax.Array, t: jax.Array) -> jax.Array:
  """CLIP's image-text logits exp(t) * zimg . ztxt^T (highest precision)."""
  return jnp.exp(t) * jnp.dot(zimg, ztxt.T, precision=jax.lax.Precision.HIGHEST)


# ----------------------------------------------------------------------------- loading

def load(init_params, init_file: str, model_cfg: Optional[Mapping[str, Any]] = None,
         dont_load: Sequence[str] = ()) -> dict:
  """Loads an OpenCLIP/OpenAI state dict (.safetensors, or .pt/.pth/.bin via torch) into
  the tree of `init_params`. The image posemb keeps the checkpoint's grid (e.g. 24x24 for
  L/14@336) whatever resolution the model was initialised at; other input resolutions resize
  it per call exactly as open_clip's load-time `resize_pos_embed` (bicubic, antialias)."""
  del model_cfg  # shapes and head counts come from init_params
  init_params = jax.device_get(init_params)
  sd = readers.read_state_dict(init_file, hint=releases.CLIP_DOWNLOAD_HINT)
  heads = {t: tl.num_heads(init_params[t][enc]) for t, enc in (("img", "Transformer"),
                                                               ("txt", "Encoder_0"))}
  return tl.merge_unrolled(init_params, openclip.clip(sd, heads), init_file,
                           releases.CLIP_DOWNLOAD_HINT, dont_load, posemb="img/pos_embedding")


def predictor(model: _Model, params, config):
  """(predict_fn, Head) for fi_jax.run: the zero-shot head with CLIP's protocol (see
  zero_shot_head.predictor): logits exp(t) * E.T on the normalised image embedding, which is also
  the features (`out['pre_logits']`)."""
  return zero_shot_head.predictor(model, params, config, "clip")
