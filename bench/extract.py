"""Extraction throughput: input only, model only and end to end, in one run.

    .venv/bin/python bench/extract.py --model resnet18 --size 64 --batch 64 --images 512
    .venv/bin/python bench/extract.py --model vit_b16 --size 224 --batch 256 --dtype bfloat16 \
        --peak_tflops 989

A tar of random JPEGs (`--images` of them, `--jpeg_size` px) is made on the fly; then
  a = input only: decode + preprocess (tf.data, parallel, deterministic order) images/s;
  b = model only: the compiled forward step on device-resident random batches, images/s;
  c = end to end: `fi_jax.extract.Forward.chunks` over the tf.data batches (the pipelined
      extraction the benchmark runs), images/s;
and the number of XLA compilations (by function). It prints c / (a·b/(a+b)) (both stages
sharing one CPU: target >= 0.9) and c / min(a, b) (an accelerator: target >= 0.9). With
`--peak_tflops` (or $PEAK_TFLOPS) it also prints the model FLOP utilisation of b and c, with the
step's FLOPs from XLA's cost analysis of the compiled step.
"""
from __future__ import annotations

import argparse
import collections
import io
import os
import sys
import tarfile
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from PIL import Image  # noqa: E402

from fi_jax.common import distributed
from fi_jax.data import preprocess
from fi_jax.extract import forward as extract
from fi_jax.models import resnet, vit  # noqa: E402

# name -> (module, Model kwargs); `dtype` is added from --dtype (vit maps it to dtype_mm)
MODELS = {
    "vit_b16": (vit, dict(variant="B/16")),
    "vit_s16": (vit, dict(variant="S/16")),
    "vit_ti16": (vit, dict(variant="Ti/16")),
    "resnet50": (resnet, dict(variant="resnet50")),
    "resnet18": (resnet, dict(variant="resnet18")),
}


def jpeg_tar(path: str, n: int, size: int, seed: int = 0) -> None:
  """`n` random smooth JPEGs of size x size (quality 90) in a tar."""
  rng = np.random.default_rng(seed)
  with tarfile.open(path, "w") as tar:
    for i in range(n):
      low = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
      img = Image.fromarray(low).resize((size, size), Image.BILINEAR)
      buf = io.BytesIO()
      img.save(buf, format="JPEG", quality=90)
      info = tarfile.TarInfo(f"{i:06d}.jpg")
      info.size = buf.tell()
      buf.seek(0)
      tar.addfile(info, buf)


