"""The command line: `python main.py` / `fi-jax` [--config=configs/x.py[:arg]] [--config.field=value] --workdir=DIR.

Without --config it runs the embedded demo (configs/demo.py). A --config path that does not
exist but names one of the bundled configs (configs/vit.py, ...) is read from the installed
`configs` package, so `fi-jax --config=configs/vit.py:...` works outside the repository too.
`--help` / `-h` lists the bundled configs with their arguments, the common overrides and the
docs (`help_text`); `--helpfull` adds every flag. Those, and a misspelled config file, override
field or detector name (one `main.py: error: ... did you mean ...` line, exit 2), answer before
JAX is imported. See README.md.
"""
from __future__ import annotations

import ast
import os
import re
import sys
import textwrap
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("NO_GCE_CHECK", "true")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # silences TF's oneDNN banner; TF only preprocesses

# Nothing imported here imports JAX: --help, a misspelled config file, override or detector
# name answer before JAX (seconds of imports) starts; `_main` imports the run.
import ml_collections  # noqa: E402
from absl import (
  flags,  # noqa: E402
)
from ml_collections import config_flags  # noqa: E402

from fi_jax.common import detector_names  # noqa: E402
from fi_jax.run import workdirs  # noqa: E402

# the parts `python -m fi_jax.run.sweep` shares
from fi_jax.run.command import CONFIGS as _CONFIGS  # noqa: E402
from fi_jax.run.command import UsageError  # noqa: E402
from fi_jax.run.command import bundled_configs as _bundled  # noqa: E402
from fi_jax.run.command import check_overrides as _check_overrides  # noqa: E402
from fi_jax.run.command import config_path as _config_path  # noqa: E402
from fi_jax.run.command import end as _end  # noqa: E402
from fi_jax.run.command import load_config as _load_config  # noqa: E402
from fi_jax.run.command import overrides as _overrides  # noqa: E402
from fi_jax.run.command import prog as _prog  # noqa: E402
from fi_jax.run.command import split_config_flag as _split_config_flag  # noqa: E402


