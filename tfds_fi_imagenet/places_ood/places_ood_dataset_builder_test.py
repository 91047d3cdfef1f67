"""DatasetBuilderTestCase for places_ood: dummy_data/extracted is the extracted Places.tar.gz."""
import tensorflow_datasets as tfds

from tfds_fi_imagenet.places_ood import places_ood_dataset_builder


class PlacesOodTest(tfds.testing.DatasetBuilderTestCase):
  DATASET_CLASS = places_ood_dataset_builder.Builder
  SPLITS = {"test": 4}
  DL_DOWNLOAD_RESULT = "extracted"
  DL_EXTRACT_ONLY_RESULT = "extracted"
  SKIP_CHECKSUMS = True   # no published SHA-256; the MD5 is checked (off for the dummy folder)

  def _make_builder(self, config=None):
    return self.dataset_class(data_dir=self.tmp_dir, config=config, version=self.VERSION,
                              expected={"test": 4}, verify_md5=False)

  def _download_and_prepare_as_dataset(self, builder):
    super()._download_and_prepare_as_dataset(builder)
    exs = list(tfds.as_numpy(builder.as_dataset(split="test")))
    got = {ex["file_name"].decode(): (ex["ood_class"].decode(), int(ex["ood_class_id"]))
           for ex in exs}
    self.assertEqual(got, {
        "places/images/Places365_val_00012755.jpg": ("", -1),
        "places/images/b_badlands_00000038.jpg": ("badlands", 0),
        "places/images/f_field_wild_00004504.jpg": ("field_wild", 1),
        "places/images/w_wheat_field_00004990.jpg": ("wheat_field", 2)})
