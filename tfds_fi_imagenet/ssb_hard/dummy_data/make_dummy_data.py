"""Writes this folder's dummy manual dir: ssb_hard.zip (2 classes x 2) and its OpenOOD list.

Run from the repository root: python tfds_fi_imagenet/ssb_hard/dummy_data/make_dummy_data.py
The zip wraps the images in a ssb_hard/ folder and holds one image the list does not name.
"""
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from tfds_fi_imagenet import testing

LISTED = ["n00000001/n00000001_1.JPEG", "n00000001/n00000001_2.JPEG",
          "n00000002/n00000002_1.JPEG", "n00000002/n00000002_7.JPEG"]
UNLISTED = ["n00000002/n00000002_9.JPEG"]

if __name__ == "__main__":
  testing.write_zip(HERE / "ssb_hard.zip", {f"ssb_hard/{n}": testing.jpeg_bytes(16, seed=i)
                                            for i, n in enumerate(LISTED + UNLISTED)})
  lst = HERE / "benchmark_imglist" / "imagenet" / "test_ssb_hard.txt"
  lst.parent.mkdir(parents=True, exist_ok=True)
  lst.write_text("".join(f"ssb_hard/{n} -1\n" for n in LISTED))
