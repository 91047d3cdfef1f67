"""Writes this folder's dummy MOS SUN: the extracted SUN.tar.gz (SUN/images/, 3 images).

Run from the repository root: python tfds_fi_imagenet/sun_ood/dummy_data/make_dummy_data.py
"""
import pathlib
import shutil
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from tfds_fi_imagenet import testing

NAMES = ["sun_aaaevyiuguntlerb.jpg", "sun_aaaxbrksvmdyrhpe.jpg", "sun_dyzllobcgjpcvijp.jpg"]

if __name__ == "__main__":
  root = HERE / "extracted"
  shutil.rmtree(root, ignore_errors=True)
  testing.write_files(root / "SUN" / "images",
                      {n: testing.jpeg_bytes(16, seed=i) for i, n in enumerate(NAMES)})
