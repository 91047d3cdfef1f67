"""fi_jax entry point: `python main.py [--config=configs/x.py[:arg]] [--config.field=value] --workdir=DIR`.

Without --config it runs the embedded demo (configs/demo.py). See README.md.
"""
import os
import re
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("NO_GCE_CHECK", "true")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # silences TF's oneDNN banner; TF only preprocesses

from absl import app  # noqa: E402
from absl import logging  # noqa: E402
from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_ROOT = os.path.dirname(os.path.abspath(__file__))
_DEMO = os.path.join(_ROOT, "configs", "demo.py")


def _define_flags():
  # config_flags reads sys.argv for --config.* overrides while defining the flag, so a bad
  # override already fails here.
  config_flags.DEFINE_config_file("config", _DEMO, "Config file (configs/*.py[:arg]).",
                                  lock_config=True)
  flags.DEFINE_string("workdir", "workdir", "Where results and the feature cache go.")
  flags.DEFINE_string("coordinator_address", None, "Multi-host: jax.distributed coordinator.")
  flags.DEFINE_integer("num_processes", None, "Multi-host: number of processes.")
  flags.DEFINE_integer("process_id", None, "Multi-host: this process's index.")


def _one_line(e: BaseException) -> str:
  """The useful part of a config/flag error, on one line."""
  text = str(e).strip()
  if isinstance(e, (KeyError, AttributeError)):
    names = re.findall(r"'(\w+)\\*'", text)
    hint = re.search(r"Did you mean [^?]*\?", text.replace("\\n", " "))
    return (f"unknown config field {(names or [text])[0]!r} in a --config.<field> override"
            + (f" ({hint.group(0)})" if hint else "")
            + "; overrides can only set fields the config file defines")
  lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
  if "Failed loading config file" in text:
    errno = [ln for ln in lines if "Errno" in ln or "Error" in ln]
    return f"cannot load the --config file: {(errno or lines)[-1]}"
  return lines[-1] if lines else type(e).__name__


def _main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)   # JAX's INFO lines (no TPU found, ...) are noise here
  from fi_jax import distributed, run  # pylint: disable=g-import-not-at-top
  distributed.initialize(flags.FLAGS.coordinator_address, flags.FLAGS.num_processes,
                         flags.FLAGS.process_id)
  try:
    run.run(flags.FLAGS.config, flags.FLAGS.workdir)
  except (ValueError, FileNotFoundError) as e:
    # Bad input (unknown detector, missing checkpoint or dataset, ...): one clear line.
    # Finished work is already in the workdir's cache. FI_JAX_TRACEBACK=1 shows the trace.
    if os.environ.get("FI_JAX_TRACEBACK"):
      raise
    print(f"main.py: error: {e}", file=sys.stderr)
    sys.exit(2)


def main():
  """Parses flags; a bad config path, arg or override gives one line on stderr and exit 2."""
  sys.path.insert(0, _ROOT)  # configs import `configs.common`
  try:
    _define_flags()
    argv = flags.FLAGS(sys.argv)
    flags.FLAGS.config.to_dict()   # a config file that failed to load raises on first use
  except Exception as e:  # pylint: disable=broad-except
    print(f"main.py: error: {_one_line(e)}", file=sys.stderr)
    sys.exit(2)
  app.run(_main, argv=argv)


if __name__ == "__main__":
  main()
