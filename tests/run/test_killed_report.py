"""A rerun killed with SIGKILL at any step of writing its report leaves a workdir whose report
is one run's: `compare` (and a reader of the top-level files) never sees the results of one run
beside the scores of another."""
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from fi_jax import report
from fi_jax.metrics import reference

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_KILL_AFTER = textwrap.dedent("""
  import importlib, os, signal, sys
  module_name, _, name = sys.argv[1].partition(":")
  module = importlib.import_module(module_name)
  step = getattr(module, name)   # a step that does not exist fails the test here
  def kill_after(*a, **k):
    out = step(*a, **k)
    os.kill(os.getpid(), signal.SIGKILL)
    return out
  setattr(module, name, kill_after)
  sys.argv = ["main.py", *sys.argv[2:]]
  from fi_jax.run import cli
  cli.main()
""")

# the report's writing steps in the order a run takes them: the writers into the staging
# folder, then the publication (fi_jax/report/files.py)
STEPS = ["fi_jax.report:write_scores", "fi_jax.report:write_plots", "fi_jax.report:write",
         "fi_jax.report.files:_sync_tree", "fi_jax.report.files:_rename_staged",
         "fi_jax.report.files:_point_report_at", "fi_jax.report.files:_link_entries",
         "fi_jax.report.files:_remove_stale"]
PUBLISHED_FROM = STEPS.index("fi_jax.report.files:_point_report_at")


def _env():
  return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": ROOT}


def _args(workdir, k):
  """The demo's quick config; knn's k differs per run, so each run has its own numbers."""
  return ["--config=configs/demo.py:quick", "--config.train.steps=20",
          "--config.detectors=('msp', 'knn')", f"--config.detector_hparams.knn.k={k}",
          f"--workdir={workdir}"]


def _as_older_layout(workdir):
  """The workdir as fi_jax wrote it before reports were published as a unit: real files and
  folders at the top level, no report link."""
  link = os.path.join(workdir, report.REPORT_LINK)
  if not os.path.islink(link):
    return
  folder = os.path.realpath(link)
  for name in report.REPORT_ENTRIES:
    os.remove(os.path.join(workdir, name))
    if os.path.lexists(os.path.join(folder, name)):
      os.rename(os.path.join(folder, name), os.path.join(workdir, name))
  os.remove(link)
  shutil.rmtree(folder)


def _one_run(workdir, out):
  """(run id, knn AUROC) of the report the workdir shows, after checking that it is one
  run's: compare's paired test (from the scores files) gives the AUROCs of its table (from
  results.json), and the top-level files read one by one agree with each other too."""
  label = report.load_results(workdir)["rows"][0]["model"]
  got = report.compare([workdir], out, [f"{label}:knn", f"{label}:msp"], n_bootstrap=1,
                       log=lambda s: None)
  rows = {r["detector"]: r for r in got["rows"]}
  t = got["paired"]["digits_6-9"]
  assert t["auroc_a"] == pytest.approx(rows["knn"]["auroc"], abs=1e-12)
  assert t["auroc_b"] == pytest.approx(rows["msp"]["auroc"], abs=1e-12)
  with open(os.path.join(workdir, "results.json")) as f:
    top = json.load(f)
  idt = np.load(os.path.join(workdir, "scores", "id_test.npz"))
  ood = np.load(os.path.join(workdir, "scores", "ood", "digits_6-9.npz"))
  for r in top["rows"]:
    assert reference.auroc(idt[r["detector"]], ood[r["detector"]]) == pytest.approx(
        r["auroc"], abs=1e-12)
  run_id = top["meta"].get("run_id")
  assert [str(z["run_id"]) if "run_id" in z.files else None for z in (idt, ood)] == [run_id] * 2
  return report.load_results(workdir)["meta"].get("run_id"), rows["knn"]["auroc"]


@pytest.mark.slow
def test_a_rerun_killed_at_each_report_step_never_mixes_two_runs(tmp_path):
  workdir = str(tmp_path / "w")
  first = subprocess.run([sys.executable, "main.py", *_args(workdir, 5)], cwd=ROOT, env=_env(),
                         capture_output=True, text=True, timeout=600)
  assert first.returncode == 0, first.stderr[-3000:]
  _as_older_layout(workdir)   # the first publish also replaces an older layout
  shown, auroc = _one_run(workdir, str(tmp_path / "cmp"))
  aurocs = {auroc}
  for i, step in enumerate(STEPS):
    killed = subprocess.run([sys.executable, "-c", _KILL_AFTER, step,
                             *_args(workdir, 15 + 10 * i)], cwd=ROOT, env=_env(),
                            capture_output=True, text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, (step, killed.stderr[-3000:])
    now, auroc = _one_run(workdir, str(tmp_path / "cmp"))
    assert (now != shown) == (i >= PUBLISHED_FROM), step   # the new report, or the old one
    shown = now
    aurocs.add(auroc)
  assert len(aurocs) > 2   # the runs differ, so a mixture would show
  final = subprocess.run([sys.executable, "main.py", *_args(workdir, 95)], cwd=ROOT,
                         env=_env(), capture_output=True, text=True, timeout=600)
  assert final.returncode == 0, final.stderr[-3000:]
  assert _one_run(workdir, str(tmp_path / "cmp"))[0] != shown
  current = os.readlink(os.path.join(workdir, report.REPORT_LINK))
  assert [n for n in os.listdir(workdir) if n.startswith(".report-") and n != current
          and n.endswith(".tmp")] == []   # killed runs' staging folders are gone
