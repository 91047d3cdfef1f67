"""A run's report is published as one unit: the workdir shows the previous report or the new
one, never files of both; a full disk keeps the previous report; a metrics failure publishes
the new scores alone (never beside the old results); every file names its run."""
import errno
import json
import os
import shutil

import numpy as np
import pytest

from fi_jax import pipeline, report
from fi_jax.report import files as report_files
from fi_jax.report import plots as report_plots
from tests.helpers import feature_runs


@pytest.fixture
def first_run(tmp_path):
  """(sets folder, workdir) after one finished run with msp, energy, knn and its plots."""
  sets = feature_runs.write_sets(str(tmp_path / "sets"))
  workdir = str(tmp_path / "w")
  feature_runs.run(sets, workdir, "m", plots=True)
  return sets, workdir


def _leftovers(workdir):
  """What a finished publish must not leave: staging folders, trash, temporary links, report
  folders other than the linked one."""
  current = os.readlink(os.path.join(workdir, report.REPORT_LINK))
  return sorted(n for n in os.listdir(workdir)
                if (n.startswith(".report-") and n != current) or ".link-" in n)


def test_the_report_is_one_folder_reached_through_the_report_link(first_run):
  sets, workdir = first_run
  first = feature_runs.run_id(workdir)
  assert os.readlink(os.path.join(workdir, "report")) == f".report-{first}"
  for name in report.REPORT_ENTRIES:
    assert os.readlink(os.path.join(workdir, name)) == os.path.join("report", name)
  for set_name in ("id_test", "ood/far"):
    assert str(report.load_scores(workdir, set_name)["run_id"]) == first
  assert os.path.exists(os.path.join(workdir, "plots", "hist_msp.png"))
  feature_runs.run(sets, workdir, "m", detectors=("msp", "knn"))
  second = feature_runs.run_id(workdir)
  assert second != first and _leftovers(workdir) == []
  assert not os.path.exists(os.path.join(workdir, f".report-{first}"))
  assert set(report.load_scores(workdir, "id_test")) == {"id", "label", "group", "run_id",
                                                         "msp", "knn"}
  assert os.listdir(os.path.join(workdir, "plots")) == []   # this run drew none


def _enospc(*a, **k):
  raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _full_disk_in_scores(monkeypatch):
  """The second scores file fails half written."""
  savez, calls = np.savez, []

  def savez_then_full(path, **arrays):
    calls.append(path)
    if len(calls) == 2:
      with open(path, "wb") as f:
        f.write(b"PK\x03\x04 half")
      _enospc()
    savez(path, **arrays)
  monkeypatch.setattr(report_files.np, "savez", savez_then_full)


def _full_disk_in_results(monkeypatch):
  """results.json fails half written."""
  def dump_half(obj, f, **kw):
    f.write(json.dumps(obj, **kw)[:100])
    _enospc()
  monkeypatch.setattr(report_files.json, "dump", dump_half)


def _full_disk_at_sync(monkeypatch):
  """The data reaches the disk only at fsync, and does not fit."""
  monkeypatch.setattr(report_files.os, "fsync", _enospc)


@pytest.mark.parametrize("full_disk", [_full_disk_in_scores, _full_disk_in_results,
                                       _full_disk_at_sync])
def test_a_full_disk_keeps_the_previous_report(first_run, monkeypatch, full_disk):
  sets, workdir = first_run
  before = feature_runs.snapshot(workdir)
  assert "scores/id_test.npz" in before and "results.json" in before
  full_disk(monkeypatch)
  lines = []
  with pytest.raises(OSError) as e:
    feature_runs.run(sets, workdir, "m", detectors=("msp", "knn"), log=lines.append)
  assert e.value.errno == errno.ENOSPC
  monkeypatch.undo()
  assert feature_runs.snapshot(workdir) == before
  assert _leftovers(workdir) == []
  assert f"{workdir}'s previous report, if any, is unchanged" in lines[-1]


