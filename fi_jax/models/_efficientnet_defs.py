"""timm's EfficientNet / MobileNet architecture definitions and their decoding, as data.

timm builds EfficientNet, EfficientNet-Lite / -EdgeTPU, MixNet, MnasNet, MobileNet V1 / V2 /
V3 / V4, FBNet, LCNet and TinyNet from one block vocabulary: per stage a list of block strings
such as "ir_r2_k3_s2_e6_c24_se0.25" (block kind, repeats, kernel, stride, expansion, output
channels, squeeze-excite ratio, ...), scaled by channel / depth multipliers. This module ports
that decoding (timm `models/_efficientnet_builder.py`: `_decode_block_str`, `decode_arch_def`,
`_scale_stage_depth`, `EfficientNetBuilder._make_block`; the `_gen_*` functions of
`models/efficientnet.py` and `models/mobilenetv3.py`; timm 1.0.x as installed with fi_jax) and
returns the keyword arguments of `fi_jax.models.efficientnet.Model` for a timm model name.

A block is `(kind, kernel, stride, in_chs, mid_chs, out_chs, se_chs, residual, opts)` with
`opts` a sorted tuple of (name, value) pairs (hashable, so it can be a Flax attribute):
  act       the block's activation when it differs from the model's
  exp_k / pw_k   kernel(s) of the expansion / projection conv when not 1 (a tuple: MixNet's
            channel-split grouped conv)
  groups    group count of the main conv when neither dense nor depthwise
  pw_act    DepthwiseSeparable with an activation after its pointwise conv ('dsa')
  k_start / k_end   UniversalInvertedResidual's extra depthwise convs (kernel 0: none)
  heads / key_dim / kv_stride   MobileAttention (multi-query attention)
  layer_scale    a learned per-channel scale before the residual
  experts   CondConv: the block's convs mix this many expert kernels per sample
  s2d       a DepthwiseSeparable block that starts space-to-depth (a 2x2 stride-2 conv to 4x
            channels first; the block's stride is 2 and its depthwise kernel (k + 1) // 2)
The `kernel` is a tuple for MixNet's mixed depthwise convs (channels split across kernels).
"""
from __future__ import annotations

import math
import re
from typing import Optional

# ----------------------------------------------------------------------------- decoding


def make_divisible(v: float, divisor: int = 8, round_limit: float = 0.9) -> int:
  """timm `make_divisible`: nearest multiple of `divisor` (at least `divisor`), never below
  round_limit * v."""
  new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
  return new_v + divisor if new_v < round_limit * v else new_v


def round_channels(c: float, multiplier: float = 1.0, divisor: int = 8,
                   round_limit: float = 0.9) -> int:
  """timm `round_channels`: `c` scaled and made divisible (unchanged for a zero multiplier)."""
  return int(c) if not multiplier else make_divisible(c * multiplier, divisor, round_limit)


_ACTS = {"re": "relu", "r6": "relu6", "hs": "hard_swish", "sw": "silu", "mi": "mish"}


def _ksize(s: str):
  return int(s) if s.isdigit() else tuple(int(k) for k in s.split("."))


def decode_block(block: str) -> tuple[dict, int]:
  """One block string -> (block args, repeats), as timm's `_decode_block_str`."""
  kind, *ops = block.split("_")
  opt, skip = {}, None
  for op in ops:
    if op in ("noskip", "skip"):
      skip = op == "skip"
    elif op.startswith("n"):
      if op[1:] in _ACTS:
        opt["n"] = _ACTS[op[1:]]
    else:
      parts = re.split(r"(\d.*)", op)
      if len(parts) >= 2:
        opt[parts[0]] = parts[1]
  a = dict(kind=kind, out=int(opt["c"]), stride=int(opt["s"]), act=opt.get("n"),
           se=float(opt.get("se", 0.0)), noskip=skip is False)
  if kind in ("ir", "ds", "dsa"):
    a["s2d"] = int(opt.get("d", 0)) > 0
  if kind == "ir":
    a.update(k=_ksize(opt["k"]), exp_k=_ksize(opt.get("a", "1")), pw_k=_ksize(opt.get("p", "1")),
             exp=float(opt["e"]), experts=int(opt.get("cc", 0)))
  elif kind in ("ds", "dsa"):
    a.update(kind="ds", k=_ksize(opt["k"]), pw_k=_ksize(opt.get("p", "1")), pw_act=kind == "dsa",
             noskip=kind == "dsa" or skip is False)
  elif kind == "er":
    a.update(k=_ksize(opt["k"]), pw_k=_ksize(opt.get("p", "1")), exp=float(opt["e"]),
             force_in=int(opt.get("fc", 0)))
  elif kind == "cn":
    a.update(k=int(opt["k"]), skip=skip is True)
  elif kind == "uir":
    a.update(k_start=_ksize(opt.get("a", "0")), k=_ksize(opt["k"]),
             k_end=_ksize(opt.get("p", "0")), exp=float(opt["e"]))
  elif kind in ("mqa", "mha"):
    a.update(k=_ksize(opt["k"]), heads=int(opt["h"]), key_dim=int(opt["d"]),
             kv_stride=int(opt.get("v", 1)))
  else:
    raise ValueError(f"Unknown block kind {kind!r} in {block!r}.")
  if "gs" in opt:
    a["group_size"] = int(opt["gs"])
  return a, int(opt["r"])


def _scale_depth(args: list, repeats: list, mult: float, trunc: str) -> list:
  """timm `_scale_stage_depth`: the stage's total repeats scaled, spread back-to-front."""
  n = sum(repeats)
  n_scaled = max(1, round(n * mult)) if trunc == "round" else int(math.ceil(n * mult))
  scaled = []
  for r in repeats[::-1]:
    rs = max(1, round(r / n * n_scaled))
    scaled.append(rs)
    n -= r
    n_scaled -= rs
  return [dict(a) for a, rep in zip(args, scaled[::-1]) for _ in range(rep)]


