"""Every shipped config builds, and its pieces exist (model module, pp ops, detectors)."""
import importlib

import pytest

from fi_jax import detectors, preprocess, run

CONFIGS = ["demo", "vit", "siglip2", "clip", "dinov2", "torchvision", "timm"]


@pytest.mark.parametrize("name", CONFIGS)
def test_config_is_complete(name):
  c = importlib.import_module(f"configs.{name}").get_config()
  run.model_module(c.model_name)                 # the model family exists
  preprocess.get_preprocess_fn(c.pp)             # the pp string parses
  run.build_detectors(c)                         # every detector and hparam is valid
  assert set(c.detectors) <= set(detectors.names())
  assert {"id_fit", "id_test"} <= set(run.set_specs(c)) and c.ood


def test_config_args_and_errors():
  from configs import vit
  c = vit.get_config("ood=fi_imagenet_1k+ninco,fit_per_class=10,odin")
  assert sorted(c.ood) == ["fi_imagenet_1k", "ninco"]
  assert c.id_fit.per_class == 10 and "odin" in c.detectors
  assert c.ood.fi_imagenet_1k.split == "ood" and c.id_test.split == "id"
  with pytest.raises(ValueError, match="Unknown config argument 'nope'"):
    vit.get_config("nope=1")


def test_zoo_configs_take_names_with_and_without_tags():
  from configs import timm, torchvision
  c = torchvision.get_config("name=resnet50,ckpt=/x/r50.pth,ood=ninco")
  assert (c.model_name, c.model_label) == ("resnet", "torchvision/resnet50.IMAGENET1K_V2")
  assert c.model.to_dict() == {"num_classes": 1000, "variant": "resnet50"}
  assert c.model_init == "/x/r50.pth" and tuple(c.init_shape) == (1, 224, 224, 3)
  assert "resize_torchvision(232, 'bilinear')" in c.pp and list(c.ood) == ["ninco"]
  c = torchvision.get_config("name=regnet_y_16gf.IMAGENET1K_SWAG_E2E_V1,dtype=bfloat16")
  assert tuple(c.init_shape) == (1, 384, 384, 3) and c.model.dtype == "bfloat16"
  c = timm.get_config("name=swin_tiny_patch4_window7_224")
  assert c.model_label == "timm/swin_tiny_patch4_window7_224.ms_in1k" and c.model_name == "swin"
  assert tuple(c.input_std) == (0.229, 0.224, 0.225)
  with pytest.raises(ValueError, match="Unknown timm model 'convnext_tinyy'.*convnext_tiny"):
    timm.get_config("name=convnext_tinyy")
