"""A feature-cache entry may only name files inside its own folder: a `meta.json` naming an
absolute path, a `../` path or a link out of the folder is a damaged entry, refused before that
file is read, so its warning says nothing of the file (issue 34, item 9)."""
import json
import os

import numpy as np
import pytest

from fi_jax.extract import cache, own_features


def _entry_naming(tmp_path, name_of):
  """A valid entry whose manifest then names, for `features`, `name_of(secret file)`; the
  secret is a real array with the manifest's dtype, shape and checksum (only the path is
  wrong), so that nothing but the path check can refuse it."""
  secret = np.arange(12, dtype=np.float32).reshape(3, 4) * 7
  secret_file = tmp_path / "outside" / "secret.npy"
  secret_file.parent.mkdir()
  np.save(secret_file, secret)
  path = str(tmp_path / "cache" / "entry")
  cache.save(path, {"features": np.zeros((3, 4), np.float32),
                    "logits": np.zeros((3, 2), np.float32)}, {"set": "id_test"})
  meta_file = os.path.join(path, cache.MANIFEST)
  meta = json.load(open(meta_file))
  meta["files"]["features"] = {"file": name_of(path, str(secret_file)), "dtype": "float32",
                               "shape": [3, 4], "sha256": cache.checksum(secret)}
  json.dump(meta, open(meta_file, "w"))
  return path


def _relative(path, secret):
  return os.path.relpath(secret, path)            # ../../outside/secret.npy


def _absolute(path, secret):
  return secret


def _link(path, secret):
  os.symlink(secret, os.path.join(path, "features.link.npy"))
  return "features.link.npy"


@pytest.mark.parametrize("name_of", [_relative, _absolute, _link])
def test_manifest_naming_a_file_outside_is_a_damaged_entry(tmp_path, name_of):
  path = _entry_naming(tmp_path, name_of)
  logs = []
  assert cache.load(path, log=logs.append) is None
  (line,) = logs
  assert "not a file of the entry's own folder" in line and "recomputing" in line
  assert "float32" not in line and "(3, 4)" not in line and "[3, 4]" not in line


@pytest.mark.parametrize("name_of", [_relative, _absolute])
def test_features_source_refuses_such_an_entry(tmp_path, name_of):
  path = _entry_naming(tmp_path, name_of)
  with pytest.raises(ValueError, match="damaged fi_jax cache entry"):
    own_features.load_set("id_test", {"source": "features", "path": path})


def test_plain_entries_still_load(tmp_path):
  path = str(tmp_path / "entry")
  arrays = {"features": np.ones((3, 4), np.float32), "score/odin": np.arange(3.0)}
  cache.save(path, arrays)
  got = cache.load(path, log=pytest.fail)
  assert sorted(got) == sorted(arrays) and np.array_equal(got["score/odin"], np.arange(3.0))
