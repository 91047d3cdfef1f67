"""fi_jax.run.xla_flags: XLA's quick-compiling CPU pipeline, for CPU-only processes."""
import os
import subprocess
import sys

import pytest

from fi_jax.run import xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAST = "--xla_cpu_use_fusion_emitters=false --xla_backend_optimization_level=1"


def _fast(environ, **kw):
  kw = {"platforms": "", "plugins": [], "started": False, **kw}
  return xla_flags.fast_cpu_compile(environ, **kw)


def test_adds_both_flags_on_a_cpu_only_process():
  env = {}
  assert _fast(env) == FAST.split()
  assert env == {"XLA_FLAGS": FAST}


def test_keeps_the_users_flags_and_their_values():
  env = {"XLA_FLAGS": "--xla_backend_optimization_level=3 --xla_dump_to=/tmp/d"}
  assert _fast(env) == ["--xla_cpu_use_fusion_emitters=false"]
  assert env["XLA_FLAGS"] == ("--xla_backend_optimization_level=3 --xla_dump_to=/tmp/d "
                              "--xla_cpu_use_fusion_emitters=false")
  env = {"XLA_FLAGS": FAST}
  assert _fast(env) == [] and env == {"XLA_FLAGS": FAST}   # a second call adds nothing


def test_leaves_accelerator_processes_and_started_backends_alone():
  for kw in ({"plugins": ["xla_cuda12"]}, {"platforms": "cuda,cpu"}, {"platforms": "tpu"},
             {"started": True}):
    env = {"XLA_FLAGS": "--xla_dump_to=/tmp/d"}
    assert _fast(env, **kw) == [], kw
    assert env == {"XLA_FLAGS": "--xla_dump_to=/tmp/d"}
  # JAX_PLATFORMS=cpu: CPU only, whatever is installed
  env = {}
  assert _fast(env, platforms="cpu", plugins=["xla_cuda12", "libtpu"]) == FAST.split()


def test_cpu_only_reads_the_platforms_setting():
  assert xla_flags.cpu_only("cpu", ["xla_cuda12"])
  assert xla_flags.cpu_only(" cpu ,cpu", ["xla_cuda12"])
  assert not xla_flags.cpu_only("cuda", [])
  assert xla_flags.cpu_only("", []) and not xla_flags.cpu_only("", ["libtpu"])


def _child(code: str, env_flags=None) -> list[str]:
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  if env_flags is not None:
    env["XLA_FLAGS"] = env_flags
  res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)
  assert res.returncode == 0, res.stderr[-2000:]
  return res.stdout.split()


# what XLA itself will compile with: the DebugOptions it parsed from XLA_FLAGS
_LEVEL = ("from jax._src.lib import xla_client as xc; "
          "print(xc.CompileOptions().executable_build_options.debug_options"
          ".xla_backend_optimization_level)")


@pytest.mark.slow
def test_xla_compiles_with_the_flags_only_when_set_before_the_backend_starts():
  if xla_flags.accelerator_plugins():
    pytest.skip("an accelerator plugin is installed: the process is not CPU-only")
  before = _child("from fi_jax.run import xla_flags; print(len(xla_flags.fast_cpu_compile())); "
                  + _LEVEL)
  assert before == ["2", "1"]
  after = _child("import jax; jax.devices(); from fi_jax.run import xla_flags; "
                 "print(len(xla_flags.fast_cpu_compile())); " + _LEVEL)
  assert after == ["0", "3"]        # XLA read XLA_FLAGS when the backend started: too late
  assert _child("from fi_jax.run import xla_flags; print(len(xla_flags.fast_cpu_compile())); "
                + _LEVEL, env_flags="--xla_backend_optimization_level=2") == ["1", "2"]


@pytest.mark.slow
def test_the_cli_turns_it_on_and_the_config_off():
  if xla_flags.accelerator_plugins():
    pytest.skip("an accelerator plugin is installed: the process is not CPU-only")
  code = ("import sys; from absl import flags; from fi_jax.run import cli; from fi_jax.run import benchmark as run; "
          "run.run = lambda config, workdir, **kw: print(run.os.environ.get('XLA_FLAGS', '-')); "
          "sys.argv = ['main.py', '--config=configs/demo.py:quick', '--workdir=/tmp/x'] + "
          "sys.argv[1:]; cli.main()")
  assert " ".join(_child(code)) == FAST
  off = code.replace("sys.argv[1:]", "['--config.cpu_fast_compile=False']")
  assert _child(off) == ["-"]


@pytest.mark.slow
def test_the_model_forward_keeps_xlas_defaults_for_the_flags_added():
  """The quick flags are for the many small programs; the flags fast_cpu_compile added are
  restored to XLA's defaults for the model's forward step (fi_jax.common.compile_options), a
  flag the user set is left as the user set it."""
  if xla_flags.accelerator_plugins():
    pytest.skip("an accelerator plugin is installed: the process is not CPU-only")
  code = ("import json; from fi_jax.run import xla_flags; xla_flags.fast_cpu_compile(); "
          "from fi_jax.common import compile_options; "
          "print(json.dumps(compile_options.model_step(), sort_keys=True, separators=(',', ':')))")
  ynn = '"xla_cpu_experimental_ynn_fusion_type":"","xla_cpu_prefer_vector_width":512'
  passes = ',"xla_disable_hlo_passes":"tree_reduction_rewriter"'
  assert _child(code) == [
      '{"xla_backend_optimization_level":3,' + ynn + ',"xla_cpu_use_fusion_emitters":true'
      + passes + '}']
  assert _child(code, env_flags="--xla_backend_optimization_level=2") == [
      '{' + ynn + ',"xla_cpu_use_fusion_emitters":true' + passes + '}']
  # a pass the user disabled stays disabled in the forward step
  assert _child(code, env_flags="--xla_disable_hlo_passes=foo,bar")[0].endswith(
      '"xla_disable_hlo_passes":"foo,bar,tree_reduction_rewriter"}')


def test_forward_compiles_its_step_with_the_model_step_options(monkeypatch):
  from fi_jax.common import compile_options, distributed
  from fi_jax.extract import forward
  seen = []
  real_jit = forward.jax.jit
  monkeypatch.setattr(forward.jax, "jit", lambda f, **kw: seen.append(kw) or real_jit(f, **kw))
  monkeypatch.setattr(compile_options, "_MODEL_STEP", {"xla_backend_optimization_level": 3})
  forward.Forward(lambda p, x: (x, x), distributed.data_mesh())
  assert seen[-1]["compiler_options"] == {"xla_backend_optimization_level": 3,
                                          **compile_options.CPU_FORWARD}
  monkeypatch.setattr(compile_options, "_MODEL_STEP", None)
  monkeypatch.setattr(compile_options, "CPU_FORWARD", {})
  forward.Forward(lambda p, x: (x, x), distributed.data_mesh())
  assert seen[-1]["compiler_options"] is None
