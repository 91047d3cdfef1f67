"""fi_jax.run.huge_pages: the process restarts once with glibc's malloc on transparent huge pages."""
import os
import subprocess
import sys

import pytest

from fi_jax.run import cli, huge_pages

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LINUX = dict(platform="linux", glibc=(2, 36), thp="madvise")


def test_adds_the_tunable_on_a_glibc_host_in_madvise_mode():
  assert huge_pages.tunables_with_huge_pages({}, **LINUX) == "glibc.malloc.hugetlb=1"
  env = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
  assert (huge_pages.tunables_with_huge_pages(env, **LINUX)
          == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1")


@pytest.mark.parametrize("env, host", [
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, {}),          # the user's own value
    ({"GLIBC_TUNABLES": "a.b=1:glibc.malloc.hugetlb=2"}, {}),
    ({"FI_JAX_HUGE_PAGES": "0"}, {}),                           # the opt-out
    ({"FI_JAX_HUGE_PAGES_REEXEC": "1"}, {}),                    # already restarted once
    ({}, {"thp": "always"}), ({}, {"thp": "never"}), ({}, {"thp": None}),
    ({}, {"glibc": (2, 34)}), ({}, {"glibc": None}), ({}, {"platform": "darwin"}),
])
def test_leaves_the_process_alone(env, host):
  assert huge_pages.tunables_with_huge_pages(env, **{**LINUX, **host}) is None


def test_reads_the_kernels_mode(tmp_path):
  path = tmp_path / "enabled"
  path.write_text("always [madvise] never\n")
  assert huge_pages.thp_mode(str(path)) == "madvise"
  path.write_text("[always] madvise never\n")
  assert huge_pages.thp_mode(str(path)) == "always"
  assert huge_pages.thp_mode(str(tmp_path / "missing")) is None


def test_the_entry_point_restarts_before_it_runs(monkeypatch):
  calls = []
  monkeypatch.setattr(huge_pages, "reexec", lambda: calls.append("reexec"))
  monkeypatch.setattr(cli, "main", lambda: calls.append("main"))
  cli.entry()
  assert calls == ["reexec", "main"]


# Prints its pid to stderr, restarts, then allocates 64 MiB and prints what the kernel backs
# with huge pages in this process (kB) and the tunables it runs with.
_PROBE = """
import os, sys
print(os.getpid(), file=sys.stderr, flush=True)
from fi_jax.run import huge_pages
huge_pages.reexec()
import numpy as np
a = np.ones(64 << 17)                                   # 64 MiB, touched
with open("/proc/self/smaps_rollup") as f:
  kb = [int(l.split()[1]) for l in f if l.startswith("AnonHugePages:")][0]
print(kb, os.environ.get("GLIBC_TUNABLES") or "-")
"""


def _probe(**env):
  run = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "PYTHONPATH": ROOT, **env})
  assert run.returncode == 0, run.stderr[-2000:]
  kb, tunables = run.stdout.split()
  return int(kb), tunables, run.stderr.split()


def test_the_restarted_process_gets_huge_pages():
  if huge_pages.on_this_host({}) is None or not os.path.exists("/proc/self/smaps_rollup"):
    pytest.skip("not a glibc >= 2.35 Linux host with transparent huge pages in madvise mode")
  clean = {"FI_JAX_HUGE_PAGES": "1", "GLIBC_TUNABLES": "", "FI_JAX_HUGE_PAGES_REEXEC": ""}
  kb, tunables, pids = _probe(**clean)
  assert tunables == "glibc.malloc.hugetlb=1"
  assert len(pids) == 2 and pids[0] == pids[1]           # started twice, as the same process
  assert kb >= 32 << 10                                   # most of the 64 MiB on 2 MiB pages
  kb_off, tunables_off, pids_off = _probe(**{**clean, "FI_JAX_HUGE_PAGES": "0"})
  assert tunables_off == "-" and len(pids_off) == 1 and kb_off < kb


def test_a_failed_restart_goes_on_as_is(monkeypatch):
  monkeypatch.setattr(huge_pages, "tunables_with_huge_pages", lambda *a, **k: "x=1")
  monkeypatch.setattr(huge_pages.sys, "orig_argv", ["python", "main.py"])
  monkeypatch.setattr(huge_pages.sys, "executable", "/nonexistent/python")
  assert huge_pages.reexec() is None      # no OSError: the exec found no interpreter, it goes on
