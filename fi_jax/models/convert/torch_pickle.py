"""PyTorch checkpoint files (`torch.save`: .pth / .pt / .bin) read without torch.

A torch file is a pickle whose tensors point at raw storages: in a zip archive
(`<name>/data.pkl` + `<name>/data/<key>`, the default since torch 1.6) or, in the legacy format,
appended after the pickle. Like `torch.load(weights_only=True)`, the pickle is read by a small
pickle machine of its own that knows only the opcodes torch's weights-only unpickler knows and
only resolves an allow-list of globals (tensor rebuilders, storage types and dtypes,
OrderedDict); anything else is refused before it can run. Tensors become numpy arrays (bfloat16
as `ml_dtypes.bfloat16`); nested dicts, lists, tuples and scalars are kept.

The file is untrusted input; reading it cannot be turned against the host:

* Tensors: every tensor's (offset, size, stride) is checked against its storage as torch checks
  it, with Python ints (no overflow): offset, sizes and strides are non-negative ints
  (not bools) below 2**63, as many strides as sizes, at most `MAX_DIMS` dimensions, and for a
  tensor with elements the furthest one, offset + sum((size_i - 1) * stride_i), lies inside the
  storage (counted in the tensor's dtype). A tensor without elements may have any offset.
* Views, never copies: each storage is one read-only numpy array of its bytes, and every
  tensor is a read-only `np.lib.stride_tricks.as_strided` view of it (through a view of those
  bytes as the tensor's dtype). Tensors sharing a storage share memory
  (one storage referenced a thousand times is held once); a stride-0 (expanded) tensor stays a
  view. The logical bytes of all tensors together (elements x itemsize, as a consumer that
  copies each would need) are bounded by `MAX_VIEW_FACTOR` x the storages' bytes +
  `VIEW_SLACK_BYTES`, checked before any storage is read.
* The pickle: at most `MAX_OBJECTS` objects created and `MAX_OPS` opcodes, MARK and tuple
  nesting at most `MAX_DEPTH` deep, memo indices in a dict (no table sized by the file). The
  loaded object is then checked as a tree: at most `MAX_DEPTH` levels and `MAX_OBJECTS` nodes
  counting a shared container once per reference (so a small pickle of nested shared lists,
  whose tree is exponentially large, is refused at once; anything walking the result stays
  bounded). Shared containers and tensors stay shared in the result, as torch.load keeps them.
* The zip: a file is a zip when it starts with a local file header (torch's test). Every
  entry of the central directory passes the checks torch's zip reader (miniz) makes on opening
  (consistent sizes, data inside the file, one disk, no masked header), and the records torch
  reads besides the tensors are read and checked as torch checks them (format version 1-10,
  byte order 'little', an int storage alignment, a UTF-8 serialization id), so a damaged
  archive is refused even where the damage lies outside what a state dict needs. Members read
  are stored or deflated, not encrypted; a storage member must be exactly the bytes its pickle
  declares (numel x element size, as torch requires), data.pkl at most `PICKLE_INFLATION` x the
  zip's size (and 1 MiB at least). Members are streamed into a buffer of the declared size,
  chunk by chunk: one that would inflate beyond it is refused, and a declared size beyond what
  the member's compressed bytes could produce is refused before anything is allocated.
* The legacy format: every storage's bytes follow the pickles, each announced by its element
  count, which must match the declaration; no read is larger than what the file has left.

Every failure, of whatever kind (a refused global, a bounds violation, a truncated zip, a
decompression error, a limit), is one `UnsupportedContent` (a `CheckpointError`) that names the
file and says why; no other exception leaves `load` (bar KeyboardInterrupt and the like).
"""
from __future__ import annotations

import collections
import io
import os
import pickle
import pickletools
import re
import reprlib
import struct
import zipfile
import zlib
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from fi_jax.models._checkpoints import CheckpointError

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
_LEGACY_PROTOCOL = 1001

MAX_OBJECTS = 1_000_000        # objects the pickle creates; nodes of the loaded tree
MAX_OPS = 4 * MAX_OBJECTS      # opcodes executed
MAX_DEPTH = 100                # MARK / tuple nesting; depth of the loaded tree
MAX_DIMS = 32                  # dimensions of one tensor (numpy's portable maximum)
MAX_VIEW_FACTOR = 1024         # all tensors' logical bytes <= this x the storages' bytes ...
VIEW_SLACK_BYTES = 64 << 20    # ... + this
PICKLE_INFLATION = 16          # data.pkl may inflate to this x the zip file's size (>= 1 MiB)
_DEFLATE_MAX_RATIO = 1032      # deflate cannot inflate more than this (RFC 1951: 258 / 2 bits)
_CHUNK = 1 << 20               # bytes read from a member or file at a time
_INT64_MAX = 2**63 - 1
_FLOATING = {np.dtype(t) for t in (np.float16, np.float32, np.float64, ml_dtypes.bfloat16)}
# zip general-purpose flag bits
_ENCRYPTED, _STRONG_ENCRYPTION, _PATCHED, _MASKED_HEADER = 0x1, 0x40, 0x20, 0x2000
_RECORD_BYTES = 4096           # version, byteorder and the like
_MIN_VERSION, _MAX_VERSION = 1, 10   # the zip format versions torch reads