def test_a_metrics_failure_publishes_the_new_scores_never_beside_the_old_results(
    first_run, monkeypatch):
  sets, workdir = first_run
  old = report.load_results(workdir)["meta"].get("run_id")

  def broken(*a, **k):
    raise MemoryError("bootstrap")
  monkeypatch.setattr(pipeline, "metric_rows", broken)
  lines = []
  with pytest.raises(MemoryError):
    feature_runs.run(sets, workdir, "m", detectors=("msp", "knn"), log=lines.append)
  assert not os.path.exists(os.path.join(workdir, "results.json"))
  assert not os.path.exists(os.path.join(workdir, "results.md"))
  z = report.load_scores(workdir, "id_test")
  assert {"msp", "knn"} <= set(z) and "energy" not in z and str(z["run_id"]) != old
  with open(os.path.join(workdir, "report", report.INCOMPLETE)) as f:
    marker = json.load(f)
  assert marker == {"run_id": str(z["run_id"]), "error": "MemoryError: bootstrap"}
  assert "its per-example scores are published alone" in lines[-1]
  with pytest.raises(report.ResultsError, match=r"stopped before writing results.json "
                                                r"\(MemoryError: bootstrap\)"):
    report.load_results(workdir)
  monkeypatch.undo()
  feature_runs.run(sets, workdir, "m")   # the next run replaces it whole
  assert not os.path.exists(os.path.join(workdir, "report", report.INCOMPLETE))
  assert _leftovers(workdir) == []


def test_histograms_are_drawn_into_the_staging_folder(first_run, monkeypatch):
  sets, workdir = first_run
  folders = []
  write_hist = report_plots.write_hist

  def recording(folder, *a, **k):
    folders.append(folder)
    return write_hist(folder, *a, **k)
  monkeypatch.setattr(report_plots, "write_hist", recording)
  feature_runs.run(sets, workdir, "m", plots=True)
  assert folders and all(f != os.path.join(workdir, "plots") for f in folders)
  new = feature_runs.run_id(workdir)
  assert all(f == os.path.join(workdir, f".report-{new}.tmp", "plots") for f in folders)
  assert sorted(os.listdir(os.path.join(workdir, "plots"))) == sorted(
      ["fpr95.png", "roc_far.png", "hist_msp.png", "hist_energy.png", "hist_knn.png"])


def test_an_older_workdir_layout_is_replaced_as_a_whole(first_run):
  """A workdir written before reports were published as a unit has real results.* files and
  scores/ per_class/ plots/ folders: the next run replaces them all by the links."""
  sets, workdir = first_run
  folder = report.report_folder(workdir)
  for name in report.REPORT_ENTRIES:
    os.remove(os.path.join(workdir, name))
    os.rename(os.path.join(folder, name), os.path.join(workdir, name))
  os.remove(os.path.join(workdir, "report"))
  os.rmdir(folder)
  with open(os.path.join(workdir, "plots", "stale_old_plot.png"), "w"):
    pass
  assert report.report_folder(workdir) == workdir
  assert report.load_results(workdir)["meta"]["run_id"]
  feature_runs.run(sets, workdir, "m", detectors=("msp",))
  for name in report.REPORT_ENTRIES:
    assert os.path.islink(os.path.join(workdir, name))
  assert not os.path.exists(os.path.join(workdir, "plots", "stale_old_plot.png"))
  assert set(report.load_scores(workdir, "id_test")) == {"id", "label", "group", "run_id", "msp"}
  assert _leftovers(workdir) == []


def test_a_copied_report_folder_is_replaced(first_run, tmp_path):
  """`cp -r` of a workdir turns the report link into a folder: publishing still works (the
  copied report folder, unlinked and young, is left to a later run)."""
  sets, workdir = first_run
  copy = str(tmp_path / "copy")
  shutil.copytree(workdir, copy)   # links become real files and folders
  assert not os.path.islink(os.path.join(copy, "report"))
  feature_runs.run(sets, copy, "m", detectors=("msp",))
  assert os.path.islink(os.path.join(copy, "report"))
  assert _leftovers(copy) == [f".report-{feature_runs.run_id(workdir)}"]
  assert feature_runs.run_id(copy) == str(report.load_scores(copy, "ood/far")["run_id"])


def test_what_killed_runs_left_is_removed_but_a_live_runs_staging_is_kept(first_run):
  sets, workdir = first_run
  dead = report.StagedReport(workdir, "dead")   # a run that died: its lock is free
  dead._unlock()
  alive = report.StagedReport(workdir, "alive")   # holds its lock, as a running run does
  orphan = os.path.join(workdir, ".report-orphan")   # renamed, then killed before the link
  os.mkdir(orphan)
  young = os.path.join(workdir, ".report-young")   # maybe a concurrent run's, about to link
  os.mkdir(young)
  old = os.path.getmtime(orphan) - 3600
  os.utime(orphan, (old, old))
  feature_runs.run(sets, workdir, "m", detectors=("msp",))
  names = os.listdir(workdir)
  assert os.path.basename(dead.path) not in names and ".report-orphan" not in names
  assert os.path.basename(alive.path) in names and ".report-young" in names
  alive.discard()
  assert os.path.basename(alive.path) not in os.listdir(workdir)
