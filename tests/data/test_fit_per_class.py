"""Small runs stay small: a per-class fit set (`per_class`, the configs' fit_per_class) of a
split with fewer classes or images than asked is planned at the size it really has, and
preflight says so with the numbers (issue 33)."""
import math

import ml_collections
import numpy as np
import pytest

from fi_jax.data import loader as data
from fi_jax.data import preprocess
from fi_jax.run import benchmark as run
from fi_jax.run import preflight
from tests.helpers.imagenet_standin import build_imagenet2012
from tfds_fi_imagenet import subsets

PP = "decode|resize(16)|value_range(-1, 1)"
N_CLASSES, PER_CLASS = 20, 10   # of imagenet2012's 1000 classes


@pytest.fixture(scope="module")
def imagenet_dir(tmp_path_factory):
  """An imagenet2012 stand-in built by the project's builder: 20 classes x 10 images."""
  return build_imagenet2012(tmp_path_factory.mktemp("imagenet_small"), N_CLASSES, PER_CLASS)


def _spec(data_dir, split="train", **kw):
  return dict(source="tfds", name="imagenet2012", split=split, data_dir=data_dir, **kw)


@pytest.mark.parametrize("per_class, total", [(10, 200), (15, 200), (4, 80)])
def test_counts_and_batches_are_what_the_split_has(imagenet_dir, per_class, total):
  spec = _spec(imagenet_dir, per_class=per_class)
  counts = data.per_class_counts(spec)
  assert counts.shape == (1000,) and counts.sum() == total
  assert (counts[:N_CLASSES] == min(per_class, PER_CLASS)).all() and not counts[N_CLASSES:].any()
  it, steps, info = data.batches(spec, preprocess.get_preprocess_fn(PP), 64)
  batches = list(it)
  assert info.num_examples == total and steps == len(batches) == math.ceil(total / 64)
  labels = np.concatenate([b["label"][b["_mask"]] for b in batches])
  assert len(labels) == total
  assert np.bincount(labels, minlength=N_CLASSES).tolist() == [min(per_class, PER_CLASS)] * 20


def test_two_processes_share_the_real_count(imagenet_dir):
  spec = _spec(imagenet_dir, per_class=10)
  fn = preprocess.get_preprocess_fn(PP)
  parts = [data.batches(spec, fn, 64, process_index=p, process_count=2) for p in range(2)]
  assert [info.num_examples_per_process for _, _, info in parts] == [[100, 100]] * 2
  assert {steps for _, steps, _ in parts} == {math.ceil(100 / 32)}
  ids = [i for it, _, _ in parts for b in it for i in b["_id"][b["_mask"]]]
  assert len(ids) == len(set(ids)) == 200


def test_per_class_available_stops_once_every_class_is_full():
  import tensorflow as tf
  labels = [0, 1, 0, 1, 2, 2, 0, 5, 7]
  ds = tf.data.Dataset.from_tensor_slices({"label": np.array(labels, np.int64)})
  assert subsets.per_class_available(ds, 2, 3, chunk=2).tolist() == [2, 2, 2]
  assert subsets.per_class_available(ds, 2, 8).tolist() == [2, 2, 2, 0, 0, 1, 0, 1]
  assert subsets.per_class_subset_counts(10, 1000, 3, total=200) == [67, 67, 66]


def test_preflight_says_how_many_classes_and_images_there_are(imagenet_dir):
  specs = {"id_fit": _spec(imagenet_dir, per_class=10), "id_test": _spec(imagenet_dir)}
  assert preflight.check_sets(specs) == []
  assert preflight.notes(specs) == [
      "id_fit: per_class=10 asks for 10 images of each of 1000 classes (10000); imagenet2012 "
      "train has 20 of the 1000 classes (980 with fewer than 10 images): the run uses the "
      "200 it has."]


@pytest.mark.slow
def test_a_run_plans_exactly_the_real_fit_examples(imagenet_dir, tmp_path):
  c = ml_collections.ConfigDict(dict(
      seed=0, model_name="vit", model_label="vit-tiny", random_init=True,
      model=dict(num_classes=1000, patch_size=(4, 4), width=32, depth=1, mlp_dim=64,
                 num_heads=2, pool_type="gap"),
      model_init="", init_shape=(1, 16, 16, 3), train={}, pp=PP, batch_size=64,
      id_name="imagenet2012/train[:40]", id_fit=_spec(imagenet_dir, per_class=10),
      id_test=_spec(imagenet_dir, "train[:40]"),
      ood={"same": _spec(imagenet_dir, "train[:40]", label_key=None)},
      detectors=("msp",), detector_preset="ninco", metrics=dict(n_bootstrap=0),
      input_std=(0.5, 0.5, 0.5), x64=True, cache=True))
  logs = []
  results = run.run(c, str(tmp_path), log=logs.append)
  assert results["meta"]["set_sizes"]["id_fit"] == 200
  text = "\n".join(logs)
  assert "id_fit: 200 examples, 4 batches of 64" in text, text
  assert "id_fit: per_class=10 asks for 10 images of each of 1000 classes (10000)" in text
  assert text.index("asks for 10 images") < text.index("id_fit: 200 examples")
