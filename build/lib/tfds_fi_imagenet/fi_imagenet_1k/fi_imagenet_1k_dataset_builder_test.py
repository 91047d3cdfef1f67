"""DatasetBuilderTestCase for fi_imagenet_1k on dummy_data/ (10 val images, all list forms)."""
import tensorflow_datasets as tfds

from tfds_fi_imagenet.fi_imagenet_1k import fi_imagenet_1k_dataset_builder

SPLITS = {"ood": 5, "ambiguous": 2, "id": 3}


class FiImagenet1kTest(tfds.testing.DatasetBuilderTestCase):
  DATASET_CLASS = fi_imagenet_1k_dataset_builder.Builder
  SPLITS = SPLITS

  def _make_builder(self, config=None):
    return self.dataset_class(data_dir=self.tmp_dir, config=config, version=self.VERSION,
                              expected=SPLITS)

  def _download_and_prepare_as_dataset(self, builder):
    super()._download_and_prepare_as_dataset(builder)
    self._check_examples(builder)

  def _check_examples(self, builder):
    """Labels, classes and ids of the prepared dummy data, in val-id order."""
    ood = list(tfds.as_numpy(builder.as_dataset(split="ood")))
    names = [ex["file_name"].decode() for ex in ood]
    self.assertEqual(names, [f"ILSVRC2012_val_{i:08d}.JPEG" for i in (2, 3, 5, 7, 9)])
    self.assertEqual([ex["ood_class"].decode() for ex in ood],
                     ["hot air balloon", "hot air balloon", "okapi", "kiwi, fruit", ""])
    # sorted names: 'hot air balloon' 0, 'kiwi, fruit' 1, 'okapi' 2; missing -> -1
    self.assertEqual([int(ex["ood_class_id"]) for ex in ood], [0, 0, 2, 1, -1])
    self.assertEqual(builder.info.metadata["ood_class_names"],
                     ["hot air balloon", "kiwi, fruit", "okapi"])
    # TFDS imagenet2012 labels of val images 2 and 3: n09193705 -> 970, n02105855 -> 230.
    self.assertEqual([int(ex["label"]) for ex in ood[:2]], [970, 230])
    ids = list(tfds.as_numpy(builder.as_dataset(split="id")))
    self.assertEqual([ex["file_name"].decode() for ex in ids],
                     [f"ILSVRC2012_val_{i:08d}.JPEG" for i in (1, 6, 8)])
    self.assertEqual(int(ids[0]["label"]), 65)
    self.assertTrue(all(int(ex["ood_class_id"]) == -1 for ex in ids))
    self.assertEqual(ids[0]["image"].shape, (16, 16, 3))
