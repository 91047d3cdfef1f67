"""fi_jax ResNet's timm variants vs timm (and timm's plain pre-activation ResNetV2s): ECA, anti-aliasing (average pool and BlurPool2d),
GroupNorm, pruned widths, ResNet-RS's conv stem pool, SENet-154's reduced first conv and 3x3 shortcuts,
per-stage block kinds (test_resnet), Res2Net's split bottleneck, ResNeSt's split attention, SKNet's selective kernels and timm's legacy SENets
(senet.py's own key names, stride in the 1x1, ceil-mode stem pool, SE after the ReLU).

Each case is a randomly initialised timm model of the real structure (small widths / depths
through timm's own constructor arguments) with perturbed norm statistics, saved as
safetensors or with torch.save, loaded through `zoo.from_pretrained` under the published
name it stands in for, and compared on logits and pre-logits at 72 px (odd feature maps in
the last stages: ceil-mode pools, reflect padding; 64 px for the average-pool anti-aliasing,
which timm itself cannot run on odd maps next to a ceil-mode shortcut). The cases are checked together to keep
the compile count down.
"""
import pytest

from fi_jax.models import resnet, zoo
from tests.helpers.torch_reference import perturb_norms, save_state_dict
from tests.models.test_resnet import NUM_CLASSES, assert_matches

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")

SIZE = 72
_SMALL = dict(channels=(16, 24, 32, 40), stem_width=8)
_SMALL_FI = dict(widths=(16, 24, 32, 40), stem_width=8)


def _timm(name, **kw):
  return timm.create_model(name, pretrained=False, num_classes=NUM_CLASSES, **kw)


def _legacy(block, groups, **kw):
  from timm.models import senet
  return senet.SENet(getattr(senet, block), layers=[1, 1, 1, 1], groups=groups, reduction=16,
                     num_classes=NUM_CLASSES, **kw)


def _perturb_evonorms(m):
  """EvoNorm2dS0's weight, bias and v off their init (1, 0, 1): perturb_norms knows only
  BatchNorm / GroupNorm, and a swapped weight / v would not show at the init."""
  g = torch.Generator().manual_seed(1)
  with torch.no_grad():
    for mod in m.modules():
      if isinstance(mod, timm.layers.EvoNorm2dS0):
        for p, base in ((mod.weight, 1.0), (mod.bias, 0.0), (mod.v, 1.0)):
          p.copy_(base + 0.3 * torch.randn(p.shape, generator=g))
  return m


# per stage (conv3 width, (conv1, conv2) widths per block) of the pruned stand-in
PRUNED = ((12, ((7, 5),)), (20, ((9, 6), (11, 10))), (26, ((13, 7),)), (30, ((15, 12),)))


def _pruned_ecaresnet():
  """A small ecaresnet50d with the average-pool anti-aliasing, cut to PRUNED's widths by
  timm's own pruning adapter (the one its pruned models go through, fed a spec string in its
  file format)."""
  from timm.models._prune import adapt_model_from_string
  m = _timm("ecaresnet50d", layers=(1, 2, 1, 1), aa_layer=torch.nn.AvgPool2d, **_SMALL)
  shapes = {k: list(v.shape) for k, v in m.state_dict().items() if k.endswith(".weight")}
  prev = 2 * _SMALL["stem_width"]
  for s, (out, block_widths) in enumerate(PRUNED, start=1):
    for b, (c1, c2) in enumerate(block_widths):
      pre = f"layer{s}.{b}."
      shapes.update({pre + "conv1.weight": [c1, prev, 1, 1], pre + "bn1.weight": [c1],
                     pre + "conv2.weight": [c2, c1, 3, 3], pre + "bn2.weight": [c2],
                     pre + "conv3.weight": [out, c2, 1, 1], pre + "bn3.weight": [out]})
      if b == 0:
        shapes.update({pre + "downsample.1.weight": [out, prev, 1, 1],
                       pre + "downsample.2.weight": [out]})
      prev = out
  shapes["fc.weight"] = [NUM_CLASSES, prev]
  return adapt_model_from_string(m, "***".join(f"{k}:{v}" for k, v in shapes.items()))


