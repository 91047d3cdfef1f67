"""On-disk cache of what a model produced for one set (features, logits, labels, ...).

Extraction is the expensive stage, so each finished set is written at once, atomically
(a temporary folder renamed into place), and reused by later runs with the same key: a crash
in a detector or a changed metric never costs the forward passes again. Files are plain
`.npy` arrays (loaded with allow_pickle=False) plus a `meta.json`.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from typing import Any, Optional

import numpy as np


def key_of(*parts: Any) -> str:
  """A short stable hash of JSON-able parts (model config, pp, set spec, ...)."""
  blob = json.dumps(parts, sort_keys=True, default=str).encode()
  return hashlib.sha256(blob).hexdigest()[:16]


def set_dir(root: str, model_key: str, set_name: str) -> str:
  return os.path.join(root, model_key, set_name.replace("/", "_"))


def load(path: str) -> Optional[dict[str, np.ndarray]]:
  """The arrays saved at `path`, or None when nothing (complete) is there."""
  meta_file = os.path.join(path, "meta.json")
  if not os.path.exists(meta_file):
    return None
  with open(meta_file) as f:
    meta = json.load(f)
  return {k: np.load(os.path.join(path, _file(k)), allow_pickle=False) for k in meta["arrays"]}


def _file(key: str) -> str:
  """Array keys may contain '/' (e.g. 'score/odin'); file names may not."""
  return key.replace("/", "__") + ".npy"


def save(path: str, arrays: dict[str, np.ndarray], meta: Optional[dict] = None) -> None:
  """Writes arrays + meta.json into `path` atomically (replacing an older entry)."""
  parent = os.path.dirname(os.path.abspath(path))
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(dir=parent, prefix=".tmp-")
  try:
    for k, v in arrays.items():
      np.save(os.path.join(tmp, _file(k)), np.asarray(v), allow_pickle=False)
    with open(os.path.join(tmp, "meta.json"), "w") as f:
      json.dump({**(meta or {}), "arrays": sorted(arrays)}, f, indent=1, default=str)
    if os.path.exists(path):
      shutil.rmtree(path)
    os.rename(tmp, path)
  finally:
    if os.path.exists(tmp):
      shutil.rmtree(tmp)
