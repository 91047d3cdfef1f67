"""The repository's structure (docs/architecture.md): the stages' packages in pipeline order,
each importing only from its own stage or earlier ones; no import cycles; no probing of
detector attributes with getattr outside the detectors' package (the `Detector` contract
declares them); a docstring on every package; and no pointer to files outside the repository
(users only have what is in it)."""
from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys
from typing import Mapping, Optional

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("fi_jax", "tfds_fi_imagenet", "configs")

# The stages in pipeline order. A module belongs to the longest prefix listed; it may import
# from its own stage and from earlier ones, never from a later one.
STAGES = (
    "fi_jax",             # the top-level package (its docstring only)
    "tfds_fi_imagenet",   # the TFDS builders (no fi_jax import at all)
    "fi_jax.common",      # mesh, progress bars, Outputs/Head, column names
    "fi_jax.data",        # set specs, input pipeline, preprocessing, class names
    "fi_jax.models",      # model families, key maps, checkpoints, text towers
    "fi_jax.extract",     # the sharded forward, layer columns, feature cache, own features
    "fi_jax.detectors",   # the detector contract, numerics, checks and families
    "fi_jax.metrics",     # in-device metrics, the numpy reference, paired bootstrap
    "fi_jax.report",      # results schema, files, plots, compare, leaderboard
    "fi_jax.pipeline",    # the core: sets -> extract -> detectors -> metric rows
    "fi_jax.evaluators",  # front end 1: big_vision's evaluator API
    "configs",            # the bundled ml_collections configs
    "fi_jax.run",         # front end 2: the CLI, the benchmark run, sweeps
)


def _modules(package: str) -> dict[str, pathlib.Path]:
  """{dotted module name: file} for every module of `package` (dummy-data scripts excluded)."""
  out = {}
  for path in sorted((ROOT / package).rglob("*.py")):
    rel = path.relative_to(ROOT).with_suffix("")
    if "dummy_data" in rel.parts or rel.name.endswith("_test"):
      continue
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    out[".".join(parts)] = path
  return out


def _imports(name: str, path: pathlib.Path, known: set[str], source: Optional[str] = None,
             ) -> set[str]:
  """Project modules that module `name` imports (at any depth of its body)."""
  is_pkg = path.name == "__init__.py"
  out = set()
  text = path.read_text() if source is None else source
  for node in ast.walk(ast.parse(text, str(path))):
    if isinstance(node, ast.Import):
      targets = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:   # relative import
        pkg = name.split(".") if is_pkg else name.split(".")[:-1]
        pkg = pkg[:len(pkg) - node.level + 1]
        base = ".".join(pkg + ([base] if base else []))
      # `from pkg import sub` imports the submodule; `from mod import name` the module
      targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    else:
      continue
    for t in targets:
      while t and t not in known:   # `import a.b.c` of a non-module attribute -> its module
        t = t.rpartition(".")[0]
      if t and t != name:
        out.add(t)
  return out


def _graph(sources: Optional[Mapping[str, str]] = None) -> dict[str, set[str]]:
  """{module: project modules it imports}; `sources` replaces modules' text (mutation tests)."""
  mods = {}
  for p in PACKAGES:
    mods.update(_modules(p))
  known = set(mods)
  sources = dict(sources or {})
  return {m: _imports(m, f, known, sources.get(m)) for m, f in mods.items()}


def stage_of(module: str) -> int:
  """Index in STAGES of the longest stage prefix of `module` (ValueError if none)."""
  best = None
  for i, s in enumerate(STAGES):
    if module == s or module.startswith(s + "."):
      if best is None or len(s) > len(STAGES[best]):
        best = i
  if best is None:
    raise ValueError(f"module {module} belongs to no stage of tests/test_layout.py STAGES")
  return best


def upward_imports(graph: Mapping[str, set[str]]) -> list[str]:
  """'a -> b' for every import of a module from a later stage than the importer's."""
  return sorted(f"{m} ({STAGES[stage_of(m)]}) -> {n} ({STAGES[stage_of(n)]})"
                for m, deps in graph.items() for n in deps if stage_of(n) > stage_of(m))


def test_every_module_has_a_stage():
  for m in _graph():
    stage_of(m)


def test_stages_import_only_their_own_or_earlier_stages():
  bad = upward_imports(_graph())
  assert not bad, "imports from a later stage:\n" + "\n".join(bad)


