"""Two-tower image-text model (SigLIP, SigLIP 2) in big_vision's layout.

`Model(image=..., text=..., out_dim=(None, 768), bias_init=-10.)` holds an image tower `img`
(fi_jax.models.vit) and a text tower `txt` (fi_jax.models.text.transformer), the log
temperature `t` and, with `bias_init`, the bias `b`. `apply({'params': p}, images, tokens)`
returns `(zimg, ztxt, out)` with L2-normalised embeddings; either input may be None. SigLIP's
pairwise logit is `zimg @ ztxt.T * exp(t) + b`.

For the detectors `out["pre_logits"]` is the normalised image embedding, so that the zero-shot
logits are exactly `pre_logits @ head.w + head.b` (see `predictor`); the raw tower output stays
in `out["img/pre_logits"]`.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping, Optional, Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from fi_jax.common.outputs import Head
from fi_jax.models import _checkpoints as ckpt
from fi_jax.models import _releases as releases
from fi_jax.models import vit, zero_shot_head
from fi_jax.models.convert import hf_siglip, readers
from fi_jax.models.convert import torch_layers as tl
from fi_jax.models.text import transformer as text_transformer

# --------------------------------------------------------------------------- model

# big_vision's tower names -> fi_jax.models modules (the text tower lives in models/text/)
_TOWERS = {"text_transformer": "text.transformer"}


def _module(name: str):
  """'vit' / 'proj.image_text.text_transformer' (big_vision names) -> fi_jax.models module."""
  leaf = name.rsplit(".", 1)[-1]
  return importlib.import_module(f"fi_jax.models.{_TOWERS.get(leaf, leaf)}")


class Model(nn.Module):
  """Image tower `img`, text tower `txt`, log temperature `t`, optional bias `b`."""
  image: Optional[Mapping[str, Any]] = None
  text: Optional[Mapping[str, Any]] = None
  image_model: str = "vit"
  text_model: str = "text_transformer"
  out_dim: Any = 128
  temperature_init: float = 1.0
  bias_init: Optional[float] = None
  text_len: int = 64  # text length the text tower is initialised with (SigLIP So400m/14@224: 16)

  @nn.compact
  def __call__(self, image, text=None, *, train=False):
    out_dims = tuple(self.out_dim) if isinstance(self.out_dim, (list, tuple)) else (self.out_dim,) * 2
    if self.is_initializing() and text is None:  # init builds both towers from the images alone
      text = jnp.zeros((1, self.text_len), jnp.int32)
    out = {}
    zimg = ztxt = None
    if image is not None:
      img = _module(self.image_model).Model(num_classes=out_dims[0], **dict(self.image or {}), name="img")
      zimg, out_img = img(image, train=train)
      out.update({f"img/{k}": v for k, v in out_img.items()})
      out["img/norm"] = jnp.linalg.norm(zimg, axis=-1, keepdims=True)
      zimg = vit.l2_normalize(zimg)
      out["img/normalized"] = out["pre_logits"] = zimg
    if text is not None:
      txt = _module(self.text_model).Model(num_classes=out_dims[1], **dict(self.text or {}), name="txt")
      ztxt, out_txt = txt(text, train=train)
      out.update({f"txt/{k}": v for k, v in out_txt.items()})
      out["txt/norm"] = jnp.linalg.norm(ztxt, axis=-1, keepdims=True)
      ztxt = vit.l2_normalize(ztxt)
      out["txt/normalized"] = ztxt
    t = self.param("t", nn.initializers.constant(np.log(self.temperature_init)), (1,), jnp.float32)
    out["t/parameter"], out["t"] = t, jnp.exp(t)
    if self.bias_init is not None:
      out["b"] = self.param("b", nn.initializers.constant(self.bias_init), (1,), jnp.float32)
    return zimg, ztxt, out


# --------------------------------------------------------------------------- loading

def _load_tree(path: str, init_params: Mapping[str, Any]) -> tuple[dict, str, str]:
  """(two-tower tree, file, hint) of an npz (params/ prefix optional) or HF safetensors."""
  path, hint = releases.resolve_vanity(path, releases.SIGLIP_RELEASES)
  file, _ = readers.split_subkey(path)
  if readers.is_safetensors(file):
    tree = hf_siglip.two_towers(readers.load_safetensors(file, hint), tl.num_heads(init_params["img"]),
                                tl.num_heads(init_params["txt"]), file, hint)
  else:
    tree = readers.load_params(path, hint)
  return tree, file, hint


def load(init_params: Mapping[str, Any], init_files: Any, model_cfg: Optional[Mapping] = None,
         img_load_kw: Optional[Mapping] = None, txt_load_kw: Optional[Mapping] = None,
         dont_load: Sequence[str] = ()) -> dict:
  """Loads SigLIP / SigLIP 2 weights onto `init_params`.

  `init_files`: one file (big_vision `.npz`, with or without `params/`, scanned or unrolled,
  bfloat16 or not; an HF `model.safetensors`; or a release name such as "siglip2_b16_224",
  looked up in $FI_JAX_CHECKPOINT_DIR; see releases.SIGLIP_TABLE), or a dict {"img": file, "txt": file[, "t": file, "b": file]}
  as in big_vision. Towers are converted to the init's scan layout and the image posemb is
  resampled to the init resolution. `dont_load` (and `img_load_kw` / `txt_load_kw`
  "dont_load" lists, relative to their tower) name params kept from init.
  """
  del model_cfg
  img_kw, txt_kw = dict(img_load_kw or {}), dict(txt_load_kw or {})
  skip = list(dont_load) + [f"img/{p}" for p in img_kw.pop("dont_load", ())] + [
      f"txt/{p}" for p in txt_kw.pop("dont_load", ())]
  if img_kw or txt_kw:
    raise ValueError(f"Unsupported load kwargs {sorted(img_kw) + sorted(txt_kw)}; only 'dont_load'.")
  if isinstance(init_files, str):
    tree, source, hint = _load_tree(init_files, init_params)
  else:
    files = dict(init_files)
    unknown = set(files) - {"img", "txt", "t", "b"}
    if unknown:
      raise ValueError(f"init_files keys must be among img, txt, t, b; got {sorted(unknown)}.")
    tree, source, hint = {}, ", ".join(f"{k}={v}" for k, v in files.items()), ""
    for part, path in files.items():
      sub, _, hint = _load_tree(path, init_params)
      if isinstance(sub, dict) and part in sub and ("img" in sub or "txt" in sub):
        sub = sub[part]  # a whole two-tower file given for one part
      tree[part] = sub
  tree = dict(tree)
  if "img" in tree and "img" in init_params:
    tree["img"] = vit.prepare(dict(tree["img"]), init_params["img"])
  if "txt" in tree and "txt" in init_params:
    tree["txt"] = text_transformer.prepare(dict(tree["txt"]), init_params["txt"])
  for k in ("t", "b"):
    if k in tree:
      tree[k] = np.asarray(tree[k]).reshape(-1)
  return ckpt.merge_params(tree, init_params, skip, source=source, hint=hint)


# --------------------------------------------------------------------------- zero-shot head

def predictor(model: Model, params: Mapping[str, Any], config) -> tuple[Callable, Head]:
  """The pipeline's predictor: images -> (zero-shot logits, normalised image embedding), with
  SigLIP's protocol (see zero_shot_head.predictor; config.zero_shot.tokenizer is required). The
  head is `exp(t) * class_embeddings.T` with bias `b`, i.e. SigLIP's own logits."""
  return zero_shot_head.predictor(model, params, config, "siglip")
