"""DatasetBuilderTestCase for reimagenet_noclass on dummy_data/ (10 val images, a fake
reannotation.jsonl in the forms tfds_fi_imagenet/reannotation.py reads)."""
import tensorflow_datasets as tfds

from tfds_fi_imagenet.reimagenet_noclass import reimagenet_noclass_dataset_builder

SPLITS = {"ood": 3, "ambiguous": 2, "id": 5}


class ReimagenetNoclassTest(tfds.testing.DatasetBuilderTestCase):
  DATASET_CLASS = reimagenet_noclass_dataset_builder.Builder
  SPLITS = SPLITS

  def _make_builder(self, config=None):
    return self.dataset_class(data_dir=self.tmp_dir, config=config, version=self.VERSION,
                              expected=SPLITS)

  def _download_and_prepare_as_dataset(self, builder):
    super()._download_and_prepare_as_dataset(builder)
    ood = list(tfds.as_numpy(builder.as_dataset(split="ood")))
    self.assertEqual([ex["file_name"].decode() for ex in ood],
                     [f"ILSVRC2012_val_{i:08d}.JPEG" for i in (2, 3, 7)])
    self.assertEqual([ex["ood_class"].decode() for ex in ood],
                     ["", "hot air balloon", "kiwi fruit"])
    self.assertEqual([int(ex["ood_class_id"]) for ex in ood], [-1, 0, 1])
    self.assertEqual([len(ex["labels"]) for ex in ood], [0, 0, 0])
    ids = list(tfds.as_numpy(builder.as_dataset(split="id")))
    self.assertEqual([ex["file_name"].decode() for ex in ids],
                     [f"ILSVRC2012_val_{i:08d}.JPEG" for i in (1, 5, 6, 8, 9)])
    # val image 1: original n01751748 (65) plus a second box of n01440764 (0)
    self.assertEqual(int(ids[0]["label"]), 65)
    self.assertEqual(sorted(ids[0]["labels"].tolist()), [0, 65])
    amb = list(tfds.as_numpy(builder.as_dataset(split="ambiguous")))
    self.assertEqual([ex["file_name"].decode() for ex in amb],
                     [f"ILSVRC2012_val_{i:08d}.JPEG" for i in (4, 10)])
