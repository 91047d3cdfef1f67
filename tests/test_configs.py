"""Every shipped config builds, and its pieces exist (model module, pp ops, detectors)."""
import importlib

import pytest

from fi_jax import detectors, preprocess, run

CONFIGS = ["demo", "vit", "siglip2", "clip", "dinov2"]


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
