"""The command line's first hour: --help and the name checks answer before JAX is imported,
with one `main.py: error: ...` line, exit 2 and a "did you mean" (issue 33)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = sorted(f for f in os.listdir(os.path.join(ROOT, "configs"))
                 if f.endswith(".py") and f not in ("__init__.py", "common.py", "sweep.py"))

# Runs cli.main() with the given argv and reports, after its exit, whether JAX was imported.
_PROBE = """
import sys
sys.argv = sys.argv[1:]
from fi_jax.run import cli
try:
  cli.main()
except SystemExit as e:
  print("EXIT", e.code, "jax" in sys.modules, flush=True)
"""


def _cli(*args, prog="main.py", cwd=ROOT):
  """(exit code, stdout without the probe's line, stderr, JAX imported) of `prog *args`."""
  env = {**os.environ, "PYTHONPATH": ROOT}
  res = subprocess.run([sys.executable, "-c", _PROBE, prog, *args], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=120)
  lines = res.stdout.splitlines()
  assert lines and lines[-1].startswith("EXIT "), (res.stdout[-2000:], res.stderr[-3000:])
  _, code, jax_imported = lines[-1].split()
  return int(code), "\n".join(lines[:-1]), res.stderr, jax_imported == "True"


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_configs_overrides_and_docs_without_jax(flag, tmp_path):
  code, out, err, jax_imported = _cli(flag, prog="fi-jax", cwd=tmp_path)   # outside the repo
  assert code == 0 and not jax_imported and not err
  assert out.startswith("usage: fi-jax ")
  for name in CONFIGS:
    assert f"configs/{name}" in out
  for text in ("quick=False", "name='resnet50'", "fit_per_class=0", "--config.batch_size",
               "--config.detectors", "--config.metrics.n_bootstrap", "--workdir", "energy",
               "docs/usage.md", "README.md", "python -m tfds_fi_imagenet --help"):
    assert text in out, text


def test_main_py_help_exits_0():
  res = subprocess.run([sys.executable, os.path.join(ROOT, "main.py"), "--help"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
  assert res.returncode == 0 and "Unknown command line flag" not in res.stderr
  assert res.stdout.startswith("usage: main.py ")


def test_builders_cli_has_help():
  res = subprocess.run([sys.executable, "-m", "tfds_fi_imagenet", "--help"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
  assert res.returncode == 0 and "build" in res.stdout and "list" in res.stdout


@pytest.mark.parametrize("args, line", [
    (["--config=configs/torchvison.py"],
     "main.py: error: --config=configs/torchvison.py: no such file 'configs/torchvison.py'; "
     "did you mean configs/torchvision.py? (see main.py --help)"),
    (["--config=configs/vit.py", "--config.n_bootstrap=100"],
     "main.py: error: unknown config field --config.n_bootstrap (did you mean "
     "--config.metrics.n_bootstrap?); overrides can only set fields the config file defines"),
    (["--config=configs/vit.py", "--config.detectors=('msp','energie')"],
     "main.py: error: --config.detectors: unknown detector 'energie'; did you mean 'energy'?"),
    (["--config=configs/torchvision.py", "--config.detectors=energie"],
     "main.py: error: --config.detectors: unknown detector 'energie'; did you mean 'energy'?"),
    (["--config=configs/torchvision.py", "--config.n_bootstrap=100"],   # the zoo needs JAX
     "main.py: error: unknown config field --config.n_bootstrap (did you mean "
     "--config.metrics.n_bootstrap?); overrides can only set fields the config file defines"),
    (["--config.metrics.n_bootstrp=3"],
     "main.py: error: unknown config field --config.metrics.n_bootstrp (did you mean "
     "--config.metrics.n_bootstrap?); overrides can only set fields the config file defines"),
])
def test_misspelled_names_one_line_exit_2_before_jax(args, line, tmp_path):
  code, out, err, jax_imported = _cli(*args, f"--workdir={tmp_path}/w")
  assert code == 2 and not jax_imported
  assert err.strip().splitlines() == [line]
  assert not os.path.exists(tmp_path / "w")


def test_a_bad_value_after_jax_leaves_no_workdir(tmp_path):
  # the hyper-parameter checks need the detectors (JAX); the workdir they test is removed
  code, _, err, _ = _cli("--config=configs/demo.py:quick",
                         "--config.detector_hparams={'msp': {'k': 3}}",
                         f"--workdir={tmp_path}/a/b")
  assert code == 2 and "hyper-parameter" in err
  assert not os.path.exists(tmp_path / "a")


def test_helpfull_adds_every_flag_of_the_config_without_jax():
  code, out, err, jax_imported = _cli("--config=configs/vit.py", "--helpfull")
  assert code == 0 and not jax_imported
  assert out.startswith("usage: main.py ") and "\nEvery flag:\n" in out
  assert "--workdir: Where results" in out and "n_bootstrap: 0" in out


@pytest.mark.parametrize("name", CONFIGS)
def test_a_bundled_config_defines_only_fields_its_source_assigns(name):
  # what lets an override of another field fail before the config (and so JAX) loads
  import importlib

  from fi_jax.run import cli
  config = importlib.import_module(f"configs.{name[:-3]}").get_config()
  assert set(config.keys()) <= cli.assigned_fields(os.path.join(ROOT, "configs", name))
