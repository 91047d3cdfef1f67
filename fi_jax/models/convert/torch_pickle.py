"""PyTorch checkpoint files (`torch.save`: .pth / .pt / .bin) read without torch.

A torch file is a pickle whose tensors point at raw storages: in a zip archive
(`<name>/data.pkl` + `<name>/data/<key>`, the default since torch 1.6) or, in the legacy format,
appended after the pickle. Like `torch.load(weights_only=True)`, the pickle is read with an
unpickler that only resolves an allow-list of globals (tensor rebuilders, storage types,
OrderedDict); anything else is refused before it can run. Tensors become numpy arrays (bfloat16
as `ml_dtypes.bfloat16`); nested dicts, lists and scalars are kept.
"""
from __future__ import annotations

import collections
import io
import pickle
import struct
import zipfile
from typing import Any, Callable

import ml_dtypes
import numpy as np

# storage class name in the pickle -> numpy dtype of its elements
STORAGE_DTYPES = {
    "DoubleStorage": np.float64, "FloatStorage": np.float32, "HalfStorage": np.float16,
    "BFloat16Storage": ml_dtypes.bfloat16, "LongStorage": np.int64, "IntStorage": np.int32,
    "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}
# torch.<dtype> objects (newer rebuilders pass them)
TORCH_DTYPES = {
    "float64": np.float64, "float32": np.float32, "float16": np.float16,
    "bfloat16": ml_dtypes.bfloat16, "int64": np.int64, "int32": np.int32, "int16": np.int16,
    "int8": np.int8, "uint8": np.uint8, "bool": np.bool_,
}
_LEGACY_MAGIC = 0x1950a86a20f9469cfc6c


class UnsupportedContent(ValueError):
  """The file holds something other than tensors, containers and scalars."""


class _Storage:
  """A typed storage: its elements, as a flat numpy array (filled lazily for legacy files)."""

  def __init__(self, dtype, numel: int):
    self.dtype, self.numel = np.dtype(dtype), int(numel)
    self.raw, self.array = b"", None


def _rebuild_tensor(storage: _Storage, offset: int, size, stride, *rest) -> np.ndarray:
  del rest   # requires_grad, backward hooks, metadata: nothing a state dict needs
  return _Pending(storage, int(offset), tuple(size), tuple(stride))


class _Pending:
  """A tensor whose storage bytes may arrive after the pickle (legacy files)."""

  def __init__(self, storage, offset, size, stride):
    self.storage, self.offset, self.size, self.stride = storage, offset, size, stride

  def value(self) -> np.ndarray:
    flat = self.storage.array
    if not self.size:
      return np.array(flat[self.offset])   # a 0-d array
    need = self.offset + sum((n - 1) * s for n, s in zip(self.size, self.stride)) + 1
    if min(self.size) > 0 and (need > flat.size or min(self.stride) < 0):
      raise UnsupportedContent(f"a tensor of shape {self.size} reaches past its storage "
                               f"({need} > {flat.size} elements): the file is truncated or corrupt")
    item = flat.itemsize
    view = np.lib.stride_tricks.as_strided(
        flat[self.offset:], shape=self.size, strides=[s * item for s in self.stride],
        writeable=False)
    return np.array(view)   # a copy: independent of the storage, C-contiguous


def _rebuild_tensor_v3(storage, offset, size, stride, requires_grad, hooks, dtype, *rest):
  del requires_grad, hooks, rest
  if np.dtype(dtype) != storage.dtype:
    storage.dtype = np.dtype(dtype)   # untyped storage: the tensor says what its bytes are
  return _Pending(storage, int(offset), tuple(size), tuple(stride))


def _rebuild_parameter(data, *rest):
  del rest
  return data


_ALLOWED: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    **{("torch", name): name for name in STORAGE_DTYPES},
    **{("torch", name): dt for name, dt in TORCH_DTYPES.items()},
    ("torch", "UntypedStorage"): "ByteStorage",
}


