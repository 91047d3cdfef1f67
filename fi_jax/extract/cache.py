"""On-disk cache of what a model produced for one set (features, logits, labels, ...).

Extraction is the expensive stage, so each finished set (and, while a big set is extracted,
each finished shard of it) is written at once and reused by later runs with the same key: a
crash in a detector, a changed metric or a killed run never costs those forward passes again.
In a run with several processes each process writes the rows it extracted as its own entry
(`part`: `<entry>/process-<i>-of-<n>`, with the rows' `_id`s), so no process ever holds or
writes more than its share; process 0 reads them all for the detectors.

An entry is a folder holding plain `.npy` arrays (loaded with allow_pickle=False) and a
manifest, `meta.json`, that names each array's file with its dtype, shape and SHA-256. The
files a manifest names must lie in the entry's own folder: a manifest naming an absolute path,
a `../` path or a link out of the folder is a damaged entry, refused before that file is read.
Writes are safe with concurrent writers and readers: arrays go to files with unique names,
then the manifest is replaced atomically (`os.replace`), so a reader sees either the old
entry or the new one, never half of one. `load` verifies every checksum; a missing, truncated
or corrupt entry is logged (path and reason) and reported as absent, so it is recomputed.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import uuid
from typing import Any, Callable, Optional

import numpy as np

MANIFEST = "meta.json"
FORMAT = 2              # manifests without this version (older fi_jax) are recomputed
_GRACE_S = 120          # unreferenced files younger than this may belong to a reader or writer
_TMP_MAX_AGE_S = 86400  # a writer's temporary files older than this are left over from a crash


def key_of(*parts: Any) -> str:
  """A short stable hash of JSON-able parts (model config, pp, set spec, ...)."""
  blob = json.dumps(parts, sort_keys=True, default=str).encode()
  return hashlib.sha256(blob).hexdigest()[:16]


def set_dir(root: str, model_key: str, set_name: str) -> str:
  return os.path.join(root, model_key, set_name.replace("/", "_"))


def part(path: str, process_index: int, process_count: int) -> str:
  """The entry of one process's rows of the entry `path` in a run with several processes
  (each writes its own: `path/process-00001-of-00002`); `path` itself with one process."""
  if process_count == 1:
    return path
  return os.path.join(path, f"process-{process_index:05d}-of-{process_count:05d}")


def _warn(msg: str) -> None:
  print(f"WARNING: {msg}", flush=True)


def parts(path: str) -> list[str]:
  """The per-process entries under `path` written by one run with several processes (those of
  the largest process count there), in process order; [] when there are none."""
  found = {}
  try:
    names = os.listdir(path)
  except OSError:
    return []
  for n in names:
    m = re.fullmatch(r"process-(\d{5})-of-(\d{5})", n)
    if m:
      found.setdefault(int(m.group(2)), {})[int(m.group(1))] = os.path.join(path, n)
  if not found:
    return []
  count = max(found)
  return [found[count][i] for i in sorted(found[count])]


def load_parts(path: str, *, log: Callable[[str], None] = _warn,
               ) -> Optional[dict[str, np.ndarray]]:
  """The whole set saved at `path` by a run with several processes: every process's rows
  put into set order by their `_id` (which is dropped); None when a part is missing/damaged."""
  files = parts(path)
  count = int(files[-1][-5:]) if files else 0
  if not files or len(files) != count:
    return None
  arrays = [load(f, log=log) for f in files]
  if any(a is None for a in arrays):
    return None
  out = {k: np.concatenate([a[k] for a in arrays]) for k in arrays[0]}
  order = np.argsort(out.pop("_id"), kind="stable")
  return {k: v[order] for k, v in out.items()}


def checksum(a: np.ndarray) -> str:
  """SHA-256 of an array's data (C order); dtype and shape are checked separately."""
  a = np.ascontiguousarray(a)
  return hashlib.sha256(memoryview(a.reshape(-1).view(np.uint8))).hexdigest()


def _read_manifest(path: str) -> dict:
  with open(os.path.join(path, MANIFEST), encoding="utf-8") as f:
    meta = json.load(f)
  if not isinstance(meta, dict) or meta.get("format") != FORMAT or not isinstance(
      meta.get("files"), dict):
    raise ValueError("not a manifest of this fi_jax version (no checksums)")
  return meta


def _inside(path: str, name: Any) -> str:
  """The file `name` of the entry at `path`: a plain file name in the entry's own folder (no
  folder part, no '..', not absolute, not a link leading out of it), else a ValueError. Checked
  before the file is touched, so that a crafted manifest reveals nothing about other files."""
  ok = (isinstance(name, str) and name not in ("", ".", "..") and "\0" not in name
        and os.path.basename(name) == name and not os.path.isabs(name)
        and (os.altsep is None or os.altsep not in name))
  if ok:
    folder = os.path.realpath(path)
    file = os.path.realpath(os.path.join(folder, name))
    ok = os.path.dirname(file) == folder
  if not ok:
    raise ValueError(f"{MANIFEST} names {name!r}, not a file of the entry's own folder "
                     "(a cache entry may only name its own files)")
  return os.path.join(path, name)


