"""fi_jax.models.zoo: every PRETRAINED entry against torchvision's weights enums and timm's
pretrained configs (eval transform, classes, file), the defaults, names and errors, the
torchvision / timm-exact pp ops on real JPEGs, and from_pretrained on real-format files."""
import ast
import io
import math

import numpy as np
import pytest
import timm
import timm.data
import torch
import torchvision
from PIL import Image
from torchvision.models import get_model_weights

from fi_jax.data import preprocess
from fi_jax.models import zoo

TABLE = zoo.table()
TV = [n for n in TABLE if n.startswith("torchvision/")]
TIMM = [n for n in TABLE if n.startswith("timm/")]


def _ops(pp: str) -> dict[str, tuple]:
  out = {}
  for t in pp.split("|"):
    node = ast.parse(t, mode="eval").body
    if isinstance(node, ast.Name):
      out[node.id] = ()
    else:
      out[node.func.id] = tuple(ast.literal_eval(a) for a in node.args)
  return out


def _split(name):
  source, rest = name.split("/", 1)
  model, tag = rest.split(".", 1)
  return source, model, tag


def _tv_weights(name):
  _, model, tag = _split(name)
  return get_model_weights(model)[tag]


def _timm_cfg(name):
  _, model, tag = _split(name)
  cfg = timm.models.get_pretrained_cfg(f"{model}.{tag}").to_dict()
  return cfg, timm.data.resolve_data_config(pretrained_cfg=cfg)


_INTERP = {torchvision.transforms.InterpolationMode.BILINEAR: "bilinear",
           torchvision.transforms.InterpolationMode.BICUBIC: "bicubic"}


def test_torchvision_entries_equal_the_weights_enums():
  assert len(TV) >= 60
  for name in TV:
    e, w = TABLE[name], _tv_weights(name)
    t = w.transforms()
    ops = _ops(e["pp"])
    assert list(ops) == ["decode_pil", "resize_torchvision", "central_crop_torchvision",
                         "normalize"], name
    assert ops["resize_torchvision"] == (t.resize_size[0], _INTERP[t.interpolation]), name
    assert ops["central_crop_torchvision"] == (t.crop_size[0],), name
    np.testing.assert_allclose(ops["normalize"], (t.mean, t.std), err_msg=name)
    assert e["input_size"] == t.crop_size[0] and e["source"] == "torchvision", name
    assert e["num_classes"] == len(w.meta["categories"]) and e["url"] == w.url, name


def test_timm_entries_equal_the_pretrained_cfgs():
  assert len(TIMM) >= 100
  for name in TIMM:
    e, (cfg, dc) = TABLE[name], _timm_cfg(name)
    ops = _ops(e["pp"])
    assert list(ops) == ["decode_pil", "resize_timm", "central_crop_torchvision",
                         "normalize"], name
    size = dc["input_size"][1]
    assert dc["input_size"][1] == dc["input_size"][2], name
    assert ops["resize_timm"] == (size, dc["crop_pct"], dc["interpolation"],
                                  dc["crop_mode"]), name
    assert ops["central_crop_torchvision"] == (size,), name
    np.testing.assert_allclose(ops["normalize"], (dc["mean"], dc["std"]), err_msg=name)
    assert e["input_size"] == size and e["source"] == "timm", name
    assert e["num_classes"] == cfg["num_classes"], name
    if cfg.get("hf_hub_id"):
      assert e["url"] == (f"https://huggingface.co/{cfg['hf_hub_id']}/resolve/main/"
                          "model.safetensors"), name
    else:   # not on the hub (timm's legacy SENets): timm's own download URL
      assert e["url"] == cfg["url"], name


def test_defaults_are_the_libraries():
  for model, tag in zoo.TORCHVISION_DEFAULTS.items():
    assert get_model_weights(model).DEFAULT.name == tag, model
  for model, tag in zoo.TIMM_DEFAULTS.items():
    assert timm.models.get_pretrained_cfg(model).tag == tag, model
  # every model of the tables has its default recorded
  for name in TABLE:
    source, model, _ = _split(name)
    assert model in zoo._DEFAULTS[source], name