_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxstring, _repr.maxother = 3, 60, 60


class UnsupportedContent(CheckpointError):
  """A file this reader refuses: content beyond tensors, containers and scalars, or a damaged,
  truncated or hostile file. `reason` says why; `path` is the file (set by `load`, whose
  message then names it)."""

  def __init__(self, reason: str, path: str | None = None):
    super().__init__(reason if path is None else f"{path!r}: {reason}")
    self.reason, self.path = reason, path


# what reading a hostile file can raise below `load`, each turned into UnsupportedContent
READ_ERRORS = (OSError, EOFError, ValueError, ArithmeticError, LookupError, TypeError,
                AttributeError, RuntimeError, MemoryError, struct.error, zlib.error,
                zipfile.BadZipFile, zipfile.LargeZipFile, pickle.UnpicklingError)


# ----------------------------------------------------------------------------- storages, tensors

class _Storage:
  """One storage: `nbytes` declared by the pickle (numel x the element size of its type), its
  bytes filled in after the pickle is read (`array`: read-only uint8), typed views made once."""

  def __init__(self, key: str, dtype: np.dtype, numel: int):
    self.key, self.dtype, self.numel = key, dtype, numel
    self.nbytes = numel * dtype.itemsize
    self.array: np.ndarray | None = None
    self._typed: dict[np.dtype, np.ndarray] = {}

  def fill(self, buffer) -> None:
    array = np.frombuffer(buffer, np.uint8)
    array.flags.writeable = False
    self.array = array

  def typed(self, dtype: np.dtype) -> np.ndarray:
    """The storage's bytes as a flat read-only array of `dtype` (a view, made once)."""
    if dtype not in self._typed:
      n = self.nbytes - self.nbytes % dtype.itemsize
      self._typed[dtype] = self.array[:n].view(dtype)
    return self._typed[dtype]


class _Pending:
  """A tensor (offset, size, stride in elements of `dtype`) of a storage whose bytes arrive
  after the pickle. Constructed only by `_tensor`, which checks the types and signs."""
  __slots__ = ("dtype", "offset", "size", "storage", "stride")

  def __init__(self, storage, offset, size, stride, dtype):
    self.storage, self.offset, self.size, self.stride, self.dtype = (
        storage, offset, size, stride, dtype)

  def numel(self) -> int:
    n = 1
    for d in self.size:
      n *= d
    return n

  def check_bounds(self) -> None:
    """torch's check: the furthest element of a tensor with elements inside the storage."""
    if self.numel() == 0:
      return
    last = self.offset + sum((n - 1) * s for n, s in zip(self.size, self.stride))
    have = self.storage.nbytes // self.dtype.itemsize
    if last >= have:
      raise UnsupportedContent(
          f"a tensor of shape {self.size}, strides {self.stride} and offset {self.offset} "
          f"reaches element {last} of a storage of {have} {self.dtype} elements: the file is "
          f"truncated or corrupt")

  def value(self) -> np.ndarray:
    """A read-only view of the storage (never a copy)."""
    item = self.dtype.itemsize
    if self.numel() == 0:
      flat = self.storage.typed(self.dtype)[:0]
      return np.lib.stride_tricks.as_strided(flat, self.size, (0,) * len(self.size),
                                             writeable=False)
    flat = self.storage.typed(self.dtype)[self.offset:]
    strides = tuple(s * item if n > 1 else 0 for n, s in zip(self.size, self.stride))
    return np.lib.stride_tricks.as_strided(flat, self.size, strides, writeable=False)


def _index(x: Any, what: str) -> int:
  if type(x) is not int or not 0 <= x <= _INT64_MAX:
    raise UnsupportedContent(f"a tensor's {what} is {_repr.repr(x)}, not an int in [0, 2**63)")
  return x


