"""Writes this folder's dummy DTD: the extracted dtd-r1.0.1 archive with 3 small classes.

Run from the repository root: python tfds_fi_imagenet/textures_ood/dummy_data/make_dummy_data.py
'bubbly' is one of the four classes the builder must leave out.
"""
import pathlib
import shutil
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from tfds_fi_imagenet import testing

NAMES = ["banded/banded_0001.jpg", "banded/banded_0002.jpg", "bubbly/bubbly_0038.jpg",
         "zigzagged/zigzagged_0001.jpg", "zigzagged/zigzagged_0002.jpg"]

if __name__ == "__main__":
  root = HERE / "dtd-r1.0.1"
  shutil.rmtree(root, ignore_errors=True)
  testing.write_files(root / "dtd" / "images", {n: testing.jpeg_bytes(16, seed=i)
                                                for i, n in enumerate(NAMES)})
  (root / "dtd" / "labels").mkdir(parents=True)
  (root / "dtd" / "labels" / "labels_joint_anno.txt").write_text(
      "".join(f"{n} {n.split('/')[0]}\n" for n in NAMES))