def test_names_and_defaults_resolve():
  assert set(zoo.names()) == set(TABLE)
  info = zoo.resolve("torchvision/resnet50")
  assert info["name"] == "torchvision/resnet50.IMAGENET1K_V2" and info["family"] == "resnet"
  assert info["pp"] == ("decode_pil|resize_torchvision(232, 'bilinear')|"
                        "central_crop_torchvision(224)|"
                        "normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))")
  assert info["model"] == {"num_classes": 1000, "variant": "resnet50"}
  assert info["mean"] == (0.485, 0.456, 0.406) and info["input_size"] == 224
  info = zoo.resolve("timm/convnext_tiny.fb_in22k_ft_in1k")
  assert (info["family"], info["source"], info["input_size"]) == ("convnext", "timm", 224)
  assert zoo.resolve("timm/convnext_tiny")["name"] == "timm/convnext_tiny.in12k_ft_in1k"
  info = zoo.resolve("torchvision/regnet_y_16gf.IMAGENET1K_SWAG_E2E_V1")
  assert info["input_size"] == 384 and "'bicubic'" in info["pp"]


@pytest.mark.parametrize("name,match", [
    ("torchvision/resnet51", r"Unknown torchvision model 'resnet51'.*resnet50"),
    ("timm/resnet50.a9_in1k", r"Unknown checkpoint 'timm/resnet50.a9_in1k'.*timm/resnet50.a1_in1k"),
    ("resnet50", r"must be 'torchvision/<model>"),
    ("keras/resnet50", r"must be 'torchvision/<model>"),
])
def test_unknown_names_list_close_matches(name, match):
  with pytest.raises(ValueError, match=match):
    zoo.resolve(name)


def test_missing_file_names_it_and_the_url(tmp_path):
  missing = str(tmp_path / "r50.pth")
  with pytest.raises(FileNotFoundError, match=r"r50\.pth.*https://download\.pytorch\.org/models/"
                     r"resnet50-0676ba61\.pth"):
    zoo.from_pretrained("torchvision/resnet50.IMAGENET1K_V1", missing)


# ----------------------------------------------------------------------------- pixels

