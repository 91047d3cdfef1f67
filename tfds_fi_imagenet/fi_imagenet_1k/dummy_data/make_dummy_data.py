"""Writes this folder's dummy manual dir: a 10-image val tar and the two lists.

Run from the repository root: python tfds_fi_imagenet/fi_imagenet_1k/dummy_data/make_dummy_data.py
The lists use every line form the parser accepts (header, comment, bare name, path, tab,
quoted class with a comma, CSV row with an index column, missing class).
"""
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from tfds_fi_imagenet import testing

OOD_LIST = """\
image,ood_class
# Fi-ImageNet-1k OOD list (dummy)
ILSVRC2012_val_00000002.JPEG,hot air balloon
val/ILSVRC2012_val_00000003.JPEG\thot  air balloon
ILSVRC2012_val_00000005.JPEG\tokapi
/data/imagenet/val/ILSVRC2012_val_00000007.JPEG,"kiwi, fruit"
ILSVRC2012_val_00000009

"""
AMBIGUOUS_LIST = "4,ILSVRC2012_val_00000004.JPEG\r\nn01440764/ILSVRC2012_val_00000010.JPEG\r\n"

if __name__ == "__main__":
  testing.write_val_tar(HERE / "ILSVRC2012_img_val.tar", range(1, 11), size=16)
  (HERE / "fi_imagenet_1k_ood.txt").write_text(OOD_LIST)
  (HERE / "fi_imagenet_1k_ambiguous.txt").write_bytes(AMBIGUOUS_LIST.encode())
