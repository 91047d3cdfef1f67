"""`python -m fi_jax.report compare WORKDIR... [--out DIR] [--pair MODEL:DET MODEL:DET]` and
`python -m fi_jax.report leaderboard WORKDIR [--out DIR] [--hardness A B] [--detectors ...]
[--n_bootstrap N] [--seed S]` (fi_jax/report/leaderboard.py)."""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from fi_jax.report.compare import compare


def main(argv: Optional[Sequence[str]] = None) -> int:
  p = argparse.ArgumentParser(prog="python -m fi_jax.report",
                              description="Compare fi_jax runs; a sweep's leaderboard.")
  sub = p.add_subparsers(dest="command", required=True)
  c = sub.add_parser("compare", help="one table and heat map over several workdirs")
  c.add_argument("workdirs", nargs="+", help="workdirs of finished runs (results.json)")
  c.add_argument("--out", default=".", help="where compare.md/.csv/.json/.png go")
  c.add_argument("--pair", nargs=2, metavar="MODEL:DET",
                 help="paired bootstrap test between two (model, detector) pairs")
  c.add_argument("--n_bootstrap", type=int, default=1000)
  c.add_argument("--seed", type=int, default=0)
  b = sub.add_parser("leaderboard", help="the leaderboard of a sweep folder "
                     "(python -m fi_jax.run.sweep), or of any folder of run folders")
  b.add_argument("workdir", help="the sweep's --workdir")
  b.add_argument("--out", default=None, help="where leaderboard.md/.csv/.json/*.png go "
                 "(default: WORKDIR)")
  b.add_argument("--hardness", nargs=2, metavar=("NUMERATOR", "DENOMINATOR"), default=None,
                 help="the two OOD sets of the hardness ratio (default: the sweep's, else "
                 "fi_imagenet_1k ninco)")
  b.add_argument("--detectors", default=None, help="the hardness ratio's detectors: "
                 "best_third (default), all, or a comma-separated list")
  b.add_argument("--n_bootstrap", type=int, default=None, help="paired bootstrap resamples "
                 "of the hardness CI (default: the sweep's, else 1000)")
  b.add_argument("--seed", type=int, default=None)
  b.add_argument("--primary", default=None, help="the OOD set of the per-model best detector")
  args = p.parse_args(argv)
  try:
    if args.command == "leaderboard":
      from fi_jax.report import leaderboard
      leaderboard.write(args.workdir, args.out, hardness=args.hardness,
                        detectors=args.detectors, n_bootstrap=args.n_bootstrap, seed=args.seed,
                        primary=args.primary)
      return 0
    compare(args.workdirs, args.out, args.pair, n_bootstrap=args.n_bootstrap, seed=args.seed)
  except (ValueError, FileNotFoundError) as e:
    print(f"python -m fi_jax.report: error: {' '.join(str(e).split())}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
