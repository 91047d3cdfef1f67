"""imagenet2012 from ILSVRC2012_img_train.tar alone (no beam, no val tar), read with TFDS split
slicing and per-class subsets, and a pipeline fitted on it."""
import os

import ml_collections
import pytest
import tensorflow_datasets as tfds

from fi_jax.data import loader as data
from fi_jax.data import preprocess
from fi_jax.run import benchmark as run
from tests.helpers.imagenet_standin import build_imagenet2012
from tfds_fi_imagenet import __main__ as cli

PP = "decode|resize(16)|value_range(-1, 1)"
N_CLASSES, PER_CLASS = 3, 4


@pytest.fixture(scope="module")
def imagenet_dir(tmp_path_factory):
  """A fake ILSVRC2012_img_train.tar as the real one: one <wnid>.tar per class of JPEGs."""
  return build_imagenet2012(tmp_path_factory.mktemp("imagenet"), N_CLASSES, PER_CLASS)


def test_builds_tfds_imagenet2012_train_only(imagenet_dir):
  builder = tfds.builder("imagenet2012", data_dir=imagenet_dir)   # TFDS's own name
  assert builder.is_prepared() and set(builder.info.splits) == {"train"}
  assert builder.info.splits["train"].num_examples == N_CLASSES * PER_CLASS
  assert builder.info.splits["train[:50%]"].num_examples == N_CLASSES * PER_CLASS // 2
  labels = sorted(int(ex["label"]) for ex in builder.as_dataset(split="train"))
  assert labels == sorted(list(range(N_CLASSES)) * PER_CLASS)


def test_wrong_count_fails_the_build(tmp_path, imagenet_dir, capsys):
  manual = os.path.join(os.path.dirname(imagenet_dir), "manual")
  rc = cli.main(["build", "imagenet2012", f"--manual_dir={manual}",
                 f"--data_dir={tmp_path}", "--expect=train=13"])
  assert rc == 1 and "has 12 images, expected 13" in capsys.readouterr().err
  rc = cli.main(["build", "imagenet2012", f"--manual_dir={tmp_path}", f"--data_dir={tmp_path}"])
  assert rc == 2 and "ILSVRC2012_img_train.tar" in capsys.readouterr().err


def test_sliced_and_per_class_reads(imagenet_dir, capfd):
  fn = preprocess.get_preprocess_fn(PP)
  for split, per_class, n in (("train[:50%]", None, 6), ("train[:5]", None, 5),
                              ("train[:50%]", 1, None)):
    spec = dict(source="tfds", name="imagenet2012", split=split, data_dir=imagenet_dir,
                per_class=per_class)
    it, _, info = data.batches(spec, fn, 4)
    labels = [int(l) for b in it for l in b["label"][b["_mask"]]]
    if per_class:
      assert sorted(labels) == sorted(set(labels)) and len(labels) >= 1
    else:
      assert len(labels) == n == info.num_examples
  assert "AutoGraph" not in capfd.readouterr().err


@pytest.mark.slow
def test_pipeline_fits_on_half_of_train(imagenet_dir, tmp_path):
  spec = lambda split, **kw: dict(source="tfds", name="imagenet2012", split=split,
                                  data_dir=imagenet_dir, **kw)
  c = ml_collections.ConfigDict(dict(
      seed=0, model_name="vit", model_label="vit-tiny", random_init=True,
      model=dict(num_classes=1000, patch_size=(4, 4), width=32, depth=1, mlp_dim=64,
                 num_heads=2, pool_type="gap", head_zeroinit=False),   # zero head: constant MSP
      model_init="", init_shape=(1, 16, 16, 3), train={}, pp=PP, batch_size=4,
      id_name="imagenet2012/train[50%:]", id_fit=spec("train[:50%]"),
      id_test=spec("train[50%:]"), ood={"same": spec("train[50%:]", label_key=None)},
      detectors=("msp", "mds"), detector_preset="ninco", metrics=dict(n_bootstrap=0),
      input_std=(0.5, 0.5, 0.5), x64=True, cache=True))
  results = run.run(c, str(tmp_path), log=lambda s: None)
  assert results["meta"]["set_sizes"] == {"id_fit": 6, "id_test": 6, "ood/same": 6}
  assert [r["detector"] for r in results["rows"]] == ["msp", "mds"]
  assert all(r["auroc"] == pytest.approx(0.5) for r in results["rows"])   # same images
