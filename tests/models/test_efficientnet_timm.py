"""fi_jax EfficientNet family vs timm's arch-def built models (MixNet, MobileNet V1-V4, LCNet,
EdgeTPU, ...: fi_jax/models/_efficientnet_defs.py).

Each case builds the timm model with timm's own generator at small channel / depth multipliers
(the real block structure, few channels), perturbs its weights and BatchNorm statistics, saves
it as timm's .safetensors and loads it through `zoo.from_pretrained` of a real tag with the
same multipliers, then compares logits and pre-logits. The tf_ ports run at an even and an odd
input size (TensorFlow "SAME" padding is asymmetric at even sizes). Together the cases cover
every block kind and option the arch strings add over EfficientNet B0-B7 / V2
(tests/models/test_efficientnet.py): mixed-kernel and channel-split grouped convs, 'dsa'
blocks, grouped EdgeResidual convs, ReLU / ReLU6 / hard-swish / GELU, hard-sigmoid SE gates,
MobileNetV3's and V4's pooled heads, UniversalInvertedResidual blocks, multi-query attention
and layer scale. Full-size layouts (every key and shape, block strides and residuals, BatchNorm
eps, padding) are checked on the meta device.
"""
import functools

import jax
import numpy as np
import pytest

from fi_jax.models import _efficientnet_defs as defs
from fi_jax.models import efficientnet, zoo

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")
safetensors_torch = pytest.importorskip("safetensors.torch")
from timm.layers import CondConv2d  # noqa: E402  (after the conftest shim)
from timm.models import efficientnet as timm_eff  # noqa: E402
from timm.models import mobilenetv3 as timm_mnv3  # noqa: E402

from tests.helpers.torch_reference import perturb_norms  # noqa: E402

TOL = 1e-4
NUM_CLASSES = 10

# Small models of timm's own classes built from arch strings that use every block kind and
# option once: (timm class, its kwargs, fi_jax generator config, the tag they load as, input
# sizes). "n<act>" sets a block's activation, "a"/"p" the expansion / projection kernels
# (1.1: a channel-split grouped conv), "k3.5.7" mixed depthwise kernels, "gs" a group size,
# "cc4" CondConv with 4 experts.
_EFFNET_ARCH = [["ds_r1_k3.5_s1_c16_nre"],
                ["ir_r1_k3.5.7_a1.1_p1.1_s2_e6_c24_se0.5_nsw", "ir_r1_k3_s1_e3_c24_nr6"],
                ["er_r1_k3_s2_e4_gs8_c32_se0.25", "dsa_r1_k5_s1_c32"],
                ["ir_r2_k5_s2_e3_c40_se0.25_cc4"], ["cn_r1_k1_s1_c48"]]
_MNV3_ARCH = [["ds_r1_k3_s2_c16_se0.25_nre"], ["ir_r1_k5_s2_e4_c24_se0.25", "ir_r1_k3_s1_e3_c24"],
              ["cn_r1_k1_s1_c48"]]
_MNV4_ARCH = [["er_r1_k3_s2_e4_c24"], ["uir_r1_a3_k5_s2_e4_c32", "uir_r1_a0_k3_s1_e2_c32",
                                      "uir_r1_a3_k0_s1_e4_c32", "uir_r1_a0_k0_s1_e2_c32"],
              ["mqa_r1_k3_h2_s1_v2_d16_c32", "uir_r1_a5_k0_p3_s2_e4_c48",
               "mqa_r1_k3_h4_s1_d8_c48"], ["cn_r1_k1_s1_c64"]]


