"""A sweep's folder: which models it has and what became of each, read from the files alone
(several machines write into one sweep folder; none of them keeps state in memory).

  <sweep>/sweep.json             the sweep: {"name", "models": [{"label", "dir", ...}] in the
                                 config's order, "leaderboard": its settings}; written
                                 atomically by every process of the sweep (the same content)
  <sweep>/<dir>/                 one model's run folder, exactly what `main.py --workdir` writes
  <sweep>/<dir>/results.json     the model finished (fi_jax.report.schema)
  <sweep>/<dir>/FAILED.json      its last attempt failed: {"label", "reason", "stage", "host",
                                 "pid", "shard"}; removed when an attempt succeeds
  <sweep>/<dir>/RUNNING.json     a process is running it (or was killed while it did):
                                 {"label", "host", "pid", "shard", "started"}

`status(folder)` is "failed" when FAILED.json exists (the newest attempt failed, even if an
older results.json is there), else "done" when results.json reads (`schema.load`), else
"running" when RUNNING.json exists (running now, or killed: a rerun resumes it), else
"missing".
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Optional

from fi_jax.report import schema

SWEEP_FILE = "sweep.json"
FAILED_FILE = "FAILED.json"
RUNNING_FILE = "RUNNING.json"


def folder_name(label: str) -> str:
  """A model label as a folder name: characters other than letters, digits and `-_.+@=`
  become `_` ("torchvision/resnet50.IMAGENET1K_V1" -> "torchvision_resnet50.IMAGENET1K_V1")."""
  name = "".join(c if c.isalnum() or c in "-_.+@=" else "_" for c in label).strip(".")
  return name or "_"


def write_json(path: str, obj: Any) -> None:
  """`obj` as JSON at `path`, atomically: a reader sees the old file or the whole new one."""
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=folder)
  try:
    with os.fdopen(fd, "w") as f:
      json.dump(schema.jsonable(obj), f, indent=1, sort_keys=False)
      f.write("\n")
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def write_text(path: str, text: str) -> None:
  """`text` at `path`, atomically (as `write_json`)."""
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=folder)
  try:
    with os.fdopen(fd, "w", newline="") as f:
      f.write(text)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def read_json(path: str) -> Optional[dict]:
  """The JSON object at `path`, or None when the file is absent or unreadable."""
  try:
    with open(path, encoding="utf-8") as f:
      obj = json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError):
    return None
  return obj if isinstance(obj, dict) else None


def read_sweep(workdir: str) -> Optional[dict]:
  """<workdir>/sweep.json, or None."""
  return read_json(os.path.join(workdir, SWEEP_FILE))


def status(folder: str) -> tuple[str, Optional[dict]]:
  """(status, detail) of one model folder (module docstring): ("failed", FAILED.json),
  ("done", the results), ("running", RUNNING.json) or ("missing", None)."""
  failed = read_json(os.path.join(folder, FAILED_FILE))
  if failed is not None or os.path.exists(os.path.join(folder, FAILED_FILE)):
    return "failed", failed or {"reason": f"{FAILED_FILE} is unreadable"}
  try:
    return "done", schema.load(folder)
  except (FileNotFoundError, schema.ResultsError):
    pass
  running = read_json(os.path.join(folder, RUNNING_FILE))
  if running is not None:
    return "running", running
  return "missing", None


def models(workdir: str) -> list[dict]:
  """[{"label", "dir"}] of the sweep in `workdir`: sweep.json's models in config order, else
  every subfolder holding a results.json, FAILED.json or RUNNING.json (sorted by name; the
  label is the run's model label, else the folder name)."""
  sweep = read_sweep(workdir)
  if sweep is not None and isinstance(sweep.get("models"), list):
    return [{"label": str(m["label"]), "dir": str(m.get("dir") or folder_name(m["label"]))}
            for m in sweep["models"]]
  out = []
  for name in sorted(os.listdir(workdir)) if os.path.isdir(workdir) else []:
    folder = os.path.join(workdir, name)
    if not os.path.isdir(folder) or not any(
        os.path.exists(os.path.join(folder, f))
        for f in ("results.json", FAILED_FILE, RUNNING_FILE)):
      continue
    label = name
    state, detail = status(folder)
    if state == "done":
      label = schema.model_label(detail) or name
    elif detail and detail.get("label"):
      label = str(detail["label"])
    out.append({"label": label, "dir": name})
  return out
