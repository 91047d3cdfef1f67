"""The detectors' ID fit set: TFDS `imagenet2012` (train split) from ILSVRC2012_img_train.tar alone.

  python -m tfds_fi_imagenet build imagenet2012 --manual_dir=DIR --data_dir=DATA_DIR

DIR holds `ILSVRC2012_img_train.tar` (the 138 GB tar of 1000 per-class tars, from
image-net.org). This writes TFDS's own `imagenet2012` dataset (same name, version, features
and example encoding as `tensorflow_datasets`' builder, whose example generator it reuses) into
DATA_DIR, with the `train` split only, so that `tfds.builder("imagenet2012", data_dir=...)` and
the configs' `id_fit` read it. It differs from `tfds build imagenet2012` in what it needs:
no apache-beam, no validation tar (Fi-ImageNet-1k is the ID test set), and the class and
image counts are checked (`--expect train=N` / `classes=N` for a subset, e.g. in tests).
"""
from __future__ import annotations

import os
from typing import Mapping, Optional

import tensorflow_datasets as tfds
from tensorflow_datasets.datasets.imagenet2012 import imagenet2012_dataset_builder as tfds_imagenet

TRAIN_TAR = "ILSVRC2012_img_train.tar"
PUBLISHED = {"train": 1_281_167, "classes": 1000}


class ImagenetTrainBuilder(tfds_imagenet.Builder, skip_registration=True):
  """TFDS's imagenet2012 builder restricted to the train split, with count checks."""

  name = "imagenet2012"
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      f"manual_dir must contain {TRAIN_TAR} (register at https://image-net.org/download-images "
      "to get it); the validation tar is not needed.")

  def __init__(self, *, expected: Optional[Mapping[str, int]] = None, **kwargs):
    super().__init__(**kwargs)
    self._original_state["expected"] = expected
    expected = dict(PUBLISHED if expected is None else expected)
    unknown = set(expected) - set(PUBLISHED)
    if unknown:
      raise ValueError(f"imagenet2012: unknown count key(s) {sorted(unknown)} in expected; "
                       f"known: {sorted(PUBLISHED)}.")
    self.expected = {k: int(v) for k, v in expected.items()}

  def _split_generators(self, dl_manager):
    path = os.path.join(dl_manager.manual_dir, TRAIN_TAR)
    if not os.path.exists(path):
      raise FileNotFoundError(f"imagenet2012: {path} does not exist. "
                              + self.MANUAL_DOWNLOAD_INSTRUCTIONS)
    return [tfds.core.SplitGenerator(name=tfds.Split.TRAIN,
                                     gen_kwargs={"archive": dl_manager.iter_archive(path)})]

  def _generate_examples(self, archive, validation_labels=None, labels_exist=True):
    """TFDS's train examples, counted: a wrong number of classes or images stops the build."""
    del validation_labels, labels_exist
    images, classes = 0, set()
    for key, example in super()._generate_examples(archive):
      images += 1
      classes.add(example["label"])
      yield key, example
    for what, got in (("classes", len(classes)), ("train", images)):
      want = self.expected.get(what)
      if want is not None and got != want:
        raise ValueError(
            f"imagenet2012: {TRAIN_TAR} has {got} {'classes' if what == 'classes' else 'images'}"
            f", expected {want}. A truncated download? For a subset pass --expect {what}={got}.")