def decode_arch_def(arch_def, depth_multiplier=1.0, depth_trunc: str = "ceil",
                    fix_first_last: bool = False, group_size: Optional[int] = None,
                    experts_multiplier: int = 1) -> list[list[dict]]:
  """timm `decode_arch_def`: stages of block strings -> stages of block args."""
  mults = (tuple(depth_multiplier) if isinstance(depth_multiplier, (tuple, list))
           else (depth_multiplier,) * len(arch_def))
  out = []
  for i, (blocks, mult) in enumerate(zip(arch_def, mults)):
    args, reps = [], []
    for b in blocks:
      a, r = decode_block(b)
      if a.get("experts") and experts_multiplier > 1:
        a["experts"] *= experts_multiplier
      if group_size is not None:
        a.setdefault("group_size", group_size)
      args.append(a)
      reps.append(r)
    first_last = fix_first_last and i in (0, len(arch_def) - 1)
    out.append(_scale_depth(args, reps, 1.0 if first_last else mult, depth_trunc))
  return out


def _groups(group_size: Optional[int], chs: int) -> int:
  """timm `num_groups`: 1 (dense) for no group size, else chs // group_size (-1: depthwise)."""
  if not group_size:
    return 1
  return -1 if group_size == 1 else chs // group_size


def build(cfg: dict) -> dict:
  """A generator config (see `GENERATORS`) -> `efficientnet.Model` keyword arguments, as timm's
  EfficientNet / MobileNetV3 constructors and `EfficientNetBuilder` compute them."""
  mult, divisor, limit = cfg.get("round", (1.0, 8, 0.9))
  chs = lambda c: round_channels(c, mult, divisor, limit)
  stages_args = decode_arch_def(cfg["arch"], cfg.get("dm", 1.0), cfg.get("trunc", "ceil"),
                                cfg.get("fix_first_last", False), cfg.get("group_size"),
                                cfg.get("experts_multiplier", 1))
  stem = cfg["stem"] if cfg.get("fix_stem") else chs(cfg["stem"])
  act = cfg["act"]
  se_from_exp, se_round = cfg.get("se_from_exp", False), cfg.get("se_round")
  cin, stages, space2depth = stem, [], 0
  for stage in stages_args:
    blocks = []
    for j, a in enumerate(stage):
      kind, k, stride = a["kind"], a["k"], a["stride"] if j == 0 else 1
      # space-to-depth (EfficientNet-X): a 2x2 stride-2 conv to 4x channels starts it in a DS
      # block (s2d 1); the next blocks run at 4x width (s2d 2) until a stride-2 block, which
      # ends it at stride 1 with a quarter of its expansion (timm EfficientNetBuilder.__call__)
      s2d = 0
      if not space2depth and a.get("s2d"):
        space2depth = 1
      if space2depth:
        if space2depth == 2 and stride == 2:
          stride, space2depth = 1, 0
          a = {**a, "exp": a["exp"] / 4}
        else:
          s2d = space2depth
      cout = chs(a["out"]) * (4 if s2d else 1)
      opts = {}
      if s2d == 1:
        if kind != "ds":
          raise ValueError(f"Space-to-depth starting in a {kind!r} block is not ported.")
        opts["s2d"] = True
      if a["act"] and a["act"] != act:
        opts["act"] = a["act"]
      if a.get("experts"):
        opts["experts"] = a["experts"]
      gs = a.get("group_size")
      if kind == "ds":
        res = stride == 1 and cin == cout and not a["noskip"]
        if s2d == 1:   # (the block downsamples by 2: its conv_s2d)
          cin_eff, k, stride = 4 * cin, (k + 1) // 2, 2
        else:
          cin_eff = cin
        mid, groups = cin_eff, _groups(1 if gs is None else gs, cin_eff)
        if a["pw_act"]:
          opts["pw_act"] = True
      elif kind == "ir":
        mid = make_divisible(cin * a["exp"])
        groups = _groups(1 if gs is None else gs, mid)
        res = stride == 1 and cin == cout and not a["noskip"]
      elif kind == "er":
        mid = make_divisible((chs(a["force_in"]) if a["force_in"] else cin) * a["exp"])
        groups = _groups(gs, mid)
        res = stride == 1 and cin == cout and not a["noskip"]
      elif kind == "cn":
        mid, groups = cout, _groups(gs, cin)
        res = a["skip"] and stride == 1 and cin == cout
      elif kind == "uir":
        mid, groups = make_divisible(cin * a["exp"]), _groups(1 if gs is None else gs, cin)
        res = stride == 1 and cin == cout and not a["noskip"]
        opts.update(k_start=a["k_start"], k_end=a["k_end"])
      elif kind == "mqa":
        mid, groups = cin, -1
        res = stride == 1 and cin == cout and not a["noskip"]
        opts.update(heads=a["heads"], key_dim=a["key_dim"], kv_stride=a["kv_stride"])
      else:
        raise ValueError(f"Block kind {kind!r} (timm {cfg.get('name', '?')}) is not ported.")
      if groups not in (1, -1) or (groups == 1 and kind in ("ds", "ir", "uir")):
        opts["groups"] = groups
      for key in ("exp_k", "pw_k"):
        if a.get(key, 1) != 1:
          opts[key] = a[key]
      if kind in ("uir", "mqa") and cfg.get("layer_scale"):
        opts["layer_scale"] = True
      se = 0
      if a["se"]:
        if kind in ("uir", "mqa", "cn"):
          raise ValueError(f"Squeeze-excite in a {kind!r} block is not ported.")
        ratio = a["se"] if se_from_exp else a["se"] / a.get("exp", 1.0)
        v = mid * ratio / (4 if s2d == 1 else 1)
        if se_round == "half_up":   # timm GlobalContext: make_divisible(v, 1, round_limit=0)
          se = max(1, int(v + 0.5))
        else:
          se = round(v) if se_round is None else round_channels(v, *se_round)
      blocks.append((kind, k, stride, cin, mid, cout, se, bool(res), tuple(sorted(opts.items()))))
      cin = cout
      if space2depth == 1:
        space2depth = 2
    stages.append(tuple(blocks))
  head = cfg.get("head", "conv")
  return dict(stem_chs=stem, stem_kernel=cfg.get("stem_k", 3), stages=tuple(stages),
              head_chs=cfg["features"], head=head, head_bias=cfg.get("head_bias", True),
              act=act, se_gate=cfg.get("se_gate", "sigmoid"), se_act=cfg.get("se_act"),
              bn_eps=1e-3 if cfg.get("tf") or cfg.get("bn_tf") else 1e-5,
              same_pad=bool(cfg.get("tf")), aa=cfg.get("aa"), norm=cfg.get("norm", "bn"),
              se_kind=cfg.get("se_kind", "se"))


