"""ReImageNet and ReaL on the ID side: the reannotation.jsonl reader's checks (one error naming
the line), multi-label accuracy against its definition, ReaL from TFDS's own imagenet2012_real
built offline, and dropping the ambiguous ID test images (fi_jax.run.benchmark.reannotated_id)."""
import json

import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.core.download import checksums

from fi_jax.data import id_labels
from fi_jax.metrics import multilabel
from fi_jax.run import benchmark
from tfds_fi_imagenet import id_shift, imagenet_val, reannotation, testing

WNIDS = imagenet_val.validation_wnids()
LABELS = imagenet_val.label_names_file().read_text().split()


def fp(i):
  return f"{WNIDS[i - 1]}/ILSVRC2012_val_{i:08d}.JPEG"


def write(path, records):
  path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
  return path


def test_reader_label_forms_and_ambiguity(tmp_path):
  path = write(tmp_path / "r.jsonl", [
      {"file_path": fp(1), "boxes": [{"label": WNIDS[0]}, {"label": "n01440764"}]},
      {"file_path": fp(2), "boxes": []},
      {"file_path": fp(3), "boxes": [{"label": "hot air balloon", "attributes": ["ambiguous"]}]},
      {"file_path": fp(4), "labels": [5, "7"], "ambiguous": True},
      {"file_path": "val/" + fp(5), "objects": [{"class": WNIDS[4],
                                                 "attributes": {"ambiguous": False}}]},
  ])
  r = reannotation.read(path)
  assert r[1].labels == (0, LABELS.index(WNIDS[0])) and not r[1].ambiguous
  assert r[2].labels == () and r[2].other_labels == ()
  assert r[3].labels == () and r[3].other_labels == ("hot air balloon",) and r[3].ambiguous
  assert r[4].labels == (5, 7) and r[4].ambiguous
  assert r[5].labels == (LABELS.index(WNIDS[4]),) and not r[5].ambiguous
  # the field names, once known, override the guesses
  path = write(tmp_path / "o.jsonl", [{"file_path": fp(1), "regions": [{"name": "n01440764"}],
                                       "flags": ["x"], "labels": [9]}])
  r = reannotation.read(path, label_field="regions.name", ambiguous_field="flags")
  assert r[1].labels == (0,) and r[1].ambiguous
  assert reannotation.label_sets(r, ["a/ILSVRC2012_val_00000001.JPEG"]) == [(0,)]
  with pytest.raises(reannotation.ReannotationError, match="1 image.s. have no reannotation"):
    reannotation.label_sets(r, ["ILSVRC2012_val_00000002.JPEG"])


@pytest.mark.parametrize("records, message", [
    (["{not json"], r"line 1: not JSON"),
    ([{"file_path": fp(1), "labels": []}, "[1, 2]"], r"line 2: a JSON list, not an object"),
    ([{"file": fp(1), "labels": []}], r"line 1: 'file_path' is None"),
    ([{"file_path": "ILSVRC2012_val_00000001.JPEG", "labels": []}], r"not '<wnid>/ILSVRC2012"),
    ([{"file_path": "n01440764/ILSVRC2012_val_00000001.JPEG", "labels": []}],
     r"class folder n01440764, but its ImageNet label is n01751748"),
    ([{"file_path": fp(1), "labels": []}, {"file_path": fp(1), "labels": []}],
     r"line 2: ILSVRC2012_val_00000001.JPEG appears twice"),
    ([{"file_path": fp(1), "labels": [1000]}], r"label 1000 is outside 0..999"),
    ([{"file_path": fp(1), "tags": ["n01440764"]}],
     r"no record has a label field .* first record's fields are \['file_path', 'tags'\]. "
     r"Name the field with label_field"),
])
def test_reader_errors_name_the_line(tmp_path, records, message):
  path = write(tmp_path / "reannotation.jsonl", records)
  with pytest.raises(reannotation.ReannotationError, match=message):
    reannotation.read(path)


def test_missing_file_says_where_to_get_it(tmp_path):
  with pytest.raises(FileNotFoundError, match="vrg-prague/ReImageNet .* does not ship it"):
    reannotation.read(tmp_path / "reannotation.jsonl")


def test_multilabel_accuracy_is_a_hit_when_the_argmax_is_any_valid_label():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(200, 10))
  sets = [tuple(rng.choice(10, rng.integers(0, 4), replace=False)) for _ in range(200)]
  pred = logits.argmax(1)
  scored = [i for i, s in enumerate(sets) if s]
  acc, n = multilabel.multilabel_accuracy(logits, sets)
  assert n == len(scored) < 200
  assert acc == pytest.approx(np.mean([pred[i] in sets[i] for i in scored]), abs=0)
  assert multilabel.multilabel_accuracy(logits[:2], [(), ()]) == (None, 0)
  with pytest.raises(ValueError, match="one label set per row"):
    multilabel.multilabel_accuracy(logits, sets[:3])


