"""The repository's structure: no import cycles, models independent of detectors, and no
pointer to files outside the repository (users only have what is in it)."""
from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("fi_jax", "tfds_fi_imagenet", "configs")


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


def _imports(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
  """Project modules that module `name` imports (at any depth of its body)."""
  is_pkg = path.name == "__init__.py"
  out = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
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


def _graph() -> dict[str, set[str]]:
  mods = {}
  for p in PACKAGES:
    mods.update(_modules(p))
  known = set(mods)
  return {m: _imports(m, f, known) for m, f in mods.items()}


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


def test_models_do_not_import_detectors():
  graph = _graph()
  bad = {m: sorted(n for n in deps if n.startswith("fi_jax.detectors"))
         for m, deps in graph.items() if m.startswith("fi_jax.models")}
  assert not {m: d for m, d in bad.items() if d}


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
