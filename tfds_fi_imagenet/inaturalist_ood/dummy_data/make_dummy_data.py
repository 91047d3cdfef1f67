"""Writes this folder's dummy MOS iNaturalist: the extracted archive with 3 images.

Run from the repository root: python tfds_fi_imagenet/inaturalist_ood/dummy_data/make_dummy_data.py
"""
import pathlib
import shutil
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from tfds_fi_imagenet import testing

NAMES = ["0a1b2c3d4e5f60718293a4b5c6d7e8f9.jpg", "1f0e1d2c3b4a59687766554433221100.jpg",
         "ffeeddccbbaa99887766554433221100.jpg"]

if __name__ == "__main__":
  root = HERE / "extracted"
  shutil.rmtree(root, ignore_errors=True)
  testing.write_files(root / "iNaturalist" / "images",
                      {n: testing.jpeg_bytes(16, seed=i) for i, n in enumerate(NAMES)})
