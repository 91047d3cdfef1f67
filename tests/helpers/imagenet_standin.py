"""A small imagenet2012 built by the project's own builder from a tar in the real layout
(ILSVRC2012_img_train.tar holding one <wnid>.tar of JPEGs per class): the stand-in of
`python -m tfds_fi_imagenet.standin` (tfds_fi_imagenet/standin.py)."""
from tfds_fi_imagenet import standin


def build_imagenet2012(root, n_classes: int, per_class: int) -> str:
  """The TFDS data_dir of an imagenet2012 with the first `n_classes` classes x `per_class`
  generated 16 px JPEGs, built under `root` with `python -m tfds_fi_imagenet build`."""
  data_dir = str(root / "data")
  standin.imagenet2012(data_dir, str(root / "manual"), n_classes, per_class, image_size=16)
  return data_dir