# ----------------------------------------------------------------------------- generators
# Each returns the config `build` reads: arch (block strings), dm / trunc / fix_first_last /
# group_size (depth scaling), round (channel multiplier, divisor, round_limit), stem, fix_stem,
# stem_k, features (head width; 0: none), act, se_gate / se_act / se_from_exp / se_round,
# head ("conv": conv-bn-act then pool, timm EfficientNet; "pool_conv": pool then conv
# (+bias) and act, MobileNetV3; "pool_conv_bn": pool, conv, BN and act, MobileNetV4),
# layer_scale.

_B = [["ds_r1_k3_s1_e1_c16_se0.25"], ["ir_r2_k3_s2_e6_c24_se0.25"], ["ir_r2_k5_s2_e6_c40_se0.25"],
      ["ir_r3_k3_s2_e6_c80_se0.25"], ["ir_r3_k5_s1_e6_c112_se0.25"],
      ["ir_r4_k5_s2_e6_c192_se0.25"], ["ir_r1_k3_s1_e6_c320_se0.25"]]
_LITE = [[s.replace("_se0.25", "") for s in stage] for stage in _B]


def _mnasnet_a1(cm=1.0):
  return dict(arch=[["ds_r1_k3_s1_e1_c16_noskip"], ["ir_r2_k3_s2_e6_c24"],
                    ["ir_r3_k5_s2_e3_c40_se0.25"], ["ir_r4_k3_s2_e6_c80"],
                    ["ir_r2_k3_s1_e6_c112_se0.25"], ["ir_r3_k5_s2_e6_c160_se0.25"],
                    ["ir_r1_k3_s1_e6_c320"]],
              stem=32, round=(cm, 8, 0.9), features=1280, act="relu")


def _mnasnet_b1(cm=1.0):
  return dict(arch=[["ds_r1_k3_s1_c16_noskip"], ["ir_r3_k3_s2_e3_c24"], ["ir_r3_k5_s2_e3_c40"],
                    ["ir_r3_k5_s2_e6_c80"], ["ir_r2_k3_s1_e6_c96"], ["ir_r4_k5_s2_e6_c192"],
                    ["ir_r1_k3_s1_e6_c320_noskip"]],
              stem=32, round=(cm, 8, 0.9), features=1280, act="relu")


def _mnasnet_small(cm=1.0):
  return dict(arch=[["ds_r1_k3_s1_c8"], ["ir_r1_k3_s2_e3_c16"], ["ir_r2_k3_s2_e6_c16"],
                    ["ir_r4_k5_s2_e6_c32_se0.25"], ["ir_r3_k3_s1_e6_c32_se0.25"],
                    ["ir_r3_k5_s2_e6_c88_se0.25"], ["ir_r1_k3_s1_e6_c144"]],
              stem=8, round=(cm, 8, 0.9), features=1280, act="relu")


def _mobilenet_v1(cm=1.0, head_conv=False):
  return dict(arch=[["dsa_r1_k3_s1_c64"], ["dsa_r2_k3_s2_c128"], ["dsa_r2_k3_s2_c256"],
                    ["dsa_r6_k3_s2_c512"], ["dsa_r2_k3_s2_c1024"]],
              stem=32, round=(cm, 8, 0.9), act="relu6",
              features=max(1024, round_channels(1024, cm)) if head_conv else 0)


def _mobilenet_v2(cm=1.0, dm=1.0, fix_stem_head=False):
  return dict(arch=[["ds_r1_k3_s1_c16"], ["ir_r2_k3_s2_e6_c24"], ["ir_r3_k3_s2_e6_c32"],
                    ["ir_r4_k3_s2_e6_c64"], ["ir_r3_k3_s1_e6_c96"], ["ir_r3_k3_s2_e6_c160"],
                    ["ir_r1_k3_s1_e6_c320"]],
              dm=dm, fix_first_last=fix_stem_head, stem=32, fix_stem=fix_stem_head,
              round=(cm, 8, 0.9), act="relu6",
              features=1280 if fix_stem_head else max(1280, round_channels(1280, cm)))


def _fbnetc(cm=1.0):
  return dict(arch=[["ir_r1_k3_s1_e1_c16"], ["ir_r1_k3_s2_e6_c24", "ir_r2_k3_s1_e1_c24"],
                    ["ir_r1_k5_s2_e6_c32", "ir_r1_k5_s1_e3_c32", "ir_r1_k5_s1_e6_c32",
                     "ir_r1_k3_s1_e6_c32"],
                    ["ir_r1_k5_s2_e6_c64", "ir_r1_k5_s1_e3_c64", "ir_r2_k5_s1_e6_c64"],
                    ["ir_r3_k5_s1_e6_c112", "ir_r1_k5_s1_e3_c112"], ["ir_r4_k5_s2_e6_c184"],
                    ["ir_r1_k3_s1_e6_c352"]],
              stem=16, features=1984, round=(cm, 8, 0.9), act="relu", bn_tf=True)


def _spnasnet(cm=1.0):
  return dict(arch=[["ds_r1_k3_s1_c16_noskip"], ["ir_r3_k3_s2_e3_c24"],
                    ["ir_r1_k5_s2_e6_c40", "ir_r3_k3_s1_e3_c40"],
                    ["ir_r1_k5_s2_e6_c80", "ir_r3_k3_s1_e3_c80"],
                    ["ir_r1_k5_s1_e6_c96", "ir_r3_k5_s1_e3_c96"], ["ir_r4_k5_s2_e6_c192"],
                    ["ir_r1_k3_s1_e6_c320_noskip"]],
              stem=32, round=(cm, 8, 0.9), features=1280, act="relu")


def _efficientnet(cm=1.0, dm=1.0):
  return dict(arch=_B, dm=dm, stem=32, round=(cm, 8, 0.9),
              features=round_channels(1280, cm), act="silu")


def _efficientnet_condconv(cm=1.0, dm=1.0, experts_multiplier=1):
  arch = [list(stage) for stage in _B]
  for i in (4, 5, 6):
    arch[i] = [arch[i][0] + "_cc4"]
  return dict(arch=arch, dm=dm, experts_multiplier=experts_multiplier, stem=32,
              round=(cm, 8, 0.9), features=round_channels(1280, cm), act="silu")


