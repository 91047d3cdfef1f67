"""Checkpoint files in: big_vision npz, safetensors and PyTorch weights-only files -> numpy.

big_vision stores params as a flat `np.savez` archive whose keys are '/'-joined tree paths;
bfloat16 arrays come back from numpy as the 2-byte void dtype `|V2`. HF / timm / open_clip
weights come as safetensors or as PyTorch `torch.save` files (.pth / .bin), both read with
numpy only: torch is never needed at run time. Torch files are unpickled with an allow-list
(tensors, containers, scalars; `torch_pickle.py`), as `torch.load(weights_only=True)` does.
Every reader turns a bad file into one `CheckpointError` naming the file and where to get the
right one (`hint`).
"""
from __future__ import annotations

import json
import os
import re
import struct
import zipfile
import zlib
from typing import Any, Mapping, Optional

import ml_dtypes
import numpy as np

from fi_jax.models._checkpoints import CheckpointError, Flat, flatten, recover_tree, tree_get
from fi_jax.models.convert import torch_pickle


def recover_dtype(a: np.ndarray) -> np.ndarray:
  """numpy saves bfloat16 as void `|V2`; view such arrays as ml_dtypes.bfloat16 again."""
  if a.dtype.kind == "V" and a.dtype.itemsize == 2:
    return a.view(ml_dtypes.bfloat16)
  return a


def _check_exists(path: str, hint: str) -> None:
  if not os.path.exists(path):
    msg = f"Checkpoint file {path!r} does not exist."
    raise FileNotFoundError(f"{msg} {hint}" if hint else msg)


# what numpy / zipfile / zlib raise on a truncated, empty or corrupted archive
_READ_ERRORS = (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error, KeyError,
                struct.error)


def _first_line(e: BaseException) -> str:
  lines = str(e).splitlines()
  return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__


def load_npz(path: str, hint: str = "") -> Flat:
  """Flat {name: array} from a big_vision-style .npz (or .npy -> {'': array}), bf16 recovered.

  A truncated, empty or corrupted file is one CheckpointError naming the file (and the
  array, when the archive opens but one of its members does not read)."""
  _check_exists(path, hint)
  try:
    z = np.load(path, allow_pickle=False)
  except _READ_ERRORS as e:
    raise CheckpointError(f"Cannot read {path!r} as an npz archive ({_first_line(e)}); the "
                          f"file is truncated or corrupted. {hint}".strip()) from None
  if isinstance(z, np.ndarray):   # a .npy file
    return {"": recover_dtype(z)}
  out = {}
  with z:
    for k in z.files:
      try:
        out[k] = recover_dtype(z[k])
      except _READ_ERRORS as e:
        raise CheckpointError(f"Cannot read tensor {k!r} of {path!r} ({_first_line(e)}); the "
                              f"file is truncated or corrupted. {hint}".strip()) from None
  return out


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
    try:
      with open(path, encoding="utf-8") as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
      raise CheckpointError(f"{path!r} is not a safetensors index (no readable weight_map: "
                            f"{_first_line(e)}). {hint}".strip()) from None
    out: Flat = {}
    for shard in shards:
      out.update(load_safetensors(os.path.join(os.path.dirname(path), shard), hint))
    return out
  with open(path, "rb") as f:
    raw = f.read()
  try:
    n = int(np.frombuffer(raw[:8], "<u8")[0])
    if 8 + n > len(raw):
      raise ValueError(f"header of {n} bytes in a file of {len(raw)}")
    header = json.loads(raw[8:8 + n])
    if not isinstance(header, dict):
      raise ValueError("the header is not a JSON object")
  except (ValueError, IndexError, UnicodeDecodeError) as e:
    raise CheckpointError(f"{path!r} is not a safetensors file or is truncated ({e}). "
                          f"{hint}".strip()) from None
  body = memoryview(raw)[8 + n:]
  out = {}
  for name, info in header.items():
    if name == "__metadata__":
      continue
    out[name] = _safetensors_tensor(path, name, info, body, hint)
  return out


