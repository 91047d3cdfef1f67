"""DatasetBuilderTestCase for ssb_hard: dummy_data/ is a manual dir with ssb_hard.zip."""
import tensorflow_datasets as tfds

from tfds_fi_imagenet.ssb_hard import ssb_hard_dataset_builder


class SsbHardTest(tfds.testing.DatasetBuilderTestCase):
  DATASET_CLASS = ssb_hard_dataset_builder.Builder
  SPLITS = {"test": 4}

  def _make_builder(self, config=None):
    return self.dataset_class(data_dir=self.tmp_dir, config=config, version=self.VERSION,
                              expected={"test": 4, "classes": 2})

  def _download_and_prepare_as_dataset(self, builder):
    super()._download_and_prepare_as_dataset(builder)
    exs = list(tfds.as_numpy(builder.as_dataset(split="test")))
    self.assertEqual([ex["file_name"].decode() for ex in exs], [
        "ssb_hard/n00000001/n00000001_1.JPEG", "ssb_hard/n00000001/n00000001_2.JPEG",
        "ssb_hard/n00000002/n00000002_1.JPEG", "ssb_hard/n00000002/n00000002_7.JPEG"])
    self.assertEqual([ex["ood_class"].decode() for ex in exs],
                     ["n00000001", "n00000001", "n00000002", "n00000002"])
    self.assertEqual([int(ex["ood_class_id"]) for ex in exs], [0, 0, 1, 1])