def _efficientnet_edge(cm=1.0, dm=1.0):
  return dict(arch=[["er_r1_k3_s1_e4_c24_fc24_noskip"], ["er_r2_k3_s2_e8_c32"],
                    ["er_r4_k3_s2_e8_c48"], ["ir_r5_k5_s2_e8_c96"], ["ir_r4_k5_s1_e8_c144"],
                    ["ir_r2_k5_s2_e8_c192"]],
              dm=dm, stem=32, round=(cm, 8, 0.9), features=round_channels(1280, cm), act="relu")


def _efficientnet_lite(cm=1.0, dm=1.0):
  return dict(arch=_LITE, dm=dm, fix_first_last=True, stem=32, fix_stem=True,
              round=(cm, 8, 0.9), features=1280, act="relu6")


def _efficientnetv2_xl(cm=1.0, dm=1.0):
  return dict(arch=[["cn_r4_k3_s1_e1_c32_skip"], ["er_r8_k3_s2_e4_c64"], ["er_r8_k3_s2_e4_c96"],
                    ["ir_r16_k3_s2_e4_c192_se0.25"], ["ir_r24_k3_s1_e6_c256_se0.25"],
                    ["ir_r32_k3_s2_e6_c512_se0.25"], ["ir_r8_k3_s1_e6_c640_se0.25"]],
              dm=dm, stem=32, round=(cm, 8, 0.9), features=1280, act="silu")


def _gc_efficientnetv2(cm=1.0, dm=1.0):
  """timm `_gen_efficientnetv2_s(rw=False, se_layer='gc')`: GlobalContext attention."""
  return dict(arch=[["cn_r2_k3_s1_e1_c24_skip"], ["er_r4_k3_s2_e4_c48"], ["er_r4_k3_s2_e4_c64"],
                    ["ir_r6_k3_s2_e4_c128_se0.25"], ["ir_r9_k3_s1_e6_c160_se0.25"],
                    ["ir_r15_k3_s2_e6_c256_se0.25"]],
              dm=dm, stem=24, round=(cm, 8, 0.9), features=round_channels(1280, cm), act="silu",
              se_kind="gc", se_round="half_up")


def _efficientnet_x(cm=1.0, dm=1.0, version=1):
  """timm `_gen_efficientnet_x` (EfficientNet-X / -H: space-to-depth first block)."""
  e = (6, 6, 6) if version == 1 else (4, 4, 4)
  return dict(arch=[["ds_r1_k3_s1_e1_c16_se0.25_d1"], [f"er_r2_k3_s2_e{e[0]}_c24_se0.25_nre"],
                    [f"er_r2_k5_s2_e{e[1]}_c40_se0.25_nre"], [f"ir_r3_k3_s2_e{e[2]}_c80_se0.25"],
                    ["ir_r3_k5_s1_e6_c112_se0.25"], ["ir_r4_k5_s2_e6_c192_se0.25"],
                    ["ir_r1_k3_s1_e6_c320_se0.25"]],
              dm=dm, stem=32, round=(cm, 8, 0.9), features=round_channels(1280, cm), act="silu")


def _mixnet_s(cm=1.0):
  return dict(arch=[["ds_r1_k3_s1_e1_c16"],
                    ["ir_r1_k3_a1.1_p1.1_s2_e6_c24", "ir_r1_k3_a1.1_p1.1_s1_e3_c24"],
                    ["ir_r1_k3.5.7_s2_e6_c40_se0.5_nsw", "ir_r3_k3.5_a1.1_p1.1_s1_e6_c40_se0.5_nsw"],
                    ["ir_r1_k3.5.7_p1.1_s2_e6_c80_se0.25_nsw",
                     "ir_r2_k3.5_p1.1_s1_e6_c80_se0.25_nsw"],
                    ["ir_r1_k3.5.7_a1.1_p1.1_s1_e6_c120_se0.5_nsw",
                     "ir_r2_k3.5.7.9_a1.1_p1.1_s1_e3_c120_se0.5_nsw"],
                    ["ir_r1_k3.5.7.9.11_s2_e6_c200_se0.5_nsw",
                     "ir_r2_k3.5.7.9_p1.1_s1_e6_c200_se0.5_nsw"]],
              stem=16, round=(cm, 8, 0.9), features=1536, act="relu")


def _mixnet_m(cm=1.0, dm=1.0):
  return dict(arch=[["ds_r1_k3_s1_e1_c24"],
                    ["ir_r1_k3.5.7_a1.1_p1.1_s2_e6_c32", "ir_r1_k3_a1.1_p1.1_s1_e3_c32"],
                    ["ir_r1_k3.5.7.9_s2_e6_c40_se0.5_nsw",
                     "ir_r3_k3.5_a1.1_p1.1_s1_e6_c40_se0.5_nsw"],
                    ["ir_r1_k3.5.7_s2_e6_c80_se0.25_nsw",
                     "ir_r3_k3.5.7.9_a1.1_p1.1_s1_e6_c80_se0.25_nsw"],
                    ["ir_r1_k3_s1_e6_c120_se0.5_nsw",
                     "ir_r3_k3.5.7.9_a1.1_p1.1_s1_e3_c120_se0.5_nsw"],
                    ["ir_r1_k3.5.7.9_s2_e6_c200_se0.5_nsw",
                     "ir_r3_k3.5.7.9_p1.1_s1_e6_c200_se0.5_nsw"]],
              dm=dm, trunc="round", stem=24, round=(cm, 8, 0.9), features=1536, act="relu")


def _tinynet(width=1.0, dm=1.0):
  return dict(arch=_B, dm=dm, trunc="round", stem=32, fix_stem=True, round=(width, 8, 0.9),
              features=max(1280, round_channels(1280, width)), act="silu")


def _mobilenet_edgetpu_v2_m(cm=1.0, dm=1.0):
  chs, gs = (32, 64, 80, 160, 192, 240, 320), 64
  return dict(arch=[[f"cn_r1_k1_s1_c{chs[0]}"],
                    [f"er_r1_k3_s2_e8_c{chs[1]}", f"er_r1_k3_s1_e4_gs{gs}_c{chs[1]}"],
                    [f"er_r1_k3_s2_e8_c{chs[2]}", f"er_r1_k3_s1_e4_gs{gs}_c{chs[2]}",
                     f"er_r1_k3_s1_e4_c{chs[2]}", f"er_r1_k3_s1_e4_gs{gs}_c{chs[2]}"],
                    [f"er_r1_k3_s2_e8_c{chs[3]}", f"ir_r3_k3_s1_e4_c{chs[3]}"],
                    [f"ir_r1_k3_s1_e8_c{chs[4]}", f"ir_r3_k3_s1_e4_c{chs[4]}"],
                    [f"ir_r1_k3_s2_e8_c{chs[5]}", f"ir_r3_k3_s1_e4_c{chs[5]}"],
                    [f"ir_r1_k3_s1_e8_c{chs[6]}"]],
              dm=dm, round=(cm, 8, 0.9), stem=64, stem_k=5, features=1344, act="relu")


