"""A sweep: many models x every detector x every OOD set, resumable, over several machines.

  python -m fi_jax.run.sweep --config=configs/sweep.py:<preset>[,args] --workdir=runs/sweep \
      [--shard=i/n] [--keep_going=true|false] [--config.<field>=value]
  fi-jax sweep ...                    (the same)

The sweep config (configs/sweep.py: `paper`, `openood`, `smoke`) lists models; each runs as
the normal benchmark (`fi_jax.run.benchmark.run`, what main.py runs) into
`<workdir>/<folder of its label>/`, with exactly a single run's files (results.json, scores/,
plots/, cache/), so `python -m fi_jax.report compare` works on them. The sweep's own files are
described in fi_jax/report/sweep_state.py. In order:

1. Every model's config is built (`config` + `args`, or a `zoo` name; `ckpt`; `shared` then
   the model's `overrides`; `model_label` = the label) and `<workdir>/sweep.json` written.
2. Finished models are skipped: a model is finished when its folder has a results.json that
   `schema.load` reads and whose `meta.config` is this config (a changed config reruns the
   model; its feature cache still serves the sets it can).
3. Preflight of every unfinished model of the whole sweep (all shards), all problems at once:
   the config values (`validate`), the detectors, every set and checkpoint
   (`preflight.check(config, specs)`). With --keep_going (the default) a model of this shard
   with problems is recorded as failed (FAILED.json, its problems as the reason) and the
   others run; problems of other shards' models are printed as warnings. With
   --keep_going=false any problem stops the sweep here (exit 2), before any compute.
4. This shard's models (index % n == i; `--shard=i/n`) run one after the other in this
   process. A model that raises is recorded (FAILED.json with the reason, the traceback in
   its run.log) and, with --keep_going, the sweep goes on (else it stops, exit 1). A model
   killed mid-way (SIGKILL, a crash) resumes on the next run at its feature cache's last
   finished shard; finished models are not recomputed. A model's log goes to its run.log;
   the console gets one line when it starts and one when it ends (done / failed, images/s,
   the ETA of this shard's remaining models).
5. The leaderboard of whatever has finished (fi_jax/report/leaderboard.py) is written into
   the workdir; with several shards each writes it when it ends, the last one complete.

Exit codes: 0 every model of this shard finished; 1 some failed (or the leaderboard could not
be written); 2 a bad flag or sweep config, or a preflight problem with --keep_going=false;
130 interrupted (rerun the same command to resume).
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import os
import socket
import sys
import time
import traceback
import warnings
from typing import Any, Callable, Mapping, Optional

import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from fi_jax.report import leaderboard as leaderboard_lib
from fi_jax.report import schema, sweep_state
from fi_jax.run import benchmark, command, preflight, validate, xla_flags
from fi_jax.run.model import model_label, to_dict

Log = Callable[[str], None]

# a model entry's keys (configs/sweep.py documents them)
ENTRY_KEYS = ("label", "zoo", "config", "args", "ckpt", "overrides")
ZOO_CONFIGS = {"torchvision": "configs/torchvision.py", "timm": "configs/timm.py",
               "mae": "configs/mae.py"}


@dataclasses.dataclass
class Model:
  """One model of a sweep: its index in the config, label, folder name (under the workdir),
  config (None if it could not be built) and preflight problems."""
  index: int
  label: str
  dir: str
  entry: dict
  config: Optional[ml_collections.ConfigDict] = None
  problems: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Outcome:
  """What `run_sweep` did: {label: "done" | "failed" | "other shard"} of every model, and why
  the leaderboard could not be written (None: it was)."""
  models: dict
  leaderboard_error: Optional[str] = None

  @property
  def ok(self) -> bool:
    return "failed" not in self.models.values() and self.leaderboard_error is None


class SweepError(ValueError):
  """A bad sweep config or flag: one line, exit 2."""


# ----------------------------------------------------------------------------- configs

def parse_shard(text: str) -> tuple[int, int]:
  """'i/n' -> (i, n) with 0 <= i < n."""
  i, slash, n = str(text).partition("/")
  try:
    i, n = int(i), int(n)
  except ValueError:
    i = n = -1
  if not slash or n < 1 or not 0 <= i < n:
    raise SweepError(f"--shard takes i/n with 0 <= i < n (e.g. 0/2), got {text!r}.")
  return i, n


def _assign(config: ml_collections.ConfigDict, key: str, value: Any, where: str) -> None:
  """config.<key> = value, `key` dotted for a nested field; a mapping becomes a ConfigDict
  (it replaces the whole field). An unknown field is a ValueError."""
  node, parts = config, key.split(".")
  for i, part in enumerate(parts):
    fields = list(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
    if part not in fields:
      close = difflib.get_close_matches(part, fields, n=1)
      raise ValueError(f"{where}: the config has no field {'.'.join(parts[:i + 1])!r}"
                       + (f" (did you mean {close[0]!r}?)" if close else "") + ".")
    if i < len(parts) - 1:
      node = node[part]
  if isinstance(value, ml_collections.ConfigDict):
    value = value.to_dict()
  if isinstance(value, Mapping):
    value = ml_collections.ConfigDict(dict(value))
  try:
    node[parts[-1]] = value
  except TypeError as e:
    raise ValueError(f"{where}: cannot set {key}: {e}") from None


def model_config(entry: Mapping, sweep: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The run config of one model entry: its config file with `args` (+ the sweep's `args`), or
  the zoo name's config (configs/torchvision.py / timm.py with name=...); then `ckpt` as
  config.model_init, the sweep's `shared` and the entry's `overrides` assigned field by field,
  and `model_label` = the entry's label when it has one. ValueError if it cannot be built."""
  unknown = sorted(set(entry) - set(ENTRY_KEYS))
  if unknown:
    raise ValueError(f"unknown model entry key(s) {unknown}; known: {list(ENTRY_KEYS)}.")
  zoo, path = entry.get("zoo") or "", entry.get("config") or ""
  args = entry.get("args") or ""
  if bool(zoo) == bool(path):
    raise ValueError("a model entry names either a zoo checkpoint (zoo=) or a config file "
                     "(config=), not both or neither.")
  if zoo:
    source, slash, name = zoo.partition("/")
    if source not in ZOO_CONFIGS or not name:
      raise ValueError(f"zoo name {zoo!r} must be '<source>/<model>[.<tag>]' with a source "
                       f"of {sorted(ZOO_CONFIGS)} (e.g. 'timm/convnext_tiny').")
    path, args = ZOO_CONFIGS[source], ",".join(filter(None, [f"name={name}", args]))
  args = ",".join(filter(None, [args, sweep.get("args") or ""]))
  try:
    config = command.load_config(f"{path}:{args}" if args else path)
  except command.UsageError as e:
    raise ValueError(str(e)) from None
  if entry.get("ckpt"):
    config.model_init = str(entry["ckpt"])
  for key, value in to_dict(sweep.get("shared") or {}).items():
    _assign(config, key, value, "shared")
  for key, value in dict(entry.get("overrides") or {}).items():
    _assign(config, key, value, "overrides")
  if entry.get("label"):
    config.model_label = str(entry["label"])
  return config


