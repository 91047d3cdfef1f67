"""Model forward throughput: fi_jax (jit) vs the PyTorch reference, side by side.

    .venv/bin/python bench/models.py [--batch 8] [--repeats 5] [--threads 2] [--only vit_b16]
    .venv/bin/python bench/models.py --batch 32 --only resnet50,convnext_t,swin_t,resnet50_stages

Each entry of `BENCHMARKS` is a function `(args) -> list of rows`; a row is
dict(name, fi_jax_s, ref_s, batch, max_abs_diff[, xla_default_s]). The fi_jax forward is
compiled as the pipeline compiles it: XLA_FLAGS as the CLI sets them (`--xla-flags=cli`, the
default: the quick CPU pipeline) and the forward step's compiler options
(`fi_jax.common.compile_options.model_step()`); "vs XLA default" is the time of the same forward
compiled with XLA's default CPU code generation (`xla_flags.XLA_DEFAULTS`) over fi_jax's (the CLI's
flags must not slow a forward: >= 0.95x). Both sides get the same weights (the
reference's random init, converted by fi_jax's own loader from a safetensors file), the same
inputs, the same batch and thread count; timings are the best of `repeats` warm calls, run
alternately so that load on a shared machine hits both sides alike. To add a model, write a
function like `vit_b16` and append it to `BENCHMARKS`.

`resnet50_stages` splits ResNet-50's forward into the stem and the four stages. What made the
convnets slow on XLA:CPU, and what fi_jax does about it (docs/performance.md has the figures):
XLA:CPU's grouped convolution with one channel per group (the 7x7 depthwise convolutions of
ConvNeXt, EfficientNet's) is a slow generic loop, so the models compute it as shifted
multiply-adds (`fi_jax.models._blocks.DepthwiseConv`); XLA:CPU's YNNPACK fusions of the
elementwise chains before a LayerNorm / batch norm are slow, so the forward step turns them off
(`compile_options.CPU_FORWARD`); the quick CPU pipeline's LLVM -O1 slows the batch-norm
fusions, so the forward step keeps XLA's defaults (`compile_options.model_step`). The
transformers lost time in three places: XLA:CPU's tree-reduction rewrite of every LayerNorm /
softmax row reduction into an unfused reduce-window (the forward step disables that pass),
`jax.nn.gelu`'s erfc (the ports use `_blocks.gelu_exact`, torch's erf formula) and the
[B, H, N, N] attention logits streamed through memory several times (`_blocks.attention` runs
the (batch, head) pairs in cache-sized chunks on the CPU).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Callable

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)                          # fi_jax
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

from fi_jax.common import compile_options  # noqa: E402
from fi_jax.models import torchvision_shim  # noqa: E402
from fi_jax.run import xla_flags  # noqa: E402


def alternate(fns: dict[str, Callable[[], np.ndarray]], repeats: int) -> dict[str, float]:
  """Median wall time of each warm fn over `repeats` rounds; the calling order flips every
  round (ABBA...), so that load from other processes on a shared machine hits both alike."""
  for fn in fns.values():  # warm-up (jit compile, allocator)
    fn()
  times = {k: [] for k in fns}
  items = list(fns.items())
  for r in range(repeats):
    for k, fn in (items if r % 2 == 0 else items[::-1]):
      t = time.perf_counter()
      fn()
      times[k].append(time.perf_counter() - t)
  return {k: float(np.median(v)) for k, v in times.items()}


def vit_b16(args) -> list[dict]:
  """ViT-B/16 @224 classifier (timm vit_base_patch16_224 structure, 1000 classes)."""
  import jax
  import jax.numpy as jnp
  import torch
  from safetensors.torch import save_file
  torchvision_shim.install()
  from timm.models import vision_transformer as tv

  from fi_jax.models import vit

  torch.manual_seed(0)
  ref = tv.VisionTransformer(img_size=224, patch_size=16, embed_dim=768, depth=12, num_heads=12,
                             num_classes=1000).eval()
  model = vit.Model(1000, variant="B/16", pool_type="tok", act="gelu_exact")
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "model.safetensors")
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, path)
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 224, 224, 3)))["params"]
    params = jax.device_put(vit.load(shapes, path))

  x = np.random.default_rng(0).uniform(-1, 1, (args.batch, 224, 224, 3)).astype(np.float32)
  return [_forward_row("ViT-B/16@224 fwd (timm)", model, params, ref, x, args)]


def _forward_row(name: str, model, params, ref, x: np.ndarray, args) -> dict:
  """Times the jitted fi_jax forward against the torch reference on the same NHWC batch x
  (alternating, best of args.repeats) and records the largest logit difference."""
  import jax
  import torch  # after the shim in main()
  xt = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()
  xj = jax.device_put(x)
  apply = lambda p, im: model.apply({"params": p}, im)[0]
  fwd = jax.jit(apply, compiler_options=compile_options.model_step())   # as the pipeline does
  xla_default = jax.jit(apply, compiler_options=xla_flags.XLA_DEFAULTS)

  def run_jax():
    return np.asarray(jax.block_until_ready(fwd(params, xj)))

  def run_xla_default():
    return np.asarray(jax.block_until_ready(xla_default(params, xj)))

  def run_torch():
    with torch.inference_mode():
      return ref(xt).numpy()

  diff = float(np.max(np.abs(run_jax() - run_torch())))
  best = alternate({"fi_jax": run_jax, "ref": run_torch, "xla": run_xla_default}, args.repeats)
  return dict(name=name, fi_jax_s=best["fi_jax"], ref_s=best["ref"], xla_default_s=best["xla"],
              batch=args.batch, max_abs_diff=diff)


def clip_b16(args) -> list[dict]:
  """CLIP ViT-B/16 @224 image tower (open_clip ViT-B-16-quickgelu structure, OpenAI's)."""
  import jax
  import jax.numpy as jnp
  import torch
  from safetensors.torch import save_file
  torchvision_shim.install()
  import open_clip

  from fi_jax.models import clip

  torch.manual_seed(0)
  ref = open_clip.create_model("ViT-B-16-quickgelu", pretrained=None).eval()
  model = clip.Model("B/16", act="quick_gelu")
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "open_clip_model.safetensors")
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, path)
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 224, 224, 3)))["params"]
    params = jax.device_put(clip.load(shapes, path))

  x = np.random.default_rng(0).normal(0, 1, (args.batch, 224, 224, 3)).astype(np.float32)
  xt = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()
  xj = jax.device_put(x)
  fwd = jax.jit(lambda p, im: model.apply({"params": p}, im)[2]["img/logits"])

  def run_jax():
    return np.asarray(jax.block_until_ready(fwd(params, xj)))

  def run_torch():
    with torch.inference_mode():
      return ref.encode_image(xt).numpy()

  diff = float(np.max(np.abs(run_jax() - run_torch())))
  times = alternate({"fi_jax": run_jax, "ref": run_torch}, args.repeats)
  return [dict(name="CLIP B/16@224 image tower", fi_jax_s=times["fi_jax"], ref_s=times["ref"],
               batch=args.batch, max_abs_diff=diff)]