def _tensor(storage, offset, size, stride, requires_grad, metadata, dtype) -> _Pending:
  """A checked tensor reference (bounds are checked once every storage is declared)."""
  if not isinstance(storage, _Storage):
    raise UnsupportedContent(f"a tensor's storage is a {type(storage).__name__}, not a storage")
  if type(size) not in (tuple, list) or type(stride) not in (tuple, list):
    raise UnsupportedContent("a tensor's size or stride is not a tuple")
  if len(size) != len(stride) or len(size) > MAX_DIMS:
    raise UnsupportedContent(f"a tensor has {len(size)} sizes and {len(stride)} strides "
                             f"(equal numbers, at most {MAX_DIMS}, are readable)")
  offset = _index(offset, "storage offset")
  size = tuple(_index(n, "size") for n in size)
  stride = tuple(_index(s, "stride") for s in stride)
  extent = dtype.itemsize
  for n in size:
    extent *= max(n, 1)
  if extent > _INT64_MAX:
    raise UnsupportedContent(f"a tensor's shape {size} is too large for an array")
  if type(requires_grad) is not bool or (requires_grad and dtype not in _FLOATING):
    raise UnsupportedContent(f"a tensor of {dtype} has requires_grad={_repr.repr(requires_grad)} "
                             "(torch allows a bool, True only for floating point)")
  if metadata is not None and metadata != {}:   # torch.save writes none or a non-empty dict
    raise UnsupportedContent("tensor metadata (conjugate / negative bits) is not supported")
  return _Pending(storage, offset, size, stride, dtype)


# ----------------------------------------------------------------------------- allow-list

class _Global:
  """An allow-listed global as the pickle sees it: `value` is what it becomes in the result
  (kept from earlier versions of this reader), `kind` how REDUCE may call it."""

  def __init__(self, name: str, kind: str, value: Any = None, dtype: Any = None):
    self.name, self.kind, self.value = name, kind, value
    self.dtype = None if dtype is None else np.dtype(dtype)


_ALLOWED: dict[tuple[str, str], _Global] = {
    ("collections", "OrderedDict"): _Global("collections.OrderedDict", "ordered_dict",
                                            collections.OrderedDict),
    **{("torch._utils", n): _Global(f"torch._utils.{n}", n) for n in (
        "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_parameter",
        "_rebuild_parameter_with_state")},
    **{("torch", n): _Global(f"torch.{n}", "storage", n, dt) for n, dt in STORAGE_DTYPES.items()},
    ("torch", "UntypedStorage"): _Global("torch.UntypedStorage", "storage", "ByteStorage",
                                         np.uint8),
    **{("torch", n): _Global(f"torch.{n}", "dtype", dt, dt) for n, dt in TORCH_DTYPES.items()},
}


def _call(func: Any, args: Any, tensors: list) -> Any:
  """REDUCE: only the rebuilders and OrderedDict() are callable, with torch's signatures."""
  if not isinstance(func, _Global) or func.kind in ("storage", "dtype"):
    what = func.name if isinstance(func, _Global) else type(func).__name__
    raise UnsupportedContent(f"the pickle calls {what}, which is not a tensor rebuilder")
  if type(args) is not tuple:
    raise UnsupportedContent(f"the pickle calls {func.name} with a {type(args).__name__}")
  kind, n = func.kind, len(args)
  if kind == "ordered_dict":
    if args:
      raise UnsupportedContent("the pickle calls OrderedDict with arguments")
    return collections.OrderedDict()
  if kind == "_rebuild_tensor_v2" and n in (6, 7):
    storage = args[0]
    dtype = storage.dtype if isinstance(storage, _Storage) else np.dtype(np.uint8)
    t = _tensor(*args[:5], args[6] if n == 7 else None, dtype)
  elif kind == "_rebuild_tensor_v3" and n in (7, 8):
    dtype = args[6]
    if not (isinstance(dtype, _Global) and dtype.kind == "dtype"):
      raise UnsupportedContent(f"a tensor's dtype is {_repr.repr(dtype)}")
    t = _tensor(*args[:5], args[7] if n == 8 else None, dtype.dtype)
  elif kind in ("_rebuild_parameter", "_rebuild_parameter_with_state") and n == (
      3 if kind == "_rebuild_parameter" else 4):
    data, requires_grad = args[:2]
    if not isinstance(data, _Pending):
      raise UnsupportedContent(f"a parameter holds a {type(data).__name__}, not a tensor")
    if type(requires_grad) is not bool or (requires_grad and data.dtype not in _FLOATING):
      raise UnsupportedContent(f"a parameter of {data.dtype} has requires_grad="
                               f"{_repr.repr(requires_grad)}")
    return data
  else:
    raise UnsupportedContent(f"the pickle calls {func.name} with {n} arguments")
  tensors.append(t)
  return t


