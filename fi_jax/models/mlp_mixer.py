"""MLP-Mixer, ResMLP, gMLP and timm's gMixer in Flax, loading timm's `mlp_mixer` weights.

timm's `MlpMixer` (timm 1.0.31 `timm/models/mlp_mixer.py`, `timm/layers/mlp.py`): a patch conv
(`stem`), a stack of all-MLP blocks over the (h*w, D) token matrix, a final norm, the mean over
the tokens = `out["pre_logits"]` -> `head`. Blocks (`block`):
- 'mixer' (MLP-Mixer, Tolstikhin et al. 2021): x + token MLP over the token axis of
  LayerNorm(x) (`mlp_tokens`, hidden `tokens_hidden`), then x + channel MLP of LayerNorm(x)
  (`mlp_channels`); LayerNorm eps 1e-6. MLPs (`mlp`): 'gelu' = fc1 -> exact GELU -> fc2
  (timm Mlp); 'glu' = fc1 -> [x | gate] halves -> x * silu(gate) -> fc2 (timm GluMlp with
  gate_last, gMixer).
- 'res' (ResMLP, Touvron et al. 2021): the norms are per-channel affines (`alpha` * x +
  `beta`, timm `Affine`, also the final norm); x + `ls1` * Linear over tokens
  (`linear_tokens`, N -> N) of Affine(x), x + `ls2` * GELU channel MLP of Affine(x).
- 'gmlp' (gMLP, Liu et al. 2021): x + fc2(SGU(GELU(fc1(LayerNorm(x))))), the spatial gating
  unit splitting the hidden width into [u | v]: u * proj_tokens(LayerNorm_1e-5(v)) (timm
  `SpatialGatingUnit`, `gate.norm`, `gate.proj` N -> N).
The token count is fixed by the input size the model is built for (the token-mixing weights
are N x N or N -> hidden): a file for another grid does not load.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from fi_jax.models import _blocks
from fi_jax.models import _pretrained as pretrained
from fi_jax.models.beit import layer_norm
from fi_jax.models.convert import mlp_mixer as convert
from fi_jax.models.convert import readers

HIGHEST = jax.lax.Precision.HIGHEST


class Affine(nn.Module):
  """timm's `Affine`: alpha * x + beta per channel (ResMLP's norm)."""

  @nn.compact
  def __call__(self, x):
    d = x.shape[-1]
    alpha = self.param("alpha", nn.initializers.ones, (d,), jnp.float32)
    beta = self.param("beta", nn.initializers.zeros, (d,), jnp.float32)
    return (x * alpha + beta).astype(x.dtype)


class Mlp(nn.Module):
  """'gelu': fc1 -> exact GELU -> fc2; 'glu': fc1 -> [x | gate] -> x * silu(gate) -> fc2;
  'sgu': fc1 -> GELU -> spatial gating (`gate`) -> fc2. Acts on the last axis."""
  hidden: int
  kind: str = "gelu"
  dtype: Any = jnp.float32
  precision: Any = HIGHEST

  @nn.compact
  def __call__(self, x):
    kw = dict(dtype=self.dtype, precision=self.precision)
    y = nn.Dense(self.hidden, name="fc1", **kw)(x)
    if self.kind == "gelu":
      y = _blocks.gelu_exact(y)
    elif self.kind == "glu":
      a, gate = jnp.split(y, 2, axis=-1)
      y = a * nn.silu(gate)
    elif self.kind == "sgu":
      y = SpatialGatingUnit(name="gate", **kw)(_blocks.gelu_exact(y))
    else:
      raise ValueError(f"Unknown MLP-Mixer MLP kind {self.kind!r}; use 'gelu', 'glu' or 'sgu'.")
    return nn.Dense(x.shape[-1], name="fc2", **kw)(y)


class SpatialGatingUnit(nn.Module):
  """[u | v] -> u * proj(LayerNorm(v) over the token axis) (LayerNorm eps 1e-5)."""
  dtype: Any = jnp.float32
  precision: Any = HIGHEST

  @nn.compact
  def __call__(self, x):
    u, v = jnp.split(x, 2, axis=-1)
    v = layer_norm("norm", eps=1e-5)(v).astype(self.dtype)
    v = nn.Dense(x.shape[-2], name="proj", dtype=self.dtype, precision=self.precision)(
        jnp.swapaxes(v, -1, -2))
    return u * jnp.swapaxes(v, -1, -2)


class Block(nn.Module):
  block: str = "mixer"
  mlp: str = "gelu"
  tokens_hidden: int = 384
  channels_hidden: int = 3072
  dtype: Any = jnp.float32
  precision: Any = HIGHEST

  @nn.compact
  def __call__(self, x):
    kw = dict(dtype=self.dtype, precision=self.precision)
    t = lambda a: jnp.swapaxes(a, 1, 2)
    if self.block == "mixer":
      y = layer_norm("norm1")(x).astype(self.dtype)
      x = x + t(Mlp(self.tokens_hidden, self.mlp, name="mlp_tokens", **kw)(t(y)))
      y = layer_norm("norm2")(x).astype(self.dtype)
      return x + Mlp(self.channels_hidden, self.mlp, name="mlp_channels", **kw)(y)
    if self.block == "res":
      d = x.shape[-1]
      ls1 = self.param("ls1", nn.initializers.ones, (d,), jnp.float32).astype(self.dtype)
      ls2 = self.param("ls2", nn.initializers.ones, (d,), jnp.float32).astype(self.dtype)
      y = t(nn.Dense(x.shape[1], name="linear_tokens", **kw)(t(Affine(name="norm1")(x))))
      x = x + ls1 * y
      y = Mlp(self.channels_hidden, "gelu", name="mlp_channels", **kw)(Affine(name="norm2")(x))
      return x + ls2 * y
    if self.block == "gmlp":
      y = layer_norm("norm")(x).astype(self.dtype)
      return x + Mlp(self.channels_hidden, "sgu", name="mlp_channels", **kw)(y)
    raise ValueError(f"Unknown MLP-Mixer block {self.block!r}; use 'mixer', 'res' or 'gmlp'.")


class _Model(nn.Module):
  num_classes: Optional[int] = 1000
  patch_size: int = 16
  width: int = 768
  depth: int = 12
  block: str = "mixer"
  mlp: str = "gelu"
  tokens_hidden: int = 384
  channels_hidden: int = 3072
  dtype: str = "float32"
  precision: Any = HIGHEST

  @nn.compact
  def __call__(self, image, *, train: bool = False):
    del train
    dt = jnp.dtype(self.dtype)
    kw = dict(dtype=dt, precision=self.precision)
    p = self.patch_size
    x = nn.Conv(self.width, (p, p), strides=(p, p), padding="VALID", name="stem",
                **kw)(jnp.asarray(image, dt))
    b, h, w, d = x.shape
    x = x.reshape(b, h * w, d)
    for i in range(self.depth):
      x = Block(self.block, self.mlp, self.tokens_hidden, self.channels_hidden,
                name=f"blocks_{i}", **kw)(x)
    x = Affine(name="norm")(x) if self.block == "res" else layer_norm("norm")(x)
    out = {"encoded": x}
    x = out["pre_logits"] = jnp.mean(x.astype(jnp.float32), axis=1)
    if self.num_classes:
      x = out["logits"] = nn.Dense(self.num_classes, name="head", **kw)(x.astype(dt)).astype(
          jnp.float32)
    return x, out


def _arch(block, patch, width, depth, tokens_ratio, channels_ratio, mlp="gelu"):
  return dict(block=block, patch_size=patch, width=width, depth=depth, mlp=mlp,
              tokens_hidden=int(tokens_ratio * width), channels_hidden=int(channels_ratio * width))


# timm's model functions (mlp_ratio = (tokens, channels) for the mixers; ResMLP / gMLP mix
# tokens with an N x N Linear, so their tokens_hidden is unused).
ARCHS: dict[str, dict] = {
    "mixer_b16_224": _arch("mixer", 16, 768, 12, 0.5, 4.0),
    "mixer_l16_224": _arch("mixer", 16, 1024, 24, 0.5, 4.0),
    "gmixer_24_224": _arch("mixer", 16, 384, 24, 1.0, 4.0, mlp="glu"),
    "resmlp_12_224": _arch("res", 16, 384, 12, 0, 4),
    "resmlp_24_224": _arch("res", 16, 384, 24, 0, 4),
    "resmlp_36_224": _arch("res", 16, 384, 36, 0, 4),
    "resmlp_big_24_224": _arch("res", 8, 768, 24, 0, 4),
    "gmlp_s16_224": _arch("gmlp", 16, 256, 30, 0, 6),
}

PRETRAINED: dict[str, dict] = pretrained.timm_tags(list(ARCHS))


def Model(num_classes: Optional[int] = 1000, *, variant: str, **kw) -> _Model:
  """`Model(1000, variant="mixer_b16_224")`; `kw` overrides ARCHS (width, depth,
  tokens_hidden, channels_hidden, patch_size, dtype, ...)."""
  name = variant.split(".")[0]
  if name not in ARCHS:
    raise ValueError(f"Unknown MLP-Mixer variant {variant!r}; known: {sorted(ARCHS)}.")
  kw.pop("source", None)
  return _Model(num_classes, **{**ARCHS[name], **kw})


def load(init_params, init_file: str, model_cfg: Optional[Mapping] = None) -> dict:
  """timm mlp_mixer weights (`model.safetensors` or a .pth state dict) onto `init_params`."""
  sd = readers.read_state_dict(init_file, hint=convert.HINT)
  return convert.convert(sd, init_params, file=init_file)
