"""Command line: build the datasets of this package without TFDS's beam-dependent CLI.

  python -m tfds_fi_imagenet build NAME --manual_dir=DIR --data_dir=DIR
      [--config=CFG|all] [--download_dir=DIR] [--expect SPLIT=N ...]
      [--file_format=tfrecord|array_record] [--register_checksums] [--skip_md5]
  python -m tfds_fi_imagenet list
  python -m tfds_fi_imagenet overlap --data_dir=DIR SET... [--reference SET ...]
      [--no_reference] [--threshold=BITS] [--workers=N] [--output=FILE]

Exit codes: 0 built; 2 bad usage or missing inputs (unknown name, missing manual dir or
files); 1 invalid data (duplicates, overlaps, wrong counts, corrupt images). Errors are
one line on stderr, no traceback.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Optional, Sequence

from tfds_fi_imagenet import build, errors, overlap

PROG = "python -m tfds_fi_imagenet"


class _Parser(argparse.ArgumentParser):
  """argparse that reports a usage error as one line and exit code 2."""

  def error(self, message):
    self.exit(2, f"{PROG}: error: {message} (see {PROG} --help)\n")


def _expect(items: Optional[Sequence[str]]) -> Optional[dict[str, int]]:
  if not items:
    return None
  out = {}
  for item in items:
    key, eq, value = item.partition("=")
    if not eq or not key or not value.isdigit():
      raise errors.UsageError(
          f"--expect takes SPLIT=COUNT (e.g. --expect ood=655), got {item!r}.")
    out[key] = int(value)
  return out


def _parser() -> argparse.ArgumentParser:
  p = _Parser(prog=PROG, description="Build the Fi-ImageNet-1k / ImageNet OOD TFDS datasets.")
  sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
  b = sub.add_parser("build", help="download/read and prepare one dataset")
  b.add_argument("name", help=f"one of: {', '.join(sorted(build.DATASETS))}")
  b.add_argument("--data_dir", required=True, help="where the prepared dataset is written")
  b.add_argument("--manual_dir", help="folder with the manually obtained files")
  b.add_argument("--download_dir", help="download cache (default: DATA_DIR/downloads)")
  b.add_argument("--config", help="builder config; 'all' builds every config")
  b.add_argument("--expect", action="append", metavar="SPLIT=N",
                 help="expected size of a split (or 'classes'); replaces the published "
                      "counts, e.g. for a later release of a list; repeatable")
  b.add_argument("--file_format", choices=("tfrecord", "array_record"))
  b.add_argument("--register_checksums", action="store_true",
                 help="record the downloads' size and SHA-256 in the builder's checksums.tsv")
  b.add_argument("--skip_md5", action="store_true",
                 help="do not check the published MD5 of the archive (the downloading builders "
                      "but textures_ood, whose SHA-256 TFDS checks)")
  sub.add_parser("list", help="print the dataset names and their configs")
  o = sub.add_parser("overlap", help="exact and near duplicates between OOD sets and "
                                     "ImageNet-1k, and between the OOD sets (overlap.py)")
  o.add_argument("sets", nargs="+", metavar="SET", help="NAME[/CONFIG][:SPLIT] (all splits "
                                                        "when SPLIT is left out)")
  o.add_argument("--data_dir", required=True, help="where the sets are prepared")
  o.add_argument("--reference", action="append", metavar="SET",
                 help="reference split(s) an OOD image must not repeat (default: "
                      f"{', '.join(overlap.DEFAULT_REFERENCES)}); repeatable")
  o.add_argument("--no_reference", action="store_true",
                 help="compare the OOD sets only with each other")
  o.add_argument("--threshold", type=int, default=overlap.DEFAULT_THRESHOLD,
                 help="near duplicate: pHash Hamming distance <= this many bits of 64")
  o.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                 help="processes decoding images for the hashes (default: all CPUs)")
  o.add_argument("--output", help="the JSON report (default DATA_DIR/overlap_report.json); "
                                  "a set spec's drop_overlaps= names it")
  return p


def _overlap(args) -> int:
  refs = [] if args.no_reference else (args.reference or list(overlap.DEFAULT_REFERENCES))
  report = overlap.find_overlaps(args.sets, args.data_dir, references=refs,
                                 threshold=args.threshold, workers=args.workers,
                                 log=lambda m: print(m, file=sys.stderr))
  out = args.output or os.path.join(args.data_dir, "overlap_report.json")
  with open(out, "w") as f:
    json.dump(report, f, indent=1)
  print(overlap.summary(report))
  print(f"Report: {out}")
  return 0


class _QuietFreshDataDir(logging.Filter):
  """Drops TFDS's warning about a not yet prepared version folder ('Variant folder ... has no
  dataset_info.json'): every first build would print it."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Variant folder")


def main(argv: Optional[Sequence[str]] = None) -> int:
  args = _parser().parse_args(argv)
  logging.getLogger("absl").addFilter(_QuietFreshDataDir())
  if args.command == "list":
    for name in sorted(build.DATASETS):
      configs = list(build.builder_class(name).builder_configs)
      print(name + (f"  (configs: {', '.join(configs)})" if configs else ""))
    return 0
  try:
    if args.command == "overlap":
      return _overlap(args)
    expected = _expect(args.expect)
    configs = [args.config]
    if args.config == "all":
      configs = list(build.builder_class(args.name).builder_configs) or [None]
    for config in configs:
      builder = build.build_dataset(
          args.name, data_dir=args.data_dir, manual_dir=args.manual_dir, config=config,
          download_dir=args.download_dir, expected=expected, file_format=args.file_format,
          register_checksums=args.register_checksums, verify_md5=not args.skip_md5)
      splits = ", ".join(f"{k}: {v.num_examples}" for k, v in sorted(builder.info.splits.items()))
      print(f"Built {builder.info.full_name} in {builder.data_dir} ({splits})")
  except (errors.UsageError, FileNotFoundError) as e:
    print(f"{PROG}: error: {_one_line(e)}", file=sys.stderr)
    return 2
  except ValueError as e:
    print(f"{PROG}: error: {_one_line(e)}", file=sys.stderr)
    return 1
  return 0


def _one_line(e: BaseException) -> str:
  return " ".join(str(e).split())


if __name__ == "__main__":
  sys.exit(main())
