"""Writes this folder's dummy manual dir: openimage_o.tar.gz and the two OpenOOD lists.

Run from the repository root: python tfds_fi_imagenet/openimage_o/dummy_data/make_dummy_data.py
A compressed tar exercises the builder's one-pass streaming read.
"""
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from tfds_fi_imagenet import testing

TEST = ["images/0a1b2c3d4e5f6071.jpg", "images/1b2c3d4e5f607182.jpg",
        "images/2c3d4e5f60718293.jpg"]
VAL = ["images/3d4e5f60718293a4.jpg", "images/4e5f60718293a4b5.jpg"]

if __name__ == "__main__":
  testing.write_tar(HERE / "openimage_o.tar.gz",
                    {f"openimage_o/{n}": testing.jpeg_bytes(16, seed=i)
                     for i, n in enumerate(TEST + VAL)})
  (HERE / "test_openimage_o.txt").write_text("".join(f"openimage_o/{n} -1\n" for n in TEST))
  (HERE / "val_openimage_o.txt").write_text("".join(f"openimage_o/{n} -1\n" for n in VAL))