def assigned_fields(path: str) -> set[str]:
  """The field names a config file (with configs/common.py, which every bundled config builds
  on) assigns as `x.name = ...` or `x["name"] = ...`: a superset of the top-level fields its
  get_config() returns (tests/run/test_cli.py pins that for every bundled config)."""
  out = set()
  for file in (path, os.path.join(_CONFIGS, "common.py")):
    with open(file) as f:
      tree = ast.parse(f.read())
    for node in ast.walk(tree):
      targets = (node.targets if isinstance(node, ast.Assign) else
                 [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
      for t in targets:
        if isinstance(t, ast.Attribute):
          out.add(t.attr)
        elif isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant):
          out.add(str(t.slice.value))
  return out


def _precheck_overrides(spec: str, argv: list[str]) -> None:
  """Before a bundled config loads (torchvision.py and timm.py read the model zoo, which
  imports every model family and so JAX): an override whose first field the file can never
  define is a UsageError with the suggestions `_check_overrides` gives on the base config.
  Files outside configs/ are checked once loaded."""
  path = _config_path(spec)
  if os.path.dirname(os.path.abspath(path)) != _CONFIGS:
    return
  from configs import common  # no JAX
  base, fields = common.base_config(), assigned_fields(path)
  for field, _ in _overrides(argv):
    top = field.split(".")[0]
    if top not in base and top not in fields:
      _check_overrides(base, [argv[0], f"--config.{field}"])


def _check_detector_overrides(argv: list[str]) -> None:
  """Every detector name in a --config.detectors=... override is registered (a UsageError
  with the closest names otherwise); read from the text, before any config loads."""
  for path, value in _overrides(argv):
    if path == "detectors" and value is not None:
      bad = detector_names.unknown(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", value))
      if bad:
        raise UsageError(f"--config.detectors: {bad}")


def _define_flags(config: ml_collections.ConfigDict, argv: list[str]) -> None:
  # config_flags reads `argv` for --config.* overrides while defining the flag.
  config_flags.DEFINE_config_dict("config", config, "The config (--config=configs/*.py[:arg]).",
                                  lock_config=True, sys_argv=argv)
  flags.DEFINE_string("workdir", "workdir", "Where results and the feature cache go.")
  if "verbose" not in flags.FLAGS:
    flags.DEFINE_bool("verbose", False, "A failed detector's traceback on the console too "
                      "(it is always in <workdir>/tracebacks.log).")
  flags.DEFINE_string("coordinator_address", None, "Multi-host: jax.distributed coordinator.")
  flags.DEFINE_integer("num_processes", None, "Multi-host: number of processes.")
  flags.DEFINE_integer("process_id", None, "Multi-host: this process's index.")


# ----------------------------------------------------------------------------------- --help

_HELP_FLAGS = ("-h", "--help", "-help", "--helpshort", "-?")

_USAGE = """\
usage: {prog} [--config=FILE[:k=v,...]] [--config.FIELD=VALUE ...] [--workdir=DIR]

Runs the OOD benchmark a config describes: builds or loads the model, extracts features and
logits of the ID fit, ID test and OOD sets, fits and scores every detector and writes
results.md / .json / .csv (+ scores/, plots/) into the workdir. Without --config: the embedded
demo (configs/demo.py: open-set digits, a tiny ViT trained on the spot, no download).

Bundled configs (--config=configs/NAME.py[:k=v,...]; the arguments after ':' with their
defaults; + ARCH_ARGS = width, depth, heads, mlp_dim, patch (0 = the variant's);
+ IMAGENET_ARGS = {imagenet}):
{configs}

Common overrides (any field the config defines; nested fields with dots):
  --config.batch_size=64                     global batch size
  --config.detectors="('msp','energy','vim')"  which detectors; every name:
{detectors}
  --config.detector_preset=openood           hyper-parameters: ninco | openood | '' (papers')
  --config.metrics.n_bootstrap=1000          bootstrap confidence intervals (0 = none)
  --config.metrics.tpr=0.95                  the TPR of the FPR@TPR metric
  --config.model_init=/path/ckpt             the checkpoint file
  --config.cache=False                       no feature cache
  --config.nonfinite=drop                    drop non-finite feature rows instead of failing
  --workdir=DIR                              results and the feature cache (default: workdir)
  --verbose                                  a failed detector's traceback on the console too
                                             (it is always in WORKDIR/tracebacks.log)
  --coordinator_address, --num_processes, --process_id   multi-host runs
  --flagfile=FILE                            flags read from a file; --helpfull: every flag

Many models in one resumable sweep and its leaderboard: {prog} sweep --config=configs/sweep.py:PRESET
(paper, openood, smoke; `{prog} sweep --help`, docs/usage.md "Reproducing a table").

Docs: README.md (quick start, configs, datasets), docs/usage.md (running, overrides, outputs,
resuming), docs/models.md, docs/detectors.md, docs/data.md, docs/metrics.md.
Datasets are built with `python -m tfds_fi_imagenet --help`.
"""


def _config_args(path: str) -> tuple[str, str]:
  """(first docstring line, its `parse_arg` arguments with their defaults) of a config file,
  read from its source (nothing is imported)."""
  with open(path) as f:
    tree = ast.parse(f.read())
  doc = (ast.get_docstring(tree) or "").strip().splitlines()
  args = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "parse_arg":
      for kw in node.keywords:
        if kw.arg is None:   # **common.IMAGENET_ARGS, **common.ARCH_ARGS
          args.append("+ " + ast.unparse(kw.value).split(".")[-1])
        else:
          try:
            args.append(f"{kw.arg}={ast.literal_eval(kw.value)!r}")
          except ValueError:
            args.append(f"{kw.arg}={ast.unparse(kw.value)}")
  return (doc[0] if doc else ""), ", ".join(args)


def help_text(prog: str) -> str:
  """The --help text: usage, the bundled configs with their arguments, common overrides and
  where the docs are; built without importing JAX or any config."""
  lines = []
  for name in _bundled():
    doc, args = _config_args(os.path.join(_CONFIGS, name))
    lines.append(f"  configs/{name:<16}{doc}")
    if args:
      lines.append(textwrap.fill(args, 95, initial_indent="      args: ",
                                 subsequent_indent="            "))
  imagenet = "IMAGENET_ARGS"
  try:
    with open(os.path.join(_CONFIGS, "common.py")) as f:
      for node in ast.parse(f.read()).body:
        if (isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "IMAGENET_ARGS"
            and isinstance(node.value, ast.Call)):
          imagenet = ", ".join(f"{kw.arg}={ast.unparse(kw.value)}" for kw in node.value.keywords)
  except OSError:
    pass
  wrap = lambda text: textwrap.fill(text, 95, initial_indent="      ",
                                    subsequent_indent="      ")
  return _USAGE.format(prog=prog, configs="\n".join(lines), imagenet=wrap(imagenet).lstrip(),
                       detectors=wrap(", ".join(detector_names.NAMES)))


# ------------------------------------------------------------------------------------- run

# The workdir's folders this process's checks made (`main`): a run that fails removes them
# while they are empty (a failed preflight; not the cache of a run that did work).
_CREATED: list[str] = []


def _main(argv):
  del argv
  import jax  # noqa: F401  (the run: JAX starts here)
  from absl import logging

  from fi_jax.common import distributed
  from fi_jax.run import benchmark as run
  from fi_jax.run import xla_flags
  logging.set_verbosity(logging.WARNING)   # JAX's INFO lines (no TPU found, ...) are noise here
  if flags.FLAGS.config.get("cpu_fast_compile", True):
    xla_flags.fast_cpu_compile()   # before JAX starts its backend: XLA reads XLA_FLAGS once
  distributed.initialize(flags.FLAGS.coordinator_address, flags.FLAGS.num_processes,
                         flags.FLAGS.process_id)
  warnings.simplefilter("once")   # a repeated warning (per batch, per detector) prints once
  try:
    run.run(flags.FLAGS.config, flags.FLAGS.workdir, verbose=flags.FLAGS.verbose)
    _end(0)
  except KeyboardInterrupt:
    _end(130)   # run.run printed what the cache kept
  except (ValueError, FileNotFoundError) as e:
    # Bad input (unknown detector, missing checkpoint or dataset, ...): one clear line.
    # Finished work is already in the workdir's cache. FI_JAX_TRACEBACK=1 shows the trace.
    if os.environ.get("FI_JAX_TRACEBACK"):
      raise
    workdirs.remove_empty(_CREATED)   # a failed preflight leaves no workdir behind
    print(f"{_prog()}: error: {e}", file=sys.stderr)
    _end(2)


def main():
  """--help prints `help_text` (exit 0), --helpfull adds every flag of the config given; a bad config path, arg, override or detector name
  gives one line on stderr and exit 2, before JAX is imported (the values that need the
  detectors' hyper-parameter checks: after it); then the run. A failed check or preflight
  leaves no workdir behind (only the folders this run made, and only while empty)."""
  if len(sys.argv) > 1 and sys.argv[1] == "sweep":   # `fi-jax sweep ...` (fi_jax/run/sweep.py)
    from fi_jax.run import sweep
    sweep.main([f"{_prog()} sweep"] + sys.argv[2:])
    return
  if any(a in _HELP_FLAGS for a in sys.argv[1:sys.argv.index("--") if "--" in sys.argv else None]):
    print(help_text(_prog()))
    sys.exit(0)
  created: list[str] = []
  try:
    # --flagfile=FILE expanded first, so that a --config in it is found too.
    spec, argv = _split_config_flag(flags.FLAGS.read_flags_from_files(sys.argv, force_gnu=False))
    _precheck_overrides(spec, argv)
    _check_detector_overrides(argv)
    config = _load_config(spec)
    _check_overrides(config, argv)
    _define_flags(config, argv)
    if "--helpfull" in argv[1:]:   # every flag, the config's fields (as overrides) included
      print(help_text(_prog()) + "\nEvery flag:\n" + flags.FLAGS.get_help())
      sys.exit(0)
    argv = flags.FLAGS(argv)   # applies the overrides; bad values raise flags.Error
    bad = detector_names.unknown(tuple(flags.FLAGS.config.get("detectors", ())))
    if bad:
      raise UsageError(f"config.detectors: {bad}")
    # every value checked now, before anything is read
    from fi_jax.run import validate
    created = workdirs.missing(flags.FLAGS.workdir)
    validate.validate_config(flags.FLAGS.config, flags.FLAGS.workdir)
  except (UsageError, flags.Error, ValueError) as e:
    workdirs.remove_empty(created)
    print(f"{_prog()}: error: " + " ".join(str(e).split()), file=sys.stderr)
    sys.exit(2)
  _CREATED[:] = created   # removed again (while empty) if the run fails
  from absl import app
  app.run(_main, argv=argv)


def entry():
  """The process's entry point (`main.py`, the `fi-jax` script): `huge_pages.reexec()` first
  (it restarts the process once with huge pages for malloc, before any work), then `main()`."""
  from fi_jax.run import huge_pages
  huge_pages.reexec()
  main()


if __name__ == "__main__":
  entry()