# ----------------------------------------------------------------------------- the pickle machine

class _Source:
  """Exact reads from `f`, never more than `size` bytes in all (no allocation beyond that)."""

  def __init__(self, f, size: int):
    self._f, self.left = f, size

  def read(self, n: int) -> bytes:
    if n > self.left:
      raise UnsupportedContent(f"the file ends inside a pickle (needs {n} bytes, has "
                               f"{self.left}): it is truncated or corrupt")
    data = self._f.read(n)
    if len(data) != n:
      raise UnsupportedContent("the file ends inside a pickle: it is truncated")
    self.left -= n
    return data

  def readline(self, limit: int = 1024) -> bytes:
    line = self._f.readline(min(limit, self.left))
    self.left -= len(line)
    if not line.endswith(b"\n"):
      raise UnsupportedContent("a pickle GLOBAL name is unterminated or too long")
    return line


_NAMES = {ord(code): op.name for code, op in pickletools.code2op.items()}   # byte -> opcode name
_UNPACK_I, _UNPACK_H, _UNPACK_UI, _UNPACK_D = (
    struct.Struct("<i").unpack, struct.Struct("<H").unpack, struct.Struct("<I").unpack,
    struct.Struct(">d").unpack)


def _unpickle(src: _Source, storage_of: Callable[[Any], _Storage] | None,
              tensors: list) -> Any:
  """One pickle from `src`, executed with the opcodes `torch.load(weights_only=True)` knows
  (protocol 2 and below, binary), the allow-list, and the limits (see the module docstring).
  Storages come from `storage_of` (None: no persistent ids allowed); every tensor built is
  appended to `tensors`."""
  read = src.read
  stack: list = []
  metastack: list = []
  memo: dict[int, Any] = {}
  tuple_depth: dict[int, tuple[tuple, int]] = {}   # id -> (the tuple, kept alive; its depth)
  ops = objects = 0

  def pop_mark() -> list:
    nonlocal stack
    if not metastack:
      raise UnsupportedContent("the pickle pops a MARK it never set")
    items, stack = stack, metastack.pop()
    return items

  def make_tuple(items) -> tuple:
    t = tuple(items)
    depth = 1 + max((tuple_depth.get(id(x), (None, 1))[1] for x in t if type(x) is tuple),
                    default=0)
    if depth > MAX_DEPTH:
      raise UnsupportedContent(f"the pickle nests tuples more than {MAX_DEPTH} deep")
    if depth > 1:
      tuple_depth[id(t)] = (t, depth)
    return t

  while True:
    code = read(1)[0]
    op = _NAMES.get(code)
    ops += 1
    if ops > MAX_OPS:
      raise UnsupportedContent(f"the pickle runs more than {MAX_OPS} opcodes")
    if op in _NO_OBJECT:
      if op in ("BINPUT", "LONG_BINPUT"):
        i = read(1)[0] if op == "BINPUT" else _UNPACK_UI(read(4))[0]
        memo[i] = stack[-1]
      elif op in ("BINGET", "LONG_BINGET"):
        i = read(1)[0] if op == "BINGET" else _UNPACK_UI(read(4))[0]
        if i not in memo:
          raise UnsupportedContent(f"the pickle reads memo entry {i}, which it never wrote")
        stack.append(memo[i])
      elif op == "MARK":
        if len(metastack) >= MAX_DEPTH:
          raise UnsupportedContent(f"the pickle nests MARKs more than {MAX_DEPTH} deep")
        metastack.append(stack)
        stack = []
      elif op == "SETITEM":
        value, key = stack.pop(), stack.pop()
        _dict_target(stack[-1], "SETITEM")[key] = value
      elif op == "SETITEMS":
        items = pop_mark()
        target = _dict_target(stack[-1], "SETITEMS")
        if len(items) % 2:
          raise UnsupportedContent("the pickle sets a dict item without a value")
        for i in range(0, len(items), 2):
          target[items[i]] = items[i + 1]
      elif op == "APPEND":
        item = stack.pop()
        _list_target(stack[-1]).append(item)
      elif op == "APPENDS":
        items = pop_mark()
        _list_target(stack[-1]).extend(items)
      elif op == "BUILD":
        state, inst = stack.pop(), stack[-1]
        # torch sets an OrderedDict's attributes (a state dict's `_metadata`); the result does
        # not keep them, as before
        if type(inst) is not collections.OrderedDict or type(state) is not dict:
          raise UnsupportedContent(f"the pickle sets the state of a {type(inst).__name__} "
                                   "(only an OrderedDict's attributes are allowed)")
      elif op == "PROTO":
        read(1)
      elif op == "STOP":
        if not stack:
          raise UnsupportedContent("the pickle stops with an empty stack")
        return stack.pop()
      continue
    objects += 1
    if objects > MAX_OBJECTS:
      raise UnsupportedContent(f"the pickle creates more than {MAX_OBJECTS} objects")
    if op == "BININT1":
      stack.append(read(1)[0])
    elif op == "BININT":
      stack.append(_UNPACK_I(read(4))[0])
    elif op == "BININT2":
      stack.append(_UNPACK_H(read(2))[0])
    elif op == "LONG1":
      stack.append(int.from_bytes(read(read(1)[0]), "little", signed=True))
    elif op == "BINFLOAT":
      stack.append(_UNPACK_D(read(8))[0])
    elif op == "BINUNICODE":
      stack.append(str(read(_UNPACK_UI(read(4))[0]), "utf-8", "surrogatepass"))
    elif op == "SHORT_BINSTRING":
      stack.append(read(read(1)[0]).decode("utf-8", "strict"))
    elif op == "NONE":
      stack.append(None)
    elif op in ("NEWTRUE", "NEWFALSE"):
      stack.append(op == "NEWTRUE")
    elif op == "EMPTY_DICT":
      stack.append({})
    elif op == "EMPTY_LIST":
      stack.append([])
    elif op == "EMPTY_TUPLE":
      stack.append(())
    elif op == "EMPTY_SET":
      stack.append(set())
    elif op == "TUPLE":
      items = pop_mark()
      stack.append(make_tuple(items))
    elif op in ("TUPLE1", "TUPLE2", "TUPLE3"):
      n = int(op[-1])
      if len(stack) < n:
        raise UnsupportedContent("the pickle builds a tuple from an empty stack")
      items = stack[-n:]
      del stack[-n:]
      stack.append(make_tuple(items))
    elif op == "GLOBAL":
      module = src.readline()[:-1].decode("utf-8")
      name = src.readline()[:-1].decode("utf-8")
      if (module, name) not in _ALLOWED:
        full = f"{module:.80}.{name:.80}"
        raise UnsupportedContent(
            f"it references {full if full.isprintable() else repr(full)}, which a plain weights "
            "file never needs (only tensors, dicts, lists and scalars are read)")
      stack.append(_ALLOWED[(module, name)])
    elif op == "REDUCE":
      args = stack.pop()
      stack[-1] = _call(stack[-1], args, tensors)
    elif op == "BINPERSID":
      pid = stack.pop()
      if storage_of is None:
        raise UnsupportedContent("the pickle references a storage where none can be")
      stack.append(storage_of(pid))
    else:
      raise UnsupportedContent(
          f"the pickle uses opcode {op or hex(code)}, which torch's weights-only "
          "loading does not read")