def _zoo_bench(args, name: str, label: str, make_ref, overrides=None) -> list[dict]:
  """A torchvision architecture with random weights (torchvision's init, BN statistics as
  initialised), saved with torch.save and read through fi_jax.models.zoo.from_pretrained."""
  import jax
  import torch

  from fi_jax.models import zoo

  torch.manual_seed(0)
  ref = make_ref().eval()
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "weights.pth")
    torch.save(ref.state_dict(), path)
    model, params, info = zoo.from_pretrained(name, path, **(overrides or {}))
  params = jax.device_put(params)
  size = info["input_size"]
  x = np.random.default_rng(0).normal(0, 1, (args.batch, size, size, 3)).astype(np.float32)
  return [_forward_row(f"{label}@{size} fwd (tv)", model, params, ref, x, args)]


def resnet50(args) -> list[dict]:
  """torchvision ResNet-50 (V1.5), 1000 classes."""
  import torchvision  # after the shim in main()
  return _zoo_bench(args, "torchvision/resnet50.IMAGENET1K_V1", "ResNet-50",
                    lambda: torchvision.models.resnet50())


def convnext_t(args) -> list[dict]:
  """torchvision ConvNeXt-T, 1000 classes."""
  import torchvision
  return _zoo_bench(args, "torchvision/convnext_tiny.IMAGENET1K_V1", "ConvNeXt-T",
                    lambda: torchvision.models.convnext_tiny())