def build_models(sweep: ml_collections.ConfigDict) -> list[Model]:
  """Every model of the sweep config, in order, with its config (or the problem building it).
  SweepError when the list is empty or two labels share a folder."""
  entries = list(sweep.get("models") or ())
  if not entries:
    raise SweepError("the sweep config lists no models (config.models).")
  models = []
  for i, entry in enumerate(entries):
    entry = to_dict(entry)
    m = Model(index=i, label="", dir="", entry=entry)
    try:
      m.config = model_config(entry, sweep)
      m.label = str(entry.get("label") or model_label(m.config))
      m.config.model_label = m.label
    except Exception as e:  # a bad entry is that model's problem (a preflight failure)
      m.problems.append(f"its config: {type(e).__name__}: {' '.join(str(e).split())}")
    if not m.label:
      m.label = str(entry.get("label") or entry.get("zoo") or
                    f"{entry.get('config', '?')}:{entry.get('args', '')}")
    m.dir = sweep_state.folder_name(m.label)
    models.append(m)
  seen: dict[str, str] = {}
  for m in models:
    if m.dir in seen:
      raise SweepError(f"models {seen[m.dir]!r} and {m.label!r} would share the folder "
                       f"{m.dir!r}: give them distinct labels (label=...).")
    seen[m.dir] = m.label
  return models


