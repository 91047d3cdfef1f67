"""End to end on Fi-ImageNet-1k: build it from a fake val tar + lists (real formats), read it through
fi_jax's input pipeline, run a demo-sized model over `id` and `ood`, and get a report."""
import csv
import json
import os

import ml_collections
import numpy as np
import pytest

from fi_jax.data import loader as data
from fi_jax.data import preprocess
from fi_jax.run import benchmark as run
from tfds_fi_imagenet import testing

PP = "decode|resize(16)|value_range(-1, 1)"


@pytest.fixture(scope="module")
def fake_data_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("fi")
  return str(testing.make_fake_fi_imagenet(root, n_id=24, n_ood=10, n_ambiguous=4,
                                           image_size=16))


def _spec(data_dir, split, **kw):
  return dict(source="tfds", name="fi_imagenet_1k", split=split, data_dir=data_dir, **kw)


def test_input_pipeline_reads_every_split(fake_data_dir):
  fn = preprocess.get_preprocess_fn(PP)
  for split, n, kw in [("id", 24, {}), ("ood", 10, dict(label_key=None, group_key="ood_class_id")),
                       ("ambiguous", 4, {})]:
    for pc in (1, 2):
      ids, groups = [], []
      for pi in range(pc):
        it, _, info = data.batches(_spec(fake_data_dir, split, **kw), fn, 4 * pc,
                                   process_index=pi, process_count=pc)
        for b in it:
          assert b["image"].shape == (4, 16, 16, 3) and b["image"].dtype == np.float32
          ids += b["_id"][b["_mask"]].tolist()
          if split == "ood":
            assert (b["label"][b["_mask"]] == -1).all()   # OOD: no ImageNet class
            groups += b["group"][b["_mask"]].tolist()     # the OOD class id; -1 if unnamed
          if split == "id":
            assert ((b["label"][b["_mask"]] >= 0) & (b["label"][b["_mask"]] < 1000)).all()
      assert sorted(ids) == list(range(n)) and info.num_examples == n
      if split == "ood":
        assert max(groups) >= 0


def test_per_class_subset_is_n_per_class_in_total(fake_data_dir):
  fn = preprocess.get_preprocess_fn(PP)
  labels = []
  for pi in range(2):
    it, _, _ = data.batches(_spec(fake_data_dir, "id", per_class=1), fn, 8, process_index=pi,
                            process_count=2)
    labels += [int(l) for b in it for l in b["label"][b["_mask"]]]
  assert len(labels) == len(set(labels)) > 0      # one image per class over both processes


@pytest.mark.slow
def test_pipeline_report_on_fake_fi_imagenet(fake_data_dir, tmp_path):
  c = ml_collections.ConfigDict(dict(
      seed=0, model_name="vit", model_label="vit-tiny-random",
      model=dict(num_classes=1000, patch_size=(4, 4), width=32, depth=1, mlp_dim=64,
                 num_heads=2, pool_type="gap", head_zeroinit=False),   # zero head: constant MSP
      model_init="", init_shape=(1, 16, 16, 3), train={}, pp=PP, batch_size=8,
      id_name="fi_imagenet_1k/id", id_fit=_spec(fake_data_dir, "id"),
      id_test=_spec(fake_data_dir, "id"),
      ood={"fi_imagenet_1k": _spec(fake_data_dir, "ood", label_key=None,
                                   group_key="ood_class_id")},
      detectors=("msp", "energy", "knn", "odin"), detector_preset="ninco",
      detector_hparams={"knn": {"k": 3}}, metrics=dict(n_bootstrap=20),
      input_std=(0.5, 0.5, 0.5), x64=True, cache=True, random_init=True))
  results = run.run(c, str(tmp_path), log=lambda s: None)
  assert results["meta"]["set_sizes"] == {"id_fit": 24, "id_test": 24, "ood/fi_imagenet_1k": 10}
  assert [r["detector"] for r in results["rows"]] == ["msp", "energy", "knn", "odin"]
  for r in results["rows"]:
    assert r["ood_set"] == "fi_imagenet_1k" and r["n_id"] == 24 and r["n_ood"] == 10
    assert 0 <= r["auroc"] <= 1 and "auroc_macro" in r and r["n_ood_groups"] >= 1
  with open(os.path.join(tmp_path, "results.json")) as f:
    saved = json.load(f)["rows"]
  assert [r["auroc"] for r in saved] == [r["auroc"] for r in results["rows"]]
  with open(os.path.join(tmp_path, "per_class", "fi_imagenet_1k", "knn.csv")) as f:
    per_class = list(csv.reader(f))
  assert per_class[0][:4] == ["group", "class", "predicted_as", "predicted_share"]
  assert {r[1] for r in per_class[1:]} <= set(testing.FAKE_OOD_CLASSES) and len(per_class) > 1
  assert all(r[2] for r in per_class[1:])                 # an ImageNet class name
  with open(os.path.join(tmp_path, "results.md")) as f:
    assert "### fi_imagenet_1k: per OOD class" in f.read()
  assert os.path.exists(os.path.join(tmp_path, "results.md"))
