"""Your own features: sets read from arrays extracted elsewhere (e.g. by a PyTorch model).

A set spec `dict(source="features", path=PATH, prefix="")` reads the set's arrays from

  * a folder of .npy files: features.npy [N, D], logits.npy [N, C], label.npy [N] (ID class,
    -1 = unknown / OOD), group.npy [N] (OOD class id for per-class metrics, -1 = none);
  * an entry of fi_jax's own feature cache (`<workdir>/cache/<model key>/<set>-<key>`: a folder
    with a checksummed `meta.json` manifest), read through `fi_jax.extract.cache` (checksums verified);
  * one .npz or .safetensors file with those keys, each optionally behind `prefix` (one file
    holding every set: prefix="id_fit/" reads "id_fit/features", ...).

`features` is required; `logits` too unless the head is given (then logits = features @ w + b);
`label` and `group` default to -1. The classifier head `Head(w [D, C], b [C])`, which some
detectors need (ViM, ReAct, ...), comes from `config.head`: a .npz / .safetensors file with keys
`w` and `b`, or the folder of .npy files w.npy and b.npy.

Files are read without pickle, and every .npy header (a file's or an npz member's) is checked
against the bytes really there before memory is given to the data. A file or array that cannot
be used is one `FeatureFileError` (a ValueError) naming the set, the file and the array: an
archive that is truncated, CRC-damaged or not an npz; a header claiming more (or less) data
than the file holds; Python objects; features or logits that are not real numbers (text,
complex); label or group values that are not whole numbers or are below -1 (whole-number floats
are taken as ids); an empty set; sets of different feature dimension or class count.
"""
from __future__ import annotations

import math
import os
import struct
import zipfile
import zlib
from typing import IO, Mapping, Optional

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from fi_jax.common import columns as columns_lib
from fi_jax.common import outputs
from fi_jax.extract import cache
from fi_jax.models.convert import readers

_KEYS = columns_lib.FILE_KEYS
_RESAVE = "save the arrays again (np.savez, np.save or safetensors)"
# what zipfile / zlib / numpy's header parser raise on a truncated, damaged or foreign file
_READ_ERRORS = (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error, struct.error,
                KeyError, SyntaxError, TypeError, NotImplementedError)
_ZIP_KINDS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)   # what np.savez(_compressed) writes
_DEFLATE_MAX_RATIO = 1032                                 # deflate expands by at most this
_KINDS = {"c": "complex numbers", "U": "text", "S": "bytes", "b": "booleans",
          "O": "Python objects", "V": "raw records", "M": "dates", "m": "time spans"}


class FeatureFileError(ValueError):
  """A features file (or one of its arrays) that cannot be used: one line naming the file,
  the array and what to do."""


def is_features_spec(spec: Mapping) -> bool:
  return dict(spec).get("source") == "features"


def _first_line(e: BaseException) -> str:
  lines = str(e).strip().splitlines()
  return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__


def _read_npy(f: IO[bytes], size: int, where: str) -> np.ndarray:
  """The array of the .npy stream `f` of `size` bytes (a file or an npz member).

  The header is checked against the bytes the stream holds before any memory is given to the
  data: a header that claims more (or less) data than there is, or Python objects, is refused
  without reading on. The stream must end with the data (an npz member's CRC is checked
  there)."""
  try:
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
      shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    elif version == (2, 0):
      shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    else:
      raise ValueError(f"unsupported .npy format version {version}")
  except _READ_ERRORS as e:
    raise FeatureFileError(f"{where}: not a readable .npy array ({_first_line(e)}); the file "
                           f"is truncated or damaged, or not an array numpy wrote: {_RESAVE}."
                           ) from None
  if dtype.hasobject:
    raise FeatureFileError(f"{where}: the array holds Python objects (dtype {dtype}), which "
                           "only pickle can read (never used here); save numeric arrays.")
  count = math.prod(shape)
  nbytes = count * dtype.itemsize
  have = size - f.tell()
  if nbytes != have:
    raise FeatureFileError(f"{where}: its header says {dtype.str} {list(shape)} ({nbytes} "
                           f"bytes of data) but the file holds {have}; it is truncated or "
                           f"damaged: {_RESAVE}.")
  try:
    a = np.empty(count, dtype)
  except (MemoryError, ValueError) as e:
    raise FeatureFileError(f"{where}: {dtype.str} {list(shape)} needs {nbytes} bytes of "
                           f"memory, more than this machine gives ({_first_line(e)}).") from None
  view, pos = memoryview(a.view(np.uint8)) if nbytes else memoryview(b""), 0
  try:
    while pos < nbytes:
      got = f.readinto(view[pos:])
      if not got:
        break
      pos += got
    if pos != nbytes or f.read(1):
      raise EOFError(f"{pos} of {nbytes} bytes of data")
  except _READ_ERRORS as e:
    raise FeatureFileError(f"{where}: the data does not read back ({_first_line(e)}); the "
                           f"file is truncated or damaged: {_RESAVE}.") from None
  return a.reshape(shape[::-1]).T if fortran else a.reshape(shape)


