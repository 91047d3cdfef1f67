"""README's fresh-clone comparison runs as written: its two `python main.py` commands give the
model labels its `report compare ... --pair` line names (the default rule of
fi_jax/common/labels.py), and that compare line, taken from README.md as it is, succeeds on two
small runs in those workdirs (synthetic features through the real pipeline and report writer,
labelled as the README's configs label their runs)."""
import json
import os
import re
import shlex

import pytest

from fi_jax.report import __main__ as report_cli
from fi_jax.run import command
from fi_jax.run import model as run_model
from tests.helpers import feature_runs

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")
SECTION = "## From a fresh clone to a comparison of two models"


def _commands() -> list[str]:
  """The shell commands of the README's fresh-clone block, continuation lines joined."""
  with open(README) as f:
    text = f.read()
  assert SECTION in text, f"README.md has no section {SECTION!r}"
  block = text.split(SECTION, 1)[1].split("```bash", 1)[1].split("```", 1)[0]
  return [" ".join(c.split()) for c in block.replace("\\\n", " ").splitlines() if c.strip()]


def _runs_and_compare() -> tuple[dict[str, str], list[str]]:
  """({workdir: the label its README config gives}, the compare command's arguments)."""
  runs, compare = {}, None
  for c in _commands():
    words = shlex.split(re.sub(r"\s+#.*$", "", c))
    if words[:2] == ["python", "main.py"]:
      spec = next(w.split("=", 1)[1] for w in words if w.startswith("--config="))
      workdir = next(w.split("=", 1)[1] for w in words if w.startswith("--workdir="))
      runs[workdir] = run_model.model_label(command.load_config(spec))
    if words[:4] == ["python", "-m", "fi_jax.report", "compare"]:
      compare = words[3:]   # from "compare" on: what `python -m fi_jax.report` parses
  assert len(runs) == 2 and compare, "README's fresh-clone block: two runs, one compare"
  return runs, compare


def test_the_readme_compare_line_runs_as_written(tmp_path, monkeypatch, capsys):
  runs, args = _runs_and_compare()
  assert list(runs.values()) == ["vit-B16", "clip-openai-B16"]   # the default rule
  pair = args[args.index("--pair") + 1:args.index("--pair") + 3]
  assert [p.rpartition(":")[0] for p in pair] == list(runs.values())
  monkeypatch.chdir(tmp_path)
  sets = str(tmp_path / "sets")
  detectors = ("msp", "energy") + tuple(p.rpartition(":")[2] for p in pair)
  for i, (workdir, label) in enumerate(runs.items()):
    feature_runs.write_sets(sets, noise=0.5 * i)   # two models on the same images
    feature_runs.run(sets, workdir, label, detectors=detectors)
  rc = report_cli.main(args)
  assert rc == 0, capsys.readouterr().err
  out = args[[a.startswith("--out=") for a in args].index(True)].split("=", 1)[1]
  with open(os.path.join(out, "compare.json")) as f:
    got = json.load(f)
  assert [(p["model"], p["detector"]) for p in got["pair"]] == [
      tuple(p.rpartition(":")[::2]) for p in pair]
  assert got["paired"]["far"]["n_id"] == feature_runs.N_TEST
  assert {r["model"] for r in got["rows"]} == set(runs.values())


@pytest.mark.parametrize("spec", ["configs/vit.py:variant=L/16", "configs/clip.py:name=laion2b-B/16"])
def test_default_labels_need_no_quoting(spec):
  label = run_model.model_label(command.load_config(spec))
  assert re.fullmatch(r"[A-Za-z0-9._-]+", label), label
