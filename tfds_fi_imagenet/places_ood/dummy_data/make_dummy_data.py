"""Writes this folder's dummy MOS Places: the extracted Places.tar.gz (Places/images/, 4 images).

Run from the repository root: python tfds_fi_imagenet/places_ood/dummy_data/make_dummy_data.py
Three names carry a Places365 category (one a sub-category), one does not.
"""
import pathlib
import shutil
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from tfds_fi_imagenet import testing

NAMES = ["b_badlands_00000038.jpg", "f_field_wild_00004504.jpg", "w_wheat_field_00004990.jpg",
         "Places365_val_00012755.jpg"]

if __name__ == "__main__":
  root = HERE / "extracted"
  shutil.rmtree(root, ignore_errors=True)
  testing.write_files(root / "Places" / "images",
                      {n: testing.jpeg_bytes(16, seed=i) for i, n in enumerate(NAMES)})
