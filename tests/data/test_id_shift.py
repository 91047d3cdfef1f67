"""The ID-shift sets through TFDS's own builders, offline (tfds_fi_imagenet/id_shift.py):
ImageNet-V2 built from its archive in manual_dir, labels read from the folder names as class
INDICES; a missing or altered archive fails in one line."""
import time

import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.core.download import checksums

from fi_jax.data import class_subsets
from tfds_fi_imagenet import id_shift, testing

V2 = "imagenet_v2/matched-frequency"
V2_URL = "https://huggingface.co/datasets/vaishaal/ImageNetV2/resolve/main/imagenetv2-matched-frequency.tar.gz"
FOLDERS = ("0", "1", "2", "10", "100")   # in string order "10" is the 3rd folder (index 2)


def _write_v2(manual_dir):
  files = {f"imagenetv2-matched-frequency-format-val/{c}/{h}.jpeg": testing.jpeg_bytes(seed=i * 7 + j)
           for i, c in enumerate(FOLDERS) for j, h in enumerate(("a1b2", "c3d4"))}
  return testing.write_tar(manual_dir / "imagenetv2-matched-frequency.tar.gz", files)


def test_imagenet_v2_builds_offline_with_folders_as_class_indices(tmp_path, monkeypatch):
  archive = _write_v2(tmp_path / "manual")
  # the fixture is not the published archive: record its checksum in place of TFDS's
  infos = tfds.builder_cls("imagenet_v2").url_infos
  assert infos[V2_URL].filename == archive.name   # the name TFDS looks for in manual_dir
  monkeypatch.setitem(infos, V2_URL, checksums.compute_url_info(archive))
  data_dir = str(tmp_path / "data")
  id_shift.prepare(V2, data_dir=data_dir, manual_dir=str(tmp_path / "manual"),
                   download_dir=str(tmp_path / "dl"))
  ds = tfds.load(V2, split="test", data_dir=data_dir, download=False)
  labels = {ex["file_name"].decode(): int(ex["label"]) for ex in tfds.as_numpy(ds)}
  assert len(labels) == 10
  wnids = class_subsets.imagenet_wnids()
  names = tfds.builder(V2, data_dir=data_dir).info.features["label"].names
  for name, label in labels.items():
    assert label == int(name.split("/")[0])
  # class 10 is the 11th ImageNet class, not the 3rd folder in string order
  assert labels["10/a1b2.jpeg"] == 10 != sorted(FOLDERS).index("10")
  assert names[10] == wnids[10] == "n01530575"


def test_a_missing_archive_is_one_line_naming_file_and_source(tmp_path):
  (tmp_path / "manual").mkdir()
  t = time.time()
  with pytest.raises(FileNotFoundError) as e:
    id_shift.prepare(V2, data_dir=str(tmp_path / "d"), manual_dir=str(tmp_path / "manual"))
  assert time.time() - t < 10
  msg = str(e.value)
  assert "\n" not in msg and "imagenetv2-matched-frequency.tar.gz" in msg and V2_URL in msg
  with pytest.raises(FileNotFoundError, match="ILSVRC2012_img_val.tar .from image-net.org"):
    id_shift.prepare("imagenet2012_corrupted/fog_3", data_dir=str(tmp_path / "d"),
                     manual_dir=str(tmp_path / "manual"))
  with pytest.raises(ValueError, match="three configs"):
    id_shift.files_of("imagenet_v2")
  assert id_shift.main([V2, "--data_dir", str(tmp_path / "d"),
                        "--manual_dir", str(tmp_path / "manual")]) == 2


def test_an_altered_archive_fails_the_recorded_checksum(tmp_path):
  _write_v2(tmp_path / "manual")   # TFDS's record (the real archive's SHA-256) stays
  with pytest.raises(ValueError, match="imagenetv2-matched-frequency.tar.gz .* is not the "
                                       "published file"):
    id_shift.prepare(V2, data_dir=str(tmp_path / "d"), manual_dir=str(tmp_path / "manual"),
                     download_dir=str(tmp_path / "dl"))


def test_preflight_names_the_offline_route_of_an_unprepared_id_shift_set(tmp_path):
  from fi_jax.run import preflight
  spec = dict(source="tfds", name=V2, split="test", data_dir=str(tmp_path))
  msg = preflight.check_tfds_set("csid/imagenet_v2", spec)
  assert f"python -m tfds_fi_imagenet.id_shift {V2} --manual_dir=DIR" in msg
  assert "DIR holds imagenetv2-matched-frequency.tar.gz" in msg