def _safetensors_tensor(path: str, name: str, info: Any, body: memoryview, hint: str,
                        ) -> np.ndarray:
  """One tensor of a safetensors body, after checking its header entry against the data."""
  bad = lambda why: CheckpointError(f"{path!r}: tensor {name!r} {why}. {hint}".strip())
  if not isinstance(info, dict) or not all(k in info for k in ("dtype", "shape", "data_offsets")):
    raise bad(f"has an incomplete header entry {info!r} (needs dtype, shape, data_offsets); "
              "the file is corrupted")
  if info["dtype"] not in _ST_DTYPES:
    raise bad(f"has unsupported dtype {info['dtype']!r}")
  try:
    start, end = (int(x) for x in info["data_offsets"])
    shape = tuple(int(d) for d in info["shape"])
  except (TypeError, ValueError):
    raise bad(f"has a malformed shape or data_offsets ({info!r})") from None
  dt = np.dtype(_ST_DTYPES[info["dtype"]]).newbyteorder("<")
  expected = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
  if not 0 <= start <= end or end - start != expected:
    raise bad(f"has data_offsets {[start, end]} for shape {list(shape)} ({expected} bytes); "
              "the file is corrupted")
  if end > len(body):
    raise bad(f"needs bytes up to {end} of the data but the file has {len(body)}; "
              "the file is truncated")
  return np.frombuffer(body[start:end], dt).reshape(shape).copy()


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
  """A torch.save state dict -> numpy, read without torch (allow-listed unpickling, as
  torch.load(weights_only=True)); bfloat16 tensors become float32.

  The arrays are read-only. They are what `torch_pickle.load` returns, views of the file's
  storages (possibly non-contiguous, stride 0, or sharing memory with each other), never copied
  here except for the bfloat16 -> float32 conversion, done once per distinct view. Consumers
  copy when they need their own arrays (`keymap.apply` and `merge_params` cast with `astype`);
  an in-place write raises instead of changing another tensor of the same storage. Any
  unreadable file is one CheckpointError naming `path`."""
  if _is_torchscript(path):
    raise CheckpointError(
        f"{path!r} is a TorchScript archive (like OpenAI's original CLIP .pt files), not a "
        f"state dict; use the state-dict version (.safetensors/.bin). {hint}".strip())
  try:
    obj = torch_pickle.load(path)
  except torch_pickle.UnsupportedContent as e:
    raise CheckpointError(f"Cannot read {path!r} as a PyTorch state dict: {e.reason}. "
                          f"{hint}".strip()) from None
  except torch_pickle.READ_ERRORS as e:   # load maps these itself; kept as a backstop
    raise CheckpointError(
        f"Cannot read {path!r} as a PyTorch state dict: the file is truncated or corrupt "
        f"({type(e).__name__}: {str(e)[:200]}). {hint}".strip()) from None
  if not isinstance(obj, Mapping):
    raise CheckpointError(
        f"{path!r} holds a {type(obj).__name__}, not a state dict. {hint}".strip())
  out = {}
  bf16 = _Bf16ToFloat32()
  for k, v in obj.items():
    if isinstance(v, Mapping):
      out.update({f"{k}.{kk}": bf16(vv) for kk, vv in v.items() if isinstance(vv, np.ndarray)})
    elif isinstance(v, np.ndarray):
      out[k] = bf16(v)
  return out


class _Bf16ToFloat32:
  """bfloat16 arrays -> read-only float32 copies, one per distinct view (a tensor referenced
  many times, e.g. tied weights, is converted once); other arrays unchanged."""

  def __init__(self):
    self._done: dict[tuple, np.ndarray] = {}

  def __call__(self, a: np.ndarray) -> np.ndarray:
    if a.dtype != ml_dtypes.bfloat16:
      return a
    key = (a.__array_interface__["data"][0], a.shape, a.strides)
    if key not in self._done:
      self._done[key] = a.astype(np.float32)
      self._done[key].flags.writeable = False
    return self._done[key]


def _is_torchscript(path: str) -> bool:
  try:
    if not zipfile.is_zipfile(path):
      return False
    with zipfile.ZipFile(path) as z:
      return any(n.split("/", 1)[-1].startswith("code/") for n in z.namelist()[:200])
  except torch_pickle.READ_ERRORS:
    return False   # the torch reader reports the damaged file


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
