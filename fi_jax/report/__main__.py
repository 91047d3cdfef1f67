"""`python -m fi_jax.report compare WORKDIR... [--out DIR] [--pair RUN:DET RUN:DET]
[--n_bootstrap N] [--seed S]` and `python -m fi_jax.report leaderboard WORKDIR [--out DIR]
[--hardness A B] [--detectors ...] [--n_bootstrap N] [--seed S]` (fi_jax/report/leaderboard.py).

Every error, a bad argument or a bad input file, is one line on stderr that names what is
wrong, and exit status 2."""
from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn, Optional, Sequence

from fi_jax.report.compare import PAIR_FORMS, compare


class _Parser(argparse.ArgumentParser):
  """An ArgumentParser whose errors are one line (`<prog>: error: ...`, exit 2); --help shows
  the usage."""

  def error(self, message: str) -> NoReturn:
    self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


def _int_at_least(low: int):
  def parse(text: str) -> int:
    try:
      value = int(text)
    except ValueError:
      value = None
    if value is None or value < low:
      raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}")
    return value
  return parse


def _out_folder(text: str) -> str:
  """A folder path that exists as a folder or can be created (no file on the way)."""
  path = os.path.abspath(text)
  while not os.path.exists(path):
    parent = os.path.dirname(path)
    if parent == path:
      break
    path = parent
  if os.path.exists(path) and not os.path.isdir(path):
    what = "is a file" if path == os.path.abspath(text) else f"is under the file {path}"
    raise argparse.ArgumentTypeError(f"{text!r} {what}; name a folder for compare.md and its "
                                     "companions")
  return text


def main(argv: Optional[Sequence[str]] = None) -> int:
  p = _Parser(prog="python -m fi_jax.report",
              description="Compare fi_jax runs; a sweep's leaderboard.")
  sub = p.add_subparsers(dest="command", required=True)
  c = sub.add_parser(
      "compare", help="one table and heat map over several workdirs",
      description="One table (AUROC and FPR@95 of every run, detector and OOD set) and an "
                  "FPR@95 heat map over several workdirs; with --pair, the paired bootstrap "
                  "test of two (run, detector) pairs on the same images. A run is its "
                  "workdir: runs with the same model label are shown as LABEL@WORKDIR.")
  c.add_argument("workdirs", nargs="+", metavar="WORKDIR",
                 help="workdirs of finished runs (each with its results.json)")
  c.add_argument("--out", default=".", type=_out_folder, metavar="DIR",
                 help="the folder compare.md/.csv/.json/_fpr95_<set>.png go into (default: .)")
  c.add_argument("--pair", nargs=2, metavar="RUN:DET",
                 help=f"paired bootstrap test between two (run, detector) pairs: {PAIR_FORMS} "
                      "(a label shared by several runs must name the workdir)")
  c.add_argument("--n_bootstrap", type=_int_at_least(1), default=1000, metavar="N",
                 help="resamples of the paired bootstrap (--pair), an integer >= 1 "
                      "(default: 1000)")
  c.add_argument("--seed", type=_int_at_least(0), default=0, metavar="S",
                 help="seed of the paired bootstrap's resamples, an integer >= 0 (default: 0)")
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
  b.add_argument("--n_bootstrap", type=_int_at_least(1), default=None, help="paired bootstrap resamples "
                 "of the hardness CI (default: the sweep's, else 1000)")
  b.add_argument("--seed", type=_int_at_least(0), default=None)
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
  except (ValueError, OSError) as e:   # bad inputs, a missing workdir, an unwritable --out
    print(f"python -m fi_jax.report: error: {' '.join(str(e).split())}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