def swin_t(args) -> list[dict]:
  """torchvision Swin-T, 1000 classes."""
  import torchvision
  return _zoo_bench(args, "torchvision/swin_t.IMAGENET1K_V1", "Swin-T",
                    lambda: torchvision.models.swin_t())


def efficientnet_b0(args) -> list[dict]:
  """torchvision EfficientNet-B0, 1000 classes."""
  import torchvision
  return _zoo_bench(args, "torchvision/efficientnet_b0.IMAGENET1K_V1", "EfficientNet-B0",
                    lambda: torchvision.models.efficientnet_b0())


def _timm_zoo_bench(args, name: str, label: str) -> list[dict]:
  """A timm architecture with random weights (timm's init), saved as model.safetensors and
  read through fi_jax.models.zoo.from_pretrained."""
  import jax
  import timm
  import torch
  from safetensors.torch import save_file

  from fi_jax.models import zoo

  torch.manual_seed(0)
  ref = timm.create_model(name.split("/", 1)[1], pretrained=False).eval()
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "model.safetensors")
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, path)
    model, params, info = zoo.from_pretrained(name, path)
  params = jax.device_put(params)
  size = info["input_size"]
  x = np.random.default_rng(0).normal(0, 1, (args.batch, size, size, 3)).astype(np.float32)
  return [_forward_row(f"{label}@{size} fwd (timm)", model, params, ref, x, args)]


def convnextv2_t(args) -> list[dict]:
  """timm ConvNeXt V2-T (GRN), 1000 classes."""
  return _timm_zoo_bench(args, "timm/convnextv2_tiny.fcmae_ft_in22k_in1k", "ConvNeXt V2-T")


def eva02_s(args) -> list[dict]:
  """timm EVA-02-S (RoPE, SwiGLU), 1000 classes, at its 336 px."""
  return _timm_zoo_bench(args, "timm/eva02_small_patch14_336.mim_in22k_ft_in1k", "EVA-02-S")


def mobilenets(args) -> list[dict]:
  """timm's arch-string models with new blocks: MobileNetV3-L (hard-swish, pooled head),
  MixNet-M (mixed kernels), MobileNetV4 hybrid-M (UIR, multi-query attention), EfficientNet
  CondConv B0 (per-sample kernels)."""
  return [row for name, label in (
      ("timm/mobilenetv3_large_100.ra_in1k", "MobileNetV3-L"),
      ("timm/mixnet_m.ft_in1k", "MixNet-M"),
      ("timm/mobilenetv4_hybrid_medium.e500_r224_in1k", "MobileNetV4-hybrid-M"),
      ("timm/tf_efficientnet_cc_b0_4e.in1k", "EfficientNet-CC-B0-4e"))
      for row in _timm_zoo_bench(args, name, label)]


