"""Small runs stay small: a per-class fit set (`per_class`, the configs' fit_per_class) of a
split with fewer classes or images than asked is planned at the size it really has, and
preflight says so with the numbers; README's tiny stand-in route does exactly that with a real
config (issue 33)."""
import math
import os
import re
import shlex

import numpy as np
import pytest

from fi_jax import pipeline
from fi_jax.data import loader as data
from fi_jax.data import preprocess
from fi_jax.extract import cache
from fi_jax.run import benchmark as run
from fi_jax.run import command, preflight
from tfds_fi_imagenet import standin, subsets

PP = "decode|resize(16)|value_range(-1, 1)"
N_CLASSES, PER_CLASS = 20, 10   # of imagenet2012's 1000 classes


def _readme_standin_route():
  """(the standin command's arguments, main.py's --config spec, --workdir, the `id_fit: ...`
  plan line README quotes) of README's "No data yet?" block, with $S left in."""
  with open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")) as f:
    text = f.read()
  block = next(b.split("```", 1)[0] for b in text.split("```bash")[1:]
               if "tfds_fi_imagenet.standin" in b.split("```", 1)[0])
  after = text.split(block, 1)[1]
  plan = re.search(r"`(id_fit: \d+ examples, \d+ batches of \d+)`", after).group(1)
  standin_args = config = workdir = None
  for line in block.replace("\\\n", " ").splitlines():
    words = shlex.split(line.split("#", 1)[0])
    if words[:3] == ["python", "-m", "tfds_fi_imagenet.standin"]:
      standin_args = words[3:]
    if words[:2] == ["python", "main.py"]:
      config = next(w.split("=", 1)[1] for w in words if w.startswith("--config="))
      workdir = next(w.split("=", 1)[1] for w in words if w.startswith("--workdir="))
  assert standin_args and config and workdir, block
  return standin_args, config, workdir, plan


@pytest.fixture(scope="module")
def readme_standin(tmp_path_factory):
  """README's stand-in data, built by README's own command into a fresh $S:
  ($S, the route's main.py --config spec, its --workdir, the plan line README quotes)."""
  standin_args, spec, workdir, plan = _readme_standin_route()
  s = str(tmp_path_factory.mktemp("standin"))
  args = [a.replace("$S", s) for a in standin_args]
  assert standin.main(args) == 0
  opts = standin.parser().parse_args(args)
  assert (opts.classes, opts.per_class) == (N_CLASSES, PER_CLASS)   # what the tests here count
  return s, opts.data_dir, spec.replace("$S", s), workdir.replace("$S", s), plan


@pytest.fixture(scope="module")
def imagenet_dir(readme_standin):
  """The imagenet2012 stand-in built by the project's builder: 20 classes x 10 images."""
  return readme_standin[1]


def _spec(data_dir, split="train", **kw):
  return dict(source="tfds", name="imagenet2012", split=split, data_dir=data_dir, **kw)


@pytest.mark.parametrize("per_class, total", [(10, 200), (15, 200), (4, 80)])
def test_counts_and_batches_are_what_the_split_has(imagenet_dir, per_class, total):
  spec = _spec(imagenet_dir, per_class=per_class)
  counts = data.per_class_counts(spec)
  assert counts.shape == (1000,) and counts.sum() == total
  assert (counts[:N_CLASSES] == min(per_class, PER_CLASS)).all() and not counts[N_CLASSES:].any()
  it, steps, info = data.batches(spec, preprocess.get_preprocess_fn(PP), 64)
  batches = list(it)
  assert info.num_examples == total and steps == len(batches) == math.ceil(total / 64)
  labels = np.concatenate([b["label"][b["_mask"]] for b in batches])
  assert len(labels) == total
  assert np.bincount(labels, minlength=N_CLASSES).tolist() == [min(per_class, PER_CLASS)] * 20


def test_two_processes_share_the_real_count(imagenet_dir):
  spec = _spec(imagenet_dir, per_class=10)
  fn = preprocess.get_preprocess_fn(PP)
  parts = [data.batches(spec, fn, 64, process_index=p, process_count=2) for p in range(2)]
  assert [info.num_examples_per_process for _, _, info in parts] == [[100, 100]] * 2
  assert {steps for _, steps, _ in parts} == {math.ceil(100 / 32)}
  ids = [i for it, _, _ in parts for b in it for i in b["_id"][b["_mask"]]]
  assert len(ids) == len(set(ids)) == 200


def test_per_class_available_stops_once_every_class_is_full():
  import tensorflow as tf
  labels = [0, 1, 0, 1, 2, 2, 0, 5, 7]
  ds = tf.data.Dataset.from_tensor_slices({"label": np.array(labels, np.int64)})
  assert subsets.per_class_available(ds, 2, 3, chunk=2).tolist() == [2, 2, 2]
  assert subsets.per_class_available(ds, 2, 8).tolist() == [2, 2, 2, 0, 0, 1, 0, 1]
  assert subsets.per_class_subset_counts(10, 1000, 3, total=200) == [67, 67, 66]


def test_preflight_says_how_many_classes_and_images_there_are(imagenet_dir):
  specs = {"id_fit": _spec(imagenet_dir, per_class=10), "id_test": _spec(imagenet_dir)}
  assert preflight.check_sets(specs) == []
  assert preflight.notes(specs) == [
      "id_fit: per_class=10 asks for 10 images of each of 1000 classes (10000); imagenet2012 "
      "train has 20 of the 1000 classes (980 with fewer than 10 images): the run uses the "
      "200 it has."]


@pytest.mark.slow
def test_the_readme_standin_route_plans_and_extracts_only_real_examples(readme_standin):
  """README's tiny stand-in route replayed: the stand-ins built by its command, its real
  config run on them (the ViT shrunk to one narrow block and two detectors, to stay quick):
  preflight says what the subset has, and the fit set is planned and extracted at the 100
  real images (20 classes x fit_per_class=5), never 5 x 1000."""
  _, _, spec, workdir, plan = readme_standin
  c = command.load_config(spec + ",width=32,depth=1,heads=2,mlp_dim=64")
  assert c.random_init and c.id_fit.per_class == 5
  c.detectors = ("msp", "knn")
  logs = []
  results = run.run(c, workdir, log=logs.append)
  text = "\n".join(logs)
  sizes = results["meta"]["set_sizes"]
  assert sizes == {"id_fit": 100, "id_test": 40, "ood/fi_imagenet_1k": 20}
  assert plan in text and plan == "id_fit: 100 examples, 1 batches of 256"   # README's quote
  assert ("id_fit: per_class=5 asks for 5 images of each of 1000 classes (5000); imagenet2012 "
          "train has 20 of the 1000 classes (980 with fewer than 5 images): the run uses the "
          "100 it has.") in text
  assert text.index("asks for 5 images") < text.index(plan)   # said before any compute
  dets = run.config_detectors(c)
  fit = cache.load(run.set_path(c, workdir, "id_fit", run.config_specs(c)["id_fit"],
                                pipeline.set_columns(dets, "id_fit")))
  assert len(fit["logits"]) == 100   # the extracted rows: the real images, no padding
  assert np.bincount(fit["label"], minlength=1000).tolist() == [5] * 20 + [0] * 980
  assert {r["detector"] for r in results["rows"]} | {f["detector"] for f in results["failed"]} \
      == {"msp", "knn"}