def _timm_case(name):
  """(timm model, fi_jax Model kwargs, tag, sizes) of the small case `name`."""
  from timm.models._efficientnet_blocks import SqueezeExcite
  from timm.models._efficientnet_builder import decode_arch_def, round_channels
  hsig = lambda **k: functools.partial(SqueezeExcite, gate_layer="hard_sigmoid", **k)
  if name == "effnet_tf":      # EfficientNet class, TF "SAME" padding, ReLU6 model default
    m = timm_eff.EfficientNet(decode_arch_def(_EFFNET_ARCH), num_classes=NUM_CLASSES,
                              num_features=64, stem_size=16, stem_kernel_size=5, pad_type="same",
                              act_layer=torch.nn.ReLU6,
                              norm_layer=functools.partial(torch.nn.BatchNorm2d, eps=1e-3))
    cfg = dict(arch=_EFFNET_ARCH, features=64, stem=16, stem_k=5, tf=True, act="relu6")
    return m, cfg, "tf_mixnet_m.in1k", (64, 47)
  if name == "global_context_s2d":   # GlobalContext attention in SE's place, space-to-depth
    # (its convs pad "SAME" in a PyTorch-padded model: odd input size too)
    arch = [["ds_r2_k3_s1_e1_c16_se0.25_d1"], ["er_r1_k3_s2_e4_c24_se0.25"],
            ["ir_r2_k3_s2_e6_c32_se0.25"]]
    m = timm_eff.EfficientNet(decode_arch_def(arch), num_classes=NUM_CLASSES, num_features=64,
                              stem_size=16, act_layer=torch.nn.SiLU, se_layer="gc")
    cfg = dict(arch=arch, features=64, stem=16, act="silu", se_kind="gc", se_round="half_up")
    return m, cfg, "gc_efficientnetv2_rw_t.agc_in1k", (64, 47)
  if name == "mobilenetv3":    # pooled head with bias, hard-swish, hard-sigmoid SE (ReLU),
    # average-pool anti-aliasing
    m = timm_mnv3.MobileNetV3(decode_arch_def(_MNV3_ARCH), num_classes=NUM_CLASSES,
                              num_features=80, stem_size=16, act_layer=torch.nn.Hardswish,
                              aa_layer="avg",
                              se_layer=hsig(force_act_layer=torch.nn.ReLU,
                                            rd_round_fn=round_channels))
    cfg = dict(arch=_MNV3_ARCH, features=80, stem=16, act="hard_swish", head="pool_conv",
               se_from_exp=True, se_gate="hard_sigmoid", se_act="relu", se_round=(1.0, 8, 0.9),
               aa="avg")
    return m, cfg, "mobilenetv3_large_100.ra_in1k", (64,)
  if name == "mobilenetv4":    # UIR blocks, multi-query attention, layer scale, BN head, GELU,
    # blur-pool anti-aliasing
    m = timm_mnv3.MobileNetV3(decode_arch_def(_MNV4_ARCH), num_classes=NUM_CLASSES,
                              num_features=80, stem_size=16, head_bias=False, head_norm=True,
                              aa_layer="blurpc",
                              act_layer=torch.nn.GELU, layer_scale_init_value=1e-5)
    cfg = dict(arch=_MNV4_ARCH, features=80, stem=16, act="gelu", head="pool_conv_bn",
               layer_scale=True, aa="blurpc")
    return m, cfg, "mobilenetv4_hybrid_medium.e500_r224_in1k", (64,)
  raise ValueError(name)


def _perturb(m, seed=0):
  torch.manual_seed(seed)
  with torch.no_grad():
    for name, p in m.named_parameters():
      if name.endswith("layer_scale.gamma"):   # timm inits it to 1e-5: make the branch count
        p.copy_(1 + 0.2 * torch.randn(p.shape))
      elif p.ndim == 1:    # every norm's affine params (LayerNorm, EvoNorm's v too) off init
        p.add_(0.2 * torch.randn(p.shape))
  return perturb_norms(m, seed)


def _ref(m, img):
  with torch.no_grad():
    x = torch.tensor(img).permute(0, 3, 1, 2)
    return m(x).numpy(), m.forward_head(m.forward_features(x), pre_logits=True).numpy()


@pytest.mark.parametrize("name", [   # (the two-size cases and the deepest one are slow)
    pytest.param("effnet_tf", marks=pytest.mark.slow),
    pytest.param("global_context_s2d", marks=pytest.mark.slow), "mobilenetv3",
    pytest.param("mobilenetv4", marks=pytest.mark.slow)])