def _load_array(path: str, key: str, entry: dict) -> np.ndarray:
  file = _inside(path, entry["file"])
  try:
    a = np.load(file, allow_pickle=False)
  except FileNotFoundError:
    raise
  except Exception as e:  # truncated / garbled .npy
    raise ValueError(f"{file}: unreadable ({type(e).__name__}: {e})") from None
  if str(a.dtype) != entry["dtype"] or list(a.shape) != entry["shape"]:
    raise ValueError(f"{file}: {a.dtype}{list(a.shape)} instead of "
                     f"{entry['dtype']}{entry['shape']} (truncated or overwritten)")
  if checksum(a) != entry["sha256"]:
    raise ValueError(f"{file}: checksum mismatch (the file was modified or corrupted)")
  del key
  return a


def load(path: str, *, log: Callable[[str], None] = _warn,
         ) -> Optional[dict[str, np.ndarray]]:
  """The arrays saved at `path`, or None when no complete, intact entry is there.

  A damaged entry (unreadable manifest, missing or truncated array, checksum mismatch) is
  logged with its path and the reason and reported as None, so that the caller recomputes it.
  """
  if not os.path.exists(os.path.join(path, MANIFEST)):
    if _orphans(path):   # (newer arrays without a manifest: a first write in progress)
      log(f"cache entry {path}: {MANIFEST} is missing; recomputing it")
    return None
  last = None
  for _ in range(10):   # a concurrent writer may replace the entry while it is being read
    try:
      meta = _read_manifest(path)
    except FileNotFoundError:
      return None
    except (ValueError, OSError) as e:
      log(f"cache entry {path}: unreadable {MANIFEST} ({e}); recomputing it")
      return None
    if meta == last:   # the same manifest twice: a file it names really is missing
      break
    last = meta
    try:
      return {k: _load_array(path, k, e) for k, e in meta["files"].items()}
    except FileNotFoundError as e:
      missing = e.filename
      continue
    except (ValueError, KeyError, TypeError) as e:
      log(f"cache entry {path}: {e}; recomputing it")
      return None
  log(f"cache entry {path}: {missing} is missing; recomputing it")
  return None


def _orphans(path: str) -> bool:
  """Whether `path` holds arrays older than the grace period but no manifest."""
  try:
    now = time.time()
    return any(n.endswith(".npy") and not n.startswith(".tmp-")
               and now - os.path.getmtime(os.path.join(path, n)) > _GRACE_S
               for n in os.listdir(path))
  except OSError:
    return False


def _file(key: str, token: str) -> str:
  """Array keys may contain '/' (e.g. 'score/odin'); file names may not."""
  return f"{key.replace('/', '__')}.{token}.npy"


def _write(file: str, write: Callable) -> None:
  with open(file, "wb") as f:
    write(f)
    f.flush()
    os.fsync(f.fileno())


def save(path: str, arrays: dict[str, np.ndarray], meta: Optional[dict] = None) -> None:
  """Writes arrays + their manifest into `path`, replacing an older entry atomically."""
  os.makedirs(path, exist_ok=True)
  token = f"{time.time_ns():x}-{uuid.uuid4().hex[:12]}"
  files = {}
  for k, v in arrays.items():
    v = np.asarray(v)
    name = _file(k, token)
    tmp = os.path.join(path, f".tmp-{name}")
    _write(tmp, lambda f, v=v: np.save(f, v, allow_pickle=False))
    os.replace(tmp, os.path.join(path, name))
    files[k] = {"file": name, "dtype": str(v.dtype), "shape": list(v.shape),
                "sha256": checksum(v)}
  now = time.time()
  for entry in files.values():   # the grace period of these files starts now
    os.utime(os.path.join(path, entry["file"]), (now, now))
  manifest = {**(meta or {}), "format": FORMAT, "arrays": sorted(arrays), "files": files}
  tmp = os.path.join(path, f".tmp-{MANIFEST}.{token}")
  _write(tmp, lambda f: f.write(json.dumps(manifest, indent=1, default=str).encode()))
  os.replace(tmp, os.path.join(path, MANIFEST))
  _collect(path)


def _collect(path: str) -> None:
  """Removes files no manifest names any more (after a grace period: a reader that has just
  read the previous manifest, or a concurrent writer, may still need them)."""
  try:
    keep = {e["file"] for e in _read_manifest(path)["files"].values()}
  except (OSError, ValueError, KeyError, TypeError):
    return
  now = time.time()
  for name in os.listdir(path):
    file = os.path.join(path, name)
    if name in keep or name == MANIFEST or not os.path.isfile(file):
      continue
    try:
      age = now - os.path.getmtime(file)
      if age > (_TMP_MAX_AGE_S if name.startswith(".tmp-") else _GRACE_S):
        os.remove(file)
    except OSError:
      pass   # another writer removed it first


def remove(path: str) -> None:
  """Deletes an entry (or a folder of entries); a concurrent reader sees it as absent."""
  shutil.rmtree(path, ignore_errors=True)
