"""Writes this folder's dummy ImageNet-O: imagenet-o.tar in the real layout (3 images, 2 wnids).

Run from the repository root: python tfds_fi_imagenet/imagenet_o/dummy_data/make_dummy_data.py
Layout: imagenet-o/<wnid>/<concept>_<confidence>.JPEG plus imagenet-o/README.txt (not an image).
"""
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from tfds_fi_imagenet import testing

NAMES = ["n01443537/benthos_0.9994893.JPEG", "n01443537/tetra_0.99716717.JPEG",
         "n01704323/tooth_0.9914603.JPEG"]

if __name__ == "__main__":
  files = {"imagenet-o/README.txt": b"ImageNet-O (dummy)\n"}
  files.update({f"imagenet-o/{n}": testing.jpeg_bytes(16, seed=i) for i, n in enumerate(NAMES)})
  testing.write_tar(HERE / "imagenet-o.tar", files)