def test_timm_block_vocabulary_matches(name, tmp_path):
  m, cfg, tag, sizes = _timm_case(name)
  m = _perturb(m)
  path = tmp_path / "model.safetensors"
  safetensors_torch.save_file({k: v.detach().clone().contiguous()
                               for k, v in m.state_dict().items()}, str(path))
  model, params, info = zoo.from_pretrained(f"timm/{tag}", str(path), num_classes=NUM_CLASSES,
                                            **defs.build(cfg))
  assert info["family"] == "efficientnet"
  apply = jax.jit(model.apply)
  for res in sizes:
    img = np.random.default_rng(res).normal(size=(2, res, res, 3)).astype(np.float32)
    logits, out = apply({"params": params}, img)
    ref_logits, ref_pre = _ref(m, img)
    d_logits = float(np.abs(np.asarray(logits) - ref_logits).max())
    d_pre = float(np.abs(np.asarray(out["pre_logits"]) - ref_pre).max())
    print(f"{name} @{res}: max |diff| logits {d_logits:.2e}, pre_logits {d_pre:.2e}, "
          f"|ref logits| {np.abs(ref_logits).max():.2f}")
    # relative to the output scale where it exceeds 1 (perturbed BatchNorm statistics and
    # layer scales ~1 let activations grow through deep residual stacks)
    assert d_logits < TOL * max(1.0, np.abs(ref_logits).max())
    assert d_pre < TOL * max(1.0, np.abs(ref_pre).max())


@pytest.mark.parametrize("norm", ["gn", "ln", "evos"])
def test_timm_test_models_with_other_norms_match(norm, tmp_path):
  """timm's test_efficientnet_{gn,ln,evos} (GroupNorm, LayerNorm, EvoNorm-S0 in BatchNorm's
  place), full size: they are tiny."""
  name = f"test_efficientnet_{norm}"
  m = _perturb(timm.create_model(name, pretrained=False))
  path = tmp_path / "model.safetensors"
  safetensors_torch.save_file({k: v.detach().clone().contiguous()
                               for k, v in m.state_dict().items()}, str(path))
  model, params, _ = zoo.from_pretrained(f"timm/{name}.r160_in1k", str(path))
  img = np.random.default_rng(0).normal(size=(2, 64, 64, 3)).astype(np.float32)
  logits, out = jax.jit(model.apply)({"params": params}, img)
  ref_logits, ref_pre = _ref(m, img)
  d_logits = float(np.abs(np.asarray(logits) - ref_logits).max())
  d_pre = float(np.abs(np.asarray(out["pre_logits"]) - ref_pre).max())
  print(f"{name}: max |diff| logits {d_logits:.2e}, pre_logits {d_pre:.2e}, "
        f"|ref logits| {np.abs(ref_logits).max():.2f}")
  assert d_logits < TOL * max(1.0, np.abs(ref_logits).max())
  assert d_pre < TOL * max(1.0, np.abs(ref_pre).max())


# ----------------------------------------------------------------------------- full size

_ACT_NAMES = {"relu": "relu", "relu6": "relu6", "hardswish": "hard_swish", "silu": "silu",
              "swish": "silu", "gelu": "gelu", "hardsigmoid": "hard_sigmoid",
              "sigmoid": "sigmoid"}


def _acts(module):
  """The activations a timm module applies, in order (fi_jax names)."""
  return [_ACT_NAMES[type(m).__name__.lower()] for m in module.modules()
          if type(m).__name__.lower() in _ACT_NAMES]


def _expected_acts(block, arch):
  """The activations an fi_jax block applies, in timm's module order."""
  kind, k, _, _, _, _, se, _, opts = block
  opts = dict(opts)
  act = opts.get("act", arch["act"])
  se_acts = [arch["se_act"] or act, arch["se_gate"]] if se else []
  return {"ds": [act] * (1 + bool(opts.get("s2d"))) + se_acts + [act] * bool(opts.get("pw_act")),
          "ir": [act, act] + se_acts, "er": [act] + se_acts, "cn": [act],
          "uir": [act] + [act] * bool(k), "mqa": []}[kind]