_NO_OBJECT = {"BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET", "MARK", "SETITEM", "SETITEMS",
              "APPEND", "APPENDS", "BUILD", "PROTO", "STOP"}   # opcodes that create no object


def _dict_target(x: Any, opcode: str) -> dict:
  if type(x) not in (dict, collections.OrderedDict):
    raise UnsupportedContent(f"the pickle runs {opcode} on a {type(x).__name__}, not a dict")
  return x


def _list_target(x: Any) -> list:
  if type(x) is not list:
    raise UnsupportedContent(f"the pickle appends to a {type(x).__name__}, not a list")
  return x


def _pid(pid: Any, n: int) -> tuple:
  """('storage', <storage type>, key, location, numel[, view]) with the right types."""
  if type(pid) is not tuple or len(pid) != n or pid[0] != "storage":
    raise UnsupportedContent(f"unknown persistent id {_repr.repr(pid)}")
  kind, key, location, numel = pid[1:5]
  if not (isinstance(kind, _Global) and kind.kind == "storage"):
    raise UnsupportedContent(f"unknown storage type {_repr.repr(kind)}")
  if type(key) is not str or type(location) is not str:
    raise UnsupportedContent(f"a storage key or location is not a string ({_repr.repr(pid)})")
  if type(numel) is not int or not 0 <= numel <= _INT64_MAX:
    raise UnsupportedContent(f"storage {key!r:.40} declares {_repr.repr(numel)} elements")
  return pid


# ----------------------------------------------------------------------------- after the pickle

