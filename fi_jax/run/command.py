"""What the command lines share (`main.py` / `fi-jax`: fi_jax/run/cli.py, and
`python -m fi_jax.run.sweep`): reading a `--config=path[:arg]` file, checking its
`--config.<field>=value` overrides (with "did you mean" suggestions), and the process exit.
Nothing here imports JAX at import time: a bad config file or override answers in well under a
second.

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

import ml_collections

import configs  # the bundled configs; `configs.common` is what config files import

CONFIGS = os.path.dirname(os.path.abspath(configs.__file__))
DEMO = os.path.join(CONFIGS, "demo.py")


def prog() -> str:
  """'main.py' or 'fi-jax': how the user called us (error lines start with it)."""
  return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "fi-jax"


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


# not run configs: what the others share, and the presets of `fi-jax sweep`
NOT_RUN_CONFIGS = ("__init__.py", "common.py", "sweep.py")


def bundled_configs() -> list[str]:
  """The bundled run configs' file names (demo.py, vit.py, ...)."""
  return sorted(f for f in os.listdir(CONFIGS)
                if f.endswith(".py") and f not in NOT_RUN_CONFIGS)


def config_path(spec: str) -> str:
  """The file of `--config=path[:arg]`: the path, or the bundled config of that name when the
  path does not exist; a UsageError naming the closest bundled configs when neither exists."""
  path = spec.partition(":")[0]
  bundled = os.path.join(CONFIGS, os.path.basename(path))
  if not os.path.exists(path) and os.path.dirname(path) in ("", "configs") and os.path.exists(bundled):
    return bundled
  if not os.path.isfile(path):
    close = difflib.get_close_matches(os.path.basename(path), bundled_configs(), n=2, cutoff=0.6)
    hint = (f"did you mean {' or '.join('configs/' + c for c in close)}?" if close
            else f"the bundled configs are {', '.join('configs/' + c for c in bundled_configs())}")
    raise UsageError(f"--config={spec}: no such file {path!r}; {hint} "
                     f"(see {prog()} --help)")
  return path


def load_config(spec: str) -> ml_collections.ConfigDict:
  """`path[:arg]` -> the file's get_config(arg) (get_config() without ':'), as ml_collections
  loads config files, with each failure raised as a UsageError."""
  path = config_path(spec)
  colon, arg = spec.partition(":")[1:]
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


def overrides(argv: list[str]):
  """(field path, value or None) of every --config.<path>[=value] in argv (before a '--')."""
  for arg in argv[1:]:
    if arg == "--":
      break
    name, eq, value = arg.lstrip("-").partition("=")
    name = name[2:] if name.startswith("noconfig.") else name   # --noconfig.flag (a bool)
    if arg.startswith("-") and name.startswith("config."):
      yield name[len("config."):], (value if eq else None)


def field_paths(node, prefix: str = "") -> list[str]:
  """Every field path of a config ('batch_size', 'metrics', 'metrics.n_bootstrap', ...)."""
  out = []
  for k in node.keys():
    out.append(prefix + k)
    if isinstance(node[k], ml_collections.ConfigDict):
      out += field_paths(node[k], prefix + k + ".")
  return out


def check_overrides(config: ml_collections.ConfigDict, argv: list[str]) -> None:
  """Every --config.<field.path>=value names a field the config has (else a UsageError that
  suggests the fields at any depth whose names are close to the last part, or else the field
  paths close to the whole path)."""
  for path, _ in overrides(argv):
    node = config
    for part in path.split("."):
      fields = list(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
      if part not in fields:
        paths = field_paths(config)
        leaf = path.split(".")[-1]
        close = ([p for p in paths if difflib.get_close_matches(leaf, [p.split(".")[-1]],
                                                                 cutoff=0.8)]
                 or difflib.get_close_matches(path, paths, n=2))
        hint = (f" (did you mean {' or '.join('--config.' + c for c in close[:3])}?)"
                if close else "")
        raise UsageError(f"unknown config field --config.{path}{hint}; overrides can only set "
                         "fields the config file defines")
      node = node[part]


def end(code: int) -> None:
  """Exits with `code`. One process: everything is written, and the interpreter's teardown
  is skipped (os._exit). It does nothing a run needs and takes over a second (XLA's and TensorFlow's
  thread pools and caches); a run that failed or was interrupted may also leave the
  compile-ahead thread inside XLA, which the teardown would kill there (the process then
  aborts or crashes instead of exiting with `code`). Several processes shut down through
  jax.distributed together, as usual (no compile-ahead thread runs there)."""
  import jax
  from absl import logging
  if jax.process_count() == 1:
    sys.stdout.flush()
    sys.stderr.flush()
    logging.flush()
    os._exit(code)
  sys.exit(code)