def _check_full(name):
  """timm's full-size model on the meta device: the block strides and residuals, every
  activation (blocks, SE, stem, head), the BatchNorm eps and the padding are those of ARCHS.
  (Keys and shapes: tests/models/test_timm_coverage.py with FI_JAX_TIMM_COVERAGE=efficientnet
  loads every tag's shapes.)"""
  with torch.device("meta"):
    ref = timm.create_model(name, pretrained=False)
  arch = efficientnet.ARCHS[f"timm/{name}"]
  strides = lambda b: [  # convs' and anti-aliasing pools' (not attention's kv stride)
      c.stride if isinstance(c.stride, int) else c.stride[0] for n, c in b.named_modules()
      if (isinstance(c, (torch.nn.Conv2d, CondConv2d)) and not n.startswith("attn."))
      or n.endswith("aa") and hasattr(c, "stride")]
  assert [(b[2], b[7]) for stage in arch["stages"] for b in stage] == [
      (max(strides(b) or [1]), bool(b.has_skip)) for stage in ref.blocks for b in stage]
  acts = [_acts(b) for stage in ref.blocks for b in stage]
  assert acts == [_expected_acts(b, arch) for stage in arch["stages"] for b in stage]
  head = _acts(ref.bn2) if arch["head"] == "conv" else _acts(ref.norm_head) + _acts(ref.act2)
  assert _acts(ref.bn1) == [arch["act"]] and head == [arch["act"]] * bool(arch["head_chs"])
  eps = {mod.eps for mod in ref.modules() if isinstance(mod, torch.nn.BatchNorm2d)}
  # timm builds fbnetc_100 with eps 1e-3 only when it loads the pretrained weights
  assert eps == ({1e-5} if name == "fbnetc_100" else {arch["bn_eps"]} if arch["norm"] == "bn"
                 else set())
  s2d = {f"blocks.{i}.{j}." for i, stage in enumerate(arch["stages"])
         for j, b in enumerate(stage) if dict(b[8]).get("s2d")}   # (pads "SAME" anyway)
  same = any(type(mod).__name__ == "Conv2dSame" for n, mod in ref.named_modules()
             if not any(n.startswith(p) for p in s2d))
  assert same == arch["same_pad"]


# one timm model per generator config (they differ in activations, SE gates and rounding,
# which shapes alone do not show); the rest differ from these in multipliers only
FULL = ("mnasnet_100", "semnasnet_075", "mnasnet_small", "spnasnet_100", "mobilenetv1_100h",
        "mobilenetv2_110d", "fbnetc_100", "tf_efficientnet_es", "tf_efficientnet_lite0",
        "mixnet_s", "tf_mixnet_m", "tinynet_e", "mobilenet_edgetpu_v2_m", "test_efficientnet",
        "mobilenetv3_rw", "mobilenetv3_small_050", "tf_mobilenetv3_large_minimal_100",
        "fbnetv3_b", "lcnet_050", "mobilenetv4_conv_small_050", "mobilenetv4_hybrid_medium",
        "mobilenetv4_conv_blur_medium", "tf_efficientnet_cc_b0_8e", "efficientnet_b1_pruned",
        "gc_efficientnetv2_rw_t", "test_efficientnet_gn", "efficientnet_h_b5")


@pytest.mark.slow
def test_full_size_structure_and_activations():
  for name in FULL:
    _check_full(name)


def test_block_strings_decode_as_timm():
  a, r = defs.decode_block("ir_r3_k3.5.7_a1.1_p1.1_s2_e6_c80_se0.25_nsw")
  assert r == 3 and a["k"] == (3, 5, 7) and a["exp_k"] == (1, 1) and a["pw_k"] == (1, 1)
  assert (a["stride"], a["exp"], a["out"], a["se"], a["act"]) == (2, 6.0, 80, 0.25, "silu")
  a, _ = defs.decode_block("dsa_r1_k3_s1_c64")
  assert a["kind"] == "ds" and a["pw_act"] and a["noskip"]
  with pytest.raises(ValueError, match="Unknown block kind 'zz'"):
    defs.decode_block("zz_r1_k3_s1_c8")
  with pytest.raises(ValueError, match="No ported timm architecture.*'mobilenetv9'"):
    defs.timm_model_arch("mobilenetv9")
