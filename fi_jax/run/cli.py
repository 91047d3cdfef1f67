"""The command line: `python main.py` / `fi-jax` [--config=configs/x.py[:arg]] [--config.field=value] --workdir=DIR.

Without --config it runs the embedded demo (configs/demo.py). A --config path that does not
exist but names one of the bundled configs (configs/vit.py, ...) is read from the installed
`configs` package, so `fi-jax --config=configs/vit.py:...` works outside the repository too.
See README.md.
"""
from __future__ import annotations

import difflib
import importlib.machinery
import os
import sys
import types
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("NO_GCE_CHECK", "true")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # silences TF's oneDNN banner; TF only preprocesses

import jax  # noqa: E402
import ml_collections  # noqa: E402
from absl import (
  app,  # noqa: E402
  flags,  # noqa: E402
  logging,  # noqa: E402
)
from ml_collections import config_flags  # noqa: E402

import configs  # noqa: E402  (the bundled configs; `configs.common` is what config files import)
from fi_jax.common import distributed
from fi_jax.run import benchmark as run
from fi_jax.run import validate, xla_flags

_CONFIGS = os.path.dirname(os.path.abspath(configs.__file__))
_DEMO = os.path.join(_CONFIGS, "demo.py")


def _prog() -> str:
  """'main.py' or 'fi-jax': how the user called us (error lines start with it)."""
  return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "fi-jax"


class UsageError(Exception):
  """A bad --config file, config argument or override: one line on stderr, exit 2."""


def _split_config_flag(argv: list[str]) -> tuple[str, list[str]]:
  """(the --config value, argv without it); the demo when --config is absent."""
  spec, rest, i = _DEMO, [argv[0]], 1
  while i < len(argv):
    arg = argv[i]
    if arg == "--":
      rest += argv[i:]
      break
    name, eq, value = arg.lstrip("-").partition("=")
    if arg.startswith("-") and name == "config":
      if not eq:   # --config PATH
        i += 1
        value = argv[i] if i < len(argv) else ""
      spec = value
    else:
      rest.append(arg)
    i += 1
  return spec, rest


def _load_config(spec: str) -> ml_collections.ConfigDict:
  """`path[:arg]` -> the file's get_config(arg) (get_config() without ':'), as ml_collections
  loads config files, with each failure raised as a UsageError."""
  path, colon, arg = spec.partition(":")
  bundled = os.path.join(_CONFIGS, os.path.basename(path))
  if not os.path.exists(path) and os.path.dirname(path) in ("", "configs") and os.path.exists(bundled):
    path = bundled
  module = types.ModuleType("fi_jax_config")
  module.__file__ = path
  try:
    importlib.machinery.SourceFileLoader(module.__name__, path).exec_module(module)
  except (OSError, SyntaxError) as e:
    raise UsageError(f"cannot load the --config file: {e}") from None
  get_config = getattr(module, "get_config", None)
  if not callable(get_config):
    raise UsageError(f"cannot load the --config file: {path} defines no get_config()")
  try:
    config = get_config(arg) if colon else get_config()
  except (TypeError, ValueError) as e:   # e.g. an unknown or malformed config argument
    raise UsageError(f"--config={spec}: {e}") from None
  if not isinstance(config, ml_collections.ConfigDict):
    raise UsageError(f"--config={spec}: get_config() returned a {type(config).__name__}, "
                     "not a ConfigDict")
  return config


def _check_overrides(config: ml_collections.ConfigDict, argv: list[str]) -> None:
  """Every --config.<field.path>=value names a field the config has (else a UsageError)."""
  for arg in argv[1:]:
    if arg == "--":
      break
    name = arg.lstrip("-").partition("=")[0]
    name = name[2:] if name.startswith("noconfig.") else name   # --noconfig.flag (a bool)
    if not (arg.startswith("-") and name.startswith("config.")):
      continue
    node = config
    for part in name.split(".")[1:]:
      fields = list(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
      if part not in fields:
        close = difflib.get_close_matches(part, fields, n=1)
        raise UsageError(f"unknown config field {part!r} in the override --{name}"
                         + (f" (did you mean {close[0]!r}?)" if close else "")
                         + "; overrides can only set fields the config file defines")
      node = node[part]


def _define_flags(config: ml_collections.ConfigDict, argv: list[str]) -> None:
  # config_flags reads `argv` for --config.* overrides while defining the flag.
  config_flags.DEFINE_config_dict("config", config, "The config (--config=configs/*.py[:arg]).",
                                  lock_config=True, sys_argv=argv)
  flags.DEFINE_string("workdir", "workdir", "Where results and the feature cache go.")
  flags.DEFINE_string("coordinator_address", None, "Multi-host: jax.distributed coordinator.")
  flags.DEFINE_integer("num_processes", None, "Multi-host: number of processes.")
  flags.DEFINE_integer("process_id", None, "Multi-host: this process's index.")


def _main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)   # JAX's INFO lines (no TPU found, ...) are noise here
  if flags.FLAGS.config.get("cpu_fast_compile", True):
    xla_flags.fast_cpu_compile()   # before JAX starts its backend: XLA reads XLA_FLAGS once
  distributed.initialize(flags.FLAGS.coordinator_address, flags.FLAGS.num_processes,
                         flags.FLAGS.process_id)
  warnings.simplefilter("once")   # a repeated warning (per batch, per detector) prints once
  try:
    run.run(flags.FLAGS.config, flags.FLAGS.workdir)
    _end(0)
  except KeyboardInterrupt:
    _end(130)   # run.run printed what the cache kept
  except (ValueError, FileNotFoundError) as e:
    # Bad input (unknown detector, missing checkpoint or dataset, ...): one clear line.
    # Finished work is already in the workdir's cache. FI_JAX_TRACEBACK=1 shows the trace.
    if os.environ.get("FI_JAX_TRACEBACK"):
      raise
    print(f"{_prog()}: error: {e}", file=sys.stderr)
    _end(2)


def _end(code: int) -> None:
  """Exits with `code`. One process: everything is written, and the interpreter's teardown
  is skipped (os._exit). It does nothing a run needs and takes over a second (XLA's and TensorFlow's
  thread pools and caches); a run that failed or was interrupted may also leave the
  compile-ahead thread inside XLA, which the teardown would kill there (the process then
  aborts or crashes instead of exiting with `code`). Several processes shut down through
  jax.distributed together, as usual (no compile-ahead thread runs there)."""
  if jax.process_count() == 1:
    sys.stdout.flush()
    sys.stderr.flush()
    logging.flush()
    os._exit(code)
  sys.exit(code)


def main():
  """Parses flags; a bad config path, arg or override gives one line on stderr and exit 2."""
  try:
    # --flagfile=FILE expanded first, so that a --config in it is found too.
    spec, argv = _split_config_flag(flags.FLAGS.read_flags_from_files(sys.argv, force_gnu=False))
    config = _load_config(spec)
    _check_overrides(config, argv)
    _define_flags(config, argv)
    argv = flags.FLAGS(argv)   # applies the overrides; bad values raise flags.Error
    # every value checked now, before JAX starts or anything is read
    validate.validate_config(flags.FLAGS.config, flags.FLAGS.workdir)
  except (UsageError, flags.Error, ValueError) as e:
    print(f"{_prog()}: error: " + " ".join(str(e).split()), file=sys.stderr)
    sys.exit(2)
  app.run(_main, argv=argv)


if __name__ == "__main__":
  main()
