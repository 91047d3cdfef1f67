"""A run's report files and how they are published.

  results.json   everything (fi_jax.report.schema): meta, id_accuracy, `rows` (one per model,
                 detector, ID set, OOD set, in configured order) and `failed` (one
                 {"detector", "failed": reason} per detector that raised or gave non-finite
                 scores; such a detector has no rows)
  results.csv    every field of every row (the full-spectrum rows too, told apart by id_set)
  results.md     the table (and, with covariate-shifted ID sets, the full-spectrum table),
                 sorted by `config.report.sort_by` on `config.report.sort_set`
                 (default: FPR@95 on fi_imagenet_1k, else the first OOD set), every configured
                 detector listed (failed ones with their reason), then per-class tables
  per_class/<ood set>/<detector>.csv   metrics of every OOD class against all ID images
  scores/id_test.npz, scores/ood/<set>.npz   per-example scores: `id` (the example's index in
                 its set, the dataset's own numbering even where rows were dropped), `label`,
                 `group`, `run_id` (the run that wrote it) and one float array per detector
                 (higher = more ID)
  plots/         fi_jax.report.plots

A run publishes these as one unit (`StagedReport`): they are written into
`<workdir>/.report-<run id>.tmp/`, which is then renamed to `<workdir>/.report-<run id>/` and
made the target of the symbolic link `<workdir>/report` by one atomic rename of a new link over
the old one. The workdir's `results.json`, `results.csv`, `results.md`, `scores`, `per_class`
and `plots` are links through `report/`, made once, so that at every instant a reader sees the
complete previous report or the complete new one, never a mixture; a reader that opens several
files resolves `report` once (`report_folder`) and reads them all from that folder. A run that
fails after its scores exist but before its results do publishes the scores alone, marked by
`incomplete.json` ({"run_id", "error"}), in place of the previous report; a run that is killed,
or whose writing fails (a full disk), publishes nothing and leaves the previous report as it was.
"""
from __future__ import annotations

import csv
import importlib.metadata
import json
import math
import os
import shutil
import time
import uuid
from typing import Mapping, Optional, Sequence

import numpy as np

from fi_jax.common import columns
from fi_jax.report import schema, tables
from fi_jax.report.schema import ResultsError, failures, lower_is_better

REPORT_LINK = "report"   # <workdir>/report -> .report-<run id>
# what a report folder holds; the workdir has a link `<name> -> report/<name>` for each
REPORT_ENTRIES = ("results.json", "results.csv", "results.md", "scores", "per_class", "plots")
INCOMPLETE = "incomplete.json"   # in a report published without results (`StagedReport.publish`)
_FOLDER_PREFIX = ".report-"
_STAGING_SUFFIX = ".tmp"
_TRASH_PREFIX = ".report-old-"
_WRITER_LOCK = ".writer.lock"   # in a staging folder: locked (flock) while its run lives
_GRACE_S = 120            # an unreferenced report folder younger than this may be a concurrent
                          # run's, about to be linked
_STAGING_MAX_AGE_S = 86400  # a staging folder without a writer lock older than this is left
                            # over from a killed run
# the scores file's own columns; a detector may not have one of these names
SCORE_FILE_COLUMNS = ("id", "label", "group", "run_id")


class ScoresError(ValueError):
  """A per-example scores file that cannot be read or is not one fi_jax wrote."""


def versions() -> dict[str, str]:
  out = {}
  for pkg in ("jax", "jaxlib", "flax", "optax", "numpy", "scikit-learn", "tensorflow-cpu",
              "tensorflow-datasets", "ml_collections"):
    try:
      out[pkg] = importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
      pass
  return out


def _int_counts(row: Mapping) -> dict:
  """The row with its count fields (n_id, n_ood, ...) as ints."""
  out = dict(row)
  for k in schema.INT_FIELDS:
    v = out.get(k)
    if isinstance(v, (float, np.floating)) and math.isfinite(v) and float(v).is_integer():
      out[k] = int(v)
  return out


