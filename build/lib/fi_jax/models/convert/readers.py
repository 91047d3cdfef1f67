"""Checkpoint files in: big_vision npz, safetensors and PyTorch weights-only files -> numpy.

big_vision stores params as a flat `np.savez` archive whose keys are '/'-joined tree paths;
bfloat16 arrays come back from numpy as the 2-byte void dtype `|V2`. HF / timm / open_clip
weights come as safetensors (read here with numpy only, so loading needs no torch) or as
PyTorch state dicts (`torch.load(weights_only=True)`, never a pickle of arbitrary objects).
Every reader turns a bad file into one `CheckpointError` naming the file and where to get the
right one (`hint`).
"""
from __future__ import annotations

import json
import os
import pickle  # only for its error type (torch.load raises pickle.UnpicklingError)
import re
import zipfile
from typing import Any, Mapping, Optional

import ml_dtypes
import numpy as np

from fi_jax.models.checkpoints import CheckpointError, Flat, flatten, recover_tree, tree_get


def recover_dtype(a: np.ndarray) -> np.ndarray:
  """numpy saves bfloat16 as void `|V2`; view such arrays as ml_dtypes.bfloat16 again."""
  if a.dtype.kind == "V" and a.dtype.itemsize == 2:
    return a.view(ml_dtypes.bfloat16)
  return a


def _check_exists(path: str, hint: str) -> None:
  if not os.path.exists(path):
    msg = f"Checkpoint file {path!r} does not exist."
    raise FileNotFoundError(f"{msg} {hint}" if hint else msg)


def load_npz(path: str, hint: str = "") -> Flat:
  """Flat {name: array} from a big_vision-style .npz (or .npy -> {'': array}), bf16 recovered."""
  _check_exists(path, hint)
  try:
    with np.load(path, allow_pickle=False) as z:
      return {k: recover_dtype(z[k]) for k in z.files}
  except AttributeError:  # .npy: np.load returned an array, which has no context manager
    return {"": recover_dtype(np.load(path, allow_pickle=False))}
  except (ValueError, OSError) as e:
    raise CheckpointError(f"Cannot read {path!r} as an npz archive ({e}). {hint}".strip()) from e


_ST_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_,
}


def is_safetensors(path: str) -> bool:
  """A .safetensors file, a sharded checkpoint's .safetensors.index.json, or an HF model
  directory holding either."""
  if path.endswith((".safetensors", ".safetensors.index.json")):
    return True
  return os.path.isdir(path) and any(
      os.path.exists(os.path.join(path, n)) for n in ("model.safetensors", "model.safetensors.index.json"))


def load_safetensors(path: str, hint: str = "") -> Flat:
  """Flat {name: array} from safetensors, read with numpy only (BF16 via ml_dtypes).

  `path`: a .safetensors file, a sharded checkpoint's `*.safetensors.index.json`, or an HF
  model directory (its model.safetensors or model.safetensors.index.json)."""
  if os.path.isdir(path):
    index = os.path.join(path, "model.safetensors.index.json")
    path = index if os.path.exists(index) else os.path.join(path, "model.safetensors")
  _check_exists(path, hint)
  if path.endswith(".index.json"):
    with open(path, encoding="utf-8") as f:
      shards = sorted(set(json.load(f)["weight_map"].values()))
    out: Flat = {}
    for shard in shards:
      out.update(load_safetensors(os.path.join(os.path.dirname(path), shard), hint))
    return out
  with open(path, "rb") as f:
    raw = f.read()
  try:
    n = int(np.frombuffer(raw[:8], "<u8")[0])
    header = json.loads(raw[8:8 + n])
  except (ValueError, IndexError, UnicodeDecodeError) as e:
    raise CheckpointError(f"{path!r} is not a safetensors file ({e}). {hint}".strip()) from e
  body = memoryview(raw)[8 + n:]
  out = {}
  for name, info in header.items():
    if name == "__metadata__":
      continue
    if info["dtype"] not in _ST_DTYPES:
      raise CheckpointError(f"{path!r}: tensor {name!r} has unsupported dtype {info['dtype']}.")
    start, end = info["data_offsets"]
    dt = np.dtype(_ST_DTYPES[info["dtype"]]).newbyteorder("<")
    out[name] = np.frombuffer(body[start:end], dt).reshape(info["shape"]).copy()
  return out


def save_npz(path: str, params: Mapping[str, Any]) -> None:
  """Writes a nested param tree the way big_vision does ('/'-joined names, np.savez)."""
  np.savez(path, **{k: np.asarray(v) for k, v in flatten(params).items()})


