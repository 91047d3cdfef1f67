"""Benchmark: KNN's exact blockwise search alone against faiss-cpu, and with / without its
compiler options.

    python bench/knn_search.py                       # 100k x 768 bank, 8192 queries, k = 1000 and 50
    python bench/knn_search.py --queries 50000 --coretype SkylakeX

`fi_jax.detectors.knn.knn_order_stats` (one search for both k, the KNN detector's defaults:
query blocks of 512, one bank block) compiled with `compile_options.selection_step()` (what the
detectors use) and with XLA's defaults, against faiss-cpu exact search (IndexFlatIP: the same
inner products; one search per k; the ratio is to the search at the largest k) on the same unit
rows. The three are timed alternately in one
process, `--repeats` times each; the table gives the best and the median. The k-th largest
similarities of the two compiled searches must be equal (the options change no value) and
equal faiss's within float32 rounding. OPENBLAS_CORETYPE is unset before numpy loads OpenBLAS
(`--coretype NAME` sets it: faiss-cpu's OpenBLAS falls back to its slow Prescott kernel on a CPU
it does not recognise); the BLAS kernels in use are printed.

    python bench/knn_search.py --stages --queries 2048 --repeats 5 --coretype SkylakeX

`--stages` adds the search cut after each of its stages, compiled the same way and timed in the
same alternation: the products alone (only each row's maximum order key kept), + the group maxima the
selection searches, + the threshold search, compaction and gather (`top_groups`); the whole
search is the first line. numpy's `queries @ bank.T` (OpenBLAS) in the same query blocks is
the host's product for comparison. The differences between consecutive lines are what each
stage adds.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

_CORETYPE_GIVEN = os.environ.pop("OPENBLAS_CORETYPE", None)
if "--coretype" in sys.argv[:-1]:
  os.environ["OPENBLAS_CORETYPE"] = sys.argv[sys.argv.index("--coretype") + 1]

import faiss  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import threadpoolctl  # noqa: E402
from jax import lax  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from fi_jax.common import compile_options  # noqa: E402
from fi_jax.detectors import knn, selection  # noqa: E402
from fi_jax.detectors.core import HIGHEST  # noqa: E402


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--bank", type=int, default=100_000)
  ap.add_argument("--queries", type=int, default=8192)
  ap.add_argument("--dim", type=int, default=768)
  ap.add_argument("--ks", default="50,1000")
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--coretype", default=None, help="set OPENBLAS_CORETYPE (e.g. SkylakeX)")
  ap.add_argument("--stages", action="store_true",
                  help="also time the search cut after each stage, and numpy's products")
  args = ap.parse_args()
  ks = tuple(sorted(int(k) for k in args.ks.split(",")))
  blas = sorted({f"{os.path.basename(i['filepath']).split('-')[0]}: {i.get('architecture')}"
                 for i in threadpoolctl.threadpool_info() if i["internal_api"] == "openblas"})
  print(f"BLAS kernels: {blas} (OPENBLAS_CORETYPE {args.coretype or 'unset'} by the bench; it was "
        f"{_CORETYPE_GIVEN!r}); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; "
        f"jax {jax.__version__}, faiss {faiss.__version__} ({faiss.omp_get_max_threads()} threads)")
  rng = np.random.default_rng(0)
  unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
  bank = unit(rng.standard_normal((args.bank, args.dim), dtype=np.float32))
  queries = unit(rng.standard_normal((args.queries, args.dim), dtype=np.float32))
  placed = knn.place_bank(bank)
  q = jnp.asarray(queries)
  hp = knn.KNN.defaults
  call = dict(ks=ks, query_block=hp["query_block"], bank_block=hp["bank_block"], sums=False)
  lowered = jax.jit(knn._knn_order_stats, static_argnames=knn._SEARCH_STATIC).lower(
      q, placed["bank"], placed["n"], mesh=None, **call)
  programs = {"fi_jax (selection_step)": lowered.compile(compile_options.selection_step()),
              "fi_jax (XLA defaults)": lowered.compile()}
  index = faiss.IndexFlatIP(args.dim)
  index.add(bank)

  runs = {name: (lambda c=c: np.asarray(c(q, placed["bank"], placed["n"])[0]))
          for name, c in programs.items()}
  if args.stages:
    runs.update(_stage_runs(q, placed, ks, hp, queries, bank))
  for k in ks:
    runs[f"faiss IndexFlatIP k={k}"] = lambda k=k: index.search(queries, k)[0][:, k - 1]
  first = {name: fn() for name, fn in runs.items()}       # compilation, warm-up
  a, b = first["fi_jax (selection_step)"], first["fi_jax (XLA defaults)"]
  assert np.array_equal(a, b), "the compiler options changed the k-th largest similarities"
  err = max(float(np.max(np.abs(a[:, i] - first[f"faiss IndexFlatIP k={k}"])))
            for i, k in enumerate(ks))
  times = {name: [] for name in runs}
  for r in range(args.repeats):
    for name, fn in (list(runs.items()) if r % 2 == 0 else list(runs.items())[::-1]):
      t = time.perf_counter()
      fn()
      times[name].append(time.perf_counter() - t)
  ref = np.median(times[f"faiss IndexFlatIP k={ks[-1]}"])
  print(f"bank {args.bank} x {args.dim}, {args.queries} queries, k = {ks} (fi_jax: one search "
        f"for all; faiss: one per k); max |fi_jax - faiss| k-th similarity {err:.1e}\n"
        f"{'':28s} {'best s':>8s} {'median s':>9s} {'/ faiss k=' + str(ks[-1]):>14s}")
  for name, ts in times.items():
    print(f"{name:28s} {min(ts):8.2f} {np.median(ts):9.2f} {np.median(ts) / ref:14.2f}")


def _stage_runs(q, placed, ks, hp, queries, bank) -> dict:
  """{name: run} for the search cut after each stage (query blocks and compiler options as the
  search) and for numpy's products in the same query blocks."""
  k, qb, bank_block = max(ks), hp["query_block"], hp["bank_block"]
  bank_j, n = placed["bank"], placed["n"]
  g = selection.group_size(bank_j.shape[0], k)     # one bank block: the search's group size
  assert bank_j.shape[0] <= bank_block, "--stages times a bank of one block"

  def blocks(qs):
    return jnp.pad(qs, ((0, (-qs.shape[0]) % qb), (0, 0))).reshape(-1, qb, qs.shape[1])

  def products(qq):
    return lax.dot_general(qq, bank_j, (((1,), (1,)), ((), ())), precision=HIGHEST,
                           preferred_element_type=jnp.float32)

  cuts = {
      # a row maximum of the order keys: XLA's float max (NaN-aware) costs more than the products
      "stage: products": lambda qq: jnp.max(selection._keys32(products(qq)), axis=1),
      "stage: + group maxima": lambda qq: jnp.max(
          selection._keys32(products(qq).reshape(qb, -1, g)), axis=2),
      "stage: + top_groups": lambda qq: knn._local_candidates(qq, bank_j, n, 0, k, bank_block),
  }
  runs = {}
  for name, cut in cuts.items():
    c = jax.jit(lambda qs, cut=cut: lax.map(cut, blocks(qs))).lower(q).compile(
        compile_options.selection_step())
    runs[name] = lambda c=c: jax.block_until_ready(c(q))

  def host_products():
    for start in range(0, len(queries), qb):
      queries[start:start + qb] @ bank.T
  runs["numpy products (OpenBLAS)"] = host_products
  return runs


if __name__ == "__main__":
  main()