def _test_efficientnet(cm=1.0, dm=1.0, norm="bn"):
  return dict(norm=norm, arch=[["cn_r1_k3_s1_e1_c16_skip"], ["er_r1_k3_s2_e4_c24"], ["er_r1_k3_s2_e4_c32"],
                    ["ir_r1_k3_s2_e4_c48_se0.25"], ["ir_r1_k3_s2_e4_c64_se0.25"]],
              dm=dm, stem=24, round=(cm, 8, 0.0), features=round_channels(256, cm, 8, 0.0),
              act="silu")


# MobileNetV3 family (timm models/mobilenetv3.py): pooled head, SE over the expanded channels
_MNV3 = dict(head="pool_conv", se_from_exp=True, se_gate="hard_sigmoid")


def _mobilenet_v3_rw(cm=1.0):
  return dict(_MNV3, arch=[["ds_r1_k3_s1_e1_c16_nre_noskip"],
                           ["ir_r1_k3_s2_e4_c24_nre", "ir_r1_k3_s1_e3_c24_nre"],
                           ["ir_r3_k5_s2_e3_c40_se0.25_nre"],
                           ["ir_r1_k3_s2_e6_c80", "ir_r1_k3_s1_e2.5_c80", "ir_r2_k3_s1_e2.3_c80"],
                           ["ir_r2_k3_s1_e6_c112_se0.25"], ["ir_r3_k5_s2_e6_c160_se0.25"],
                           ["cn_r1_k1_s1_c960"]],
              stem=16, round=(cm, 8, 0.9), features=1280, head_bias=False, act="hard_swish",
              bn_tf=True)


def _mobilenet_v3(variant: str = "large_100", cm=1.0, dm=1.0):
  small, minimal = "small" in variant, "minimal" in variant
  if small and minimal:
    arch = [["ds_r1_k3_s2_e1_c16"], ["ir_r1_k3_s2_e4.5_c24", "ir_r1_k3_s1_e3.67_c24"],
            ["ir_r1_k3_s2_e4_c40", "ir_r2_k3_s1_e6_c40"], ["ir_r2_k3_s1_e3_c48"],
            ["ir_r3_k3_s2_e6_c96"], ["cn_r1_k1_s1_c576"]]
  elif small:
    arch = [["ds_r1_k3_s2_e1_c16_se0.25_nre"],
            ["ir_r1_k3_s2_e4.5_c24_nre", "ir_r1_k3_s1_e3.67_c24_nre"],
            ["ir_r1_k5_s2_e4_c40_se0.25", "ir_r2_k5_s1_e6_c40_se0.25"],
            ["ir_r2_k5_s1_e3_c48_se0.25"], ["ir_r3_k5_s2_e6_c96_se0.25"], ["cn_r1_k1_s1_c576"]]
  elif minimal:
    arch = [["ds_r1_k3_s1_e1_c16"], ["ir_r1_k3_s2_e4_c24", "ir_r1_k3_s1_e3_c24"],
            ["ir_r3_k3_s2_e3_c40"],
            ["ir_r1_k3_s2_e6_c80", "ir_r1_k3_s1_e2.5_c80", "ir_r2_k3_s1_e2.3_c80"],
            ["ir_r2_k3_s1_e6_c112"], ["ir_r3_k3_s2_e6_c160"], ["cn_r1_k1_s1_c960"]]
  else:
    arch = [["ds_r1_k3_s1_e1_c16_nre"], ["ir_r1_k3_s2_e4_c24_nre", "ir_r1_k3_s1_e3_c24_nre"],
            ["ir_r3_k5_s2_e3_c40_se0.25_nre"],
            ["ir_r1_k3_s2_e6_c80", "ir_r1_k3_s1_e2.5_c80", "ir_r2_k3_s1_e2.3_c80"],
            ["ir_r2_k3_s1_e6_c112_se0.25"], ["ir_r3_k5_s2_e6_c160_se0.25"], ["cn_r1_k1_s1_c960"]]
  return dict(_MNV3, arch=arch, dm=dm, stem=16, fix_stem=cm < 0.75, round=(cm, 8, 0.9),
              features=1024 if small else 1280, act="relu" if minimal else "hard_swish",
              se_act="relu", se_round=(1.0, 8, 0.9))


def _fbnetv3(variant: str = "b", cm=1.0):
  arch, stem = {
      "b": ([["ds_r2_k3_s1_e1_c16"], ["ir_r1_k5_s2_e4_c24", "ir_r3_k5_s1_e2_c24"],
             ["ir_r1_k5_s2_e5_c40_se0.25", "ir_r4_k5_s1_e3_c40_se0.25"],
             ["ir_r1_k5_s2_e5_c72", "ir_r4_k3_s1_e3_c72"],
             ["ir_r1_k3_s1_e5_c120_se0.25", "ir_r5_k5_s1_e3_c120_se0.25"],
             ["ir_r1_k3_s2_e6_c184_se0.25", "ir_r5_k5_s1_e4_c184_se0.25",
              "ir_r1_k5_s1_e6_c224_se0.25"], ["cn_r1_k1_s1_c1344"]], 16),
      "d": ([["ds_r2_k3_s1_e1_c16"], ["ir_r1_k3_s2_e5_c24", "ir_r5_k3_s1_e2_c24"],
             ["ir_r1_k5_s2_e4_c40_se0.25", "ir_r4_k3_s1_e3_c40_se0.25"],
             ["ir_r1_k3_s2_e5_c72", "ir_r4_k3_s1_e3_c72"],
             ["ir_r1_k3_s1_e5_c128_se0.25", "ir_r6_k5_s1_e3_c128_se0.25"],
             ["ir_r1_k3_s2_e6_c208_se0.25", "ir_r5_k5_s1_e5_c208_se0.25",
              "ir_r1_k5_s1_e6_c240_se0.25"], ["cn_r1_k1_s1_c1440"]], 24),
      "g": ([["ds_r3_k3_s1_e1_c24"], ["ir_r1_k5_s2_e4_c40", "ir_r4_k5_s1_e2_c40"],
             ["ir_r1_k5_s2_e4_c56_se0.25", "ir_r4_k5_s1_e3_c56_se0.25"],
             ["ir_r1_k5_s2_e5_c104", "ir_r4_k3_s1_e3_c104"],
             ["ir_r1_k3_s1_e5_c160_se0.25", "ir_r8_k5_s1_e3_c160_se0.25"],
             ["ir_r1_k3_s2_e6_c264_se0.25", "ir_r6_k5_s1_e5_c264_se0.25",
              "ir_r2_k5_s1_e6_c288_se0.25"], ["cn_r1_k1_s1_c1728"]], 32),
  }[variant]
  return dict(_MNV3, arch=arch, stem=stem, round=(cm, 8, 0.95), features=1984, head_bias=False,
              se_from_exp=False, se_round=(cm, 8, 0.95), act="hard_swish")


