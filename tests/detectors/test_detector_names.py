"""fi_jax.common.detector_names (read before JAX starts) says what the REGISTRY says."""
from configs import common
from fi_jax import detectors
from fi_jax.common import detector_names


def test_names_are_the_registry_in_order():
  assert detector_names.NAMES == tuple(detectors.names())


def test_needs_and_families_match_the_classes():
  reg = detectors.REGISTRY
  assert detector_names.INPUT_GRADIENT == {n for n, c in reg.items() if "inputs" in c.needs}
  assert detector_names.LAYERS == {n for n, c in reg.items() if "layers" in c.needs}
  assert detector_names.MODEL_FAMILIES == {
      n: tuple(c.model_families) for n, c in reg.items() if c.model_families is not None}


def test_posthoc_detectors_as_from_the_classes():
  def two_tower(cls):   # NegLabel/CSP read a text bank, GL-MCM CLIP's local column
    if cls.text_bank:
      return ("clip", "two_towers")
    return ("clip",) if "local" in cls.layer_reducers else None

  def from_classes(odin, model_name, layers):
    def wanted(cls):
      fam = cls.model_families if cls.model_families is not None else two_tower(cls)
      return ((odin or "inputs" not in cls.needs) and (layers or "layers" not in cls.needs)
              and (fam is None or model_name is None or model_name in fam))
    return tuple(n for n in detectors.names() if wanted(detectors.REGISTRY[n]))
  for odin in (False, True):
    for layers in (False, True):
      for model in (None, "resnet", "convnext", "clip", "two_towers"):
        assert common.posthoc_detectors(odin, model, layers) == from_classes(odin, model, layers)


def test_unknown_suggests_the_closest_name():
  assert detector_names.unknown(("msp", "energy")) is None
  msg = detector_names.unknown(("msp", "energie"))
  assert "'energie'" in msg and "did you mean 'energy'" in msg
  assert "known:" in detector_names.unknown(("zzzzzzzz",))
