"""Input pipeline: per-process splits, padding masks, pp ops against numpy references."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from fi_jax.data import loader as data
from fi_jax.data import preprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _collect(spec, pp, bs, pi, pc):
  it, steps, info = data.batches(spec, preprocess.get_preprocess_fn(pp), bs,
                                 process_index=pi, process_count=pc)
  got = list(it)
  assert len(got) == steps
  return got, info


@pytest.mark.parametrize("process_count", [1, 3])
def test_processes_cover_every_example_once_with_equal_steps(process_count):
  spec = dict(source="digits", split="test", classes=range(10))
  ids, steps = [], set()
  for pi in range(process_count):
    got, info = _collect(spec, "", 64 * process_count, pi, process_count)
    steps.add(len(got))
    for b in got:
      assert b["image"].shape == (64, 8, 8, 1)
      ids.extend(b["_id"][b["_mask"]].tolist())
      assert (b["label"][~b["_mask"]] == 0).all()   # padding rows are zeros
  assert len(steps) == 1, "every process must run the same number of batches"
  assert sorted(ids) == list(range(info.num_examples))


def test_digits_labels_and_groups():
  arr = data.load_digits_split("test", (6, 7), id_classes=(0, 1, 2))
  assert set(arr["group"].tolist()) == {6, 7}
  assert (arr["label"] == -1).all()
  tr = data.load_digits_split("train", (0, 1, 2))
  te = data.load_digits_split("test", (0, 1, 2))
  assert set(tr["label"].tolist()) == {0, 1, 2}
  # train and test are disjoint and together are all images of those digits
  assert len(tr["label"]) + len(te["label"]) == len(data.load_digits_split("all", (0, 1, 2))["label"])


def test_unknown_source_is_a_clear_error():
  with pytest.raises(ValueError, match="Unknown set source 'nope'"):
    data.open_set(dict(source="nope"))
  with pytest.raises(ValueError, match="needs a 'name'"):
    data.open_set(dict(source="tfds"))


def test_missing_tfds_dataset_says_how_to_build(tmp_path):
  with pytest.raises(FileNotFoundError, match="python -m tfds_fi_imagenet build"):
    data.open_set(dict(source="tfds", name="fi_imagenet_1k", split="ood", data_dir=str(tmp_path)))


def _pp(pp, img):
  import tensorflow as tf
  return preprocess.get_preprocess_fn(pp)({"image": tf.constant(img)})["image"].numpy()


def test_pp_ops_match_numpy():
  rng = np.random.default_rng(0)
  img = rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)
  out = _pp("central_crop(20)|value_range(-1, 1)", img)
  np.testing.assert_allclose(out, img[5:25, 10:30].astype(np.float32) / 127.5 - 1, atol=1e-6)
  out = _pp("normalize((0.5, 0.4, 0.3), (0.2, 0.25, 0.3))", img)
  ref = (img / 255. - np.array([0.5, 0.4, 0.3])) / np.array([0.2, 0.25, 0.3])
  np.testing.assert_allclose(out, ref, atol=1e-5)
  assert _pp("resize_small(15)", img).shape == (15, 20, 3)
  assert _pp("resize((8, 9), method='bicubic')", img).shape == (8, 9, 3)
  assert _pp("resize(8)", img).dtype == np.uint8   # big_vision casts back to the input dtype


def test_pp_decode_roundtrip():
  import tensorflow as tf
  img = np.full((6, 7, 3), 100, np.uint8)
  enc = tf.io.encode_png(img)
  out = preprocess.get_preprocess_fn("decode")({"image": enc})["image"].numpy()
  np.testing.assert_array_equal(out, img)


@pytest.mark.parametrize("pp,msg", [
    ("nope(3)", "Unknown pp op 'nope'"),
    ("resize(", "Cannot parse pp op"),
    ("resize(x)", "arguments must be literals"),
    ("central_crop(1, 2, 3, 4)", "Bad arguments for pp op"),
])
def test_bad_pp_strings(pp, msg):
  with pytest.raises(ValueError, match=msg):
    preprocess.get_preprocess_fn(pp)


def test_digits_read_without_sklearn_equal_load_digits(monkeypatch):
  from sklearn import datasets as skd
  ref = skd.load_digits()
  data._digits.cache_clear()
  x, y = data._digits()
  np.testing.assert_array_equal(x[..., 0], ref.images)
  np.testing.assert_array_equal(y, ref.target)
  assert x.dtype == np.float32 and y.dtype == np.int64 and not x.flags.writeable
  # scikit-learn's file elsewhere (another layout): its load_digits, the same arrays
  data._digits.cache_clear()
  monkeypatch.setattr(data.importlib.util, "find_spec", lambda name: None)
  try:
    x2, y2 = data._digits()
  finally:
    data._digits.cache_clear()
  np.testing.assert_array_equal(x2, x)
  np.testing.assert_array_equal(y2, y)


@pytest.mark.slow
def test_tf_imported_without_its_eager_keras_and_tf_keras_still_works():
  # a fresh interpreter: TF's import there is the first one
  code = textwrap.dedent("""
      import sys
      from fi_jax.data import preprocess
      tf = preprocess.tf_module()
      print("keras" in sys.modules, "sklearn" in sys.modules, preprocess._EAGER_KERAS in sys.modules)
      ds = tf.data.Dataset.from_tensor_slices({"image": [[[[16.0]]]]})
      ds = ds.map(preprocess.get_preprocess_fn("value_range(-1, 1, 0, 16)"))
      print(next(iter(ds))["image"].numpy().ravel().tolist())
      print(tf.keras.layers.Dense(2)(tf.ones([1, 3])).shape)   # Keras on first use
  """)
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       check=True).stdout.split("\n")
  assert out[:3] == ["False False False", "[1.0]", "(1, 2)"], out