class _Unpickler(pickle.Unpickler):
  """Resolves only the allow-listed globals; storages come from `storage_of`."""

  def __init__(self, data: io.BytesIO, storage_of: Callable[[tuple], _Storage]):
    super().__init__(data)
    self._storage_of = storage_of

  def find_class(self, module: str, name: str):
    try:
      return _ALLOWED[(module, name)]
    except KeyError:
      raise UnsupportedContent(
          f"it references {module}.{name}, which a plain weights file never needs (only "
          f"tensors, dicts, lists and scalars are read)") from None

  def persistent_load(self, pid):
    if not (isinstance(pid, tuple) and pid and pid[0] == "storage"):
      raise UnsupportedContent(f"unknown persistent id {pid!r:.80}")
    return self._storage_of(pid)


def _resolve(obj: Any) -> Any:
  """Replaces pending tensors by arrays throughout containers."""
  if isinstance(obj, _Pending):
    return obj.value()
  if isinstance(obj, dict):
    return type(obj)((k, _resolve(v)) for k, v in obj.items())
  if isinstance(obj, (list, tuple)):
    return type(obj)(_resolve(v) for v in obj)
  return obj


def _storage_dtype(kind: Any) -> np.dtype:
  if kind not in STORAGE_DTYPES:
    raise UnsupportedContent(f"unknown storage type {kind!r}")
  return np.dtype(STORAGE_DTYPES[kind])


def _load_zip(z: zipfile.ZipFile) -> Any:
  names = z.namelist()
  pkl = [n for n in names if n.endswith("data.pkl") and n.count("/") == 1]
  if len(pkl) != 1:
    raise UnsupportedContent("the zip archive has no single <name>/data.pkl (not a torch.save file)")
  root = pkl[0].split("/")[0]
  byteorder = f"{root}/byteorder"
  if byteorder in names and z.read(byteorder).strip() not in (b"little", b""):
    raise UnsupportedContent("big-endian tensors are not supported")
  storages: dict[str, _Storage] = {}

  def storage_of(pid):
    _, kind, key, _location, numel = pid[:5]
    if key not in storages:
      st = storages[key] = _Storage(_storage_dtype(kind), numel)
      st.raw = z.read(f"{root}/data/{key}")
    return storages[key]

  obj = _Unpickler(io.BytesIO(z.read(pkl[0])), storage_of).load()
  for st in storages.values():   # dtype may have been fixed by a v3 rebuild: view bytes last
    st.array = np.frombuffer(st.raw, dtype=st.dtype)
  return _resolve(obj)


def _load_legacy(f: io.BufferedReader) -> Any:
  storages: dict[str, _Storage] = {}

  def header():   # plain ints and a dict: the same allow-list refuses anything else
    return _Unpickler(f, lambda pid: None).load()

  if header() != _LEGACY_MAGIC:
    raise UnsupportedContent("not a torch.save file (no zip archive, no legacy magic number)")
  header()   # protocol version
  sys_info = header()
  if isinstance(sys_info, dict) and not sys_info.get("little_endian", True):
    raise UnsupportedContent("big-endian tensors are not supported")

  def storage_of(pid):
    _, kind, key, _location, numel = pid[:5]
    if len(pid) > 5 and pid[5] is not None:
      raise UnsupportedContent("legacy storage views are not supported")
    if key not in storages:
      storages[key] = _Storage(_storage_dtype(kind), numel)
    return storages[key]

  obj = _Unpickler(f, storage_of).load()
  keys = _Unpickler(f, storage_of).load()
  for key in keys:
    st = storages[key]
    (numel,) = struct.unpack("<q", f.read(8))
    raw = f.read(numel * st.dtype.itemsize)
    if len(raw) != numel * st.dtype.itemsize:
      raise UnsupportedContent(f"storage {key} is truncated")
    st.array = np.frombuffer(raw, dtype=st.dtype)
  return _resolve(obj)


def load(path: str) -> Any:
  """The object `torch.save` wrote to `path`, tensors as numpy arrays.

  Raises UnsupportedContent (content beyond tensors/containers/scalars, or a damaged file),
  and whatever zipfile / pickle raise on a truncated file."""
  if zipfile.is_zipfile(path):
    with zipfile.ZipFile(path) as z:
      return _load_zip(z)
  with open(path, "rb") as f:
    return _load_legacy(f)