def _check_views(tensors: list, storages: dict) -> None:
  """Every tensor inside its storage, and all of them together not much larger than the
  storages (a consumer copying each tensor stays bounded)."""
  for t in tensors:
    t.check_bounds()
  logical = sum(t.numel() * t.dtype.itemsize for t in tensors)
  stored = sum(st.nbytes for st in storages.values())
  if logical > MAX_VIEW_FACTOR * stored + VIEW_SLACK_BYTES:
    raise UnsupportedContent(
        f"its tensors view {logical} bytes of {stored} stored (more than {MAX_VIEW_FACTOR}x "
        f"+ {VIEW_SLACK_BYTES >> 20} MiB: stride-0 or repeated views built to exhaust memory)")


def _resolve(root: Any) -> Any:
  """The result: tensors -> read-only views, storages -> flat arrays, allow-listed globals ->
  their values, containers rebuilt (shared ones stay shared). Refuses a tree deeper than
  MAX_DEPTH or of more than MAX_OBJECTS nodes (each reference to a shared container counted)."""
  done: dict[int, tuple[Any, int]] = {}   # id -> (result, nodes below and including it)

  def visit(obj: Any, depth: int, key: bool) -> tuple[Any, int]:
    if depth > MAX_DEPTH:
      raise UnsupportedContent(f"it nests containers more than {MAX_DEPTH} deep (or in a cycle)")
    if obj is None or type(obj) in (bool, int, float, str):
      return obj, 1
    if id(obj) in done:
      return done[id(obj)]
    if isinstance(obj, (_Pending, _Storage)):
      if key:
        raise UnsupportedContent("a tensor or storage is used as a dict key or set element")
      out = (obj.value() if isinstance(obj, _Pending) else obj.typed(obj.dtype), 1)
    elif isinstance(obj, _Global):
      out = (obj.value if obj.value is not None else obj.name, 1)
    elif type(obj) in (dict, collections.OrderedDict):
      items, n = [], 1
      for k, v in obj.items():
        (k2, nk), (v2, nv) = visit(k, depth + 1, True), visit(v, depth + 1, False)
        items.append((k2, v2))
        n += nk + nv
        if n > MAX_OBJECTS:
          break
      out = (type(obj)(items), n)
    elif type(obj) in (list, tuple, set):
      items, n = [], 1
      for v in obj:
        v2, nv = visit(v, depth + 1, key or type(obj) is set)
        items.append(v2)
        n += nv
        if n > MAX_OBJECTS:
          break
      out = (type(obj)(items), n)
    else:
      raise UnsupportedContent(f"the pickle produced a {type(obj).__name__}")
    if out[1] > MAX_OBJECTS:
      raise UnsupportedContent(f"its object tree has more than {MAX_OBJECTS} nodes (a small "
                               "pickle of nested shared containers built to exhaust memory)")
    done[id(obj)] = out
    return out

  return visit(root, 0, False)[0]


# ----------------------------------------------------------------------------- zip format

def _check_central_directory(z: zipfile.ZipFile, file_size: int) -> None:
  """The central directory's records, walked by their own declared lengths (name, extra field,
  comment), must tile it exactly as the end record declares (miniz refuses an archive whose
  entries overrun or underrun it; Python's zipfile reads past such a mismatch). Zip64
  archives, whose end record defers to the zip64 record, are left to the per-entry checks."""
  f = z.fp
  tail = min(file_size, 22 + 0xFFFF)
  f.seek(file_size - tail)
  end = f.read(tail)
  at = end.rfind(b"PK\x05\x06")
  if at < 0 or at + 22 > len(end):
    raise UnsupportedContent("the zip end record is missing: the archive is corrupt")
  _, _, _, _, n_total, cd_size, _, _ = struct.unpack("<4s4H2LH", end[at:at + 22])
  if n_total == 0xFFFF or cd_size == 0xFFFFFFFF:
    return
  start = z.start_dir
  if start + cd_size > file_size:
    raise UnsupportedContent("the zip central directory runs past the end of the file")
  f.seek(start)
  cd = f.read(cd_size)
  pos = 0
  for _ in range(n_total):
    if cd[pos:pos + 4] != b"PK\x01\x02" or pos + 46 > len(cd):
      raise UnsupportedContent("a zip central directory record is damaged: the archive is corrupt")
    n, m, k = struct.unpack("<3H", cd[pos + 28:pos + 34])
    pos += 46 + n + m + k
  if pos != cd_size:
    raise UnsupportedContent(f"the zip central directory's records take {pos} bytes where the "
                             f"end record declares {cd_size}: the archive is corrupt")


