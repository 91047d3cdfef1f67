"""Writes this folder's dummy manual dir: a small `ImageNet-ES.zip` in the authors' layout.

Run from the repository root: python tfds_fi_imagenet/imagenet_es/dummy_data/make_dummy_data.py
param_control: test 2 lights x 2 settings x 2 classes = 8 images, validation 2; auto_exposure:
test 2; plus reference samples (left out by the builder) and a macOS resource file.
"""
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from tfds_fi_imagenet import testing

# class folders: WordNet ids whose ImageNet-1k labels are 1 (goldfish) and 130 (flamingo)
CLASSES = ("n01443537", "n02007558")


def files():
  out, seed = {}, 0
  for light in ("l1", "l5"):
    for param in ("param_1", "param_12"):
      for wnid in CLASSES:
        seed += 1
        out[f"ImageNet-ES/es-test/param_control/{light}/{param}/{wnid}/ILSVRC2012_val_{seed:08d}.JPEG"] = testing.jpeg_bytes(seed=seed)
  out["ImageNet-ES/es-val/param_control/l2/param_3/n01443537/ILSVRC2012_val_00000100.JPEG"] = testing.jpeg_bytes(seed=100)
  out["ImageNet-ES/es-val/param_control/l2/param_3/n02007558/ILSVRC2012_val_00000101.JPEG"] = testing.jpeg_bytes(seed=101)
  out["ImageNet-ES/es-test/auto_exposure/l3/param_1/n01443537/ILSVRC2012_val_00000200.JPEG"] = testing.jpeg_bytes(seed=200)
  out["ImageNet-ES/es-test/auto_exposure/l3/param_2/n02007558/ILSVRC2012_val_00000201.JPEG"] = testing.jpeg_bytes(seed=201)
  out["ImageNet-ES/es-test/sampled_tin_no_resize2/n01443537/ILSVRC2012_val_00000300.JPEG"] = testing.jpeg_bytes(seed=300)
  out["__MACOSX/ImageNet-ES/es-test/param_control/l1/param_1/n01443537/._ILSVRC2012_val_00000001.JPEG"] = b"\0"
  return out


if __name__ == "__main__":
  testing.write_zip(HERE / "ImageNet-ES.zip", files())