def _read_npz(path: str, keys, prefix: str) -> dict[str, np.ndarray]:
  """{key: array} of the members `prefix + key + '.npy'` of the npz archive at `path`."""
  try:
    with zipfile.ZipFile(path) as z:
      members = {i.filename: i for i in z.infolist()}
      out = {}
      for k in keys:
        info = members.get(prefix + k + ".npy")
        if info is None:
          continue
        where = f"{path}, array {prefix + k!r}"
        if info.compress_type not in _ZIP_KINDS or info.file_size > (
            _DEFLATE_MAX_RATIO * info.compress_size + 1024):
          raise FeatureFileError(f"{where}: a zip member that np.savez does not write "
                                 f"(compression {info.compress_type}, {info.compress_size} "
                                 f"bytes claiming {info.file_size}): {_RESAVE}.")
        with z.open(info) as f:
          out[k] = _read_npy(f, info.file_size, where)
      return out
  except FeatureFileError:
    raise
  except _READ_ERRORS as e:
    raise FeatureFileError(f"{path}: not a readable .npz archive ({_first_line(e)}); it is "
                           f"truncated, damaged or not an npz: {_RESAVE}.") from None


def _read_npy_file(file: str) -> np.ndarray:
  with open(file, "rb") as f:
    return _read_npy(f, os.fstat(f.fileno()).st_size, file)


def _read(path: str, keys, prefix: str = "") -> dict[str, np.ndarray]:
  """{key: array} of the keys present under `prefix` at `path`."""
  if os.path.isdir(path) and os.path.exists(os.path.join(path, "meta.json")):
    arrays = cache.load(path)
    if arrays is None:
      raise FeatureFileError(f"{path} is a damaged fi_jax cache entry (see the warning above); "
                             "rerun the pipeline that wrote it.")
    return {k: arrays[prefix + k] for k in keys if prefix + k in arrays}
  if os.path.isdir(path) and cache.parts(path):   # one entry per process (multi-host run)
    arrays = cache.load_parts(path)
    if arrays is None:
      raise FeatureFileError(f"{path}: a process's part of this fi_jax cache entry is missing "
                             "or damaged (see any warning above); rerun the pipeline that "
                             "wrote it.")
    return {k: arrays[prefix + k] for k in keys if prefix + k in arrays}
  if os.path.isdir(path):
    return {k: _read_npy_file(os.path.join(path, prefix + k + ".npy"))
            for k in keys if os.path.exists(os.path.join(path, prefix + k + ".npy"))}
  if path.endswith(".npz"):
    return _read_npz(path, keys, prefix)
  if path.endswith(".safetensors"):
    arrays = readers.load_safetensors(path, _RESAVE)
    return {k: arrays[prefix + k] for k in keys if prefix + k in arrays}
  if path.endswith(".npy"):
    raise FeatureFileError(f"{path}: one .npy holds one array; give a folder of features.npy, "
                           "logits.npy, label.npy (and group.npy), or one .npz / .safetensors "
                           "file.")
  raise FeatureFileError(f"{path}: expected a folder of .npy files, a .npz or a .safetensors "
                         "file.")


def _numbers(where: str, key: str, a: np.ndarray) -> np.ndarray:
  """`a` if it holds real numbers (float, int, bfloat16); else a FeatureFileError."""
  a = readers.recover_dtype(np.asarray(a))   # numpy saves bfloat16 as |V2
  if a.dtype.kind in "fiu" or a.dtype == ml_dtypes.bfloat16:
    return a
  what = _KINDS.get(a.dtype.kind, "values that are not numbers")
  fix = ("; save the real values you mean (e.g. the real part or the magnitude)"
         if a.dtype.kind == "c" else "")
  raise FeatureFileError(f"{where}: {key} holds {what} (dtype {a.dtype}); it must hold real "
                         f"numbers (float or int){fix}.")


