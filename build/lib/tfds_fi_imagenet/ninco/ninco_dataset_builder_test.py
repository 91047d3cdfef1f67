"""DatasetBuilderTestCase for ninco: dummy_data/NINCO_all is the extracted archive."""
import tensorflow_datasets as tfds

from tfds_fi_imagenet.ninco import ninco_dataset_builder

CLASSES = {"ood_classes": 3, "unit_tests": 2, "popular_subsamples": 2}


class NincoTest(tfds.testing.DatasetBuilderTestCase):
  DATASET_CLASS = ninco_dataset_builder.Builder
  SPLITS = {"test": 4}  # every config's dummy folder has 4 images
  DL_DOWNLOAD_RESULT = "NINCO_all"
  DL_EXTRACT_ONLY_RESULT = "NINCO_all"
  # The real archive's SHA-256 is not published (checksums.tsv explains); the builder
  # checks its published MD5 instead, switched off here because the dummy is a folder.
  SKIP_CHECKSUMS = True

  def _make_builder(self, config=None):
    name = getattr(config, "name", config) or "ood_classes"
    return self.dataset_class(data_dir=self.tmp_dir, config=config, version=self.VERSION,
                              expected={"test": 4, "classes": CLASSES[name]},
                              verify_md5=False)

  def _download_and_prepare_as_dataset(self, builder):
    super()._download_and_prepare_as_dataset(builder)
    if builder.builder_config.name != "ood_classes":
      return
    exs = list(tfds.as_numpy(builder.as_dataset(split="test")))
    self.assertEqual([ex["file_name"].decode() for ex in exs], [
        "NINCO_OOD_classes/Caracal caracal caracal/Caracal caracal caracal_001_3.png",
        "NINCO_OOD_classes/high heels/high heels_001_1.jpg",
        "NINCO_OOD_classes/high heels/high heels_002_2.JPEG",
        "NINCO_OOD_classes/pseudorca_crassidens/pseudorca_crassidens_047_67902086.gif"])
    self.assertEqual([int(ex["ood_class_id"]) for ex in exs], [0, 1, 1, 2])
    self.assertEqual(exs[1]["ood_class"].decode(), "high heels")
    self.assertEqual(exs[3]["image"].shape, (16, 16, 3))  # the GIF, re-encoded as PNG
