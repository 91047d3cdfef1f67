"""Writes this folder's dummy NINCO: the extracted archive, 4 images per top-level folder.

Run from the repository root: python tfds_fi_imagenet/ninco/dummy_data/make_dummy_data.py
Layout: NINCO_all/NINCO/<folder>/<class>/<file> (a wrapping folder, as the builder must
find the three folders by search), with class names containing spaces and one GIF.
"""
import pathlib
import shutil
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from tfds_fi_imagenet import testing

FILES = {
    "NINCO_OOD_classes/high heels/high heels_001_1.jpg": "JPEG",
    "NINCO_OOD_classes/high heels/high heels_002_2.JPEG": "JPEG",
    "NINCO_OOD_classes/Caracal caracal caracal/Caracal caracal caracal_001_3.png": "PNG",
    "NINCO_OOD_classes/pseudorca_crassidens/pseudorca_crassidens_047_67902086.gif": "GIF",
    "NINCO_OOD_unit_tests/black/black_001.jpg": "JPEG",
    "NINCO_OOD_unit_tests/black/black_002.jpg": "JPEG",
    "NINCO_OOD_unit_tests/white/white_001.png": "PNG",
    "NINCO_OOD_unit_tests/white/white_002.png": "PNG",
    "NINCO_popular_datasets_subsamples/SSB_hard/ssb_001.JPEG": "JPEG",
    "NINCO_popular_datasets_subsamples/SSB_hard/ssb_002.JPEG": "JPEG",
    "NINCO_popular_datasets_subsamples/Textures/banded_0001.jpg": "JPEG",
    "NINCO_popular_datasets_subsamples/Textures/banded_0002.jpg": "JPEG",
}

if __name__ == "__main__":
  root = HERE / "NINCO_all"
  shutil.rmtree(root, ignore_errors=True)
  testing.write_files(root / "NINCO", {name: testing.image_bytes(fmt, 16, seed)
                                       for seed, (name, fmt) in enumerate(FILES.items())})
