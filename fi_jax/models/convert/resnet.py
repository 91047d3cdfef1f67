"""torchvision / timm ResNet state dicts -> fi_jax.models.resnet params.

Both libraries name the tensors alike: `conv1` / `bn1` (timm's deep stem: `conv1.{0,1,3,4,6}`
= conv, BN, conv, BN, conv), `layer{s}.{b}.{conv,bn}{1,2,3}`, `layer{s}.{b}.downsample.{i}`
(torchvision: 0 = conv, 1 = BN; timm avg_down: 0 = the pool, 1 = conv, 2 = BN), timm's SE
`layer{s}.{b}.se.fc{1,2}` (1x1 convs with bias; ECA: `se.conv`, a Conv1d [1, 1, k]),
Res2Net's `layer{s}.{b}.{convs,bns}.{i}`, ResNet-RS's stem pool `maxpool.{0,1}` (conv, norm)
and `fc`. timm's legacy SENets (senet.py): `layer0.{conv1,bn1}` (7x7 stem) or
`layer0.{conv,bn}{1,2,3}` (the 3x3 stem), `layer{s}.{b}.se_module.fc{1,2}`, `last_linear`.
The module path is mapped by a table; each tensor's leaf by `torch_leaf` (shared with the
RegNet / ResNetV2 converters): conv [O, I, kh, kw] -> kernel [kh, kw, I, O], Linear [O, I] ->
[I, O], BN weight / bias / running_mean / running_var -> scale / bias / mean / var.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from fi_jax.models import _checkpoints as checkpoints

CheckpointError = checkpoints.CheckpointError

_NORM_LEAVES = {"weight": "scale", "bias": "bias", "running_mean": "mean", "running_var": "var"}
_SKIPPED_LEAVES = ("num_batches_tracked",)


def torch_leaf(leaf: str, v: np.ndarray) -> Optional[tuple[str, np.ndarray]]:
  """One torch parameter of a Conv2d / Conv1d / Linear / BatchNorm / GroupNorm / EvoNorm ->
  (flax leaf, array); None for a leaf none of them has."""
  v = np.asarray(v)
  if leaf == "weight" and v.ndim == 4:
    return "kernel", np.transpose(v, (2, 3, 1, 0))
  if leaf == "weight" and v.ndim == 3:   # Conv1d [O, I, k] -> [k, I, O]
    return "kernel", np.transpose(v, (2, 1, 0))
  if leaf == "weight" and v.ndim == 2:
    return "kernel", v.T
  if leaf in _NORM_LEAVES and v.ndim == 1:
    return _NORM_LEAVES[leaf], v
  if leaf == "v" and v.ndim == 1:   # EvoNorm's non-linearity weight
    return "v", v
  return None


def convert_with(sd: Mapping[str, np.ndarray], module_map: Callable[[str, str, np.ndarray],
                                                                   Optional[str]],
                 family: str, source: str, hint: str,
                 where: Optional[dict[str, str]] = None) -> dict[str, np.ndarray]:
  """{torch key: array} -> {flax path: array}; `module_map(module, leaf, value)` gives the
  flax module path of a torch module (None: not part of the model -> CheckpointError).
  `where`, if given, receives {flax path: torch key}."""
  flat = {}
  for key, v in sd.items():
    module, _, leaf = key.rpartition(".")
    if leaf in _SKIPPED_LEAVES:
      continue
    target = module_map(module, leaf, np.asarray(v))
    conv = torch_leaf(leaf, v) if target is not None else None
    if conv is None:
      raise CheckpointError(
          f"{source}: unexpected key {key!r} (shape {tuple(np.shape(v))}) for a {family} "
          f"checkpoint (wrong file or model family?). {hint}".strip())
    flat[f"{target}/{conv[0]}"] = conv[1]
    if where is not None:
      where[f"{target}/{conv[0]}"] = key
  return flat


_TORCH_LEAVES = {"kernel": "weight", "scale": "weight", "bias": "bias", "mean": "running_mean",
                 "var": "running_var", "v": "v"}


def default_torch_module(module: str) -> str:
  """A flax module path -> the torch module name the ResNet layout gives it
  ('layer3_1/bn2' -> 'layer3.1.bn2'; 'head' -> 'fc')."""
  return "fc" if module == "head" else re.sub(r"_(\d+)", r".\1", module).replace("/", ".")


def file_key_fn(where: Mapping[str, str], torch_module: Callable[[str], Optional[str]]
                ) -> Callable[[str], Optional[str]]:
  """flax path -> the torch key that holds (or would hold) it in the file: the converted
  key itself, else the torch name of a sibling leaf's module (a missing running_var next to
  a present weight), else `torch_module(flax module)` + the torch leaf name."""
  modules = {p.rpartition("/")[0]: k.rpartition(".")[0] for p, k in where.items()}

  def file_key(path: str) -> Optional[str]:
    if path in where:
      return where[path]
    module, _, leaf = path.rpartition("/")
    torch_mod = modules.get(module) or torch_module(module)
    return f"{torch_mod}.{_TORCH_LEAVES[leaf]}" if torch_mod and leaf in _TORCH_LEAVES else None
  return file_key


def merge(flat: Mapping[str, np.ndarray], init_params: Mapping[str, Any], source: str,
          hint: str, dont_load: Sequence[str] = (), *, sd: Optional[Mapping[str, Any]] = None,
          where: Optional[Mapping[str, str]] = None,
          torch_module: Callable[[str], Optional[str]] = default_torch_module) -> dict:
  """Converted arrays onto the init tree; a model without "head" ignores the file's head.
  Missing / unexpected / wrong-shaped keys raise CheckpointError (checkpoints.merge_params),
  naming the file's key and shape (with `sd`, the file's state dict, and `where`, the
  conversion's {flax path: torch key}; `torch_module` names a module the file lacks)."""
  if "head" not in init_params:
    flat = {k: v for k, v in flat.items() if not k.startswith("head/")}
  file_key = None if where is None else file_key_fn(where, torch_module)
  shapes = None if sd is None else {k: tuple(np.shape(v)) for k, v in sd.items()}
  return checkpoints.merge_params(checkpoints.recover_tree(dict(flat)), init_params, dont_load,
                                  source=source, hint=hint, file_key=file_key,
                                  file_shapes=shapes)