def write_per_class(rows: Sequence[Mapping], workdir: str,
                    group_names: Optional[Mapping[str, Sequence[str]]] = None,
                    predicted_as: Optional[Mapping[str, Mapping]] = None) -> None:
  """One CSV per (detector, OOD set) with the metrics of every OOD class vs all ID images:
  per_class/<ood set>/<detector>.csv (`group` = the dataset's class id, `class` its name,
  `predicted_as` / `predicted_share` the ID class its images are most often predicted as)."""
  group_names, predicted_as = dict(group_names or {}), dict(predicted_as or {})
  for r in rows:
    table_ = r.get("per_class")
    if not table_:
      continue
    folder = os.path.join(workdir, "per_class", str(r["ood_set"]).replace("/", "_"))
    os.makedirs(folder, exist_ok=True)
    keys = ["group", "n_ood"] + sorted(k for k in table_ if k not in ("group", "n_ood"))
    names = list(group_names.get(r["ood_set"]) or [])
    pred = predicted_as.get(r["ood_set"]) or {}
    with open(os.path.join(folder, f"{r['detector']}.csv"), "w", newline="") as f:
      w = csv.writer(f)
      w.writerow(keys[:1] + ["class", "predicted_as", "predicted_share"] + keys[1:])
      for i in range(len(table_[keys[0]])):
        g = int(table_["group"][i])
        p = pred.get(str(g)) or {}
        vals = [schema.jsonable(table_[k][i]) for k in keys]
        vals[1] = int(vals[1])   # n_ood
        w.writerow([g, names[g] if 0 <= g < len(names) else "", p.get("class", ""),
                    p.get("share", "")] + vals[1:])


def predicted_as(logits: np.ndarray, groups: np.ndarray,
                 class_names: Optional[Sequence[str]] = None) -> dict[str, dict]:
  """{str(group): {"class", "class_id", "share"}}: per OOD class, the ID class its images
  are most often predicted as (argmax of the logits) and the share of its images that are."""
  pred = np.argmax(np.asarray(logits), axis=1)
  groups = np.asarray(groups)
  out = {}
  for g in np.unique(groups[groups >= 0]):
    p = pred[groups == g]
    ids, counts = np.unique(p, return_counts=True)
    c = int(ids[np.argmax(counts)])   # np.unique sorts: ties go to the lowest class id
    name = class_names[c] if class_names is not None and c < len(class_names) else str(c)
    out[str(int(g))] = {"class": str(name), "class_id": c,
                        "share": float(counts.max() / len(p))}
  return out


