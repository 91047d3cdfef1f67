"""Text transformer in big_vision's layout (the SigLIP / SigLIP 2 / LiT text tower).

Token embedding `Embed_0`, learned `pos_embedding` of the sequence length seen at init (64 for
SigLIP, 16 for SigLIP So400m/14@224), the ViT encoder as `Encoder_0` without an attention mask
(the tower is bidirectional; padding tokens take part), pooling ("last" for the released
checkpoints), optional Dense `head`. `apply({'params': p}, tokens)` -> `(x, out)` with
`out["pre_logits"]` (pooled) and, with a head, `out["logits"]`.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from fi_jax.models import _checkpoints as ckpt
from fi_jax.models import _releases as releases
from fi_jax.models import vit
from fi_jax.models.convert import hf_siglip, readers
from fi_jax.models.convert import torch_layers as tl


class _Model(nn.Module):
  """Field names and defaults follow big_vision's `text_transformer._Model`."""
  num_classes: Optional[int] = None
  width: int = 512
  depth: int = 12
  mlp_dim: Optional[int] = None
  num_heads: int = 8
  dropout: float = 0.0
  vocab_size: int = 32_000
  pool_type: str = "last"
  scan: bool = False
  remat_policy: str = "nothing_saveable"
  dtype_mm: str = "float32"
  act: str = "gelu"
  ln_eps: float = 1e-6

  @nn.compact
  def __call__(self, text, *, train=False):
    out = {}
    embedding = nn.Embed(num_embeddings=self.vocab_size, features=self.width, name="Embed_0")
    x = out["embedded"] = embedding(jnp.asarray(text, jnp.int32))
    n, seq_len, d = x.shape
    x = x + self.param("pos_embedding", nn.initializers.normal(stddev=1 / np.sqrt(d)),
                       (1, seq_len, d), x.dtype)
    x = nn.Dropout(rate=self.dropout)(x, not train)
    x, out["encoder"] = vit.Encoder(
        depth=self.depth, mlp_dim=self.mlp_dim, num_heads=self.num_heads, dropout=self.dropout,
        act=self.act, ln_eps=self.ln_eps, scan=self.scan, remat_policy=self.remat_policy,
        dtype_mm=self.dtype_mm, name="Encoder_0")(x, deterministic=not train)
    out["encoded"] = x

    if self.pool_type == "last":
      x = x[:, -1, :]
    elif self.pool_type == "first":
      x = x[:, 0, :]
    elif self.pool_type in ("mean", "gap"):
      x = x.mean(axis=1)
    elif self.pool_type in ("max", "gmp"):
      x = x.max(axis=1)
    elif self.pool_type == "map":
      x = vit.MAPHead(num_heads=self.num_heads, mlp_dim=self.mlp_dim, act=self.act,
                      ln_eps=self.ln_eps)(x)
    else:
      raise ValueError(f"Unknown text pool type {self.pool_type!r}; use last, first, mean, max or map.")
    out["pre_logits"] = x

    if self.num_classes:
      x = out["logits"] = nn.Dense(self.num_classes, name="head")(x)
    return x, out


def Model(num_classes: Optional[int] = None, *, variant: Optional[str] = None, **kw) -> _Model:
  """Factory as in big_vision: `Model(768, variant="B", vocab_size=32_000)` (no patch size)."""
  return _Model(num_classes, **{**vit.decode_variant(variant), **kw})


# ----------------------------------------------------------------------------- loading

def prepare(tree: dict, init_params: Mapping[str, Any]) -> dict:
  """Old-layout fixes and scan <-> unrolled to match init (big_vision's text loader does not
  convert layouts; doing it here lets any config read any file)."""
  tree = ckpt.convert_pre_linen(dict(tree))
  enc = dict(tree.get("Encoder_0", {}))
  if "pos_embedding" in enc:  # older checkpoints also had a posemb inside the encoder
    stray = np.asarray(enc.pop("pos_embedding"))
    tree["pos_embedding"] = np.asarray(tree["pos_embedding"]) + stray.astype(np.asarray(tree["pos_embedding"]).dtype)
  if "Encoder_0" in tree and "Encoder_0" in init_params:
    tree["Encoder_0"] = ckpt.match_scan(enc, init_params["Encoder_0"])
  return tree


def load(init_params: Mapping[str, Any], init_file: str, model_cfg: Optional[Mapping] = None,
         dont_load: Sequence[str] = ()) -> dict:
  """Loads a text tower: big_vision `.npz` (a two-tower file without ':txt' picks 'txt') or
  an HF SigLIP `model.safetensors`. The text length (pos_embedding) must match the init."""
  del model_cfg
  path, hint = releases.resolve_vanity(init_file, releases.SIGLIP_RELEASES)
  file, key = readers.split_subkey(path)
  if readers.is_safetensors(file):
    tree = hf_siglip.text(readers.load_safetensors(file, hint), tl.num_heads(init_params),
                          source=file, hint=hint)
  else:
    tree = readers.load_params(path, hint)
    if not key and "txt" in tree and "Embed_0" not in tree:
      tree = tree["txt"]
  tree = prepare(tree, init_params)
  return ckpt.merge_params(tree, init_params, dont_load, source=file, hint=hint)
