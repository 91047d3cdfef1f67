"""Hostile feature files (`source="features"`) become one named error, never a traceback or a
silent change of the data: damaged archives, headers that claim more data than there is,
values that are not real numbers or not whole-number ids, empty sets (issue 34, items 6-8).
Every file is written by the test. The errors are `own_features.FeatureFileError`, a
ValueError (what the CLI prints as one line, exit 2)."""
import io
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from fi_jax.extract import own_features

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RNG = np.random.default_rng(0)


def _arrays(n=12, d=4, c=3, **over):
  a = {"features": RNG.normal(size=(n, d)).astype(np.float32),
       "logits": RNG.normal(size=(n, c)).astype(np.float32),
       "label": np.arange(n) % c}
  a.update(over)
  return a


def _npz(path, **arrays):
  np.savez(path, **arrays)
  return str(path)


def _load(path):
  return own_features.load_set("id_test", {"source": "features", "path": str(path)})


def _npy_bytes(header: dict, data: bytes) -> bytes:
  """A .npy file with the header `header` (descr, fortran_order, shape) over `data`."""
  buf = io.BytesIO()
  np.lib.format.write_array_header_1_0(buf, header)   # the magic string, then the header
  return buf.getvalue() + data


def test_clean_npz_reads_back(tmp_path):
  a = _arrays()
  got = _load(_npz(tmp_path / "s.npz", **a))
  for k in ("features", "logits"):
    assert got[k].dtype == a[k].dtype and np.array_equal(got[k], a[k])
  assert got["label"].dtype == np.int64 and np.array_equal(got["label"], a["label"])
  assert np.array_equal(got["group"], np.full(12, -1))
  np.savez_compressed(tmp_path / "c.npz", **a)
  assert np.array_equal(_load(tmp_path / "c.npz")["features"], a["features"])


def test_truncated_npz(tmp_path):
  path = _npz(tmp_path / "s.npz", **_arrays())
  raw = open(path, "rb").read()
  open(path, "wb").write(raw[:len(raw) // 2])
  with pytest.raises(ValueError, match=r"s\.npz: not a readable \.npz archive .*truncated"):
    _load(path)


def test_crc_damaged_npz(tmp_path):
  a = _arrays()
  path = _npz(tmp_path / "s.npz", **a)
  raw = bytearray(open(path, "rb").read())
  at = bytes(raw).index(a["features"].tobytes()) + 7   # a byte inside the features' data
  raw[at] ^= 0xFF
  open(path, "wb").write(bytes(raw))
  with pytest.raises(ValueError, match=r"s\.npz, array 'features': .*"
                     r"\(BadZipFile: Bad CRC-32 for file 'features.npy'\).*damaged"):
    _load(path)


def test_garbage_npz_is_not_a_pickle_hint(tmp_path):
  path = tmp_path / "s.npz"
  path.write_bytes(b"\x80\x04garbage, not an archive" * 10)
  with pytest.raises(ValueError, match=r"not a readable \.npz archive") as e:
    _load(path)
  assert "pickle" not in str(e.value)


def test_header_claiming_512_gib_is_refused_unread(tmp_path):
  header = {"descr": "<f4", "fortran_order": False, "shape": (1 << 37, 1)}   # 512 GiB
  data = np.ones(8, np.float32).tobytes()
  folder = tmp_path / "folder"
  folder.mkdir()
  (folder / "features.npy").write_bytes(_npy_bytes(header, data))
  np.save(folder / "logits.npy", np.ones((2, 3), np.float32))
  with pytest.raises(ValueError, match=r"features\.npy: its header says <f4 "
                     r"\[137438953472, 1\] \(549755813888 bytes of data\) but the file holds 32"):
    _load(folder)
  with zipfile.ZipFile(tmp_path / "s.npz", "w") as z:   # the same member inside an npz
    z.writestr("features.npy", _npy_bytes(header, data))
  with pytest.raises(ValueError, match=r"s\.npz, array 'features': its header says"):
    _load(tmp_path / "s.npz")


def test_object_array_header_is_refused(tmp_path):
  folder = tmp_path / "folder"
  folder.mkdir()
  (folder / "features.npy").write_bytes(
      _npy_bytes({"descr": "|O", "fortran_order": False, "shape": (2, 2)}, b"\x80\x04N."))
  with pytest.raises(ValueError, match=r"Python objects"):
    _load(folder)


@pytest.mark.parametrize("key, value, msg", [
    ("logits", np.array([["a", "b", "c"]] * 12), r"logits holds text \(dtype <U1\); it must "
     r"hold real numbers"),
    ("features", np.ones((12, 4), np.complex64) * (1 + 2j), r"features holds complex numbers "
     r"\(dtype complex64\).*real part"),
    ("label", np.full(12, 0.7), r"label holds 0\.7 at row 0, not a whole number"),
    ("group", np.r_[np.zeros(11), 2.5], r"group holds 2\.5 at row 11, not a whole number"),
    ("label", np.r_[np.zeros(11), np.nan], r"label holds nan at row 11"),
    ("label", np.full(12, -3), r"label holds -3 at row 0; ids are >= 0"),
    ("label", np.array(["x"] * 12), r"label holds text"),
    ("label", np.zeros((12, 1), int), r"label must be \[N\]"),
])
def test_values_that_are_not_what_they_claim(tmp_path, key, value, msg):
  with pytest.raises(ValueError, match=msg):
    _load(_npz(tmp_path / "s.npz", **_arrays(**{key: value})))


def test_whole_number_float_ids_are_accepted(tmp_path):
  got = _load(_npz(tmp_path / "s.npz", **_arrays(label=np.arange(12.0) % 3,
                                                 group=np.full(12, -1.0))))
  assert got["label"].dtype == np.int64 and np.array_equal(got["label"], np.arange(12) % 3)
  assert np.array_equal(got["group"], np.full(12, -1))


def test_empty_set(tmp_path):
  with pytest.raises(ValueError, match=r"id_test \(.*s\.npz\): the set is empty "
                     r"\(features of shape \(0, 4\)\)"):
    _load(_npz(tmp_path / "s.npz", **_arrays(n=0)))


def test_sets_of_different_models(tmp_path):
  specs = {"id_fit": {"source": "features", "path": _npz(tmp_path / "a.npz", **_arrays())},
           "id_test": {"source": "features", "path": _npz(tmp_path / "b.npz", **_arrays(d=5))}}
  with pytest.raises(ValueError, match=r"disagree .*id_fit 4 x 3, id_test 5 x 3"):
    own_features.load_sets(specs)


def test_cli_damaged_features_file_is_one_line(tmp_path):
  feats = tmp_path / "feats"
  feats.mkdir()
  for name in ("id_fit", "id_test", "far"):
    _npz(feats / f"{name}.npz", **_arrays())
  raw = open(feats / "id_test.npz", "rb").read()
  open(feats / "id_test.npz", "wb").write(raw[:100])
  res = subprocess.run(
      [sys.executable, os.path.join(ROOT, "main.py"), f"--config=configs/features.py:dir={feats}",
       f"--workdir={tmp_path}/w", "--config.compilation_cache_dir="],
      cwd=ROOT, capture_output=True, text=True, timeout=600,
      env={**os.environ, "PYTHONUNBUFFERED": "1"})
  assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
  last = res.stderr.strip().splitlines()[-1]
  assert last.startswith("main.py: error: ") and "id_test.npz: not a readable .npz" in last
