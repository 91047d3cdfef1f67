"""timm `MlpMixer` state dicts (MLP-Mixer, ResMLP, gMLP, gMixer) -> fi_jax.models.mlp_mixer
params.

timm keys: stem.proj.{weight, bias}; blocks.<i>.{norm1, norm2 (LayerNorm weight / bias, or
ResMLP's Affine alpha / beta of shape (1, 1, D)), mlp_tokens.{fc1, fc2}, mlp_channels.{fc1,
fc2}, linear_tokens, ls1, ls2, norm, mlp_channels.gate.{norm, proj}}; norm; head. Facebook's
original ResMLP names (patch_embed, attn, mlp, gamma_*) are renamed as timm's
`checkpoint_filter_fn` does.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from fi_jax.models import _checkpoints as checkpoints
from fi_jax.models.convert import keymap

HINT = ("MLP-Mixer / ResMLP / gMLP weights: https://huggingface.co/timm/<model>.<tag> "
        "(model.safetensors)")

_LEAF = {"kernel": ("weight", keymap.dense), "bias": ("bias", keymap.same),
         "scale": ("weight", keymap.same), "alpha": ("alpha", np.ravel),
         "beta": ("beta", np.ravel), "ls1": ("ls1", keymap.same), "ls2": ("ls2", keymap.same)}


def _flat(tree: Mapping[str, Any], prefix: str = "") -> list[str]:
  out = []
  for k, v in tree.items():
    out += _flat(v, f"{prefix}{k}/") if isinstance(v, Mapping) else [prefix + k]
  return out


def key_map(init_params: Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
  """{flax leaf path: (timm key, transform)}: the module tree mirrors timm's names."""
  spec = {}
  for path in _flat(init_params):
    *mods, leaf = path.split("/")
    if mods == ["stem"]:
      key, fn = f"stem.proj.{leaf.replace('kernel', 'weight')}", (
          keymap.conv if leaf == "kernel" else keymap.same)
    else:
      name, fn = _LEAF[leaf]
      key = ".".join(m.replace("blocks_", "blocks.") for m in mods) + ("." if mods else "") + name
    spec[path] = (key, fn)
  return spec


def _from_facebook(sd: Mapping[str, np.ndarray]) -> dict:
  """Facebook's ResMLP names -> timm's (timm's checkpoint_filter_fn)."""
  out = {}
  for k, v in sd.items():
    k = (k.replace("patch_embed.", "stem.").replace("attn.", "linear_tokens.")
         .replace("mlp.", "mlp_channels.").replace("gamma_", "ls"))
    out[k] = v
  return out


# (flax path under blocks_0, timm key under blocks.0, axis of the token count in the torch weight)
_TOKEN_WEIGHTS = (("mlp_tokens/fc1/kernel", "mlp_tokens.fc1.weight", 1),
                  ("linear_tokens/kernel", "linear_tokens.weight", 1),
                  ("mlp_channels/gate/proj/kernel", "mlp_channels.gate.proj.weight", 1))


def _check_token_count(sd: Mapping[str, np.ndarray], init_params: Mapping[str, Any],
                       file: str) -> None:
  """The token-mixing weights fix the token count (input size / patch size, squared): a file
  for another count is refused naming both grids."""
  block = init_params.get("blocks_0", {})
  for path, key, axis in _TOKEN_WEIGHTS:
    node = block
    for part in path.split("/"):
      node = node.get(part, {}) if isinstance(node, Mapping) else {}
    if f"blocks.0.{key}" not in sd or not hasattr(node, "shape"):
      continue
    have, want = np.shape(sd[f"blocks.0.{key}"])[axis], node.shape[0]
    if have != want:
      side = lambda n: f"{int(round(np.sqrt(n)))}x{int(round(np.sqrt(n)))}"
      raise checkpoints.CheckpointError(
          f"{file} (MLP-Mixer): the token-mixing weights are for {have} tokens (a {side(have)} "
          f"patch grid), the model was initialised for {want} ({side(want)}): these models "
          f"run only at the weights' input size; initialise it there (zoo `input_size`). "
          f"{HINT}.")


def convert(sd: Mapping[str, np.ndarray], init_params: Mapping[str, Any], *,
            file: str = "checkpoint") -> dict:
  """A timm mlp_mixer state dict -> params on `init_params`' tree (a model built without a
  head drops the file's). A file for another token count is refused with both grids."""
  if "patch_embed.proj.weight" in sd:
    sd = _from_facebook(sd)
  _check_token_count(sd, init_params, file)
  skip = () if "head" in init_params else ("head.weight", "head.bias")
  return keymap.apply(sd, key_map(init_params), init_params, source=f"{file} (MLP-Mixer)",
                      hint=HINT + ".", skip=skip)
