"""The files of the smoke sweep (configs/sweep.py:smoke,dir=FOLDER), written with random weights
by the libraries that publish such checkpoints:

  FOLDER/timm_vit_tiny.safetensors       a timm VisionTransformer (8x8 one-channel digits,
                                         patch 2, width 32, depth 2), saved by safetensors.torch
  FOLDER/torchvision_resnet_tiny.pth     a torchvision ResNet (BasicBlock, one block per stage,
                                         a one-channel stem), saved by torch.save
  FOLDER/features/{id_fit,id_test,digits_6-7,digits_8-9,head}.npz
                                         features of a fixed random projection of the digits'
                                         pixels (tanh(x/16 P), 16 dims), logits = features w + b
  FOLDER/broken_vit.safetensors          (with broken=True) the ViT file cut in half

Used by tests/run/test_sweep.py and bench/sweep.py. Import after the torchvision shim
(tests/conftest.py) is installed.
"""
from __future__ import annotations

import os

import numpy as np

from configs import sweep as sweep_config
from fi_jax.data import loader


def _vit(seed: int):
  import torch
  from timm.models import vision_transformer

  from tests.helpers.torch_reference import randomize_params
  v = sweep_config.SMOKE_VIT
  torch.manual_seed(seed)
  m = vision_transformer.VisionTransformer(
      img_size=8, patch_size=v["patch_size"][0], in_chans=1, embed_dim=v["width"],
      depth=v["depth"], num_heads=v["num_heads"], mlp_ratio=v["mlp_dim"] / v["width"],
      num_classes=v["num_classes"], global_pool="token", class_token=True)
  return randomize_params(m, seed)


def _resnet(seed: int):
  import torch
  import torchvision

  from tests.helpers.torch_reference import perturb_norms
  r = sweep_config.SMOKE_RESNET
  torch.manual_seed(seed)
  m = torchvision.models.ResNet(torchvision.models.resnet.BasicBlock, list(r["depths"]),
                                num_classes=r["num_classes"])
  m.conv1 = torch.nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)
  return perturb_norms(m, seed, linear_weights=True)


def _features(folder: str, seed: int) -> None:
  os.makedirs(folder, exist_ok=True)
  rng = np.random.default_rng(seed)
  proj = rng.normal(0, 1, (64, 16))
  w = rng.normal(0, 1 / 4, (16, len(sweep_config.SMOKE_ID)))
  b = rng.normal(0, 0.1, len(sweep_config.SMOKE_ID))
  np.savez(os.path.join(folder, "head.npz"), w=w.astype(np.float32), b=b.astype(np.float32))
  for name, spec in sweep_config.smoke_sets().items():
    if name not in ("id_fit", "id_test", "ood"):
      continue
    specs = spec if name == "ood" else {name: spec}
    for set_name, s in specs.items():
      a = loader.load_digits_split(s["split"], s["classes"], id_classes=s.get("id_classes"))
      f = np.tanh(a["image"].reshape(len(a["image"]), -1) / 16 @ proj).astype(np.float32)
      np.savez(os.path.join(folder, f"{set_name}.npz"), features=f,
               logits=(f @ w + b).astype(np.float32), label=a["label"], group=a["group"])


def write(folder: str, broken: bool = False, seed: int = 0) -> str:
  """Writes the smoke sweep's files into `folder`; returns it."""
  from tests.helpers.torch_reference import save_state_dict
  os.makedirs(folder, exist_ok=True)
  files = sweep_config.SMOKE_FILES
  vit_path = save_state_dict(_vit(seed), os.path.join(folder, files["vit"]))
  save_state_dict(_resnet(seed + 1), os.path.join(folder, files["resnet"]))
  _features(os.path.join(folder, files["features"]), seed + 2)
  if broken:
    with open(vit_path, "rb") as f:
      data = f.read()
    with open(os.path.join(folder, files["broken"]), "wb") as f:
      f.write(data[:len(data) // 2])
  return folder