def write(results: Mapping, workdir: str) -> None:
  """Writes results.json, results.csv, results.md and per_class/ into `workdir`."""
  os.makedirs(workdir, exist_ok=True)
  meta = results.get("meta", {})
  write_per_class(results["rows"], workdir, meta.get("group_names"), meta.get("predicted_as"))
  md = tables.table(results)
  per_class = tables.per_class_tables(results)
  fs = results.get("full_spectrum")
  fs_meta = {k: v for k, v in meta.items() if k != "id_label_accuracy"}   # ID test set only
  fs_md = tables.table({**results, "meta": fs_meta, "rows": fs["rows"],
                        "id_accuracy": fs.get("accuracy")}) if fs else ""
  results = {**results, "failed": failures(results),
             "rows": [_int_counts({k: v for k, v in r.items() if k != "per_class"})
                      for r in results["rows"]]}
  def plain(rows):
    return [_int_counts({k: v for k, v in r.items() if k != "per_class"}) for r in rows]
  restricted_md = []
  if fs:
    results["full_spectrum"] = {**fs, "rows": plain(fs["rows"])}
    if "restricted" in fs:
      results["full_spectrum"]["restricted"] = [{**b, "rows": plain(b.get("rows", []))}
                                                for b in fs["restricted"]]
    for b in fs.get("restricted", []):   # the logit-only detectors in a class subset's space
      b_failed = [{"detector": k, "failed": v} for k, v in (b.get("failed") or {}).items()]
      b_meta = {**fs_meta, "config": {**fs_meta.get("config", {}), "detectors": list(
          b.get("detectors", [])) + [f["detector"] for f in b_failed]}}
      b_md = (tables.table({**results, "meta": b_meta, "rows": b["rows"], "failed": b_failed,
                            "id_accuracy": b.get("accuracy")})
              if b.get("rows") else f"Not computed: {b.get('skipped', 'no logit-only detector')}.")
      restricted_md.append(
          f"\n### Full spectrum in the label space of {b.get('n_classes')} classes "
          f"({b.get('class_subset')}): ID = {b['id_set']}\n\n"
          f"The logit-only detectors on the logits of these classes only, for every set; the ID "
          f"test set keeps its {b.get('n_id_test')} images of these classes "
          "(docs/metrics.md#class-subsets).\n\n" + b_md + "\n")
  with open(os.path.join(workdir, "results.json"), "w") as f:
    json.dump(schema.jsonable(results), f, indent=1)
  rows = results["rows"] + schema.full_spectrum_rows(results)
  fields = list(schema.KEY_COLUMNS)
  for r in rows:
    fields += [k for k in r if k not in fields]
  with open(os.path.join(workdir, "results.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=fields)
    w.writeheader()
    for r in rows:
      w.writerow(schema.jsonable(r))
  key, where = tables.sort_spec(results)
  title = schema.model_label(results)
  if meta.get("random_init"):
    title += " (RANDOM INIT: untrained weights, not a released model)"
  with open(os.path.join(workdir, "results.md"), "w") as f:
    f.write(f"# fi_jax results: {title}\n\n")
    f.write(md + "\n\n")
    title_of = {k: t for t, k, _ in tables.TABLE_COLUMNS}
    f.write(f"Sorted by {title_of.get(key, key)} on {where} "
            f"({'lower' if lower_is_better(key) else 'higher'} is better). "
            "Metrics in percent; ID is the positive class for AUROC and FPR@95 (threshold: the "
            "K-th largest ID score); FPR@95 (OOD+) is OpenOOD v1.5's. Brackets: bootstrap CI.\n")
    for fl in failures(results):
      what, why = "failed", str(fl["failed"])
      if schema.is_degenerate(fl):
        what, why = "is degenerate", why.removeprefix(schema.DEGENERATE_PREFIX)
      f.write(f"\n- detector {fl['detector']} {what}: {tables.cell(why, 2000)}\n")
    if fs:
      f.write(f"\n## Full spectrum (OpenOOD v1.5 FS): ID = {fs['id_set']}\n\n"
              "The covariate-shifted ID sets count as ID; ID accuracy above is pooled over "
              "them. Accuracy of each: " + ", ".join(
                  f"{k} {'-' if v is None else f'{100 * v:.2f}%'}"
                  for k, v in fs.get("csid_accuracy", {}).items()) + ".\n\n" + fs_md + "\n")
      f.write("".join(restricted_md))
    if per_class:
      f.write("\n" + per_class + "\n")


def write_scores(workdir: str, scores: Mapping[str, Mapping[str, np.ndarray]],
                 sets: Mapping[str, Mapping[str, np.ndarray]],
                 run_id: Optional[str] = None) -> list[str]:
  """scores/<set>.npz for id_test and every OOD set ("ood/x" -> scores/ood/x.npz): `id` (the
  example's index in its set: the set's `_id` column where it has one, i.e. where
  `pipeline.drop_nonfinite` dropped rows, else the row number), `label`, `group`, `run_id` (a
  0-d string, with `run_id`) and one float array per detector. Returns the files written."""
  written = []
  for set_name, arrays in sets.items():
    if set_name == "id_fit":
      continue
    n = len(arrays["logits"])
    ids = arrays.get(columns.ID)
    cols = {"id": np.arange(n, dtype=np.int64) if ids is None else np.asarray(ids, np.int64)}
    for k in ("label", "group"):
      if k in arrays:
        cols[k] = np.asarray(arrays[k], np.int64)
    if run_id is not None:
      cols["run_id"] = np.asarray(str(run_id))
    for det, per_set in scores.items():
      if set_name in per_set:
        if det in SCORE_FILE_COLUMNS:
          raise ValueError(f"A detector named {det!r} clashes with the score file's own "
                           f"{det!r} column.")
        cols[det] = np.asarray(per_set[set_name])
    path = os.path.join(workdir, "scores", set_name + ".npz")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.savez(path, **cols)
    written.append(path)
  return written


def load_scores(workdir: str, set_name: str, folder: Optional[str] = None,
                ) -> dict[str, np.ndarray]:
  """The arrays of scores/<set>.npz ("id_test" or "ood/<name>") of `workdir`'s report (in
  `folder`, a `report_folder(workdir)` resolved earlier, if given): `id`, `label`, `group`,
  `run_id` (files written before run ids: none) and one array per detector. FileNotFoundError
  when the file is absent; ScoresError naming the file when it is damaged, not an .npz archive
  or not shaped like a scores file (`id` a 1-D integer array, every other array but `run_id`
  1-D of the same length)."""
  path = os.path.join(folder or workdir, "scores", set_name + ".npz")
  if not os.path.exists(path):
    raise FileNotFoundError(f"No per-example scores {path}; rerun that workdir's config with "
                            "this version of fi_jax (the feature cache makes it quick).")
  try:
    archive = np.load(path, allow_pickle=False)
  except Exception as e:  # truncated, empty, damaged zip, unreadable, not numpy's at all
    raise _unreadable(path, e, "neither an .npz archive nor a .npy array") from None
  if not isinstance(archive, np.lib.npyio.NpzFile):
    raise ScoresError(f"{path}: not a scores file (a single .npy array, not an .npz archive "
                      "of named arrays).")
  try:
    with archive as z:
      out = {k: z[k] for k in z.files}
  except Exception as e:  # a damaged member (CRC, truncated data, object arrays)
    raise _unreadable(path, e, "an array of Python objects") from None
  _check_scores(path, out)
  return out


def _unreadable(path: str, error: Exception, pickle_means: str) -> ScoresError:
  """The ScoresError of a file numpy could not read; numpy's advice to load pickles (which
  would run code from the file) becomes what the file is."""
  if isinstance(error, ValueError) and "pickle" in str(error):
    return ScoresError(f"{path}: not a scores file ({pickle_means}; fi_jax writes .npz "
                       "archives of numeric arrays and never loads pickled data).")
  return ScoresError(f"{path}: not a readable scores file ({type(error).__name__}: {error}).")


def _check_scores(path: str, arrays: Mapping[str, np.ndarray]) -> None:
  ids = arrays.get("id")
  if ids is None or ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
    raise ScoresError(f"{path}: not a scores file (no 1-D integer `id` array of example ids; "
                      f"it has {sorted(arrays)}).")
  run_id = arrays.get("run_id")
  if run_id is not None and (run_id.ndim != 0 or run_id.dtype.kind != "U"):
    raise ScoresError(f"{path}: `run_id` is not a string.")
  for k, v in arrays.items():
    if k in ("id", "run_id"):
      continue
    if v.shape != ids.shape or not (np.issubdtype(v.dtype, np.number) or v.dtype == bool):
      raise ScoresError(f"{path}: array {k!r} ({v.dtype}, shape {v.shape}) does not match the "
                        f"{len(ids)} example ids; not a scores file fi_jax wrote.")


def scores_run_id(arrays: Mapping[str, np.ndarray]) -> Optional[str]:
  """The run id a scores file records (None: written before run ids)."""
  run_id = arrays.get("run_id")
  return None if run_id is None else str(run_id)


# ----------------------------------------------------------------------------- publishing

def new_run_id() -> str:
  """A run's identity in its report files (uuid4 hex)."""
  return uuid.uuid4().hex


def report_folder(workdir: str) -> str:
  """The folder that holds `workdir`'s current report: the target of `<workdir>/report`
  resolved now, else `workdir` itself (a report written before reports were published as a
  unit). A reader that opens several report files resolves this once and reads them all
  there, so that a concurrent publish cannot give it files of two runs."""
  link = os.path.join(workdir, REPORT_LINK)
  return os.path.realpath(link) if os.path.isdir(link) else workdir


def load_results(workdir: str, folder: Optional[str] = None) -> schema.Results:
  """`workdir`'s results.json (from `folder`, default `report_folder(workdir)`) through
  `schema.load`; ResultsError naming the workdir when its last run published only scores
  (`incomplete.json`)."""
  folder = folder or report_folder(workdir)
  marker = os.path.join(folder, INCOMPLETE)
  if not os.path.exists(os.path.join(folder, "results.json")) and os.path.exists(marker):
    try:
      with open(marker, encoding="utf-8") as f:
        info = json.load(f)
      info = info if isinstance(info, dict) else {}
    except (OSError, ValueError):
      info = {}
    raise ResultsError(
        f"{workdir}: its last run (run id {info.get('run_id', '?')}) stopped before writing "
        f"results.json ({info.get('error', 'no reason recorded')}); only its per-example "
        f"scores were published ({os.path.join(workdir, 'scores')}). Rerun that workdir's "
        "config (the feature cache makes it quick).")
  return schema.load(workdir, folder)


class StagedReport:
  """One run's report files, written into `<workdir>/.report-<run_id>.tmp/` (`path`) and
  published as one unit by `publish`, or thrown away by `discard`.

  The staging folder starts with empty `scores/`, `per_class/` and `plots/`; the writers
  (`write_scores`, `write`, `plots.write_plots`, `plots.HistWriter`) take `path` as their
  workdir. Nothing in it is visible through `<workdir>/report` until `publish`.
  """

  def __init__(self, workdir: str, run_id: str):
    self.workdir, self.run_id = workdir, run_id
    self.name = _FOLDER_PREFIX + run_id
    self.path = os.path.join(workdir, self.name + _STAGING_SUFFIX)
    self.published = False
    os.makedirs(self.path)
    # held while this process lives: another run removes the folder only once it is free
    self._lock = _lock(os.path.join(self.path, _WRITER_LOCK), create=True)
    for sub in ("scores", "per_class", "plots"):
      os.makedirs(os.path.join(self.path, sub), exist_ok=True)

  def publish(self, incomplete: Optional[str] = None) -> str:
    """Makes the staged files the workdir's report in one step and removes the previous
    report's folder; returns the published folder. `incomplete`: the reason the run stopped
    before its results; the report is published without them, marked by incomplete.json."""
    if incomplete is not None:
      with open(os.path.join(self.path, INCOMPLETE), "w", encoding="utf-8") as f:
        json.dump({"run_id": self.run_id, "error": incomplete}, f, indent=1)
    _sync_tree(self.path)
    final = os.path.join(self.workdir, self.name)
    _remove_quietly(os.path.join(self.path, _WRITER_LOCK))
    _rename_staged(self.path, final)
    self._unlock()
    previous = _point_report_at(self.workdir, self.name)
    self.published = True
    _link_entries(self.workdir)
    _remove_stale(self.workdir, keep=self.name, previous=previous)
    return final

  def discard(self) -> None:
    """Removes the staging folder (nothing of it was published); the previous report stays."""
    if not self.published:
      shutil.rmtree(self.path, ignore_errors=True)
    self._unlock()

  def _unlock(self) -> None:
    if self._lock is not None:
      os.close(self._lock)
      self._lock = None


def _lock(path: str, create: bool = False) -> Optional[int]:
  """A file descriptor of `path` holding an exclusive flock, or None when another process
  holds it (or the file is gone, or this system has no flock)."""
  try:
    import fcntl
  except ImportError:
    return None
  try:
    fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
  except OSError:
    return None
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError:
    os.close(fd)
    return None
  return fd


def _sync_tree(folder: str) -> None:
  """fsync of every file and folder under `folder`: its data is on disk before the rename
  that publishes it (a write error such as a full disk surfaces here, not later)."""
  for root, dirs, files in os.walk(folder):
    for name in files:
      fd = os.open(os.path.join(root, name), os.O_RDONLY)
      try:
        os.fsync(fd)
      finally:
        os.close(fd)
    _sync_dir(root)


def _sync_dir(folder: str) -> None:
  try:
    fd = os.open(folder, os.O_RDONLY)
  except OSError:
    return
  try:
    os.fsync(fd)
  except OSError:
    pass   # some filesystems cannot sync a folder
  finally:
    os.close(fd)


def _rename_staged(staging: str, final: str) -> None:
  os.rename(staging, final)


def _replace_with_link(path: str, target: str) -> None:
  """`path` becomes a symbolic link to `target` in one rename (`path` is absent, a file or a
  link; never a folder)."""
  tmp = f"{path}.link-{uuid.uuid4().hex}"
  os.symlink(target, tmp)
  os.replace(tmp, path)


def _move_aside(workdir: str, paths: Sequence[str]) -> Optional[str]:
  """Moves `paths` (files or folders of an older report layout) into one new trash folder in
  `workdir`; returns it (None if there was nothing to move)."""
  if not paths:
    return None
  trash = os.path.join(workdir, _TRASH_PREFIX + uuid.uuid4().hex)
  os.mkdir(trash)
  for p in paths:
    os.rename(p, os.path.join(trash, os.path.basename(p)))
  return trash


def _point_report_at(workdir: str, name: str) -> Optional[str]:
  """`<workdir>/report` -> `name` by one atomic rename; returns the folder it pointed to before
  (None: there was no link). A `report` that is a real folder (a copied workdir) is moved
  aside first."""
  link = os.path.join(workdir, REPORT_LINK)
  previous = None
  if os.path.islink(link):
    previous = os.readlink(link)
  elif os.path.lexists(link):
    shutil.rmtree(_move_aside(workdir, [link]), ignore_errors=True)
  _replace_with_link(link, name)
  _sync_dir(workdir)
  return previous


def _link_entries(workdir: str) -> None:
  """Every `REPORT_ENTRIES` name in the workdir a link `report/<name>`. Entries of an older
  layout (real files and folders) are all moved aside before the first link is made, so that
  the top level never shows old and new files side by side."""
  wrong = []
  for name in REPORT_ENTRIES:
    p = os.path.join(workdir, name)
    if not (os.path.islink(p) and os.readlink(p) == os.path.join(REPORT_LINK, name)):
      wrong.append(p)
  if not wrong:
    return
  trash = _move_aside(workdir, [p for p in wrong if os.path.lexists(p)])
  for p in wrong:
    _replace_with_link(p, os.path.join(REPORT_LINK, os.path.basename(p)))
  if trash is not None:
    shutil.rmtree(trash, ignore_errors=True)


def _remove_stale(workdir: str, keep: str, previous: Optional[str]) -> None:
  """Removes the previous report folder and what killed runs left: staging folders whose
  writer lock is free (their run ended without publishing; without a lock file: older than a
  day), unlinked report folders, trash and temporary links older than `_GRACE_S` (younger
  ones may be a concurrent run's, between its rename and its link)."""
  if previous and previous != keep and os.path.basename(previous) == previous:
    shutil.rmtree(os.path.join(workdir, previous), ignore_errors=True)
  now = time.time()
  for name in os.listdir(workdir):
    path = os.path.join(workdir, name)
    try:
      age = now - os.lstat(path).st_mtime
    except OSError:
      continue
    if ".link-" in name and os.path.islink(path):
      if age > _GRACE_S:
        _remove_quietly(path)
      continue
    if not name.startswith(_FOLDER_PREFIX) or name == keep or os.path.islink(path):
      continue
    if not name.endswith(_STAGING_SUFFIX):
      if age > _GRACE_S:
        shutil.rmtree(path, ignore_errors=True)
      continue
    lock_file = os.path.join(path, _WRITER_LOCK)
    if os.path.exists(lock_file):
      fd = _lock(lock_file)
      if fd is not None:   # its writer is gone
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)
    elif age > _STAGING_MAX_AGE_S:
      shutil.rmtree(path, ignore_errors=True)


def _remove_quietly(path: str) -> None:
  try:
    os.remove(path)
  except OSError:
    pass