@pytest.mark.parametrize("module, added", [
    ("fi_jax.data.loader", "from fi_jax.run import benchmark"),
    ("fi_jax.detectors.core", "from fi_jax import report"),
    ("fi_jax.models.vit", "import fi_jax.extract.cache"),
    ("fi_jax.common.outputs", "from fi_jax.detectors import core"),
    ("fi_jax.extract.forward", "  from fi_jax.pipeline import set_columns"),
])
def test_an_added_upward_import_is_caught(module, added):
  """Mutation check of the rule above: one upward import added to a real module fails it."""
  path = _modules(module.split(".")[0])[module]
  text = path.read_text()
  if added.startswith(" "):   # inside a function: imports at any depth count
    text += "\n\ndef _mutant():\n" + added + "\n"
  else:
    text += "\n" + added + "\n"
  bad = upward_imports(_graph({module: text}))
  assert any(b.startswith(module + " ") for b in bad), bad


def test_no_import_cycle():
  graph = _graph()
  state: dict[str, int] = {}   # 1 = on the stack, 2 = done
  cycles = []

  def visit(m, stack):
    state[m] = 1
    for n in sorted(graph[m]):
      if state.get(n) == 1:
        cycles.append(stack[stack.index(n):] + [n])
      elif n not in state:
        visit(n, stack + [n])
    state[m] = 2

  for m in sorted(graph):
    if m not in state:
      visit(m, [m])
  assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def _detector_attributes() -> set[str]:
  """The attributes the `Detector` contract declares (class-level names and methods)."""
  from fi_jax.detectors import core
  return {n for n in vars(core.Detector) if not n.startswith("__")}


def getattr_probes(sources: Optional[Mapping[str, str]] = None) -> list[str]:
  """`file:line getattr(x, "<attr>")` outside fi_jax/detectors/ for every attribute the
  Detector contract declares (those are read directly: the contract gives them defaults)."""
  attrs = _detector_attributes()
  sources = dict(sources or {})
  bad = []
  for p in PACKAGES:
    for m, path in _modules(p).items():
      if m == "fi_jax.detectors" or m.startswith("fi_jax.detectors."):
        continue
      text = sources.get(m, path.read_text())
      for node in ast.walk(ast.parse(text)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant) and node.args[1].value in attrs):
          bad.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.func.id}(..., "
                     f"{node.args[1].value!r})")
  return bad


def test_no_getattr_on_detectors_outside_their_package():
  bad = getattr_probes()
  assert not bad, "read these through the Detector contract:\n" + "\n".join(bad)


def test_a_getattr_probe_is_caught():
  text = (ROOT / "fi_jax/pipeline.py").read_text()
  text += "\n\ndef _mutant(det):\n  return getattr(det, 'fit_inputs', False)\n"
  assert any("fit_inputs" in b for b in getattr_probes({"fi_jax.pipeline": text}))


def test_every_package_has_its_docstring():
  missing = []
  for p in PACKAGES:
    for init in sorted((ROOT / p).rglob("__init__.py")):
      if "dummy_data" in init.parts:
        continue
      doc = ast.get_docstring(ast.parse(init.read_text())) or ""
      # one line that only names the package says nothing
      if len(doc.split()) < 8:
        missing.append(str(init.relative_to(ROOT)))
  assert not missing, "packages without a docstring saying what they own: " + ", ".join(missing)


def test_stage_packages_say_what_they_may_import():
  missing = []
  for stage in STAGES:
    init = ROOT / stage.replace(".", "/") / "__init__.py"
    if not init.exists() or stage in ("fi_jax", "tfds_fi_imagenet", "configs"):
      continue
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    if "may import" not in doc.lower():
      missing.append(stage)
  assert not missing, "stage packages whose docstring does not say what they may import: " + \
      ", ".join(missing)


def test_every_module_imports_in_a_fresh_interpreter():
  names = sorted(m for p in ("fi_jax", "tfds_fi_imagenet") for m in _modules(p))
  code = "import importlib, sys\nfor n in sys.argv[1:]:\n  importlib.import_module(n)\n"
  r = subprocess.run([sys.executable, "-c", code, *names], cwd=ROOT, capture_output=True,
                     text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
  assert r.returncode == 0, r.stderr[-3000:]


def test_nothing_points_outside_the_repository():
  suffixes = {".py", ".md", ".txt", ".toml", ".cfg", ".ini", ".sh", ".bib"}
  tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
  files = tracked.stdout.split() if tracked.returncode == 0 else [
      str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if ".venv" not in p.parts]
  bad = []
  # built from parts so that this file does not match itself
  needles = ("../" + "shared", "shared/" + "specs", "/" + "work/")
  for rel in files:
    path = ROOT / rel
    if path.suffix not in suffixes or not path.is_file():
      continue
    for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
      if any(s in line for s in needles):
        bad.append(f"{rel}:{i}: {line.strip()}")
  assert not bad, "\n".join(bad)