def _lcnet(cm=1.0):
  return dict(_MNV3, arch=[["dsa_r1_k3_s1_c32"], ["dsa_r2_k3_s2_c64"], ["dsa_r2_k3_s2_c128"],
                           ["dsa_r1_k3_s2_c256", "dsa_r1_k5_s1_c256"], ["dsa_r4_k5_s1_c256"],
                           ["dsa_r2_k5_s2_c512_se0.25"]],
              stem=16, round=(cm, 8, 0.9), features=1280, act="hard_swish", se_act="relu")


_MNV4 = dict(head="pool_conv_bn", head_bias=False, features=1280)
_MNV4_HYBRID_MEDIUM = [
    ["er_r1_k3_s2_e4_c48"], ["uir_r1_a3_k5_s2_e4_c80", "uir_r1_a3_k3_s1_e2_c80"],
    ["uir_r1_a3_k5_s2_e6_c160", "uir_r1_a0_k0_s1_e2_c160", "uir_r1_a3_k3_s1_e4_c160",
     "uir_r1_a3_k5_s1_e4_c160", "mqa_r1_k3_h4_s1_v2_d64_c160", "uir_r1_a3_k3_s1_e4_c160",
     "mqa_r1_k3_h4_s1_v2_d64_c160", "uir_r1_a3_k0_s1_e4_c160", "mqa_r1_k3_h4_s1_v2_d64_c160",
     "uir_r1_a3_k3_s1_e4_c160", "mqa_r1_k3_h4_s1_v2_d64_c160", "uir_r1_a3_k0_s1_e4_c160"],
    ["uir_r1_a5_k5_s2_e6_c256", "uir_r1_a5_k5_s1_e4_c256", "uir_r2_a3_k5_s1_e4_c256",
     "uir_r1_a0_k0_s1_e2_c256", "uir_r1_a3_k5_s1_e2_c256", "uir_r1_a0_k0_s1_e2_c256",
     "uir_r1_a0_k0_s1_e4_c256", "mqa_r1_k3_h4_s1_d64_c256", "uir_r1_a3_k0_s1_e4_c256",
     "mqa_r1_k3_h4_s1_d64_c256", "uir_r1_a5_k5_s1_e4_c256", "mqa_r1_k3_h4_s1_d64_c256",
     "uir_r1_a5_k0_s1_e4_c256", "mqa_r1_k3_h4_s1_d64_c256", "uir_r1_a5_k0_s1_e4_c256"],
    ["cn_r1_k1_s1_c960"]]
_MNV4_HYBRID_LARGE = [
    ["er_r1_k3_s2_e4_c48"], ["uir_r1_a3_k5_s2_e4_c96", "uir_r1_a3_k3_s1_e4_c96"],
    ["uir_r1_a3_k5_s2_e4_c192", "uir_r3_a3_k3_s1_e4_c192", "uir_r1_a3_k5_s1_e4_c192",
     "uir_r2_a5_k3_s1_e4_c192", "mqa_r1_k3_h8_s1_v2_d48_c192", "uir_r1_a5_k3_s1_e4_c192",
     "mqa_r1_k3_h8_s1_v2_d48_c192", "uir_r1_a5_k3_s1_e4_c192", "mqa_r1_k3_h8_s1_v2_d48_c192",
     "uir_r1_a5_k3_s1_e4_c192", "mqa_r1_k3_h8_s1_v2_d48_c192", "uir_r1_a3_k0_s1_e4_c192"],
    ["uir_r4_a5_k5_s2_e4_c512", "uir_r1_a5_k0_s1_e4_c512", "uir_r1_a5_k3_s1_e4_c512",
     "uir_r2_a5_k0_s1_e4_c512", "uir_r1_a5_k3_s1_e4_c512", "uir_r1_a5_k5_s1_e4_c512",
     "mqa_r1_k3_h8_s1_d64_c512", "uir_r1_a5_k0_s1_e4_c512", "mqa_r1_k3_h8_s1_d64_c512",
     "uir_r1_a5_k0_s1_e4_c512", "mqa_r1_k3_h8_s1_d64_c512", "uir_r1_a5_k0_s1_e4_c512",
     "mqa_r1_k3_h8_s1_d64_c512", "uir_r1_a5_k0_s1_e4_c512"],
    ["cn_r1_k1_s1_c960"]]
