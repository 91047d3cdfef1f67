"""The command line: `python main.py` / `fi-jax` [--config=configs/x.py[:arg]] [--config.field=value] --workdir=DIR.

Without --config it runs the embedded demo (configs/demo.py). A --config path that does not
exist but names one of the bundled configs (configs/vit.py, ...) is read from the installed
`configs` package, so `fi-jax --config=configs/vit.py:...` works outside the repository too.
See README.md.
"""
from __future__ import annotations

import os
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("NO_GCE_CHECK", "true")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # silences TF's oneDNN banner; TF only preprocesses

import ml_collections  # noqa: E402
from absl import (
  app,  # noqa: E402
  flags,  # noqa: E402
  logging,  # noqa: E402
)
from ml_collections import config_flags  # noqa: E402

from fi_jax.common import distributed
from fi_jax.run import benchmark as run
from fi_jax.run import validate, xla_flags

# the parts `python -m fi_jax.run.sweep` shares
from fi_jax.run.command import UsageError
from fi_jax.run.command import check_overrides as _check_overrides
from fi_jax.run.command import end as _end
from fi_jax.run.command import load_config as _load_config
from fi_jax.run.command import split_config_flag as _split_config_flag


def _prog() -> str:
  """'main.py' or 'fi-jax': how the user called us (error lines start with it)."""
  return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "fi-jax"


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


def main():
  """Parses flags; a bad config path, arg or override gives one line on stderr and exit 2.
  `fi-jax sweep ...` is `python -m fi_jax.run.sweep ...` (fi_jax/run/sweep.py)."""
  if len(sys.argv) > 1 and sys.argv[1] == "sweep":
    from fi_jax.run import sweep
    sweep.main([f"{_prog()} sweep"] + sys.argv[2:])
    return
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
