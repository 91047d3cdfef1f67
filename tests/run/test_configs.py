"""Every shipped config builds, and its pieces exist (model module, pp ops, detectors)."""
import importlib

import pytest

from fi_jax import detectors
from fi_jax.data import preprocess
from fi_jax.run import benchmark as run
from fi_jax.run import model as run_model

CONFIGS = ["demo", "vit", "siglip2", "clip", "dinov2", "torchvision", "timm", "clip_demo",
           "pe_core"]


@pytest.mark.parametrize("name", CONFIGS)
def test_config_is_complete(name):
  c = importlib.import_module(f"configs.{name}").get_config()
  run_model.model_module(c.model_name)                 # the model family exists
  preprocess.get_preprocess_fn(c.pp)             # the pp string parses
  run.config_detectors(c)                         # every detector and hparam is valid
  assert set(c.detectors) <= set(detectors.names())
  assert {"id_fit", "id_test"} <= set(run.config_specs(c)) and c.ood


def test_zero_shot_detectors_only_for_two_tower_configs():
  from configs import clip, clip_demo, demo, siglip2, vit
  zero_shot = {"neglabel", "csp", "glmcm"}
  assert {"neglabel", "csp"} <= set(clip.get_config().detectors) - {"glmcm"}
  assert zero_shot <= set(clip.get_config("layer_detectors").detectors)
  assert {"neglabel", "csp"} <= set(siglip2.get_config().detectors)
  assert "glmcm" not in siglip2.get_config("layer_detectors").detectors
  assert not zero_shot & set(vit.get_config("layer_detectors").detectors)
  # the demo: every detector that applies to its one-tower ViT
  assert set(demo.get_config().detectors) == set(detectors.names()) - zero_shot
  assert zero_shot <= set(clip_demo.get_config().detectors)
  from configs import pe_core
  assert zero_shot <= set(pe_core.get_config("layer_detectors").detectors)
  c = pe_core.get_config("name=PE-Core-G14-448,res=224")
  assert (c.model.variant, c.model.image_size, tuple(c.init_shape)) == ("G/14", 224, (1, 224, 224, 3))
  assert c.pp.startswith("decode_pil|resize_torchvision((224, 224), 'bilinear')")
  with pytest.raises(ValueError, match="Unknown PE-Core release.*huggingface.co/facebook"):
    pe_core.get_config("name=PE-Core-X")


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


def test_architecture_args_reach_the_model():
  from configs import clip, dinov2, siglip2, timm, torchvision, vit
  arch = "width=64,depth=3,heads=2,mlp_dim=96,patch=8"
  want = dict(width=64, depth=3, num_heads=2, mlp_dim=96)
  c = vit.get_config(f"{arch},res=96")
  assert {k: c.model[k] for k in want} == want and tuple(c.model.patch_size) == (8, 8)
  assert tuple(c.init_shape) == (1, 96, 96, 3) and "resize(96)" in c.pp
  run_model.model_module(c.model_name).Model(**c.model.to_dict())   # the kwargs are the Model's
  c = siglip2.get_config(f"{arch},res=128")
  assert {k: c.model.image[k] for k in want} == want and c.model.image.variant == "B/16"
  assert tuple(c.init_shape) == (1, 128, 128, 3) and "resize(128)" in c.pp
  c = clip.get_config(f"{arch},res=160")
  assert {k: c.model.image[k] for k in want} == want and c.model.image.patch_size == 8
  assert c.model.image_size == 160 and tuple(c.init_shape) == (1, 160, 160, 3)
  assert "resize_small(160," in c.pp and "central_crop(160)" in c.pp
  c = dinov2.get_config(f"{arch},res=112")
  assert {k: c.model[k] for k in want} == want and c.model.patch_size == 8
  assert tuple(c.init_shape) == (1, 112, 112, 3)
  assert "resize_small(128," in c.pp and "central_crop(112)" in c.pp
  assert dinov2.get_config("").pp == dinov2.releases.DINOV2_PP
  c = torchvision.get_config("name=resnet50,res=160,dtype=bfloat16")
  assert tuple(c.init_shape) == (1, 160, 160, 3) and c.model.dtype == "bfloat16"
  assert "resize_torchvision(166, 'bilinear')|central_crop_torchvision(160)" in c.pp  # 232/224
  c = timm.get_config("name=convnext_tiny.fb_in22k_ft_in1k,res=256")
  assert "resize_timm(256," in c.pp and "central_crop_torchvision(256)" in c.pp
  assert timm.get_config("").pp == timm.get_config("res=0").pp


def test_labels_are_short_and_meta_names_the_checkpoint_loaded(tmp_path):
  """The default label is the family and the model (fi_jax/common/labels.py), the same
  whatever file is loaded; results meta names the file."""
  import hashlib

  from configs import clip, dinov2, siglip2, vit
  from fi_jax.common.labels import short_label
  path = tmp_path / "B_16-i21k-300ep-res_224.npz"
  path.write_bytes(b"x" * 3000)
  c = vit.get_config(f"ckpt={path}")
  assert run_model.model_label(c) == "vit-B16"
  (m,) = run_model.checkpoint_meta(c)
  assert (m["path"], m["bytes"]) == (str(path), 3000)
  assert m["sha256_first_mib"] == hashlib.sha256(b"x" * 3000).hexdigest() and m["mtime"]
  c.model_label = "mine"
  assert run_model.model_label(c) == "mine"                      # an explicit label wins
  assert run_model.model_label(vit.get_config("random_init=True")) == "vit-B16-random-init"
  assert run_model.model_label(vit.get_config("variant=L/16,ckpt=x.npz")) == "vit-L16"
  assert run_model.model_label(siglip2.get_config("release=siglip2_b16_224")) == "siglip2_b16_224"
  hub = tmp_path / "vit_base_patch16_clip_224.openai"
  hub.mkdir()
  c = clip.get_config(f"ckpt={hub / 'open_clip_model.safetensors'}")
  assert run_model.model_label(c) == "clip-openai-B16"
  c = clip.get_config("name=openai-L/14@336,ckpt=x.safetensors")
  assert run_model.model_label(c) == "clip-openai-L14-336"   # no '@': compare's LABEL@WORKDIR
  c = dinov2.get_config("ckpt=/x/dinov2_vitb14_reg4_pretrain.pth,head=/x/h.pth,registers=4")
  assert run_model.model_label(c) == "dinov2-B14-reg4"
  assert run_model.checkpoint_meta(c) == [{"path": "/x/dinov2_vitb14_reg4_pretrain.pth", "exists": False},
                                    {"path": "/x/h.pth", "exists": False}]
  c.model_label = ""   # a config without a label: the same rule on the family and variant
  assert run_model.model_label(c) == "dinov2-B14"
  assert short_label("a b", "(x)", "y:z") == "a-b-x-y-z"