def resnet50_stages(args) -> list[dict]:
  """Where ResNet-50's forward time goes in fi_jax vs torch: stem and each stage alone
  (batch `args.batch`, 224 px), plus XLA's cost analysis (FLOPs) of the whole forward."""
  import jax
  import torch
  import torchvision

  from fi_jax.models import resnet

  torch.manual_seed(0)
  ref = torchvision.models.resnet50().eval()
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "weights.pth")
    torch.save(ref.state_dict(), path)
    from fi_jax.models import zoo
    model, params, _ = zoo.from_pretrained("torchvision/resnet50.IMAGENET1K_V1", path)
  x = np.random.default_rng(0).normal(0, 1, (args.batch, 224, 224, 3)).astype(np.float32)
  fwd = jax.jit(lambda p, im: model.apply({"params": p}, im)[0])
  cost = fwd.lower(params, x).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  print(f"  ResNet-50 fwd, batch {args.batch}: XLA cost analysis {cost.get('flops', 0) / 1e9:.1f} "
        f"GFLOP", flush=True)
  # stages: the fi_jax block stack of stage s vs torch's layer{s}, on that stage's input
  rows = []
  with torch.inference_mode():
    xt = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()
    t_stem = torch.nn.Sequential(ref.conv1, ref.bn1, ref.relu, ref.maxpool)
    inputs_t = [xt]
    for m in (t_stem, ref.layer1, ref.layer2, ref.layer3):
      inputs_t.append(m(inputs_t[-1]))
  _, out = jax.jit(lambda p, im: model.apply({"params": p}, im))(params, x)
  inputs_j = [x, out["stem"], out["stage1"], out["stage2"], out["stage3"]]
  depths = resnet.ARCHS["resnet50"]["depths"]
  for s, (tmod, label) in enumerate(zip((t_stem, ref.layer1, ref.layer2, ref.layer3, ref.layer4),
                                        ("stem", "stage1", "stage2", "stage3", "stage4"))):
    if s == 0:
      sub = resnet.ResNet(None, depths=(0, 0, 0, 0))
      sub_p = {k: params[k] for k in ("conv1", "bn1")}
      jfn = jax.jit(lambda p, im, sub=sub: sub.apply({"params": p}, im)[1]["stem"])
    else:
      blocks = [resnet.Bottleneck(planes=64 * 2 ** (s - 1), stride=2 if s > 1 and b == 0 else 1,
                                  shortcut="conv" if b == 0 else None)
                for b in range(depths[s - 1])]
      sub_p = [params[f"layer{s}_{b}"] for b in range(depths[s - 1])]

      def stack(p, im, blocks=blocks):
        for blk, bp in zip(blocks, p):
          im = blk.apply({"params": bp}, im)
        return im
      jfn = jax.jit(stack)
    xj, xt_s = jax.device_put(inputs_j[s]), inputs_t[s]

    def run_jax(jfn=jfn, sub_p=sub_p, xj=xj):
      return jax.block_until_ready(jfn(sub_p, xj))

    def run_torch(tmod=tmod, xt_s=xt_s):
      with torch.inference_mode():
        return tmod(xt_s)
    times = alternate({"fi_jax": run_jax, "ref": run_torch}, args.repeats)
    rows.append(dict(name=f"  ResNet-50 {label}", fi_jax_s=times["fi_jax"], ref_s=times["ref"],
                     batch=args.batch, max_abs_diff=float("nan")))
  return rows


BENCHMARKS: list[Callable] = [vit_b16, clip_b16, resnet50, convnext_t, swin_t, efficientnet_b0,
                              convnextv2_t, eva02_s, mobilenets, resnet50_stages]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--repeats", type=int, default=8)
  parser.add_argument("--threads", type=int, default=2)
  parser.add_argument("--only", default="", help="comma-separated benchmark function names")
  parser.add_argument("--xla-flags", choices=("cli", "default"), default="cli",
                      help="cli: XLA_FLAGS as the CLI sets them (fi_jax.run.xla_flags); default: "
                           "as they are")
  args = parser.parse_args()
  if args.xla_flags == "cli":
    xla_flags.fast_cpu_compile()   # before JAX starts its backend, as the CLI does
  print(f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}; the forward's compiler options: "
        f"{compile_options.model_step()}", flush=True)
  import torch
  torch.set_num_threads(args.threads)
  torchvision_shim.install()
  # XLA:CPU sizes its thread pool from the visible cores; pin both sides to the same count.
  os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:args.threads]))
  only = set(filter(None, args.only.split(",")))
  print(f"{'model':<28} {'batch':>5} {'fi_jax img/s':>13} {'ref img/s':>10} {'ratio':>6} "
        f"{'vs XLA default':>14} {'max|diff|':>10}")
  for bench in BENCHMARKS:
    if only and bench.__name__ not in only:
      continue
    for r in bench(args):
      fj, rf = r["batch"] / r["fi_jax_s"], r["batch"] / r["ref_s"]
      vs = f"{r['xla_default_s'] / r['fi_jax_s']:>13.2f}x" if "xla_default_s" in r else f"{'':>14}"
      print(f"{r['name']:<28} {r['batch']:>5} {fj:>13.2f} {rf:>10.2f} {fj / rf:>5.2f}x {vs} "
            f"{r['max_abs_diff']:>10.2e}", flush=True)


if __name__ == "__main__":
  main()
