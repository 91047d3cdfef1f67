"""DatasetBuilderTestCase for openimage_o: dummy_data/ holds openimage_o.tar.gz + 2 lists."""
import tensorflow_datasets as tfds

from tfds_fi_imagenet.openimage_o import openimage_o_dataset_builder

SPLITS = {"test": 3, "validation": 2}


class OpenimageOTest(tfds.testing.DatasetBuilderTestCase):
  DATASET_CLASS = openimage_o_dataset_builder.Builder
  SPLITS = SPLITS

  def _make_builder(self, config=None):
    return self.dataset_class(data_dir=self.tmp_dir, config=config, version=self.VERSION,
                              expected=SPLITS)

  def _download_and_prepare_as_dataset(self, builder):
    super()._download_and_prepare_as_dataset(builder)
    exs = list(tfds.as_numpy(builder.as_dataset(split="validation")))
    self.assertEqual([ex["file_name"].decode() for ex in exs],
                     ["openimage_o/images/3d4e5f60718293a4.jpg",
                      "openimage_o/images/4e5f60718293a4b5.jpg"])
