"""DatasetBuilderTestCase for textures_ood: dummy_data/dtd-r1.0.1 is the extracted DTD."""
import tensorflow_datasets as tfds

from tfds_fi_imagenet.textures_ood import textures_ood_dataset_builder


class TexturesOodTest(tfds.testing.DatasetBuilderTestCase):
  DATASET_CLASS = textures_ood_dataset_builder.Builder
  SPLITS = {"test": 4}  # banded 2 + zigzagged 2; bubbly is left out
  DL_DOWNLOAD_RESULT = "dtd-r1.0.1"   # fetch() downloads, then extracts
  DL_EXTRACT_ONLY_RESULT = "dtd-r1.0.1"

  def _make_builder(self, config=None):
    return self.dataset_class(data_dir=self.tmp_dir, config=config, version=self.VERSION,
                              expected={"test": 4, "classes": 2})

  def _download_and_prepare_as_dataset(self, builder):
    super()._download_and_prepare_as_dataset(builder)
    exs = list(tfds.as_numpy(builder.as_dataset(split="test")))
    self.assertEqual([ex["file_name"].decode() for ex in exs], [
        "texture/banded/banded_0001.jpg", "texture/banded/banded_0002.jpg",
        "texture/zigzagged/zigzagged_0001.jpg", "texture/zigzagged/zigzagged_0002.jpg"])
    self.assertEqual([int(ex["ood_class_id"]) for ex in exs], [0, 0, 1, 1])