def input_pipeline(path: str, pp: str, batch: int):
  """Batches of {image, label, group, _id, _mask} from the tar, as `fi_jax.data.batches`
  builds them (parallel deterministic map, fixed batch, prefetch)."""
  with tarfile.open(path) as tar:
    blobs = [tar.extractfile(m).read() for m in tar.getmembers()]
  n = len(blobs) - len(blobs) % batch
  fn = preprocess.get_preprocess_fn(pp)

  def pp_fn(i, b):
    return {"image": tf.cast(fn({"image": b})["image"], tf.float32),
            "label": tf.constant(0, tf.int64), "group": tf.constant(-1, tf.int64),
            "_id": tf.cast(i, tf.int64), "_mask": tf.constant(True)}
  ds = tf.data.Dataset.from_tensor_slices(blobs[:n]).enumerate()
  ds = ds.map(pp_fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return ds.batch(batch, drop_remainder=True).prefetch(2), n   # data.batches: prefetch=2


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--model", default="resnet18", choices=sorted(MODELS))
  p.add_argument("--size", type=int, default=64, help="model input size (px)")
  p.add_argument("--jpeg_size", type=int, default=0, help="JPEG size (default: size * 8 / 7)")
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--images", type=int, default=512)
  p.add_argument("--dtype", default="float32")
  p.add_argument("--repeats", type=int, default=3, help="timed model-only passes over the set")
  p.add_argument("--peak_tflops", type=float, default=float(os.environ.get("PEAK_TFLOPS", 0)),
                 help="the device's peak TFLOP/s at --dtype, for MFU (or $PEAK_TFLOPS)")
  args = p.parse_args(argv)
  compiles: collections.Counter = collections.Counter()
  jax.monitoring.register_event_duration_secs_listener(
      lambda ev, d, **kw: compiles.update([kw.get("fun_name", "?")])
      if ev == "/jax/core/compile/backend_compile_duration" else None)

  jpeg = args.jpeg_size or args.size * 8 // 7
  pp = f"decode|resize_small({jpeg})|central_crop({args.size})|value_range(-1, 1)"
  mod, kw = MODELS[args.model]
  model = mod.Model(1000, dtype=args.dtype, **kw)
  params = jax.jit(model.init)(jax.random.PRNGKey(0),
                               jnp.zeros((1, args.size, args.size, 3)))["params"]

  def predict(p_, images):
    logits, out = model.apply({"params": p_}, images)
    return logits, out["pre_logits"]
  mesh = distributed.data_mesh()
  fwd = extract.Forward(predict, mesh)
  params = fwd.put_params(params)

  with tempfile.TemporaryDirectory() as tmp:
    tar = os.path.join(tmp, "images.tar")
    t = time.time()
    jpeg_tar(tar, args.images, jpeg)
    print(f"{args.images} JPEGs of {jpeg} px in a tar ({os.path.getsize(tar) / 2**20:.1f} MiB, "
          f"{time.time() - t:.1f} s); pp {pp!r}; {args.model} {args.dtype}, batch {args.batch}, "
          f"{jax.device_count()} x {jax.devices()[0].device_kind}")

    ds, n = input_pipeline(tar, pp, args.batch)
    for _ in ds.take(1):   # warm tf.data (graph building) outside the timing
      pass
    t = time.time()
    for _ in ds.as_numpy_iterator():
      pass
    a = n / (time.time() - t)

    rng = np.random.default_rng(0)
    local = {"image": rng.uniform(-1, 1, (args.batch, args.size, args.size, 3)).astype(np.float32),
             "label": np.zeros(args.batch, np.int64), "group": -np.ones(args.batch, np.int64),
             "_id": np.arange(args.batch, dtype=np.int64), "_mask": np.ones(args.batch, bool)}
    batch = distributed.global_batch(mesh, local)
    active = fwd.active()   # (no input scorers here: an empty flag vector)
    compiled = fwd.step.lower(params, batch, active).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    flops = float((cost or {}).get("flops", 0.0))
    jax.block_until_ready(fwd.step(params, batch, active))   # warm
    steps = max(1, n // args.batch) * args.repeats
    t = time.time()
    outs = [fwd.step(params, batch, active) for _ in range(steps)]
    jax.block_until_ready(outs)
    b = steps * args.batch / (time.time() - t)
    del outs

    t = time.time()
    rows = sum(len(r["logits"]) for r in fwd.chunks(params, ds.as_numpy_iterator()))
    c = rows / (time.time() - t)

  print(f"input only   a = {a:9.1f} images/s")
  print(f"model only   b = {b:9.1f} images/s")
  print(f"end to end   c = {c:9.1f} images/s")
  print(f"c / (a·b/(a+b)) = {c / (a * b / (a + b)):.3f}   (shared CPU: target >= 0.9)")
  print(f"c / min(a, b)   = {c / min(a, b):.3f}   (accelerator: target >= 0.9)")
  if flops:
    print(f"step FLOPs {flops:.3e} ({flops / args.batch / 1e9:.2f} GFLOP/image)")
    if args.peak_tflops:
      for label, rate in (("model only", b), ("end to end", c)):
        mfu = flops / args.batch * rate / (args.peak_tflops * 1e12)
        print(f"MFU {label}: {100 * mfu:.1f}% of {args.peak_tflops:g} TFLOP/s")
  print("compilations:", dict(compiles), f"(forward step: {compiles['jit(step)']})")


if __name__ == "__main__":
  main()