def split_subkey(path: str) -> tuple[str, Optional[str]]:
  """'file.npz:img/x' -> ('file.npz', 'img/x'); a colon is a sub-key only if followed by \\w/."""
  m = re.match(r"^(.*?)(?::([\w/]+))?$", path)
  assert m is not None
  if m.group(2) and os.path.exists(path):  # a real file whose name has a colon
    return path, None
  return m.group(1), m.group(2)


def load_params(path: str, hint: str = "") -> dict:
  """big_vision's `utils.load_params` for local files: nested params of "file.npz[:sub/key]".

  Strips the `params/` (big_vision) or `opt/target/` (old Flax optimizer) top level, then
  selects the optional sub-key (e.g. ':img' for a SigLIP image tower). `.safetensors` files
  are returned with their own (flat, dotted) names as the only level.
  """
  file, key = split_subkey(path)
  if is_safetensors(file):
    return load_safetensors(file, hint)
  tree = recover_tree(load_npz(file, hint))
  if "params" in tree and isinstance(tree["params"], dict):
    tree = tree["params"]
  elif "opt" in tree and isinstance(tree["opt"], dict) and "target" in tree["opt"]:
    tree = tree["opt"]["target"]
  if key:
    try:
      tree = tree_get(tree, key)
    except CheckpointError as e:
      raise CheckpointError(f"{file!r}: {e} {hint}".strip()) from None
  return tree


# ----------------------------------------------------------------------------- PyTorch

def _read_torch(path: str, hint: str) -> dict[str, np.ndarray]:
  """torch.load(weights_only=True) -> numpy."""
  try:
    import torch  # pylint: disable=g-import-not-at-top  (heavy optional dependency)
  except ImportError:
    raise CheckpointError(
        f"{path!r} is a PyTorch file and reading it needs torch (the CPU build is enough); "
        f"install torch, or use the .safetensors version of the checkpoint. {hint}".strip()
    ) from None
  if _is_torchscript(path):
    raise CheckpointError(
        f"{path!r} is a TorchScript archive (like OpenAI's original CLIP .pt files), not a "
        f"state dict; use the state-dict version (.safetensors/.bin). {hint}".strip())
  try:
    obj = torch.load(path, map_location="cpu", weights_only=True)
  except (RuntimeError, OSError, EOFError, pickle.UnpicklingError) as e:
    raise CheckpointError(
        f"Cannot read {path!r} as a PyTorch state dict ({str(e).splitlines()[0]}). "
        f"{hint}".strip()) from None
  if not isinstance(obj, Mapping):
    raise CheckpointError(
        f"{path!r} holds a {type(obj).__name__}, not a state dict. {hint}".strip())
  out = {}
  for k, v in obj.items():
    if isinstance(v, Mapping):
      out.update({f"{k}.{kk}": vv for kk, vv in _tensors_to_numpy(v).items()})
    elif hasattr(v, "numpy"):
      out[k] = _tensor_to_numpy(v)
  return out


def _tensors_to_numpy(d: Mapping) -> dict[str, np.ndarray]:
  return {k: _tensor_to_numpy(v) for k, v in d.items() if hasattr(v, "numpy")}


def _tensor_to_numpy(v) -> np.ndarray:
  import torch  # pylint: disable=g-import-not-at-top  (heavy optional dependency)
  v = v.detach().cpu()
  if v.dtype == torch.bfloat16:
    v = v.to(torch.float32)
  return v.numpy()


def _is_torchscript(path: str) -> bool:
  if not zipfile.is_zipfile(path):
    return False
  with zipfile.ZipFile(path) as z:
    return any(n.split("/", 1)[-1].startswith("code/") for n in z.namelist()[:200])


def read_state_dict(path: str, hint: str = "") -> dict[str, np.ndarray]:
  """A flat state dict as {key: numpy array}: .safetensors (numpy only), .pt/.pth/.bin
  (torch.load(weights_only=True)) or .npz (its flat names); unwraps 'state_dict'/'model'
  and a 'module.' prefix."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"Checkpoint {path!r} does not exist. {hint}".strip())
  if path.endswith(".safetensors"):
    sd = load_safetensors(path, hint)
  elif path.endswith((".pt", ".pth", ".bin")):
    sd = _read_torch(path, hint)
  elif path.endswith(".npz"):
    sd = load_npz(path, hint)
  else:
    raise CheckpointError(
        f"Checkpoint {path!r}: unknown file type; expected .safetensors, .pt, .pth, .bin or .npz. "
        f"{hint}".strip())
  for wrapper in ("state_dict", "model"):
    if sd and all(k.startswith(wrapper + ".") for k in sd):
      sd = {k[len(wrapper) + 1:]: v for k, v in sd.items()}
  if sd and all(k.startswith("module.") for k in sd):
    sd = {k[len("module."):]: v for k, v in sd.items()}
  if not sd:
    raise CheckpointError(f"Checkpoint {path!r} holds no tensors. {hint}".strip())
  return sd
