"""Config values that used to reach a traceback, a cryptic line or a run with no rows are one
named error from fi_jax/run/validate.py, before anything loads (the CLI: one line, exit 2):
seeds outside what jax.random takes, huge batches, negative warmup / shift / decay, empty
detector or OOD lists, architectures whose width does not split into their heads (issue 34,
items 6-8)."""
import os
import subprocess
import sys
import time

import pytest

from configs import demo, siglip2, timm, torchvision, vit
from fi_jax.run import validate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _quick(**overrides):
  c = demo.get_config("quick")
  for k, v in overrides.items():
    node = c
    *parents, leaf = k.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = v
  return c


@pytest.mark.parametrize("overrides, msg", [
    ({"seed": -1}, r"config.seed must be an integer >= 0 \(what jax.random.PRNGKey takes: 0 "
     r"to 2\*\*63 - 1\), got -1"),
    ({"seed": 2 ** 64}, r"config.seed must be at most 9223372036854775807 \(what jax"),
    ({"batch_size": 2_000_000}, r"config.batch_size must be at most 65536 \(a bigger global "
     r"batch of images does not fit in memory\), got 2000000"),
    ({"train.batch_size": 2_000_000}, r"config.train.batch_size must be at most 65536"),
    ({"train.warmup_steps": -10}, r"config.train.warmup_steps must be an integer >= 0, got -10"),
    ({"train.augment_shift": -1}, r"config.train.augment_shift must be an integer >= 0 "
     r"\(pixels of random shift; 0 = none\), got -1"),
    ({"train.weight_decay": -1e-4}, r"config.train.weight_decay must be a number in \[0.0, inf\)"),
    ({"train.label_smoothing": 1.0}, r"config.train.label_smoothing must be a number in "
     r"\[0.0, 1.0\)"),
    ({"detectors": ()}, r"config.detectors is empty: a run needs at least one detector"),
    ({"ood": {}}, r"config.ood names no OOD set: a run needs at least one"),
    ({"model.num_heads": 3}, r"config.model: the width 64 does not split into num_heads=3 "
     r"equal attention heads"),
    ({"model.num_classes": -6}, r"config.model.num_classes must be an integer >= 0"),
    ({"model.depth": -2}, r"config.model.depth must be a positive integer"),
])
def test_bad_values_are_named_before_any_work(tmp_path, overrides, msg):
  with pytest.raises(ValueError, match=msg):
    validate.validate_config(_quick(**overrides), str(tmp_path / "w"))
  assert not os.path.exists(tmp_path / "w")   # the workdir is checked last


def test_edges_that_are_fine(tmp_path):
  validate.validate_config(_quick(**{"seed": 2 ** 63 - 1, "batch_size": 65536,
                                     "train.warmup_steps": 0, "train.augment_shift": 0}),
                           str(tmp_path / "w"))


@pytest.mark.parametrize("config, msg", [
    (lambda: vit.get_config("width=100,heads=12"), r"config.model: the width 100 does not "
     r"split into num_heads=12"),
    (lambda: vit.get_config("heads=7"), r"config.model: the width 768 .* num_heads=7"),
    (lambda: siglip2.get_config("heads=7"), r"config.model.image: the width 768 .* num_heads=7"),
    (lambda: _with(timm.get_config("name=swin_tiny_patch4_window7_224"), embed_dim=100),
     r"config.model: stage 0's width embed_dim \* 2\*\*0 = 100 does not split into "
     r"num_heads\[0\]=3"),
    (lambda: _with(torchvision.get_config("name=regnet_y_16gf"), group_widths=(9, 9, 9, 9)),
     r"config.model: stage 0's width 224 does not split into groups of group_widths\[0\]=9"),
    (lambda: _with(vit.get_config(""), variant="Q/16"), r"config.model does not build a vit "
     r"model: Unknown ViT variant 'Q/16'"),
])
def test_architectures_that_do_not_divide(tmp_path, config, msg):
  with pytest.raises(ValueError, match=msg):
    validate.validate_config(config(), str(tmp_path / "w"))


def _with(c, **model):
  for k, v in model.items():
    c.model[k] = v
  return c


@pytest.mark.parametrize("spec, msg", [
    (dict(source="digits", split="test", classes=()), r"ood/none: the digits spec selects no "
     r"example \(classes=\(\)\); name some of the digits 0-9"),
    (dict(source="digits", split="val", classes=(6,)), r"ood/none: digits split 'val'"),
])
def test_a_set_that_selects_nothing_fails_preflight(tmp_path, spec, msg):
  from fi_jax.run import benchmark as run
  c = _quick(ood={"none": spec})
  with pytest.raises(ValueError, match=msg):
    run.run(c, str(tmp_path / "w"), log=lambda s: None)
  assert not os.path.exists(tmp_path / "w" / "cache")   # nothing was extracted


def _main(*args):
  return subprocess.run([sys.executable, os.path.join(ROOT, "main.py"), *args], cwd=ROOT,
                        env={**os.environ, "PYTHONUNBUFFERED": "1"}, capture_output=True,
                        text=True, timeout=600)


@pytest.mark.parametrize("args, msg", [
    (["--config=configs/demo.py:quick", "--config.seed=-1"], "config.seed must be an integer "
     ">= 0 (what jax.random.PRNGKey takes: 0 to 2**63 - 1), got -1."),
    (["--config=configs/vit.py:heads=7,random_init=True"], "config.model: the width 768 does "
     "not split into num_heads=7"),
])
def test_cli_one_line_exit_2_before_anything_loads(tmp_path, args, msg):
  t = time.time()
  res = _main(*args, f"--workdir={tmp_path}/w")
  assert res.returncode == 2 and time.time() - t < 120, res.stderr[-3000:]
  lines = res.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(f"main.py: error: {msg}"), res.stderr
  assert not os.path.exists(tmp_path / "w")