_STEM = {"conv1": "conv1", "bn1": "bn1", "conv1.0": "stem_conv1", "conv1.1": "stem_bn1",
         "conv1.3": "stem_conv2", "conv1.4": "stem_bn2", "conv1.6": "conv1", "fc": "head"}
# timm's legacy SENets: the 7x7 stem, or the 3x3 one (conv3 / bn3 = the stem's last conv / BN)
_LEGACY_STEM = {"layer0.conv1": "conv1", "layer0.bn1": "bn1", "last_linear": "head"}
_LEGACY_DEEP_STEM = {"layer0.conv1": "stem_conv1", "layer0.bn1": "stem_bn1",
                     "layer0.conv2": "stem_conv2", "layer0.bn2": "stem_bn2",
                     "layer0.conv3": "conv1", "layer0.bn3": "bn1", "last_linear": "head"}
_BLOCK_LAYERS = ("conv1", "bn1", "conv2", "bn2", "conv3", "bn3")


def _is_conv(leaf: str, v: np.ndarray) -> bool:
  return leaf == "weight" and v.ndim == 4


def _block_module(module: str, leaf: str, v: np.ndarray) -> Optional[str]:
  m = re.fullmatch(r"layer([1-4])\.(\d+)\.(.+)", module)
  if not m:
    return None
  block, sub = f"layer{m[1]}_{m[2]}", m[3]
  if sub in _BLOCK_LAYERS:
    return f"{block}/{sub}"
  if sub in ("se.fc1", "se.fc2", "se.conv", "se_module.fc1", "se_module.fc2"):  # SE / ECA
    return f"{block}/se/{sub.rpartition('.')[2]}"
  if s := re.fullmatch(r"(convs|bns)\.(\d+)", sub):   # Res2Net
    return f"{block}/{s[1]}_{s[2]}"
  # ResNeSt's split attention (conv2.{conv,bn0,fc1,bn1,fc2}), SKNet's ConvNormAct
  # (conv{1,2,3}.{conv,bn}) and selective kernels (conv{1,2}.paths.{i}.*, conv{1,2}.attn.*)
  if s := re.fullmatch(r"(conv[123])\.(conv|bn|bn0|fc1|bn1|fc2)", sub):
    return f"{block}/{s[1]}/{s[2]}"
  if s := re.fullmatch(r"(conv[12])\.paths\.([01])\.(conv|bn)", sub):
    return f"{block}/{s[1]}/path{s[2]}_{s[3]}"
  if s := re.fullmatch(r"(conv[12])\.attn\.(fc_reduce|bn|fc_select)", sub):
    return f"{block}/{s[1]}/attn_{s[2]}"
  if re.fullmatch(r"downsample\.[0-2]", sub):   # conv or norm, told apart by the tensor
    return f"{block}/downsample_{'conv' if _is_conv(leaf, v) else 'bn'}"
  return None


def _module(module: str, leaf: str, v: np.ndarray) -> Optional[str]:
  if module in _STEM:
    return _STEM[module]
  if re.fullmatch(r"maxpool\.[0-2]", module):   # ResNet-RS: conv, [aa,] norm
    return f"stem_pool_{'conv' if _is_conv(leaf, v) else 'bn'}"
  return _block_module(module, leaf, v)


def is_legacy_senet(sd: Mapping[str, np.ndarray]) -> bool:
  """timm senet.py's layout (`layer0.conv1.weight`) rather than resnet.py's."""
  return "layer0.conv1.weight" in sd


def convert(sd: Mapping[str, np.ndarray], source: str = "checkpoint",
            hint: str = "", where: Optional[dict[str, str]] = None) -> dict[str, np.ndarray]:
  """torchvision / timm ResNet (or timm legacy SENet) state dict -> flat {flax path: array}
  (`where`: see convert_with)."""
  if is_legacy_senet(sd):
    stem = _LEGACY_DEEP_STEM if "layer0.conv3.weight" in sd else _LEGACY_STEM
    return convert_with(sd, lambda m, leaf, v: stem.get(m) or _block_module(m, leaf, v),
                        "timm legacy SENet", source, hint, where)
  return convert_with(sd, _module, "ResNet", source, hint, where)


def torch_module_of(sd: Mapping[str, np.ndarray]) -> Callable[[str], Optional[str]]:
  """The file layout's flax module -> torch module name (for naming a missing key)."""
  if not is_legacy_senet(sd):
    return default_torch_module
  stem = _LEGACY_DEEP_STEM if "layer0.conv3.weight" in sd else _LEGACY_STEM
  inverse = {v: k for k, v in stem.items()}

  def legacy(module: str) -> str:
    if module in inverse:
      return inverse[module]
    return default_torch_module(module).replace(".se.fc", ".se_module.fc")
  return legacy