def _id_test_set(tmp_path):
  """fi_imagenet_1k built from a fake val tar: its `id` split is val images 1, 6, 8, 9, 10."""
  data_dir = testing.make_fake_fi_imagenet(tmp_path, n_id=5, n_ood=3, n_ambiguous=2)
  spec = dict(source="tfds", name="fi_imagenet_1k", split="id", data_dir=str(data_dir))
  return spec, id_labels.set_file_names(spec)


@pytest.mark.slow
def test_reimagenet_and_real_accuracy_and_dropping_ambiguous(tmp_path, monkeypatch):
  spec, names = _id_test_set(tmp_path)
  ids = [int(imagenet_val.VAL_ID_RE.search(n).group(1)) for n in names]
  assert ids == sorted(ids) and len(ids) == 5
  # ReImageNet: the first ID image ambiguous, the second with no ImageNet class
  label_of = {i: LABELS.index(WNIDS[i - 1]) for i in range(1, 11)}
  records = [{"file_path": fp(i), "labels": [] if i == ids[1] else [label_of[i], 3],
              "ambiguous": i == ids[0]} for i in range(1, 11)]
  path = write(tmp_path / "reannotation.jsonl", records)
  logits = np.zeros((5, 1000))
  logits[:, 3] = 1.0                                  # rows 0-2: argmax 3 (a valid label)
  logits[3, label_of[ids[3]]] = 2.0                   # row 3: its original label
  logits[4, 999] = 2.0                                # row 4: wrong
  arrays = {"logits": logits, "features": np.zeros((5, 2)), "label": np.zeros(5, np.int64)}
  # ReaL: TFDS's imagenet2012_real from the same fake val tar and a fake real.json (all 50,000)
  real = [[] for _ in range(imagenet_val.NUM_VAL)]
  for i in ids:
    real[i - 1] = [label_of[i]]
  manual = tmp_path / "manual"
  (manual / "real.json").write_text(json.dumps(real))
  url = next(u for u, info in tfds.builder_cls("imagenet2012_real").url_infos.items()
             if info.filename == "real.json")
  monkeypatch.setitem(tfds.builder_cls("imagenet2012_real").url_infos, url,
                      checksums.compute_url_info(manual / "real.json"))
  id_shift.prepare("imagenet2012_real", data_dir=spec["data_dir"], manual_dir=str(manual),
                   download_dir=str(tmp_path / "dl"))

  config = ml_collections.ConfigDict({"id_labels": dict(
      reimagenet=str(path), real=True, drop_ambiguous=False)})
  specs = {"id_test": spec}
  sets, meta = benchmark.reannotated_id(config, specs, {"id_test": arrays}, print)
  assert sets["id_test"] is arrays
  # ReImageNet: row 1 has no class (left out); hits rows 0, 2 (label 3), 3; miss row 4
  assert meta["id_label_accuracy"]["reimagenet"] == {"accuracy": 0.75, "n": 4}
  # ReaL: only row 3 predicts the original label
  assert meta["id_label_accuracy"]["real"] == {"accuracy": 0.2, "n": 5}

  config.id_labels.drop_ambiguous = True
  sets, meta = benchmark.reannotated_id(config, specs, {"id_test": arrays}, print)
  kept = sets["id_test"]
  assert meta["reannotation_dropped"] == 1
  assert kept["_id"].tolist() == [1, 2, 3, 4] and len(kept["logits"]) == 4
  assert meta["id_label_accuracy"]["reimagenet"] == {"accuracy": 2 / 3, "n": 3}
  assert meta["id_label_accuracy"]["real"] == {"accuracy": 0.25, "n": 4}

  config.id_labels.reimagenet = ""
  with pytest.raises(ValueError, match="drop_ambiguous needs config.id_labels.reimagenet"):
    benchmark.reannotated_id(config, specs, {"id_test": arrays}, print)


def test_preflight_finds_id_label_problems_before_any_extraction(tmp_path):
  spec = dict(source="tfds", name="fi_imagenet_1k", split="id", data_dir=str(tmp_path))
  bad = write(tmp_path / "bad.jsonl", ["{not json"])
  found = id_labels.problems(dict(reimagenet=str(bad), real=True), spec)
  assert len(found) == 2
  assert "reimagenet: " in found[0] and "line 1: not JSON" in found[0]
  assert "imagenet2012_real is not prepared" in found[1]
  assert id_labels.problems(dict(drop_ambiguous=True), spec)[0].startswith(
      "config.id_labels.drop_ambiguous needs")
  assert "must be a whole tfds split" in id_labels.problems(
      dict(reimagenet=str(bad)), dict(source="digits"))[0]
  assert id_labels.problems({}, spec) == []