def _check_directory(z: zipfile.ZipFile, file_size: int) -> None:
  """The checks torch's zip reader (miniz) makes on every entry when it opens an archive, so
  that a file torch refuses is refused here too, whether or not the damaged entry is read."""
  _check_central_directory(z, file_size)
  for info in z.infolist():
    name = f"zip member {info.filename!r:.80}"
    if ((info.compress_type == zipfile.ZIP_STORED and info.compress_size != info.file_size)
        or (info.file_size and not info.compress_size)):
      raise UnsupportedContent(f"{name} has inconsistent sizes: the archive is corrupt")
    if info.header_offset + 30 + info.compress_size > file_size:
      raise UnsupportedContent(f"{name} claims {info.compress_size} bytes past the end of the "
                               "file: it is truncated or corrupt")
    if info.volume not in (0, 1):
      raise UnsupportedContent(f"{name} lies on disk {info.volume} of a multi-disk archive")
    if info.flag_bits & _MASKED_HEADER:
      raise UnsupportedContent(f"{name} has an encrypted (masked) header")


def _read_member(z: zipfile.ZipFile, info: zipfile.ZipInfo, size: int, what: str) -> bytearray:
  """Exactly `size` bytes of member `info`, streamed into one buffer of that size; refused
  when the member is encrypted, not stored/deflated, declares another size, cannot produce
  `size` bytes from its compressed ones (`_check_directory` has bounded those by the file),
  or inflates beyond them."""
  name = f"zip member {info.filename!r:.80}"
  if info.flag_bits & (_ENCRYPTED | _STRONG_ENCRYPTION | _PATCHED):
    raise UnsupportedContent(f"{name} is encrypted (or a patch)")
  if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
    raise UnsupportedContent(f"{name} uses compression method {info.compress_type} (only "
                             "stored or deflated are read)")
  if info.file_size != size:
    raise UnsupportedContent(f"{name} holds {info.file_size} bytes where {what} declares {size}")
  ratio = 1 if info.compress_type == zipfile.ZIP_STORED else _DEFLATE_MAX_RATIO
  if size > ratio * info.compress_size + 64:
    raise UnsupportedContent(f"{name} declares {size} bytes, more than its "
                             f"{info.compress_size} compressed bytes can hold")
  buf = bytearray(size)
  view = memoryview(buf)
  pos = 0
  with z.open(info) as f:
    while pos < size:
      chunk = f.read(min(_CHUNK, size - pos))
      if not chunk:
        raise UnsupportedContent(f"{name} ends after {pos} of {size} bytes")
      view[pos:pos + len(chunk)] = chunk
      pos += len(chunk)
    if f.read(1):   # also where zipfile checks the CRC
      raise UnsupportedContent(f"{name} inflates beyond its {size} bytes")
  return buf


