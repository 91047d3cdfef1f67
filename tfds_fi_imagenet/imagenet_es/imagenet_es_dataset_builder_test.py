"""DatasetBuilderTestCase for imagenet_es on dummy_data/ (a small ImageNet-ES.zip in the authors'
layout, with reference samples and a macOS resource file the builder leaves out)."""
import tensorflow_datasets as tfds

from tfds_fi_imagenet.imagenet_es import imagenet_es_dataset_builder


class ImagenetEsTest(tfds.testing.DatasetBuilderTestCase):
  DATASET_CLASS = imagenet_es_dataset_builder.Builder
  BUILDER_CONFIG_NAMES_TO_TEST = ["param_control"]
  SPLITS = {"test": 8, "validation": 2}

  def _download_and_prepare_as_dataset(self, builder):
    super()._download_and_prepare_as_dataset(builder)
    test = list(tfds.as_numpy(builder.as_dataset(split="test")))
    # labels are the ImageNet-1k indices of the WordNet-id folders (goldfish 1, flamingo 130),
    # not the folders' positions (0, 1)
    self.assertEqual(sorted({int(ex["label"]) for ex in test}), [1, 130])
    first = test[0]
    self.assertEqual(first["file_name"].decode(),
                     "es-test/param_control/l1/param_1/n01443537/ILSVRC2012_val_00000001.JPEG")
    self.assertEqual((first["light"].decode(), first["camera_setting"].decode()),
                     ("l1", "param_1"))
    self.assertEqual(int(first["label"]), 1)
    # 8 = the param_control test images: auto_exposure and the reference samples left out
    self.assertTrue(all(b"/param_control/" in ex["file_name"] for ex in test))

