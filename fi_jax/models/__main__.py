"""`python -m fi_jax.models list [--family F]`: every checkpoint name the zoo accepts, with its
family, input size and eval preprocessing (one line each; a '*' marks the default weights, the
ones the tag-less name means)."""
from __future__ import annotations

import argparse
import sys

from fi_jax.models import zoo


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m fi_jax.models", description=__doc__)
  sub = parser.add_subparsers(dest="command", required=True)
  ls = sub.add_parser("list", help="every name the zoo accepts, with input size and preprocessing")
  ls.add_argument("--family", choices=zoo.FAMILIES, help="only this model family")
  args = parser.parse_args(argv)
  rows = zoo.rows(args.family)
  width = max(len(r["name"]) for r in rows) + 2
  for r in rows:
    mark = "*" if r["default"] else " "
    print(f"{mark} {r['name']:<{width}}{r['family']:<13}{r['input_size']:>4} px  "
          f"{r['num_classes']:>5} classes  {r['preprocessing']}")
  print(f"{len(rows)} names; '*': the default weights (the name without a tag).",
        file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
