"""configs/clip_demo.py end to end in-process: a tiny random CLIP reports MCM, NegLabel, CSP and
GL-MCM (the text banks embedded once, GL-MCM's local column extracted with every set). (The
banks' cache: tests/run/test_text_bank_cache.py.)"""
import pytest

from configs import clip_demo
from fi_jax.run import benchmark as run

pytest.importorskip("open_clip")   # the CLIP BPE vocabulary


@pytest.mark.slow
def test_clip_demo_reports_the_zero_shot_detectors(tmp_path):
  c = clip_demo.get_config("words=3")
  c.detectors = ("mcm", "neglabel", "csp", "glmcm")
  c.report.plots = False
  c.compilation_cache_dir = ""
  workdir = str(tmp_path / "wd")
  results = run.run(c, workdir, log=lambda s: None)
  assert results["failed"] == []
  rows = {r["detector"]: r for r in results["rows"]}
  assert set(rows) == {"mcm", "neglabel", "csp", "glmcm"}
  assert all(0 <= rows[d]["auroc"] <= 100 for d in rows)
