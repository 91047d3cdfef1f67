"""`python -m fi_jax.report compare WORKDIR... [--out DIR] [--pair MODEL:DET MODEL:DET]`."""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from fi_jax.report.compare import compare


def main(argv: Optional[Sequence[str]] = None) -> int:
  p = argparse.ArgumentParser(prog="python -m fi_jax.report",
                              description="Compare the results of several fi_jax runs.")
  sub = p.add_subparsers(dest="command", required=True)
  c = sub.add_parser("compare", help="one table and heat map over several workdirs")
  c.add_argument("workdirs", nargs="+", help="workdirs of finished runs (results.json)")
  c.add_argument("--out", default=".", help="where compare.md/.csv/.json/.png go")
  c.add_argument("--pair", nargs=2, metavar="MODEL:DET",
                 help="paired bootstrap test between two (model, detector) pairs")
  c.add_argument("--n_bootstrap", type=int, default=1000)
  c.add_argument("--seed", type=int, default=0)
  args = p.parse_args(argv)
  try:
    compare(args.workdirs, args.out, args.pair, n_bootstrap=args.n_bootstrap, seed=args.seed)
  except (ValueError, FileNotFoundError) as e:
    print(f"python -m fi_jax.report: error: {' '.join(str(e).split())}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