def _smooth_image(rng, h, w):
  """A random smooth RGB image (upsampled noise + a gradient) with sharp-ish detail."""
  small = rng.uniform(0, 255, (max(h // 16, 2), max(w // 16, 2), 3))
  img = np.asarray(Image.fromarray(small.astype(np.uint8)).resize((w, h), Image.BICUBIC),
                   np.float32)
  img += rng.normal(0, 6, img.shape) + np.linspace(0, 40, w)[None, :, None]
  return np.clip(img, 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def jpegs():
  rng = np.random.default_rng(0)
  out = []
  for h, w in ((333, 500), (480, 360), (257, 256), (200, 317), (150, 120), (601, 413)):
    buf = io.BytesIO()
    Image.fromarray(_smooth_image(rng, h, w)).save(buf, "JPEG", quality=90)
    out.append(buf.getvalue())
  buf = io.BytesIO()   # a greyscale JPEG: convert("RGB") on both sides
  Image.fromarray(_smooth_image(rng, 300, 240)[..., 0]).save(buf, "JPEG")
  out.append(buf.getvalue())
  return out


def _fi_jax(pp, data):
  import tensorflow as tf  # heavy: only here
  fn = preprocess.get_preprocess_fn(pp)
  return fn({"image": tf.constant(data)})["image"].numpy()


def _grey(x, mean, std):
  """Normalised CHW / HWC tensor -> grey levels (0..255)."""
  return (x * np.asarray(std) + np.asarray(mean)) * 255.0


def _check_pixels(pp, reference, jpegs, mean, std):
  for data in jpegs:
    ref = reference(Image.open(io.BytesIO(data)).convert("RGB")).numpy().transpose(1, 2, 0)
    got = _fi_jax(pp, data)
    assert got.shape == ref.shape and got.dtype == np.float32
    diff = np.abs(_grey(got, mean, std) - _grey(ref, mean, std))
    assert diff.max() <= 0.01, (pp, diff.max())   # the same pixels (float error only)


@pytest.mark.parametrize("name", [
    "torchvision/resnet50.IMAGENET1K_V1", "torchvision/resnet50.IMAGENET1K_V2",
    "torchvision/swin_v2_t.IMAGENET1K_V1", "torchvision/regnet_y_16gf.IMAGENET1K_SWAG_E2E_V1",
    "torchvision/efficientnet_v2_l.IMAGENET1K_V1", "torchvision/efficientnet_b1.IMAGENET1K_V2"])
def test_torchvision_pp_pixels_equal_weights_transforms(name, jpegs):
  e, t = TABLE[name], _tv_weights(name).transforms()
  _check_pixels(e["pp"], t, jpegs, t.mean, t.std)


@pytest.mark.parametrize("name", [
    "timm/convnext_tiny.fb_in22k_ft_in1k", "timm/convnext_tiny.fb_in22k_ft_in1k_384",
    "timm/resnet50.a1_in1k", "timm/resnetv2_50x1_bit.goog_in21k_ft_in1k",
    "timm/swinv2_tiny_window8_256.ms_in1k", "timm/tf_efficientnetv2_m.in1k",
    "timm/tf_efficientnet_b3.ns_jft_in1k", "timm/resnet18.fb_ssl_yfcc100m_ft_in1k"])
def test_timm_pp_pixels_equal_create_transform(name, jpegs):
  e, (_, dc) = TABLE[name], _timm_cfg(name)
  t = timm.data.create_transform(**dc)
  _check_pixels(e["pp"], t, jpegs, dc["mean"], dc["std"])


def test_torchvision_resize_and_crop_rules(jpegs):
  import tensorflow as tf
  # output sizes: int(size * long / short), truncated; the short side already at size: as is
  assert preprocess.torchvision_resized_hw(333, 500, 256) == (256, 384)
  assert preprocess.torchvision_resized_hw(500, 333, 232) == (348, 232)
  assert preprocess.torchvision_resized_hw(256, 300, 256) == (256, 300)
  assert preprocess.timm_scale_size(224, 0.875) == 256 == math.floor(224 / 0.875)
  # centre crop: round half to even offsets, zero padding when the image is smaller
  img = np.arange(7 * 9 * 1, dtype=np.uint8).reshape(7, 9, 1)
  for crop in (4, (2, 6), (8, 12), 3):
    ref = torchvision.transforms.functional.center_crop(torch.from_numpy(img).permute(2, 0, 1),
                                                        list(np.broadcast_to(crop, 2)))
    got = preprocess.get_preprocess_fn(f"central_crop_torchvision({crop!r})")(
        {"image": tf.constant(img)})["image"].numpy()
    np.testing.assert_array_equal(got, ref.permute(1, 2, 0).numpy())
  # decode_pil|resize_torchvision equals PIL + torchvision Resize bit for bit
  for method, mode in (("bilinear", "BILINEAR"), ("bicubic", "BICUBIC")):
    ref = torchvision.transforms.Resize(
        100, getattr(torchvision.transforms.InterpolationMode, mode))(
            Image.open(io.BytesIO(jpegs[0])).convert("RGB"))
    got = _fi_jax(f"decode_pil|resize_torchvision(100, '{method}')", jpegs[0])
    np.testing.assert_array_equal(got, np.asarray(ref))
  with pytest.raises(ValueError, match="uint8"):
    preprocess.get_preprocess_fn("resize_torchvision(8)")({"image": tf.zeros((9, 9, 3))})
  with pytest.raises(ValueError, match="crop_mode"):
    preprocess.get_preprocess_fn("resize_timm(8, 0.9, 'bicubic', 'border')")


def test_every_default_is_in_the_tables():
  missing = [f"{s}/{m}.{t}" for s, d in zoo._DEFAULTS.items() for m, t in d.items()
             if f"{s}/{m}.{t}" not in TABLE]
  assert not missing


def test_docs_list_every_name():
  import pathlib
  docs = (pathlib.Path(__file__).parents[2] / "docs" / "models.md").read_text()
  assert zoo.names_markdown() in docs   # regenerate: print(zoo.names_markdown())


# ----------------------------------------------------------------------------- tags as data

def test_recorded_timm_tags_are_timms():
  """fi_jax/models/_timm_tags.py equals the installed timm's facts (regenerate with
  `python -m tests.helpers.timm_tags > fi_jax/models/_timm_tags.py`)."""
  from fi_jax.models import _timm_tags
  from tests.helpers import timm_tags
  assert _timm_tags.TIMM_VERSION == timm.__version__
  assert timm_tags.facts() == _timm_tags.TAGS
  assert timm_tags.default_tags() == _timm_tags.DEFAULT_TAGS


@pytest.mark.parametrize("tag", ["augreg_in1k", "orig_in21k_ft_in1k", "sam_in1k",
                                 "augreg2_in21k_ft_in1k"])
def test_every_tag_of_an_architecture_resolves(tag):
  info = zoo.resolve(f"timm/vit_base_patch16_224.{tag}")
  assert info["variant"] == "vit_base_patch16_224" and info["family"] == "vit"
  assert info["model"] == {"num_classes": 1000, "variant": "vit_base_patch16_224"}


def test_list_command_prints_every_name(capsys):
  from fi_jax.models.__main__ import main
  assert main(["list", "--family", "vit"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == sum(e["family"] == "vit" for e in TABLE.values())
  row = next(r for r in lines if "timm/vit_base_patch16_224_miil.in21k_ft_in1k " in r)
  assert "224 px" in row and "resize 256 (crop_pct 0.875) bilinear, crop 224" in row
  assert "mean (0.0, 0.0, 0.0) std (1.0, 1.0, 1.0)" in row
  assert any(r.startswith("* timm/vit_base_patch16_224.augreg2_in21k_ft_in1k ") for r in lines)
  with pytest.raises(SystemExit):
    main(["list", "--family", "nope"])


def test_a_file_that_does_not_fit_names_its_own_keys(tmp_path):
  """torchvision ResNet: the error names the file's key and shape, then the model's, and
  the download url of the named weights."""
  from torchvision.models.resnet import BasicBlock, ResNet
  sd = ResNet(BasicBlock, [1, 1, 2, 1], num_classes=10).state_dict()   # resnet18, shallower
  small = dict(depths=(1, 1, 2, 1), num_classes=10)
  path = str(tmp_path / "r18.pth")
  torch.save({k: v for k, v in sd.items() if k != "layer3.1.bn2.running_var"}, path)
  with pytest.raises(ValueError, match=r"missing from the file, first 'layer3\.1\.bn2\.running_var' "
                     r"\(the model's 'layer3_1/bn2/var'\).*https://download\.pytorch\.org/models/"
                     r"resnet18-f37072fd\.pth"):
    zoo.from_pretrained("torchvision/resnet18", path, **small)
  torch.save({**sd, "layer3.1.conv1.weight": torch.zeros(256, 128, 3, 3)}, path)
  with pytest.raises(ValueError, match=r"the file's 'layer3\.1\.conv1\.weight' of shape "
                     r"\(256, 128, 3, 3\): the model's 'layer3_1/conv1/kernel' needs "
                     r"\(3, 3, 256, 256\)"):
    zoo.from_pretrained("torchvision/resnet18", path, **small)
