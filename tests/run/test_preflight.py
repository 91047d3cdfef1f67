"""Preflight in the first hour: a failed one leaves no workdir, a missing published checkpoint
says where to download it (issue 33)."""
import os
import subprocess
import sys

import pytest

from configs import timm, torchvision, vit
from fi_jax.run import benchmark as run
from fi_jax.run import preflight

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("workdir", ["wd", "a/b/wd"])
def test_a_failed_preflight_leaves_no_workdir(tmp_path, workdir):
  c = vit.get_config(f"ckpt={tmp_path}/nope.npz,data_dir={tmp_path}/tfds,ood=ninco")
  with pytest.raises(preflight.PreflightError):
    run.run(c, str(tmp_path / workdir), log=lambda s: None)
  assert sorted(os.listdir(tmp_path)) == []


def test_a_failed_preflight_keeps_an_existing_workdir_as_it_was(tmp_path):
  (tmp_path / "wd").mkdir()
  (tmp_path / "wd" / "notes.txt").write_text("mine")
  c = vit.get_config(f"ckpt={tmp_path}/nope.npz,data_dir={tmp_path}/tfds,ood=ninco")
  with pytest.raises(preflight.PreflightError):
    run.run(c, str(tmp_path / "wd"), log=lambda s: None)
  assert os.listdir(tmp_path / "wd") == ["notes.txt"]


def test_main_py_leaves_no_workdir_after_a_failed_preflight(tmp_path):
  res = subprocess.run(
      [sys.executable, os.path.join(ROOT, "main.py"),
       f"--config=configs/vit.py:data_dir={tmp_path}/tfds,ood=ninco,random_init=True",
       f"--workdir={tmp_path}/a/wd"], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert res.returncode == 2 and "preflight found" in res.stderr, res.stderr[-2000:]
  assert os.listdir(tmp_path) == []


def test_missing_torchvision_checkpoint_points_to_download_pytorch_org(tmp_path):
  c = torchvision.get_config(f"name=resnet50,ckpt={tmp_path}/r50.pth")
  problems = preflight.check_model(c)
  assert len(problems) == 1
  assert f"checkpoint {tmp_path}/r50.pth does not exist" in problems[0]
  assert "https://download.pytorch.org/models/resnet50-11ad3fa6.pth" in problems[0]


def test_missing_timm_checkpoint_points_to_its_hub_file(tmp_path):
  problems = preflight.check_model(timm.get_config(f"ckpt={tmp_path}/m.safetensors"))
  assert len(problems) == 1 and "https://huggingface.co/timm/" in problems[0]


def test_other_missing_checkpoints_list_download_pytorch_org_too(tmp_path):
  problems = preflight.check_model(vit.get_config(f"ckpt={tmp_path}/model.pth"))
  assert len(problems) == 1 and "https://download.pytorch.org/models/" in problems[0]
  assert "gs://big_vision/" in problems[0]
