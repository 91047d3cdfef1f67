"""The ID-shift sets through TFDS's own builders, offline (tfds_fi_imagenet/id_shift.py):
ImageNet-V2 built from its archive in manual_dir, labels read from the folder names as class
INDICES; ImageNet-R, -A, -Sketch and -C built from files written in their published layout; a
missing or altered archive, or a missing package, fails in one line."""
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


def _offline_build(tmp_path, monkeypatch, name, archive):
  """Prepares TFDS's own builder `name` from `archive` (written in the real layout) in
  manual_dir, its checksum recorded in place of the published file's; returns the test split
  as {file_name: label}."""
  infos = tfds.builder_cls(name.partition("/")[0]).url_infos
  (url,) = [u for u, info in infos.items() if info.filename == archive.name]
  monkeypatch.setitem(infos, url, checksums.compute_url_info(archive))
  data_dir = str(tmp_path / "data")
  id_shift.prepare(name, data_dir=data_dir, manual_dir=str(archive.parent),
                   download_dir=str(tmp_path / "dl"))
  split = "validation" if name.startswith("imagenet2012_corrupted") else "test"
  ds = tfds.load(name, split=split, data_dir=data_dir, download=False)
  return {ex["file_name"].decode(): (int(ex["label"]), ex["image"].shape)
          for ex in tfds.as_numpy(ds)}


@pytest.mark.parametrize("name", ["imagenet_r", "imagenet_a", "imagenet_sketch"])
def test_imagenet_r_a_sketch_build_offline_from_their_archives(tmp_path, monkeypatch, name):
  """TFDS's own imagenet_r / imagenet_a / imagenet_sketch builders, prepared from an archive in
  the published layout (imagenet-r.tar: imagenet-r/<wnid>/<file>; imagenet-a.tar:
  imagenet-a/<wnid>/<file>; ImageNet-Sketch.zip: sketch/<wnid>/<file>.JPEG): every image, its
  label = the ImageNet-1k index of its WordNet-id folder; ImageNet-R / -A's folders are classes
  of their 200-class subsets."""
  wnids = class_subsets.imagenet_wnids()
  subset = class_subsets.SUBSETS.get(name, ("n01440764", "n15075141"))
  folders = (subset[0], subset[-1])
  files = {f"{w}/{k}_{i}.{'JPEG' if name == 'imagenet_sketch' else 'jpg'}":
           testing.jpeg_bytes(seed=10 * i + k) for i, w in enumerate(folders) for k in range(2)}
  manual = tmp_path / "manual"
  if name == "imagenet_sketch":
    archive = testing.write_zip(manual / "ImageNet-Sketch.zip",
                                {f"sketch/{f}": d for f, d in files.items()})
  else:
    top = name.replace("_", "-")
    archive = testing.write_tar(manual / f"{top}.tar", {f"{top}/{f}": d for f, d in files.items()})
  got = _offline_build(tmp_path, monkeypatch, name, archive)
  # imagenet_a's file_name is the bare file name, the others' <wnid>/<file>
  want = {(f.split("/")[1] if name == "imagenet_a" else f): wnids.index(f.split("/")[0])
          for f in files}
  assert {f: label for f, (label, _) in got.items()} == want


def test_imagenet_c_builds_offline_from_the_val_tar_and_frost_files(tmp_path, monkeypatch):
  """TFDS's own imagenet2012_corrupted (gaussian_noise_1) from ILSVRC2012_img_val.tar and the
  frost images in manual_dir: the validation images' labels (TFDS's validation_labels.txt),
  224x224 corrupted images. TFDS seeds OpenCV's RNG even for corruptions that never call it:
  without OpenCV installed, a stand-in module with that one function takes its place (the
  noise corruptions use numpy only). Without it, prepare says in one line what to install."""
  import sys
  import types
  name = "imagenet2012_corrupted/gaussian_noise_1"
  manual = tmp_path / "manual"
  testing.write_val_tar(manual / "ILSVRC2012_img_val.tar", (1, 2, 3), size=40)
  infos = tfds.builder_cls("imagenet2012_corrupted").url_infos
  for url, info in list(infos.items()):
    if info.filename and info.filename.startswith("frost"):
      fmt = "PNG" if info.filename.endswith(".png") else "JPEG"
      path = manual / info.filename
      path.write_bytes(testing.image_bytes(fmt, size=8, seed=len(info.filename)))
      monkeypatch.setitem(infos, url, checksums.compute_url_info(path))
  if not id_shift._importable("cv2"):
    with pytest.raises(ModuleNotFoundError, match=r"needs opencv-python \(cv2\): install it "
                                                  r"\(pip install opencv-python\)"):
      id_shift.prepare(name, data_dir=str(tmp_path / "d"), manual_dir=str(manual))
    assert id_shift.main([name, "--data_dir", str(tmp_path / "d"), "--manual_dir",
                          str(manual)]) == 2
    monkeypatch.setitem(sys.modules, "cv2", types.SimpleNamespace(setRNGSeed=lambda seed: None))
  assert "scikit-image" in " ".join(id_shift.missing_requirements(
      "imagenet2012_corrupted/saturate_2")) or id_shift._importable("skimage")
  data_dir = str(tmp_path / "data")
  id_shift.prepare(name, data_dir=data_dir, manual_dir=str(manual),
                   download_dir=str(tmp_path / "dl"))
  ds = tfds.load(name, split="validation", data_dir=data_dir, download=False)
  got = {ex["file_name"].decode(): (int(ex["label"]), ex["image"].shape)
         for ex in tfds.as_numpy(ds)}
  labels = tfds.builder("imagenet2012").info.features["label"]
  val = (tfds.core.tfds_path("datasets/imagenet2012/validation_labels.txt")
         .read_text().split())
  assert got == {f"ILSVRC2012_val_{i:08d}.JPEG": (labels.str2int(val[i - 1]), (224, 224, 3))
                 for i in (1, 2, 3)}
