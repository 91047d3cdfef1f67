"""End to end: configs/torchvision.py and configs/timm.py on tiny stand-ins of published
checkpoints (the reference library's own state_dict, in the real file format, at reduced
depth / width) and a fake Fi-ImageNet-1k built by tfds_fi_imagenet, through `run.run`.

The stand-ins are also loaded with `zoo.from_pretrained` and compared with the reference's
eval-mode forward (logits and pre_logits)."""
import json
import os

import numpy as np
import pytest
import timm
import torch
import torchvision
from safetensors.torch import save_file

from configs import timm as timm_config
from configs import torchvision as tv_config
from fi_jax.models import zoo
from fi_jax.run import benchmark as run
from tests.helpers.torch_reference import perturb_norms
from tfds_fi_imagenet import testing

pytestmark = pytest.mark.slow   # ~1 min on two cores: two 224 px models over ~60 images each


def _perturb_bn(model, seed=0):
  return perturb_norms(model, seed)


@pytest.fixture(scope="module")
def standins(tmp_path_factory):
  """{zoo name: (file, Model overrides, reference torch module)}."""
  d = tmp_path_factory.mktemp("ckpt")
  torch.manual_seed(0)
  r = _perturb_bn(torchvision.models.ResNet(torchvision.models.resnet.BasicBlock, [1, 1, 1, 1]))
  r_path = str(d / "resnet18-f37072fd.pth")
  torch.save(r.state_dict(), r_path)
  c = timm.create_model("convnext_tiny", pretrained=False, depths=(1, 1, 1, 1),
                        dims=(8, 16, 32, 64)).eval()
  for blk in c.modules():   # layer scales away from their 1e-6 init
    if hasattr(blk, "gamma") and isinstance(blk.gamma, torch.nn.Parameter):
      blk.gamma.data.uniform_(0.5, 1.5)
  c_path = str(d / "model.safetensors")
  save_file({k: v.contiguous() for k, v in c.state_dict().items()}, c_path)
  return {
      "torchvision/resnet18.IMAGENET1K_V1": (r_path, dict(depths=(1, 1, 1, 1)), r),
      "timm/convnext_tiny.fb_in22k_ft_in1k": (c_path, dict(depths=(1, 1, 1, 1),
                                                           dims=(8, 16, 32, 64)), c),
  }


def test_from_pretrained_equals_the_reference(standins):
  x = np.random.default_rng(0).normal(0, 1, (2, 64, 64, 3)).astype(np.float32)
  for name, (path, overrides, ref) in standins.items():
    model, params, info = zoo.from_pretrained(name, path, **overrides)
    assert info["name"] == name and info["model"]["variant"] in name
    logits, out = model.apply({"params": params}, x)
    with torch.inference_mode():
      xt = torch.from_numpy(x).permute(0, 3, 1, 2)
      if name.startswith("timm/"):
        feats = ref.forward_head(ref.forward_features(xt), pre_logits=True)
        ref_logits = ref.forward_head(ref.forward_features(xt))
      else:
        ref_logits = ref(xt)
        feats = torch.flatten(ref.avgpool(ref.layer4(ref.layer3(ref.layer2(ref.layer1(
            ref.maxpool(ref.relu(ref.bn1(ref.conv1(xt))))))))), 1)
    np.testing.assert_allclose(out["pre_logits"], feats.numpy(), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(logits, ref_logits.numpy(), atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def fake_data_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("fi")
  return str(testing.make_fake_fi_imagenet(root, n_id=16, n_ood=8, n_ambiguous=2,
                                           image_size=48))


@pytest.mark.slow
@pytest.mark.parametrize("config,name", [(tv_config, "resnet18.IMAGENET1K_V1"),
                                         (timm_config, "convnext_tiny.fb_in22k_ft_in1k")])
def test_zoo_config_runs_the_benchmark(config, name, standins, fake_data_dir, tmp_path):
  source = "timm" if config is timm_config else "torchvision"
  path, overrides, _ = standins[f"{source}/{name}"]
  c = config.get_config(f"name={name},ckpt={path},data_dir={fake_data_dir},"
                        "ood=fi_imagenet_1k,batch_size=8")
  c.model.update(overrides)   # the stand-in's reduced depth / width
  # no fake imagenet2012 train: fit the detectors on the fake `id` split
  c.id_fit = dict(source="tfds", name="fi_imagenet_1k", split="id", data_dir=fake_data_dir)
  c.detector_hparams = {"knn": {"k": 3}}
  results = run.run(c, str(tmp_path), log=lambda s: None)
  assert results["meta"]["set_sizes"] == {"id_fit": 16, "id_test": 16, "ood/fi_imagenet_1k": 8}
  # every detector ran; 16 fit images and a random model: some cannot fit (no correctly
  # classified row, too few rows or dimensions for their defaults), each failing alone with its
  # reason; on these noise images some give scores that rank nothing (LINE and Relation a
  # constant; others a spread within float32 rounding), reported as degenerate, never as 50.00
  errors = results["meta"]["detector_errors"]
  degenerate = {f["detector"] for f in results["failed"] if f["status"] == "degenerate"}
  assert set(errors) - degenerate <= {"she", "nnguide", "openmax", "neco", "cfood", "grood"}, errors
  assert {"line", "relation"} <= degenerate, errors
  assert all(errors[d].startswith(f"degenerate: {d}: its scores take ") for d in degenerate)
  assert {r["detector"] for r in results["rows"]} | set(errors) == set(c.detectors)
  assert len(results["rows"]) == len(c.detectors) - len(errors) >= 15
  for r in results["rows"]:
    assert r["model"] == f"{source}/{name}" and r["ood_set"] == "fi_imagenet_1k"
    assert r["n_id"] == 16 and r["n_ood"] == 8 and 0 <= r["auroc"] <= 1
  with open(os.path.join(tmp_path, "results.json")) as f:
    saved = json.load(f)
  assert saved["meta"]["config"]["pp"] == zoo.resolve(f"{source}/{name}")["pp"]
  assert [r["auroc"] for r in saved["rows"]] == [r["auroc"] for r in results["rows"]]