def _record(z: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
  """A small record (version, byteorder, ...), at most `_RECORD_BYTES`."""
  if info.file_size > _RECORD_BYTES:
    raise UnsupportedContent(f"its record {info.filename!r:.80} holds {info.file_size} bytes "
                             f"(at most {_RECORD_BYTES} are expected)")
  return bytes(_read_member(z, info, info.file_size, "its size"))


def _check_records(z: zipfile.ZipFile, infos: dict, root: str) -> None:
  """The records torch reads besides the tensors, checked as torch checks them: the format
  version (required, 1 to 10), the byte order ('little'; 'big' is not supported), the storage
  alignment (an int), the serialization id (UTF-8); `.format_version` is only read."""
  version = infos.get(f"{root}/.data/version") or infos.get(f"{root}/version")
  if version is None:
    raise UnsupportedContent("the zip archive has no version record (not a torch.save file)")
  m = re.match(rb"\s*\+?(\d{1,19})", _record(z, version))   # C++ stoull, as torch parses it
  if not m or not _MIN_VERSION <= int(m[1]) <= _MAX_VERSION:
    raise UnsupportedContent(f"its format version is not an integer in [{_MIN_VERSION}, "
                             f"{_MAX_VERSION}] (a file from an unknown torch, or corrupt)")
  order = infos.get(f"{root}/byteorder")
  if order is not None and _record(z, order) != b"little":   # torch byte-swaps b"big"
    raise UnsupportedContent("its byteorder record is not 'little': big-endian tensors are not "
                             "supported")
  if f"{root}/.storage_alignment" in infos:
    int(_record(z, infos[f"{root}/.storage_alignment"]))   # ValueError: refused
  if f"{root}/.data/serialization_id" in infos:
    _record(z, infos[f"{root}/.data/serialization_id"]).decode("utf-8")
  if f"{root}/.format_version" in infos:
    _record(z, infos[f"{root}/.format_version"])


def _load_zip(z: zipfile.ZipFile, file_size: int) -> Any:
  _check_directory(z, file_size)
  entries = z.infolist()
  infos = {i.filename: i for i in entries}
  root = entries[0].filename.split("/")[0] if entries else ""
  if not entries or "/" not in entries[0].filename or f"{root}/data.pkl" not in infos:
    raise UnsupportedContent("the zip archive has no <name>/data.pkl in the folder of its "
                             "first entry (not a torch.save file)")
  _check_records(z, infos, root)
  info = infos[f"{root}/data.pkl"]
  cap = max(1 << 20, PICKLE_INFLATION * file_size)
  if info.file_size > cap:
    raise UnsupportedContent(f"its data.pkl declares {info.file_size} bytes, more than this "
                             f"{file_size}-byte file can sensibly hold")
  raw = _read_member(z, info, info.file_size, "its size")
  storages: dict[str, _Storage] = {}

  def storage_of(pid):
    _, kind, key, _location, numel = _pid(pid, 5)
    if key not in storages:   # torch keeps the first declaration of a key
      storages[key] = _Storage(key, kind.dtype, numel)
    return storages[key]

  tensors: list[_Pending] = []
  obj = _unpickle(_Source(io.BytesIO(raw), len(raw)), storage_of, tensors)
  del raw
  _check_views(tensors, storages)
  for key, st in storages.items():
    member = infos.get(f"{root}/data/{key}")
    if member is None:
      raise UnsupportedContent(f"storage {key!r:.40} has no zip member data/{key:.40}")
    st.fill(_read_member(z, member, st.nbytes, f"the pickle ({st.numel} x {st.dtype})"))
  return _resolve(obj)


# ----------------------------------------------------------------------------- legacy format

def _load_legacy(f, file_size: int) -> Any:
  src = _Source(f, file_size)

  def header():   # plain ints and a dict: the same machine refuses anything else
    return _unpickle(src, None, [])

  if header() != _LEGACY_MAGIC:
    raise UnsupportedContent("not a torch.save file (no zip archive, no legacy magic number)")
  if header() != _LEGACY_PROTOCOL:
    raise UnsupportedContent("an unknown legacy torch.save protocol version")
  sys_info = header()
  if isinstance(sys_info, dict) and not sys_info.get("little_endian", True):
    raise UnsupportedContent("big-endian tensors are not supported")
  storages: dict[str, _Storage] = {}

  def storage_of(pid):
    _, kind, key, _location, numel, view = _pid(pid, 6)
    if view is not None:
      raise UnsupportedContent("legacy storage views are not supported")
    if key not in storages:
      storages[key] = _Storage(key, kind.dtype, numel)
    return storages[key]

  tensors: list[_Pending] = []
  obj = _unpickle(src, storage_of, tensors)
  keys = _unpickle(src, None, [])
  if (type(keys) is not list or any(type(k) is not str for k in keys)
      or sorted(keys) != sorted(storages)):
    raise UnsupportedContent("its list of storages does not match the storages its pickle uses")
  _check_views(tensors, storages)
  for key in keys:
    st = storages[key]
    (numel,) = struct.unpack("<q", src.read(8))
    if numel * st.dtype.itemsize != st.nbytes:
      raise UnsupportedContent(f"storage {key!r:.40} holds {numel} elements where the pickle "
                               f"declares {st.numel}")
    st.fill(src.read(st.nbytes))
  return _resolve(obj)


def load(path: str) -> Any:
  """The object `torch.save` wrote to `path`, tensors as read-only numpy views of their storages.

  Containers come back as dicts (OrderedDicts), lists, tuples and sets, scalars as Python
  scalars; a tensor is a read-only `as_strided` view of its storage's one array (it may be
  non-contiguous, stride 0, or share memory with other tensors: copy it to write to it); a bare
  storage is its flat array. Raises UnsupportedContent (a CheckpointError naming `path`) for
  any file it cannot or will not read: content beyond tensors / containers / scalars, a
  damaged or truncated file, or one built to exhaust memory or read outside a storage."""
  try:
    with open(path, "rb") as f:
      file_size = os.fstat(f.fileno()).st_size
      if f.read(4) != b"PK\x03\x04":   # torch's test: a zip starts with a local file header
        f.seek(0)
        return _load_legacy(f, file_size)
      with zipfile.ZipFile(f) as z:
        return _load_zip(z, file_size)
  except UnsupportedContent as e:
    raise UnsupportedContent(e.reason, path) from None
  except READ_ERRORS as e:
    lines = str(e).splitlines()
    why = f"{type(e).__name__}: {lines[0][:200]}" if lines else type(e).__name__
    if isinstance(e, OSError):
      raise UnsupportedContent(f"the file cannot be read ({why})", path) from None
    raise UnsupportedContent(f"the file is truncated or corrupt ({why})", path) from None