def fingerprint(config) -> Any:
  """The config as results.json's meta.config holds it (JSON round trip)."""
  return json.loads(json.dumps(schema.jsonable(to_dict(config))))


def finished(folder: str, config) -> tuple[bool, str]:
  """(whether the run in `folder` is finished with this config, why not)."""
  if os.path.exists(os.path.join(folder, sweep_state.FAILED_FILE)):
    return False, "failed before"
  try:
    res = schema.load(folder)
  except FileNotFoundError:
    if os.path.exists(os.path.join(folder, sweep_state.RUNNING_FILE)):
      return False, "resuming an interrupted run"
    return False, "not run"
  except schema.ResultsError as e:
    return False, f"unreadable results.json ({e})"
  saved = res.get("meta", {}).get("config")
  if saved is not None and config is not None and saved != fingerprint(config):
    return False, "its config changed"
  return True, ""


def sweep_record(sweep: ml_collections.ConfigDict, models: list[Model]) -> dict:
  """sweep.json: the sweep's name, models (label, folder, how each is configured) and
  leaderboard settings; the same content from every shard."""
  return schema.jsonable({
      "name": sweep.get("name", ""),
      "models": [{"label": m.label, "dir": m.dir,
                  **{k: m.entry[k] for k in ENTRY_KEYS[1:] if m.entry.get(k)}}
                 for m in models],
      "leaderboard": to_dict(sweep.get("leaderboard") or {})})


# ----------------------------------------------------------------------------- preflight

def check_models(models: list[Model], workdir: str) -> None:
  """Appends to each model's `problems` what would make it fail: config values, detectors,
  sets and files (preflight.check)."""
  for m in models:
    if m.config is None:
      continue
    folder = os.path.join(workdir, m.dir)
    try:
      validate.validate_config(m.config, folder)
      benchmark.config_detectors(m.config)
      m.problems += preflight.check(m.config, benchmark.config_specs(m.config))
    except Exception as e:  # every failure of a model's checks is its problem
      m.problems.append(f"{type(e).__name__}: {' '.join(str(e).split())}")


def _one_line(text: str, limit: int = 600) -> str:
  text = " ".join(str(text).split())
  return text if len(text) <= limit else text[:limit - 3] + "..."


# ----------------------------------------------------------------------------- the sweep

def _fmt_s(s: float) -> str:
  if s < 90:
    return f"{s:.0f} s"
  if s < 5400:
    return f"{s / 60:.0f} min"
  return f"{s / 3600:.1f} h"


def _remove(path: str) -> None:
  try:
    os.remove(path)
  except FileNotFoundError:
    pass


