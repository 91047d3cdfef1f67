"""Benchmark: where the compiled detector suite spends its time, XLA's matrix products or the rest.

    python bench/suite_profile.py --coretype SkylakeX          # bench/detectors.py's part-1a suite
    python bench/suite_profile.py --scale 0.1 --detectors knn,mds --top 5   # + each run's 5 slowest ops

Target (a) of bench/detectors.py compares the suite without the pairwise-kernel detectors with
one faiss-cpu exact search. This script splits the suite's compiled time, so that what (a) asks
of the non-product work can be read off. On bench/detectors.py's data it runs the same suite
(every feature / logit detector x both presets but relation, weiper_kld and weiper, fit + score,
inside one `detectors.shared()` scope, the sets handed over as JAX arrays) three times:

1. cold, with XLA dumping the optimised HLO of every module it compiles (`--xla_dump_to`, a
   temporary folder), so that every op of every module is known to hold a product or not;
2. compiled, unprofiled: the time target (a) reads;
3. compiled, under `jax.profiler`: for each detector x preset run, every XLA op's own time
   (its trace events less the ops nested in them, per thread) is put in one of two classes:
   - *products*: dots and convolutions (a YNNPACK / Eigen fusion that holds one, with whatever
     elementwise work XLA fused into it) and LAPACK custom calls (eigh, svd, ...);
   - *other XLA ops*: elementwise and reduction fusions, sorts, gathers, scatters, copies.
   The rest of the run's wall time is *outside XLA*: Python, NumPy (including the host-side
   products some fits make with OpenBLAS, e.g. the float64 scatter matrices), dispatch and
   transfers. An op whose name is ambiguous (the same module and op name with both classes
   among the modules compiled for the run) is counted as *unclassified*. `--top N` lists each
   run's N slowest ops with the JAX operation each comes from (the HLO's `op_name`).

One faiss-cpu exact search (bench/detectors.py's `faiss_knn` at the suite's largest KNN k:
IndexFlatL2 on the unit rows) is timed before run 2 and after run 3. Profiling adds its own cost to the
non-product classes; the unprofiled time is the one to compare with (a).
"""
from __future__ import annotations

import argparse
import collections
import glob
import gzip
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fi_jax.run import huge_pages  # noqa: E402

huge_pages.reexec()   # as the CLI and bench/detectors.py: first, before the environment changes

_DUMP = tempfile.mkdtemp(prefix="fi_jax_suite_hlo_")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + f" --xla_dump_to={_DUMP} --xla_dump_hlo_as_text").strip()

# bench/detectors.py sets OPENBLAS_CORETYPE (from --coretype), x64 and the data; loaded as a module
_spec = importlib.util.spec_from_file_location(
    "bench_detectors", os.path.join(os.path.dirname(os.path.abspath(__file__)), "detectors.py"))
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

import jax  # noqa: E402
import threadpoolctl  # noqa: E402

