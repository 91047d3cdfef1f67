"""What the command lines share (`main.py` / `fi-jax`: fi_jax/run/cli.py, and
`python -m fi_jax.run.sweep`): reading a `--config=path[:arg]` file, checking its
`--config.<field>=value` overrides, and the process exit.

A --config path that does not exist but names one of the bundled configs (configs/vit.py, ...)
is read from the installed `configs` package, so `fi-jax --config=configs/vit.py:...` works
outside the repository too.
"""
from __future__ import annotations

import difflib
import importlib.machinery
import os
import sys
import types

# before TensorFlow is imported (the input pipeline): its banners and probes, as main.py
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("NO_GCE_CHECK", "true")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import jax  # noqa: E402
import ml_collections  # noqa: E402
from absl import logging  # noqa: E402

import configs  # noqa: E402  the bundled configs; `configs.common` is what config files import

CONFIGS = os.path.dirname(os.path.abspath(configs.__file__))
DEMO = os.path.join(CONFIGS, "demo.py")


class UsageError(Exception):
  """A bad --config file, config argument or override: one line on stderr, exit 2."""


def split_config_flag(argv: list[str], default: str = DEMO) -> tuple[str, list[str]]:
  """(the --config value, argv without it); `default` (the demo) when --config is absent."""
  spec, rest, i = default, [argv[0]], 1
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


def load_config(spec: str) -> ml_collections.ConfigDict:
  """`path[:arg]` -> the file's get_config(arg) (get_config() without ':'), as ml_collections
  loads config files, with each failure raised as a UsageError."""
  path, colon, arg = spec.partition(":")
  bundled = os.path.join(CONFIGS, os.path.basename(path))
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


def check_overrides(config: ml_collections.ConfigDict, argv: list[str]) -> None:
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


def end(code: int) -> None:
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