_MNV4_CONV = {
    "small": ([["cn_r1_k3_s2_e1_c32", "cn_r1_k1_s1_e1_c32"],
               ["cn_r1_k3_s2_e1_c96", "cn_r1_k1_s1_e1_c64"],
               ["uir_r1_a5_k5_s2_e3_c96", "uir_r4_a0_k3_s1_e2_c96", "uir_r1_a3_k0_s1_e4_c96"],
               ["uir_r1_a3_k3_s2_e6_c128", "uir_r1_a5_k5_s1_e4_c128", "uir_r1_a0_k5_s1_e4_c128",
                "uir_r1_a0_k5_s1_e3_c128", "uir_r2_a0_k3_s1_e4_c128"],
               ["cn_r1_k1_s1_c960"]], 32),
    "medium": ([["er_r1_k3_s2_e4_c48"], ["uir_r1_a3_k5_s2_e4_c80", "uir_r1_a3_k3_s1_e2_c80"],
                ["uir_r1_a3_k5_s2_e6_c160", "uir_r2_a3_k3_s1_e4_c160", "uir_r1_a3_k5_s1_e4_c160",
                 "uir_r1_a3_k3_s1_e4_c160", "uir_r1_a3_k0_s1_e4_c160", "uir_r1_a0_k0_s1_e2_c160",
                 "uir_r1_a3_k0_s1_e4_c160"],
                ["uir_r1_a5_k5_s2_e6_c256", "uir_r1_a5_k5_s1_e4_c256", "uir_r2_a3_k5_s1_e4_c256",
                 "uir_r1_a0_k0_s1_e4_c256", "uir_r1_a3_k0_s1_e4_c256", "uir_r1_a3_k5_s1_e2_c256",
                 "uir_r1_a5_k5_s1_e4_c256", "uir_r2_a0_k0_s1_e4_c256", "uir_r1_a5_k0_s1_e2_c256"],
                ["cn_r1_k1_s1_c960"]], 32),
    "large": ([["er_r1_k3_s2_e4_c48"], ["uir_r1_a3_k5_s2_e4_c96", "uir_r1_a3_k3_s1_e4_c96"],
               ["uir_r1_a3_k5_s2_e4_c192", "uir_r3_a3_k3_s1_e4_c192", "uir_r1_a3_k5_s1_e4_c192",
                "uir_r5_a5_k3_s1_e4_c192", "uir_r1_a3_k0_s1_e4_c192"],
               ["uir_r4_a5_k5_s2_e4_c512", "uir_r1_a5_k0_s1_e4_c512", "uir_r1_a5_k3_s1_e4_c512",
                "uir_r2_a5_k0_s1_e4_c512", "uir_r1_a5_k3_s1_e4_c512", "uir_r1_a5_k5_s1_e4_c512",
                "uir_r3_a5_k0_s1_e4_c512"],
               ["cn_r1_k1_s1_c960"]], 24),
}


def _mobilenet_v4(variant: str = "conv_small", cm=1.0, aa=None):
  """timm `_gen_mobilenet_v4`; `aa`: anti-aliased downsampling ("avg", "blurpc")."""
  if variant == "hybrid_medium":
    arch, stem, act, ls = _MNV4_HYBRID_MEDIUM, 32, "relu", True
  elif variant == "hybrid_large":
    arch, stem, act, ls = _MNV4_HYBRID_LARGE, 24, "gelu", True
  else:
    (arch, stem), act, ls = _MNV4_CONV[variant.split("_")[1]], "relu", False
  return dict(_MNV4, arch=arch, stem=stem, fix_stem=cm < 1.0, round=(cm, 8, 0.9), act=act,
              layer_scale=ls, aa=aa)


_E = _efficientnet_edge
_LITE_SCALES = ((1.0, 1.0), (1.0, 1.1), (1.1, 1.2), (1.2, 1.4), (1.4, 1.8))
_TINY_SCALES = dict(a=(1.0, 1.2), b=(0.75, 1.1), c=(0.54, 0.85), d=(0.54, 0.695), e=(0.51, 0.6))
_MNV3_SCALES = dict(large_075=(0.75, 1.0), large_100=(1.0, 1.0), large_150d=(1.5, 1.2),
                    small_050=(0.5, 1.0), small_075=(0.75, 1.0), small_100=(1.0, 1.0))

