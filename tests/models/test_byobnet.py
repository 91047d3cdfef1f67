"""fi_jax's RegNetZ (timm byobnet.py) vs timm: small ByobNets built with timm's own
ByoModelCfg / ByoBlockCfg of the regnetz block kinds (bottle_in + linear_out bottlenecks with
SE, grouped 3x3 convs, no shortcut where the shape changes, the final 1x1 conv-norm-act), one
per stem (tiered + BatchNorm: regnetz_d8; 3x3 and deep + EvoNorm2dS0a: regnetz_c16_evos /
regnetz_d8_evos), norm statistics and EvoNorm parameters randomised, saved as safetensors,
loaded through `zoo.from_pretrained` under the published name, logits and pre-logits within
1e-4 at two input sizes (odd feature maps at the second)."""
import pytest

from fi_jax.models import zoo
from tests.helpers.torch_reference import perturb_norms, save_state_dict
from tests.models.test_resnet import NUM_CLASSES, assert_matches

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")

SIZES = (64, 72)


def _stand_in(stem_type, stem_chs, blocks, norm):
  """timm ByobNet of `blocks` ((depth, width, stride, group size, bottle ratio) per stage)
  with the regnetz_* model-level settings, and the matching fi_jax Model fields."""
  from functools import partial

  from timm.layers import EvoNorm2dS0a
  from timm.models.byobnet import ByoBlockCfg, ByobNet, ByoModelCfg
  cfg = ByoModelCfg(
      blocks=tuple(ByoBlockCfg(type="bottle", d=d, c=c, s=s, gs=gs, br=br)
                   for d, c, s, gs, br in blocks),
      stem_chs=stem_chs, stem_type=stem_type, stem_pool="", downsample="", num_features=48,
      act_layer="silu", attn_layer="se", attn_kwargs=dict(rd_ratio=0.25),
      block_kwargs=dict(bottle_in=True, linear_out=True),
      **({"norm_layer": partial(EvoNorm2dS0a, group_size=16)} if norm == "evos" else {}))
  torch.manual_seed(0)
  m = perturb_norms(ByobNet(cfg, num_classes=NUM_CLASSES))
  g = torch.Generator().manual_seed(1)
  with torch.no_grad():
    for mod in m.modules():
      if isinstance(mod, EvoNorm2dS0a):
        for p, base in ((mod.weight, 1.0), (mod.bias, 0.0), (mod.v, 1.0)):
          if p is not None:
            p.copy_(base + 0.3 * torch.randn(p.shape, generator=g))
  d, c, s, gs, br = zip(*blocks)
  assert len(set(gs)) == len(set(br)) == 1
  fields = dict(stem_type=stem_type, stem_chs=stem_chs, depths=d, widths=c, strides=s,
                group_size=gs[0], bottle_ratio=br[0], num_features=48)
  return m, fields


CASES = {
    "regnetz_d8.ra3_in1k": ("tiered", 16, ((2, 16, 1, 8, 2), (1, 24, 2, 8, 2)), "batch"),
    "regnetz_c16_evos.ch_in1k": ("3x3", 16, ((1, 32, 2, 16, 2), (2, 48, 2, 16, 2)), "evos"),
    "regnetz_d8_evos.ch_in1k": ("deep", 16, ((2, 16, 1, 16, 2), (1, 32, 2, 16, 2)), "evos"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_regnetz_matches_timm(tmp_path, name):
  ref, fields = _stand_in(*CASES[name])
  path = save_state_dict(ref, tmp_path / "model.safetensors")
  model, params, info = zoo.from_pretrained(f"timm/{name}", path, num_classes=NUM_CLASSES,
                                            **fields)
  assert info["route"] == "flax" and info["family"] == "byobnet"
  for size in SIZES:
    assert_matches(model, params, ref, size)