from fi_jax import detectors  # noqa: E402

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = .*?\s([a-z][a-z0-9\-]*)\((.*)$")
_COMP = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_CALLS = re.compile(r"calls=%?([\w.\-]+)")
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_OP_NAME = re.compile(r'op_name="([^"]+)"')
_CONTAINERS = ("ThunkExecutor", "$", "while", "call", "conditional")


def hlo_op_classes(path: str) -> dict[str, tuple[str, str]]:
  """{op name: ('product' | 'other', the JAX operation it comes from)} for every instruction of
  an optimised HLO text file: a dot, a convolution, a fusion whose computation (or one it
  calls) holds one, or a LAPACK custom call is a product."""
  bodies, ops, comp = collections.defaultdict(list), [], None
  for line in open(path):
    m = _COMP.match(line)
    if m and " = " not in line:
      comp = m.group(1)
      continue
    m = _INSTR.match(line)
    if m and comp is not None:
      name, opcode, rest = m.groups()
      bodies[comp].append((opcode, rest))
      ops.append((name, opcode, rest))

  memo: dict[str, bool] = {}

  def holds_product(c: str) -> bool:
    if c not in memo:
      memo[c] = False
      memo[c] = any(op in ("dot", "convolution")
                    or any(holds_product(x) for x in _CALLS.findall(rest))
                    for op, rest in bodies.get(c, ()))
    return memo[c]

  out = {}
  for name, opcode, rest in ops:
    target = _TARGET.search(rest)
    product = (opcode in ("dot", "convolution")
               or (opcode == "fusion" and any(holds_product(c) for c in _CALLS.findall(rest)))
               or (opcode == "custom-call" and target is not None
                   and target.group(1).startswith("lapack")))
    source = _OP_NAME.search(rest)
    out[name] = ("product" if product else "other", source.group(1) if source else "")
  return out


def dumped_modules() -> set[str]:
  return set(glob.glob(os.path.join(_DUMP, "module_*.cpu_after_optimizations.txt")))


def module_name(path: str) -> str:
  """'module_0123.jit__score.cpu_after_optimizations.txt' -> 'jit__score'."""
  return os.path.basename(path).split(".", 1)[1].rsplit(".cpu_after_optimizations.txt", 1)[0]


class Classifier:
  """Op classes by (module name, op name), preferring the modules compiled for a given run."""

  def __init__(self):
    self.by_file: dict[str, dict[str, str]] = {}

  def add(self, files):
    for f in files:
      if f not in self.by_file:
        self.by_file[f] = hlo_op_classes(f)

  def classify(self, module: str, op: str, own_files) -> tuple[str, str]:
    """(class, source): the op's class and the JAX operation it comes from."""
    for files in (own_files, self.by_file):
      seen = [self.by_file[f][op] for f in files
              if module_name(f) == module and op in self.by_file.get(f, {})]
      if len({c for c, _ in seen}) == 1:
        return seen[0]
      if seen:
        return "unclassified", ""
    return "unclassified", ""


def trace_split(trace_dir: str, classifier: Classifier, own_files):
  """(seconds of XLA ops' own time per class, seconds per (class, module, op, source)) in the
  newest trace under trace_dir."""
  fn = sorted(glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True))[-1]
  with gzip.open(fn) as f:
    events = json.load(f)["traceEvents"]
  by_thread = collections.defaultdict(list)
  for e in events:
    if e.get("ph") == "X" and not e["name"].startswith(_CONTAINERS):
      by_thread[(e["pid"], e["tid"])].append(e)
  own = collections.Counter()                       # id(event) -> own time (us)
  for evs in by_thread.values():
    evs.sort(key=lambda e: (e["ts"], -e["dur"]))
    stack = []
    for e in evs:
      while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
        stack.pop()
      if stack:
        own[id(stack[-1])] -= e["dur"]
      own[id(e)] += e["dur"]
      stack.append(e)
  out, per_op, classes = collections.Counter(), collections.Counter(), {}
  for evs in by_thread.values():
    for e in evs:
      args = e.get("args") or {}
      if "hlo_op" in args and "hlo_module" in args:
        key = (args["hlo_module"], args["hlo_op"])      # an op runs many times inside loops
        if key not in classes:
          classes[key] = classifier.classify(*key, own_files)
        cls, source = classes[key]
        out[cls] += own[id(e)] / 1e6
        per_op[(cls, args["hlo_module"], args["hlo_op"], source)] += own[id(e)] / 1e6
  return out, per_op


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--scale", type=float, default=1.0, help="fraction of 100k fit / 50k test rows")
  ap.add_argument("--dim", type=int, default=768)
  ap.add_argument("--classes", type=int, default=1000)
  ap.add_argument("--detectors", default="", help="comma-separated subset (default: the suite)")
  ap.add_argument("--coretype", default=None,
                  help="set OPENBLAS_CORETYPE (e.g. SkylakeX) when an OpenBLAS falls back to Prescott")
  ap.add_argument("--top", type=int, default=0,
                  help="also list each run's TOP slowest XLA ops (module, op, the JAX operation)")
  args = ap.parse_args()
  t0 = time.perf_counter()
  n_fit, n_test = int(100_000 * args.scale), int(50_000 * args.scale)
  fit, test, head = bench.make_data(n_fit, n_test, args.dim, args.classes)
  blas = sorted({f"{os.path.basename(i['filepath']).split('-')[0]}: {i.get('architecture')}"
                 for i in threadpoolctl.threadpool_info() if i["internal_api"] == "openblas"})
  print(f"BLAS kernels: {blas}; host load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} "
        f"CPUs; malloc on huge pages: {'yes' if huge_pages.in_use() else 'no'}; jax "
        f"{jax.__version__} on {jax.devices()[0].platform} x{jax.device_count()}; "
        f"fit {fit.features.shape}, test {test.features.shape}, C={args.classes}")
  names = args.detectors.split(",") if args.detectors else [
      n for n in detectors.names() if detectors.REGISTRY[n].needs <= bench.FEATURE_LOGIT
      and detectors.REGISTRY[n].text_bank is None and n not in bench.PAIRWISE]
  bad = [n for n in names if n not in detectors.REGISTRY
         or not detectors.REGISTRY[n].needs <= bench.FEATURE_LOGIT]
  if bad:
    ap.error(f"--detectors: {bad} are not feature / logit detectors of the registry")
  runs = [(n, p) for n in names for p in ("ninco", "openood")]
  dets = {r: detectors.build(r[0], preset=r[1]) for r in runs}
  knn_k = max([dets[r].hparams["k"] for r in runs if r[0] == "knn"] or [1000])

  def faiss_search():
    return bench.timed(lambda: bench.faiss_knn(fit, test, knn_k))[1]

  classifier, own_files = Classifier(), {}
  trace_root = tempfile.mkdtemp(prefix="fi_jax_suite_trace_")
  split = {}

  def suite(mode):
    fit_d, test_d = bench.on_device(fit), bench.on_device(test)
    t_all = time.perf_counter()
    with detectors.shared([dets[r] for r in runs]):
      for r in runs:
        before = dumped_modules() if mode == "cold" else None
        if mode == "profiled":
          path = os.path.join(trace_root, f"{r[0]}_{r[1]}")
          jax.profiler.start_trace(path)
        t = time.perf_counter()
        state = dets[r].fit(fit_d, head)
        jax.block_until_ready(dets[r].score(state, test_d))
        wall = time.perf_counter() - t
        if mode == "cold":
          own_files[r] = dumped_modules() - before
          classifier.add(own_files[r])
        elif mode == "profiled":
          jax.profiler.stop_trace()
          split[r] = (wall, trace_split(path, classifier, own_files[r]))
          shutil.rmtree(path, ignore_errors=True)
    return time.perf_counter() - t_all

  with detectors.scoring_rows(n_test):
    t_cold = suite("cold")
    classifier.add(dumped_modules())
    f_before = faiss_search()
    t_warm = suite("compiled")
    suite("profiled")
    f_after = faiss_search()
  shutil.rmtree(_DUMP, ignore_errors=True)
  shutil.rmtree(trace_root, ignore_errors=True)

  print(f"\n{'detector':16s} {'preset':8s} {'wall s':>7s} {'products':>9s} {'other XLA':>9s} "
        f"{'outside':>8s} {'unclass.':>8s}   (compiled, profiled; seconds)")
  tot = collections.Counter()
  for r, (wall, (c, per_op)) in split.items():
    outside = wall - c["product"] - c["other"] - c["unclassified"]
    tot.update({"wall": wall, "outside": outside, **c})
    if wall >= 0.005:
      print(f"{r[0]:16s} {r[1]:8s} {wall:7.2f} {c['product']:9.2f} {c['other']:9.2f} "
            f"{outside:8.2f} {c['unclassified']:8.2f}")
      for (cls, module, op, source), secs in per_op.most_common(args.top):
        print(f"    {secs:7.3f} s  {cls:8s} {module}/{op}  {source[-80:]}")
  print(f"{'total':25s} {tot['wall']:7.2f} {tot['product']:9.2f} {tot['other']:9.2f} "
        f"{tot['outside']:8.2f} {tot['unclassified']:8.2f}")
  ref = (f_before + f_after) / 2
  print(f"\nfaiss-cpu exact search (IndexFlatL2 add + search, k={knn_k}): {f_before:.1f} s before "
        f"the compiled run, {f_after:.1f} s after the profiled one; their mean {ref:.1f} s is the "
        f"unit below")
  print(f"suite cold {t_cold:.1f} s; compiled {t_warm:.1f} s = {t_warm / ref:.2f} faiss "
        f"searches [target (a) <= 2.5]; profiled {tot['wall']:.1f} s (the runs' sum)")
  print(f"  of the profiled run: products {tot['product']:.1f} s = {tot['product'] / ref:.2f} "
        f"searches; other XLA ops {tot['other']:.1f} s = {tot['other'] / ref:.2f}; outside XLA "
        f"{tot['outside']:.1f} s = {tot['outside'] / ref:.2f}; unclassified "
        f"{tot['unclassified']:.1f} s")
  rest = 2.5 * ref - tot["product"]
  print(f"  (a) leaves {rest:.1f} s = {rest / ref:.2f} searches for everything but the products "
        f"at their profiled time (now {tot['wall'] - tot['product']:.1f} s)")
  print(f"wall time of the whole bench: {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
  sys.exit(main())