# timm model name -> (generator, its keyword arguments, tf_ port): the `_gen_*` call of the
# model's `@register_model` in timm. tf_ ports pad like TensorFlow and use BatchNorm eps 1e-3.
GENERATORS: dict[str, tuple] = {
    "mnasnet_100": (_mnasnet_b1, dict(cm=1.0), False),
    "mnasnet_small": (_mnasnet_small, dict(cm=1.0), False),
    "semnasnet_075": (_mnasnet_a1, dict(cm=0.75), False),
    "semnasnet_100": (_mnasnet_a1, dict(cm=1.0), False),
    "spnasnet_100": (_spnasnet, dict(cm=1.0), False),
    "mobilenetv1_100": (_mobilenet_v1, dict(cm=1.0), False),
    "mobilenetv1_100h": (_mobilenet_v1, dict(cm=1.0, head_conv=True), False),
    "mobilenetv1_125": (_mobilenet_v1, dict(cm=1.25), False),
    "mobilenetv2_050": (_mobilenet_v2, dict(cm=0.5), False),
    "mobilenetv2_100": (_mobilenet_v2, dict(cm=1.0), False),
    "mobilenetv2_140": (_mobilenet_v2, dict(cm=1.4), False),
    "mobilenetv2_110d": (_mobilenet_v2, dict(cm=1.1, dm=1.2, fix_stem_head=True), False),
    "mobilenetv2_120d": (_mobilenet_v2, dict(cm=1.2, dm=1.4, fix_stem_head=True), False),
    # timm builds fbnetc_100 with BatchNorm eps 1e-3 when it loads the pretrained weights
    "fbnetc_100": (_fbnetc, dict(cm=1.0), False),
    "efficientnet_es": (_E, dict(cm=1.0, dm=1.0), False),
    "efficientnet_es_pruned": (_E, dict(cm=1.0, dm=1.0), False),
    "efficientnet_em": (_E, dict(cm=1.0, dm=1.1), False),
    "efficientnet_el": (_E, dict(cm=1.2, dm=1.4), False),
    "efficientnet_el_pruned": (_E, dict(cm=1.2, dm=1.4), False),
    "tf_efficientnet_es": (_E, dict(cm=1.0, dm=1.0), True),
    "tf_efficientnet_em": (_E, dict(cm=1.0, dm=1.1), True),
    "tf_efficientnet_el": (_E, dict(cm=1.2, dm=1.4), True),
    "tf_efficientnet_cc_b0_4e": (_efficientnet_condconv, dict(cm=1.0, dm=1.0), True),
    "tf_efficientnet_cc_b0_8e": (_efficientnet_condconv, dict(experts_multiplier=2), True),
    "tf_efficientnet_cc_b1_8e": (_efficientnet_condconv, dict(dm=1.1, experts_multiplier=2),
                                 True),
    "efficientnet_lite0": (_efficientnet_lite, dict(cm=1.0, dm=1.0), False),
    **{f"tf_efficientnet_lite{i}": (_efficientnet_lite, dict(cm=cm, dm=dm), True)
       for i, (cm, dm) in enumerate(_LITE_SCALES)},
    "tf_efficientnetv2_xl": (_efficientnetv2_xl, {}, True),
    "efficientnet_x_b5": (_efficientnet_x, dict(cm=1.6, dm=2.2), False),
    "efficientnet_h_b5": (_efficientnet_x, dict(cm=1.92, dm=2.2, version=2), False),
    "gc_efficientnetv2_rw_t": (_gc_efficientnetv2, dict(cm=0.8, dm=0.9), False),
    "mixnet_s": (_mixnet_s, dict(cm=1.0), False),
    "mixnet_m": (_mixnet_m, dict(cm=1.0), False),
    "mixnet_l": (_mixnet_m, dict(cm=1.3), False),
    "mixnet_xl": (_mixnet_m, dict(cm=1.6, dm=1.2), False),
    "tf_mixnet_s": (_mixnet_s, dict(cm=1.0), True),
    "tf_mixnet_m": (_mixnet_m, dict(cm=1.0), True),
    "tf_mixnet_l": (_mixnet_m, dict(cm=1.3), True),
    **{f"tinynet_{v}": (_tinynet, dict(width=w, dm=d), False) for v, (w, d) in _TINY_SCALES.items()},
    "mobilenet_edgetpu_v2_m": (_mobilenet_edgetpu_v2_m, {}, False),
    "test_efficientnet": (_test_efficientnet, {}, False),
    "test_efficientnet_gn": (_test_efficientnet, dict(norm="gn8"), False),
    "test_efficientnet_ln": (_test_efficientnet, dict(norm="ln"), False),
    "test_efficientnet_evos": (_test_efficientnet, dict(norm="evos8"), False),
    # timm models/mobilenetv3.py
    "mobilenetv3_rw": (_mobilenet_v3_rw, dict(cm=1.0), False),
    **{f"mobilenetv3_{v}": (_mobilenet_v3, dict(variant=v, cm=cm, dm=dm), False)
       for v, (cm, dm) in _MNV3_SCALES.items()},
    **{f"tf_mobilenetv3_{v}": (_mobilenet_v3, dict(variant=v, cm=cm), True) for v, cm in (
        ("large_075", 0.75), ("large_100", 1.0), ("large_minimal_100", 1.0),
        ("small_075", 0.75), ("small_100", 1.0), ("small_minimal_100", 1.0))},
    **{f"fbnetv3_{v}": (_fbnetv3, dict(variant=v), False) for v in "bdg"},
    **{f"mobilenetv4_{v}": (_mobilenet_v4, dict(variant=v), False) for v in (
        "conv_small", "conv_medium", "conv_large", "hybrid_medium", "hybrid_large")},
    "mobilenetv4_conv_small_050": (_mobilenet_v4, dict(variant="conv_small", cm=0.5), False),
    "mobilenetv4_conv_aa_large": (_mobilenet_v4, dict(variant="conv_large", aa="avg"), False),
    "mobilenetv4_conv_blur_medium": (_mobilenet_v4, dict(variant="conv_medium", aa="blurpc"),
                                     False),
    **{f"lcnet_{n}": (_lcnet, dict(cm=cm), False) for n, cm in (("050", 0.5), ("075", 0.75),
                                                                ("100", 1.0))},
}


# timm's pruned EfficientNets (timm models/_pruned/efficientnet_b*_pruned.txt, from "Knapsack
# Pruning with Inner Distillation"): the tf_ B1-B3 blocks with other widths; per block
# "mid/out/se" channels in order.
PRUNED = {
    "efficientnet_b1_pruned": ((1.0, 1.1), (
        "32/16/8 16/16/4 48/12/4 62/12/6 48/12/6 70/35/6 61/35/10 51/35/10 175/74/10 188/74/20 "
        "137/74/20 164/74/20 399/67/20 201/67/28 160/67/28 213/67/28 637/192/27 806/192/48 "
        "798/192/48 891/192/48 990/192/48 1152/320/48 1912/320/80")),
    "efficientnet_b2_pruned": ((1.1, 1.2), (
        "32/16/8 16/16/4 54/17/4 69/17/6 61/17/6 86/42/6 72/42/12 98/42/12 245/85/12 274/85/22 "
        "254/85/22 292/85/22 502/116/22 315/116/30 354/116/30 443/116/30 719/208/30 1148/208/52 "
        "1160/208/52 1182/208/52 1228/208/52 1248/352/52 2112/352/88")),
    "efficientnet_b3_pruned": ((1.2, 1.4), (
        "40/24/10 24/24/6 27/12/6 49/12/8 48/12/8 83/40/8 90/40/12 85/40/12 215/93/12 261/93/24 "
        "219/93/24 254/93/24 236/93/24 480/120/24 235/120/34 217/120/34 226/120/33 340/120/34 "
        "802/232/34 1030/232/58 924/232/58 1016/232/58 1130/232/58 1266/232/58 1392/384/58 "
        "2301/384/96")),
}


def pruned_arch(name: str) -> dict:
  """`efficientnet.Model` keyword arguments of a timm pruned EfficientNet (`PRUNED`)."""
  (cm, dm), widths = PRUNED[name]
  arch = build({**_efficientnet(cm, dm), "tf": True, "name": name})
  it = iter(tuple(int(c) for c in w.split("/")) for w in widths.split())
  stages, cin = [], arch["stem_chs"]
  for stage in arch["stages"]:
    blocks = []
    for kind, k, s, _, _, _, _, res, opts in stage:
      mid, cout, se = next(it)
      blocks.append((kind, k, s, cin, mid, cout, se, res, opts))
      cin = cout
    stages.append(tuple(blocks))
  if next(it, None) is not None:
    raise ValueError(f"{name}: more pruned widths than blocks.")
  return {**arch, "stages": tuple(stages)}


def timm_model_arch(name: str, **gen_kwargs) -> dict:
  """`efficientnet.Model` keyword arguments of the timm model `name` (no pretrained tag);
  `gen_kwargs` override its generator's (e.g. cm / dm: the channel / depth multipliers of a
  small stand-in)."""
  if name not in GENERATORS:
    raise ValueError(f"No ported timm architecture definition for {name!r}; known: "
                     f"{sorted(GENERATORS)}.")
  gen, kwargs, tf = GENERATORS[name]
  return build({**gen(**{**kwargs, **gen_kwargs}), "tf": tf, "name": name})