# published timm name: (the timm stand-in, fi_jax Model overrides, file suffix). Stand-ins
# combine options where that saves a compile (the fi_jax module is one code path per option).
CASES = {
    # ResNet-RS (conv stem pool, SE of C / 4) with GroupNorm (the resnet50_gn path)
    "resnetrs50.tf_in1k": (
        lambda: _timm("resnetrs50", layers=(1, 1, 1, 1), channels=(32, 32, 32, 32),
                      stem_width=32, norm_layer="groupnorm"),
        dict(depths=(1, 1, 1, 1), widths=(32, 32, 32, 32), stem_width=32, norm="group"),
        ".pth"),
    # pruned widths (ECA with the unpruned kernel size) with the average-pool anti-aliasing
    # (the resnetaa* / seresnextaa* path: 2x2 average pools for the stem pool and strides)
    "ecaresnet50d_pruned.miil_in1k": (
        _pruned_ecaresnet, dict(depths=(1, 2, 1, 1), pruned=PRUNED, aa="avg", **_SMALL_FI),
        ".safetensors"),
    # SENet-154's halved first 1x1 and 3x3 shortcuts with BlurPool2d and ECA (the
    # resnetblur50 / ecaresnet* paths)
    "senet154.gluon_in1k": (
        lambda: _timm("senet154", layers=(1, 1, 1, 1), cardinality=4, channels=(32, 32, 64, 64),
                      stem_width=16, aa_layer=timm.layers.BlurPool2d,
                      block_args=dict(attn_layer="eca")),
        dict(depths=(1, 1, 1, 1), groups=4, widths=(32, 32, 64, 64), stem_width=16, aa="blur",
             attn="eca"), ".safetensors"),
    "test_resnet.r160_in1k": (lambda: _timm("test_resnet"), {}, ".safetensors"),
    # Res2NeXt-D: groups, 3 scales, deep stem, average-pool shortcuts
    "res2net50d.in1k": (
        lambda: _timm("res2net50d", layers=(1, 2, 1, 1), cardinality=2, block_args=dict(scale=3),
                      **_SMALL),
        dict(depths=(1, 2, 1, 1), groups=2, res2_scale=3, **_SMALL_FI), ".safetensors"),
    # ResNeSt: split attention (radix 2 over 2 groups: the softmax layout), average pool after
    # it; radix 1 (sigmoid) over 4 groups with the pool before it
    "resnest14d.gluon_in1k": (
        lambda: _timm("resnest14d", layers=(1, 1, 1, 1), cardinality=2, **_SMALL),
        dict(depths=(1, 1, 1, 1), groups=2, **_SMALL_FI), ".safetensors"),
    "resnest50d_1s4x24d.in1k": (
        lambda: _timm("resnest50d_1s4x24d", layers=(1, 1, 1, 1), **_SMALL),
        dict(depths=(1, 1, 1, 1), **_SMALL_FI), ".safetensors"),
    # SKNet: selective kernels on split inputs (BasicBlock), on the whole input (grouped)
    "skresnet18.ra_in1k": (
        lambda: _timm("skresnet18", layers=(1, 1, 1, 1), channels=(16, 24, 32, 40)),
        dict(depths=(1, 1, 1, 1), widths=(16, 24, 32, 40)), ".safetensors"),
    "skresnext50_32x4d.ra_in1k": (
        lambda: _timm("skresnext50_32x4d", layers=(1, 1, 1, 1), cardinality=4,
                      channels=(16, 24, 32, 40)),
        dict(depths=(1, 1, 1, 1), groups=4, widths=(16, 24, 32, 40)), ".safetensors"),
    # legacy SENets (senet.py's widths are fixed: depth 1 per stage)
    "legacy_seresnet18.in1k": (lambda: _legacy("SEResNetBlock", 1),
                               dict(depths=(1, 1, 1, 1)), ".pth"),
    # SEResNetBottleneck (stride in the 1x1) with senet154's 3x3 stem and 3x3 shortcuts
    "legacy_seresnet50.in1k": (
        lambda: _legacy("SEResNetBottleneck", 1, inplanes=128, input_3x3=True,
                        downsample_kernel_size=3, downsample_padding=1),
        dict(depths=(1, 1, 1, 1), stem="deep", stem_width=64, down_kernel=3), ".safetensors"),
    # plain pre-activation ResNetV2s (fi_jax.models.resnetv2): BasicBlock with the deep stem
    # and average-pool shortcuts, GroupNorm
    "resnetv2_18d.ra4_e3600_r224_in1k": (
        lambda: _timm("resnetv2_18d", layers=(1, 1, 2, 1), channels=(16, 24, 32, 40),
                      stem_chs=16),
        dict(depths=(1, 1, 2, 1), channels=(16, 24, 32, 40), stem_width=16), ".pth"),
    "resnetv2_50d_gn.ah_in1k": (
        lambda: _timm("resnetv2_50d_gn", layers=(1, 1, 1, 1), channels=(128, 128, 256, 256)),
        dict(depths=(1, 1, 1, 1), channels=(128, 128, 256, 256)), ".safetensors"),
    # EvoNorm-S0 with the 7x7 stem (the resnetv2_50 / 101 stem)
    "resnetv2_50d_evos.ah_in1k": (
        lambda: _perturb_evonorms(_timm("resnetv2_50d_evos", layers=(1, 1, 1, 1),
                                        channels=(128, 128, 256, 256), stem_type="")),
        dict(depths=(1, 1, 1, 1), channels=(128, 128, 256, 256), stem=""), ".safetensors"),
}


@pytest.mark.slow   # one compile per case (14 small models)
def test_resnet_variants_match_timm(tmp_path):
  """Every case through zoo.from_pretrained (the converter, the published variant's fields)
  -> logits and pre-logits within 1e-4 of timm's."""
  diffs = {}
  for name, (make, overrides, suffix) in CASES.items():
    torch.manual_seed(0)
    ref = perturb_norms(make())
    path = save_state_dict(ref, tmp_path / f"{name}{suffix}")
    model, params, info = zoo.from_pretrained(f"timm/{name}", path, num_classes=NUM_CLASSES,
                                              **overrides)
    family = "resnetv2" if name.startswith("resnetv2") else "resnet"
    assert info["route"] == "flax" and info["family"] == family
    size = 64 if info["model"].get("aa", resnet.ARCHS.get(info["variant"], {}).get("aa")) \
        == "avg" else SIZE
    diffs[name] = assert_matches(model, params, ref, size)
  assert len(diffs) == len(CASES)