def _ids(where: str, key: str, a: np.ndarray) -> np.ndarray:
  """`a` [N] as int64 ids (>= 0, -1 = none); whole-number floats are accepted, anything else
  (0.7, NaN, text, ids below -1) is a FeatureFileError naming the first bad row."""
  a = np.asarray(a)
  if a.ndim != 1:
    raise FeatureFileError(f"{where}: {key} must be [N] (one id per row), got shape {a.shape}.")
  kind = a.dtype.kind
  if kind not in "fiu":
    what = _KINDS.get(kind, "values that are not numbers")
    raise FeatureFileError(f"{where}: {key} holds {what} (dtype {a.dtype}); it must hold "
                           "integer ids (-1 = none).")
  if kind == "f":
    whole = np.isfinite(a) & (np.abs(a) < 2.0 ** 53)
    whole[whole] = a[whole] == np.round(a[whole])
    if not whole.all():
      i = int(np.flatnonzero(~whole)[0])
      raise FeatureFileError(f"{where}: {key} holds {a[i].item()!r} at row {i}, not a whole "
                             f"number; {key}s are integer ids (-1 = none): save them as "
                             "integers.")
  elif kind == "u" and len(a) and a.max() > np.iinfo(np.int64).max:
    i = int(np.argmax(a))
    raise FeatureFileError(f"{where}: {key} holds {a[i]} at row {i}, beyond int64.")
  ids = a.astype(np.int64)
  if len(ids) and ids.min() < -1:
    i = int(np.argmin(ids))
    raise FeatureFileError(f"{where}: {key} holds {ids[i]} at row {i}; ids are >= 0, with -1 "
                           "for none.")
  return ids


def load_head(path: str) -> outputs.Head:
  """The classifier head (w [D, C], b [C]) from a .npz / .safetensors file or a folder."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"Head file {path} does not exist (config.head).")
  arrays = _read(path, ("w", "b"))
  if set(arrays) != {"w", "b"}:
    raise FeatureFileError(f"Head file {path} needs arrays 'w' [D, C] and 'b' [C]; it has "
                           f"{sorted(arrays)}.")
  where = f"head file {path}"
  w, b = _numbers(where, "w", arrays["w"]), _numbers(where, "b", arrays["b"])
  if w.ndim != 2 or b.shape != (w.shape[1],) or not w.size:
    raise FeatureFileError(f"Head file {path}: w must be [D, C] and b [C] (D, C >= 1); got "
                           f"{w.shape}, {b.shape}.")
  return outputs.Head(jnp.asarray(w), jnp.asarray(b))


def load_set(name: str, spec: Mapping, head: Optional[outputs.Head] = None
             ) -> dict[str, np.ndarray]:
  """The arrays {features, logits, label, group} of one features spec, checked: features
  [N, D] and logits [N, C] real numbers with N, D, C >= 1; label and group [N] integer ids
  (whole-number floats accepted), -1 = none; every array with N rows. Anything else is a
  FeatureFileError naming the set, the file and the array."""
  spec = dict(spec)
  path, prefix = spec.get("path", ""), spec.get("prefix", "")
  if not path or not os.path.exists(path):
    raise FileNotFoundError(f"{name}: feature path {path!r} does not exist.")
  arrays = _read(path, _KEYS, prefix)
  where = f"{name} ({path}{', prefix ' + repr(prefix) if prefix else ''})"
  if "features" not in arrays:
    raise FeatureFileError(f"{where}: no 'features' array [N, D].")
  f = arrays["features"] = _numbers(where, "features", arrays["features"])
  if f.ndim != 2:
    raise FeatureFileError(f"{where}: features must be [N, D], got shape {f.shape}.")
  if not f.size:
    raise FeatureFileError(f"{where}: the set is empty (features of shape {f.shape}); every "
                           "set needs at least one row and one feature.")
  n = len(f)
  if "logits" not in arrays:
    if head is None:
      raise FeatureFileError(f"{where}: no 'logits' array [N, C]; save the logits too, or give "
                             "the head (config.head) to compute them.")
    if f.shape[1] != head.w.shape[0]:
      raise FeatureFileError(f"{where}: features are {f.shape[1]}-dimensional but the head's w "
                             f"is {tuple(head.w.shape)}; give the head of the model that made "
                             "the features.")
    arrays["logits"] = np.asarray(jnp.asarray(f) @ head.w + head.b)
  logits = arrays["logits"] = _numbers(where, "logits", arrays["logits"])
  if logits.ndim != 2 or not logits.shape[-1]:
    raise FeatureFileError(f"{where}: logits must be [N, C] with C >= 1, got shape "
                           f"{logits.shape}.")
  for k in ("label", "group"):
    arrays[k] = _ids(where, k, arrays[k]) if k in arrays else np.full(n, -1, np.int64)
  for k, v in arrays.items():
    if len(v) != n:
      raise FeatureFileError(f"{where}: {k} has {len(v)} rows, features {n}.")
  return arrays


def load_sets(specs: Mapping[str, Mapping], head: Optional[outputs.Head] = None
              ) -> dict[str, dict[str, np.ndarray]]:
  """{set name: arrays} of features specs (all of them must be), every set with the feature
  dimension and number of classes of the first."""
  sets = {name: load_set(name, spec, head) for name, spec in specs.items()}
  dims = {name: (a["features"].shape[1], a["logits"].shape[1]) for name, a in sets.items()}
  if len(set(dims.values())) > 1:
    listed = ", ".join(f"{name} {d} x {c}" for name, (d, c) in dims.items())
    raise FeatureFileError(f"the feature sets disagree on (features D x classes C): {listed}; "
                           "every set must come from the same model.")
  return sets