def run_model(m: Model, workdir: str, shard: tuple[int, int],
              run_fn: Callable = benchmark.run) -> tuple[str, Any, float]:
  """Runs one model into its folder: ("done", results, seconds) or ("failed", reason,
  seconds). Its log goes to <folder>/run.log; RUNNING.json marks it while it runs."""
  folder = os.path.join(workdir, m.dir)
  os.makedirs(folder, exist_ok=True)
  who = {"label": m.label, "host": socket.gethostname(), "pid": os.getpid(),
         "shard": f"{shard[0]}/{shard[1]}"}
  sweep_state.write_json(os.path.join(folder, sweep_state.RUNNING_FILE),
                         {**who, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
  t = time.time()
  with open(os.path.join(folder, "run.log"), "a") as logfile:
    def log(msg: str) -> None:
      logfile.write(str(msg) + "\n")
      logfile.flush()
    log(f"==== {m.label}: started {time.strftime('%Y-%m-%d %H:%M:%S')} (pid {os.getpid()})")
    try:
      results = run_fn(m.config, folder, log=log)
    except KeyboardInterrupt:
      log("Interrupted.")
      _remove(os.path.join(folder, sweep_state.RUNNING_FILE))
      raise
    except Exception as e:  # the model failed; the sweep goes on
      reason = f"{type(e).__name__}: {_one_line(e)}"
      log(traceback.format_exc())
      sweep_state.write_json(os.path.join(folder, sweep_state.FAILED_FILE),
                             {**who, "reason": reason, "stage": "run"})
      _remove(os.path.join(folder, sweep_state.RUNNING_FILE))
      return "failed", reason, time.time() - t
  _remove(os.path.join(folder, sweep_state.FAILED_FILE))
  _remove(os.path.join(folder, sweep_state.RUNNING_FILE))
  return "done", results, time.time() - t


def run_sweep(sweep: ml_collections.ConfigDict, workdir: str, *, shard: tuple[int, int] = (0, 1),
              keep_going: bool = True, log: Log = print, run_fn: Callable = benchmark.run,
              write_leaderboard: bool = True) -> Outcome:
  """Runs the sweep (module docstring) and writes its leaderboard. Raises SweepError on a bad
  sweep config and preflight.PreflightError on a problem with keep_going=False."""
  os.makedirs(workdir, exist_ok=True)
  models = build_models(sweep)
  i_shard, n_shard = shard
  mine = [m for m in models if m.index % n_shard == i_shard]
  sweep_state.write_json(os.path.join(workdir, sweep_state.SWEEP_FILE),
                         sweep_record(sweep, models))
  state = {}
  for m in models:
    ok, why = finished(os.path.join(workdir, m.dir), m.config)
    state[m.label] = "done" if ok else why
  todo = [m for m in models if state[m.label] != "done"]
  t = time.time()
  check_models(todo, workdir)
  bad = [m for m in todo if m.problems]
  log(f"Sweep {sweep.get('name', '')!r}: {len(models)} models into {workdir}; shard "
      f"{i_shard}/{n_shard} has {len(mine)} ({sum(state[m.label] == 'done' for m in mine)} "
      f"finished earlier). Preflight of {len(todo)} unfinished model(s): "
      f"{len(bad)} with problems ({time.time() - t:.1f} s).")
  if bad and not keep_going:
    raise preflight.PreflightError([f"model {m.label}: {p}" for m in bad for p in m.problems])
  for m in bad:
    if m not in mine:
      log(f"WARNING: model {m.label} (shard {m.index % n_shard}/{n_shard}): "
          + "; ".join(_one_line(p, 300) for p in m.problems))

  outcome: dict[str, str] = {m.label: "other shard" for m in models if m not in mine}
  computed: list[float] = []
  left = [m for m in mine if state[m.label] != "done"]
  for m in mine:
    tag = f"[{m.index + 1}/{len(models)}] {m.label}"
    if state[m.label] == "done":
      outcome[m.label] = "done"
      log(f"{tag}: done (finished earlier)")
      continue
    left.remove(m)
    if m.problems:
      reason = "preflight: " + " | ".join(_one_line(p, 400) for p in m.problems)
      folder = os.path.join(workdir, m.dir)
      sweep_state.write_json(os.path.join(folder, sweep_state.FAILED_FILE), {
          "label": m.label, "reason": reason, "stage": "preflight",
          "host": socket.gethostname(), "pid": os.getpid(), "shard": f"{i_shard}/{n_shard}"})
      outcome[m.label] = "failed"
      log(f"{tag}: FAILED (preflight): {_one_line(reason, 400)}")
      continue
    why = "" if state[m.label] == "not run" else f" ({state[m.label]})"
    log(f"{tag}: running{why}; log: {os.path.join(workdir, m.dir, 'run.log')}")
    status, detail, seconds = run_model(m, workdir, shard, run_fn)
    outcome[m.label] = status
    if status == "done":
      computed.append(seconds)
      n_img = sum((detail.get("meta", {}).get("set_sizes") or {}).values())
      eta = (f"ETA of this shard {_fmt_s(len(left) * sum(computed) / len(computed))} "
             f"({len(left)} model(s) left)" if left else "this shard's last model")
      log(f"{tag}: done in {_fmt_s(seconds)}, {n_img / max(seconds, 1e-9):,.0f} images/s; "
          f"{eta}")
    else:
      log(f"{tag}: FAILED after {_fmt_s(seconds)}: {_one_line(detail, 400)}")
      if not keep_going:
        break
  result = Outcome(outcome)
  if write_leaderboard:
    try:
      leaderboard_lib.write(workdir, log=log)
    except Exception as e:  # the runs are kept; `python -m fi_jax.report leaderboard` retries
      result.leaderboard_error = f"{type(e).__name__}: {_one_line(e)}"
      log(f"The leaderboard failed ({result.leaderboard_error}); rerun it with "
          f"python -m fi_jax.report leaderboard {workdir}")
  failed = [k for k, v in outcome.items() if v == "failed"]
  log(f"Sweep shard {i_shard}/{n_shard}: {sum(v == 'done' for v in outcome.values())} done, "
      f"{len(failed)} failed" + (f" ({', '.join(failed)})" if failed else "") + ".")
  return result


# ----------------------------------------------------------------------------- command line

SWEEP_USAGE = """\
usage: {prog} --config=configs/sweep.py:PRESET[,k=v,...] --workdir=DIR [--shard=i/n]
       [--keep_going=false] [--config.FIELD=VALUE ...]

Runs every model of a sweep config through the benchmark into DIR/<model label>/ and writes
DIR/leaderboard.md/.csv/.json and its figures. A killed sweep resumes where it stopped;
--shard=i/n runs every n-th model (several machines, one shared DIR); a model that fails is
recorded with its reason and the others go on (--keep_going=false: stop at the first problem).

Presets (configs/sweep.py): paper, openood, smoke. The leaderboard alone:
`python -m fi_jax.report leaderboard DIR`. Docs: docs/usage.md "Reproducing a table".
"""


def main(argv: Optional[list[str]] = None) -> None:
  """`python -m fi_jax.run.sweep` / `fi-jax sweep`: parses flags (a bad one: one line, exit
  2) and runs the sweep."""
  argv = list(sys.argv if argv is None else argv)
  prog = "python -m fi_jax.run.sweep" if argv[0].endswith(".py") else argv[0]
  if any(a in ("-h", "--help", "-help") for a in argv[1:]):
    print(SWEEP_USAGE.format(prog=prog))
    sys.exit(0)
  try:
    argv = flags.FLAGS.read_flags_from_files(argv, force_gnu=False)
    spec, rest = command.split_config_flag(argv, default="")
    if not spec:
      raise SweepError("--config=configs/sweep.py:<preset>[,args] is required (presets: "
                       "paper, openood, smoke).")
    config = command.load_config(spec)
    command.check_overrides(config, rest)
    config_flags.DEFINE_config_dict("config", config, "The sweep config "
                                    "(--config=configs/sweep.py:<preset>[,args]).",
                                    lock_config=True, sys_argv=rest)
    flags.DEFINE_string("workdir", None, "The sweep folder (one subfolder per model).")
    flags.DEFINE_string("shard", "0/1", "i/n: run the models whose index % n == i.")
    flags.DEFINE_bool("keep_going", True, "Record a failing model (preflight or run) and go "
                      "on; false: stop at the first problem.")
    rest = flags.FLAGS(rest)
    if not flags.FLAGS.workdir:
      raise SweepError("--workdir is required.")
    shard = parse_shard(flags.FLAGS.shard)
  except (command.UsageError, SweepError, flags.Error, ValueError) as e:
    print(f"{prog}: error: " + " ".join(str(e).split()), file=sys.stderr)
    sys.exit(2)

  def _main(_):
    logging.set_verbosity(logging.WARNING)
    if flags.FLAGS.config.get("cpu_fast_compile", True):
      xla_flags.fast_cpu_compile()   # before JAX starts its backend, as main.py does
    warnings.simplefilter("once")
    say = lambda s: print(s, flush=True)
    workdir = flags.FLAGS.workdir
    try:
      outcome = run_sweep(flags.FLAGS.config, workdir, shard=shard,
                          keep_going=flags.FLAGS.keep_going, log=say)
    except KeyboardInterrupt:
      say("Interrupted; rerun the same command to resume (finished models are kept, the "
          "model in flight resumes from its feature cache).")
      command.end(130)
    except (SweepError, preflight.PreflightError) as e:
      print(f"{prog}: error: {e}", file=sys.stderr)
      command.end(2)
    command.end(0 if outcome.ok else 1)

  app.run(_main, argv=rest)


if __name__ == "__main__":
  from fi_jax.run import huge_pages
  huge_pages.reexec()   # as the CLI's entry point: before any work
  main()
