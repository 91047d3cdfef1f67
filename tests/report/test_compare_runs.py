"""`report compare`: a run is its workdir, not its label; `--pair` pairs the dataset's own
examples; every bad input (results.json, a scores file, an argument) is one error naming it."""
import io
import json
import os

import numpy as np
import pytest

from fi_jax import report
from fi_jax.report import __main__ as report_cli
from tests.helpers import feature_runs

NAN_ROWS = {"id_test": [3, 7, 20], "far": [0, 11]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """Three runs on the same sets (one folder, rewritten between runs): `a` and `b` share the
  label "vit" (one model, two precisions, say), `drop` lost rows with NaN features
  (nonfinite=drop) and is otherwise `a`."""
  root = tmp_path_factory.mktemp("compare")
  sets = str(root / "sets")
  wds = {k: str(root / k / "run") for k in ("a", "b", "drop")}
  feature_runs.write_sets(sets)
  feature_runs.run(sets, wds["a"], "vit")
  feature_runs.write_sets(sets, noise=0.7)
  feature_runs.run(sets, wds["b"], "vit")
  feature_runs.write_sets(sets, nan_rows=NAN_ROWS)
  feature_runs.run(sets, wds["drop"], "vit-dropped", nonfinite="drop")
  return wds


def _cli(capsys, *args):
  """(exit status, stderr) of `python -m fi_jax.report ...` run in this process."""
  try:
    rc = report_cli.main(list(args))
  except SystemExit as e:
    rc = e.code
  return rc, capsys.readouterr().err


def _one_error_line(rc, err):
  assert rc == 2, err
  lines = err.strip().splitlines()
  assert len(lines) == 1 and "error: " in lines[0] and "Traceback" not in err, err
  return lines[0]


def _row(workdir, det):
  (row,) = [r for r in report.load_results(workdir)["rows"] if r["detector"] == det]
  return row


# ----------------------------------------------------------------------------- run identity

def test_runs_with_one_label_are_told_apart_by_their_workdir(runs, tmp_path):
  lines = []
  got = report.compare([runs["a"], runs["b"]], str(tmp_path), log=lines.append)
  names = {"vit@a/run": runs["a"], "vit@b/run": runs["b"]}
  assert {(r["model"], r["detector"]) for r in got["rows"]} == {
      (m, d) for m in names for d in ("msp", "energy", "knn")}
  for r in got["rows"]:   # each row has its own run's numbers
    assert r["workdir"] == names[r["model"]]
    assert r["auroc"] == _row(names[r["model"]], r["detector"])["auroc"]
  md = (tmp_path / "compare.md").read_text()
  note = f"vit@a/run = {runs['a']}, vit@b/run = {runs['b']}"
  assert note in md and note in lines[0]
  assert md.count("| vit@a/run |") == md.count("| vit@b/run |") == 3


def test_pair_by_a_shared_label_is_refused_with_the_candidates(runs, tmp_path, capsys):
  with pytest.raises(ValueError, match="is ambiguous: 2 runs have the label 'vit'") as e:
    report.compare([runs["a"], runs["b"]], str(tmp_path), ["vit:msp", "vit:msp"],
                   n_bootstrap=10, log=lambda s: None)
  assert runs["a"] in str(e.value) and runs["b"] in str(e.value)
  line = _one_error_line(*_cli(capsys, "compare", runs["a"], runs["b"], f"--out={tmp_path}",
                               "--pair", "vit:msp", "vit:energy"))
  assert "vit@a/run" in line and "vit@b/run" in line


@pytest.mark.parametrize("form", ["workdir", "name", "label@workdir"])
def test_pair_names_a_run_by_its_workdir(runs, tmp_path, form):
  spec = {"workdir": lambda k: runs[k], "name": lambda k: f"vit@{k}/run",
          "label@workdir": lambda k: f"vit@{runs[k]}"}[form]
  got = report.compare([runs["a"], runs["b"]], str(tmp_path),
                       [f"{spec('a')}:msp", f"{spec('b')}:msp"], n_bootstrap=20,
                       log=lambda s: None)
  t = got["paired"]["far"]
  a, b = _row(runs["a"], "msp")["auroc"], _row(runs["b"], "msp")["auroc"]
  assert a != b and t["auroc_a"] == pytest.approx(a, abs=1e-12)
  assert t["auroc_b"] == pytest.approx(b, abs=1e-12) and t["auroc_diff"] != 0
  assert [p["workdir"] for p in got["pair"]] == [runs["a"], runs["b"]]


def test_pairing_a_run_with_itself_is_refused(runs, tmp_path):
  with pytest.raises(ValueError, match=r"pairs msp of the same run .* with itself"):
    report.paired_tests(report.load_runs([runs["a"], runs["b"]]),
                        [f"{runs['a']}:msp", "vit@a/run:msp"], ["far"], n_bootstrap=10, seed=0)
  copy = feature_runs.copy_workdir(runs["a"], str(tmp_path / "copy"))
  with pytest.raises(ValueError, match="copies of one run"):
    report.compare([runs["a"], copy], str(tmp_path / "out"), [f"{runs['a']}:msp", f"{copy}:msp"],
                   n_bootstrap=10, log=lambda s: None)
  got = report.compare([runs["a"]], str(tmp_path / "out"), ["vit:msp", "vit:energy"],
                       n_bootstrap=10, log=lambda s: None)   # two detectors of one run: fine
  assert got["paired"]["far"]["n_id"] == feature_runs.N_TEST


def test_a_workdir_given_twice_is_refused(runs, tmp_path):
  with pytest.raises(ValueError, match="are the same workdir"):
    report.compare([runs["a"], runs["a"] + "/"], str(tmp_path), log=lambda s: None)


def test_unknown_run_or_detector_lists_runs_and_detectors_apart(runs, tmp_path, capsys):
  line = _one_error_line(*_cli(capsys, "compare", runs["a"], runs["drop"], f"--out={tmp_path}",
                               "--pair", "nope:msp", "vit:msp"))
  assert (f"The runs: vit ({runs['a']}), vit-dropped ({runs['drop']}). "
          "Their detectors: msp, energy, knn.") in line
  line = _one_error_line(*_cli(capsys, "compare", runs["a"], f"--out={tmp_path}",
                               "--pair", "vit:vim", "vit:msp"))
  assert "has no rows of detector 'vim'; its detectors: msp, energy, knn." in line


# ----------------------------------------------------------------------------- example ids

def test_dropped_rows_keep_the_datasets_example_ids(runs, tmp_path):
  """nonfinite=drop removes rows 3, 7, 20 of id_test: the scores file names the others by
  their own index, and --pair against a run that has every row pairs the same images (their
  scores are the same, so every difference is exactly 0)."""
  for set_name, n, name in (("id_test", feature_runs.N_TEST, "id_test"),
                            ("ood/far", feature_runs.N_OOD, "far")):
    z = report.load_scores(runs["drop"], set_name)
    np.testing.assert_array_equal(z["id"], np.setdiff1d(np.arange(n), NAN_ROWS[name]))
  got = report.compare([runs["a"], runs["drop"]], str(tmp_path),
                       ["vit:energy", "vit-dropped:energy"], n_bootstrap=20, log=lambda s: None)
  t = got["paired"]["far"]
  assert (t["n_id"], t["n_ood"]) == (feature_runs.N_TEST - 3, feature_runs.N_OOD - 2)
  assert t["auroc_diff"] == 0 and t["fpr95_diff"] == 0 and t["auroc_p"] == 1.0
  assert t["auroc_b"] == pytest.approx(_row(runs["drop"], "energy")["auroc"], abs=1e-12)


# ----------------------------------------------------------------------------- run ids

def test_scores_of_another_run_are_refused_naming_both_files(runs, tmp_path):
  mixed = feature_runs.copy_workdir(runs["a"], str(tmp_path / "mixed"))
  theirs = os.path.join(runs["b"], "scores", "id_test.npz")
  ours = os.path.join(report.report_folder(mixed), "scores", "id_test.npz")
  os.replace(ours, ours + ".bak")
  with open(theirs, "rb") as src, open(ours, "wb") as dst:
    dst.write(src.read())
  with pytest.raises(report.ScoresError) as e:
    report.compare([mixed, runs["drop"]], str(tmp_path / "out"),
                   ["vit:msp", "vit-dropped:msp"], n_bootstrap=10, log=lambda s: None)
  text = str(e.value)
  assert ours in text and os.path.join(report.report_folder(mixed), "results.json") in text
  assert feature_runs.run_id(runs["b"]) in text and feature_runs.run_id(runs["a"]) in text


# ----------------------------------------------------------------------------- bad inputs

def _results_text(workdir):
  with open(os.path.join(workdir, "results.json")) as f:
    return f.read()


def _edit(key_path, value):
  def edit(text):
    res = json.loads(text)
    node = res
    for k in key_path[:-1]:
      node = node[k]
    node[key_path[-1]] = value
    return json.dumps(res)
  return edit


@pytest.mark.parametrize("damage, says", [
    (lambda t: t[:len(t) // 2], "not a readable results file (JSONDecodeError"),
    (lambda t: "", "not a readable results file"),
    (lambda t: "\x89PNG\r\n\x1a\n\x00\xff", "not a readable results file"),
    (lambda t: "[1, 2]", "a JSON list, not an object"),
    (_edit(("rows", 0, "auroc"), "0.9"), "['auroc'] not numbers"),
    (_edit(("rows", 1, "fpr95"), [0.1]), "['fpr95'] not numbers"),
    (_edit(("rows", 0, "detector"), None), "row 0 lacks the key columns"),
    (_edit(("meta", "config"), "oops"), "meta.config is a str, not a dict"),
    (_edit(("meta", "ood_sets"), "far"), "meta.ood_sets is a str, not a list"),
    (_edit(("meta", "config", "id_test"), 3), "meta.config.id_test is a int"),
    (_edit(("meta", "config", "metrics", "tpr"), "x"), "meta.config.metrics.tpr is 'x'"),
    (_edit(("failed",), [{"reason": 1}]), "'failed' holds an entry without a detector name"),
    (_edit(("meta",), []), "'meta' is not an object"),
])
def test_a_malformed_results_json_is_one_error_naming_the_file(runs, tmp_path, capsys, damage,
                                                               says):
  bad = feature_runs.copy_workdir(runs["a"], str(tmp_path / "bad"))
  path = os.path.join(report.report_folder(bad), "results.json")
  text = damage(_results_text(bad))
  os.remove(path)   # the published file is read-only to nobody, but replace it, never edit
  with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
    f.write(text)
  line = _one_error_line(*_cli(capsys, "compare", bad, runs["drop"], f"--out={tmp_path / 'o'}",
                               "--pair", "vit:msp", "vit-dropped:msp", "--n_bootstrap=10"))
  assert path in line and says in line


def _npz_bytes(**arrays):
  buf = io.BytesIO()
  np.savez(buf, **arrays)
  return buf.getvalue()


def _npy_bytes(array):
  buf = io.BytesIO()
  np.save(buf, array)
  return buf.getvalue()


def _scores_damages(good: bytes):
  n = feature_runs.N_TEST
  crc = bytearray(good)
  crc[len(crc) // 3] ^= 0xFF
  return {
      "truncated": (good[:len(good) // 2], "not a readable scores file"),
      "empty": (b"", "not a readable scores file"),
      "crc": (bytes(crc), "not a readable scores file"),
      "text": (b"id,msp\n0,0.5\n" * 5, "not a scores file (neither an .npz archive nor"),
      "npy": (_npy_bytes(np.arange(n)), "a single .npy array, not an .npz archive"),
      "lengths": (_npz_bytes(id=np.arange(n), msp=np.ones(n - 1), energy=np.ones(n),
                             knn=np.ones(n)), "does not match the"),
      "no ids": (_npz_bytes(msp=np.ones(n)), "no 1-D integer `id` array"),
      "float ids": (_npz_bytes(id=np.arange(n) + 0.5, msp=np.ones(n)),
                    "no 1-D integer `id` array"),
  }


@pytest.mark.parametrize("kind", ["truncated", "empty", "crc", "text", "npy", "lengths",
                                  "no ids", "float ids"])
def test_a_damaged_scores_file_is_one_error_naming_it(runs, tmp_path, capsys, kind):
  bad = feature_runs.copy_workdir(runs["a"], str(tmp_path / "bad"))
  path = os.path.join(report.report_folder(bad), "scores", "id_test.npz")
  with open(path, "rb") as f:
    good = f.read()
  content, says = _scores_damages(good)[kind]
  os.remove(path)
  with open(path, "wb") as f:
    f.write(content)
  line = _one_error_line(*_cli(capsys, "compare", bad, runs["drop"], f"--out={tmp_path / 'o'}",
                               "--pair", "vit:msp", "vit-dropped:msp", "--n_bootstrap=10"))
  assert path in line and says in line


def test_a_pickle_in_a_scores_file_is_not_loaded(runs, tmp_path, capsys):
  bad = feature_runs.copy_workdir(runs["a"], str(tmp_path / "bad"))
  path = os.path.join(report.report_folder(bad), "scores", "id_test.npz")
  os.remove(path)   # an object array: numpy would load it only with allow_pickle
  np.savez(path, id=np.arange(3), msp=np.array([1, "x", None], dtype=object))
  line = _one_error_line(*_cli(capsys, "compare", bad, runs["drop"], f"--out={tmp_path / 'o'}",
                               "--pair", "vit:msp", "vit-dropped:msp", "--n_bootstrap=10"))
  assert path in line and "not a scores file (an array of Python objects" in line
  assert "allow_pickle" not in line


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_a_nonfinite_score_in_a_pair_is_an_error_naming_file_and_detector(runs, tmp_path,
                                                                          capsys, value):
  bad = feature_runs.copy_workdir(runs["a"], str(tmp_path / "bad"))
  path = os.path.join(report.report_folder(bad), "scores", "ood", "far.npz")
  with np.load(path) as z:
    arrays = {k: z[k] for k in z.files}
  arrays["energy"][5] = value
  os.remove(path)
  np.savez(path, **arrays)
  line = _one_error_line(*_cli(capsys, "compare", bad, runs["drop"], f"--out={tmp_path / 'o'}",
                               "--pair", "vit:energy", "vit-dropped:energy", "--n_bootstrap=10"))
  assert path in line and "detector 'energy' has 1 non-finite score(s)" in line


@pytest.mark.parametrize("args, says", [
    (["--n_bootstrap", "-5"], "argument --n_bootstrap: must be an integer >= 1, got '-5'"),
    (["--n_bootstrap=0"], "argument --n_bootstrap: must be an integer >= 1, got '0'"),
    (["--n_bootstrap=many"], "argument --n_bootstrap: must be an integer >= 1"),
    (["--seed=-1"], "argument --seed: must be an integer >= 0, got '-1'"),
    (["--out={file}"], "argument --out: '{file}' is a file"),
    (["--out={file}/sub"], "argument --out: '{file}/sub' is under the file {file}"),
])
def test_bad_arguments_are_one_line_exit_2(runs, tmp_path, capsys, args, says):
  file = tmp_path / "compare.md"
  file.write_text("mine")
  args = [a.format(file=file) for a in args]
  line = _one_error_line(*_cli(capsys, "compare", runs["a"], *args))
  assert line.startswith("python -m fi_jax.report compare: error: ")
  assert says.format(file=file) in line
  assert file.read_text() == "mine"


def test_help_documents_every_option(capsys):
  with pytest.raises(SystemExit) as e:
    report_cli.main(["compare", "--help"])
  assert e.value.code == 0
  text = " ".join(capsys.readouterr().out.split())
  for option in ("--n_bootstrap N", "--seed S", "--out DIR", "--pair RUN:DET RUN:DET"):
    assert option in text
  assert "resamples of the paired bootstrap" in text and "seed of the paired bootstrap" in text
  assert "LABEL@WORKDIR:DETECTOR" in text


def test_a_workdir_whose_last_run_stopped_before_its_results_is_named(runs, tmp_path, capsys):
  stopped = feature_runs.copy_workdir(runs["a"], str(tmp_path / "stopped"))
  folder = report.report_folder(stopped)
  for name in ("results.json", "results.csv", "results.md"):
    os.remove(os.path.join(folder, name))
  with open(os.path.join(folder, report.INCOMPLETE), "w") as f:
    json.dump({"run_id": "abc", "error": "MemoryError: bootstrap"}, f)
  line = _one_error_line(*_cli(capsys, "compare", runs["b"], stopped, f"--out={tmp_path / 'o'}"))
  assert (f"{stopped}: its last run (run id abc) stopped before writing results.json "
          "(MemoryError: bootstrap)") in line


def test_a_missing_workdir_is_one_line(tmp_path, capsys):
  line = _one_error_line(*_cli(capsys, "compare", str(tmp_path / "nope"),
                               f"--out={tmp_path / 'o'}"))
  assert f"{tmp_path / 'nope'} has no results.json" in line
