"""AUROC of every detector with bfloat16 compute vs float32, on the same weights (the demo).

    .venv/bin/python bench/bf16_auroc.py --workdir /tmp/demo [--config configs/demo.py]

Runs the float32 benchmark in `--workdir` (or reuses its cache), then extracts every set again
with the model computing in bfloat16 (`model.dtype_mm`; features and logits come out float32)
from the same trained parameters, scores every detector and prints AUROC(bf16) - AUROC(float32)
per detector and OOD set.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fi_jax import pipeline
from fi_jax.run import benchmark as run
from fi_jax.run import model as run_model


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--workdir", required=True)
  p.add_argument("--config", default="configs/demo.py")
  p.add_argument("--dtype_field", default="dtype_mm", help="the family's compute dtype field")
  args = p.parse_args(argv)
  spec = importlib.util.spec_from_file_location("cfg", args.config)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  c32 = mod.get_config()
  quiet = lambda s: None
  r32 = run.run(c32, args.workdir, log=quiet)
  c16 = mod.get_config()
  c16.model[args.dtype_field] = "bfloat16"
  model = run_model.LazyModel(c16, quiet, args.workdir)
  model.params_cache = run_model.LazyModel(c32, quiet, args.workdir).params_cache   # same weights
  dets = run.config_detectors(c16)
  sets = run.extract_cached(c16, model, args.workdir, quiet, dets)
  head = run_model.cached_head(c32, model, args.workdir, quiet)
  scores, errors = pipeline.score_sets(dets, sets, head, keep_going=True)
  a16 = {(r["detector"], r["ood_set"]): r["auroc"] for r in pipeline.metric_rows(scores, sets)}
  print(f"{'detector':18s} {'ood set':14s} {'AUROC f32':>9s} {'bf16 - f32':>10s}")
  worst = 0.0
  for r in r32["rows"]:
    key = (r["detector"], r["ood_set"])
    if key in a16:
      d = a16[key] - r["auroc"]
      worst = max(worst, abs(d))
      print(f"{key[0]:18s} {key[1]:14s} {r['auroc']:9.4f} {d:+10.4f}")
  print(f"max |AUROC bf16 - f32| = {worst:.4f}; failed: {sorted(errors)}")


if __name__ == "__main__":
  main()
