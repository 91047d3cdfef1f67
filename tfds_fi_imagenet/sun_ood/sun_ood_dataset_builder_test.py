"""DatasetBuilderTestCase for sun_ood: dummy_data/extracted is the extracted SUN.tar.gz."""
import tensorflow_datasets as tfds

from tfds_fi_imagenet.sun_ood import sun_ood_dataset_builder


class SunOodTest(tfds.testing.DatasetBuilderTestCase):
  DATASET_CLASS = sun_ood_dataset_builder.Builder
  SPLITS = {"test": 3}
  DL_DOWNLOAD_RESULT = "extracted"
  DL_EXTRACT_ONLY_RESULT = "extracted"
  SKIP_CHECKSUMS = True   # no published SHA-256; the MD5 is checked (off for the dummy folder)

  def _make_builder(self, config=None):
    return self.dataset_class(data_dir=self.tmp_dir, config=config, version=self.VERSION,
                              expected={"test": 3}, verify_md5=False)

  def _download_and_prepare_as_dataset(self, builder):
    super()._download_and_prepare_as_dataset(builder)
    exs = list(tfds.as_numpy(builder.as_dataset(split="test")))
    self.assertEqual(exs[0]["file_name"].decode(), "sun/images/sun_aaaevyiuguntlerb.jpg")
    self.assertTrue(all(int(ex["ood_class_id"]) == -1 for ex in exs))
