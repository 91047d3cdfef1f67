"""Faults become named outcomes: damaged cache entries, concurrent cache writers, killed runs,
unreadable checkpoints, non-finite model outputs and bad config values (issue 13)."""
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from configs import demo
from fi_jax import pipeline, report
from fi_jax.data import loader as data
from fi_jax.extract import cache
from fi_jax.models import vit
from fi_jax.models._checkpoints import CheckpointError
from fi_jax.models.convert import readers
from fi_jax.run import benchmark as run
from fi_jax.run import model as run_model
from fi_jax.run import validate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _python(code: str, *args, timeout=600):
  env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": ROOT}
  return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=timeout)


def _main(*args, timeout=600):
  env = {**os.environ, "PYTHONUNBUFFERED": "1"}
  return subprocess.run([sys.executable, os.path.join(ROOT, "main.py"), *args], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=timeout)


# ----------------------------------------------------------------------------- cache entries

def _entry(tmp_path):
  path = str(tmp_path / "entry")
  arrays = {"features": np.arange(600, dtype=np.float32).reshape(60, 10),
            "logits": np.linspace(-1, 1, 120).reshape(60, 2), "score/odin": np.ones(60)}
  cache.save(path, arrays, {"set": "id_test"})
  files = json.load(open(os.path.join(path, "meta.json")))["files"]
  return path, arrays, {k: os.path.join(path, e["file"]) for k, e in files.items()}


def test_cache_round_trip(tmp_path):
  path, arrays, _ = _entry(tmp_path)
  got = cache.load(path, log=pytest.fail)
  assert sorted(got) == sorted(arrays)
  for k, v in arrays.items():
    assert got[k].dtype == v.dtype and np.array_equal(got[k], v)


def _flip_last_byte(file):
  with open(file, "r+b") as f:
    f.seek(-1, os.SEEK_END)
    b = f.read(1)
    f.seek(-1, os.SEEK_END)
    f.write(bytes([b[0] ^ 0x01]))   # a plausible value: the float changes in its last bit


def _truncate(file):
  with open(file, "r+b") as f:
    f.truncate(os.path.getsize(file) // 2)


@pytest.mark.parametrize("damage, reason", [
    (_flip_last_byte, "checksum mismatch"), (_truncate, "unreadable"),
    (os.remove, "missing")])
def test_damaged_array_is_reported_and_absent(tmp_path, damage, reason):
  path, _, files = _entry(tmp_path)
  damage(files["features"])
  logs = []
  assert cache.load(path, log=logs.append) is None
  assert len(logs) == 1 and os.path.basename(files["features"]) in logs[0] and reason in logs[0]


@pytest.mark.parametrize("damage", [_truncate, os.remove])
def test_damaged_manifest_is_reported_and_absent(tmp_path, damage):
  path, _, files = _entry(tmp_path)
  for f in files.values():   # an old entry (younger arrays could be a write in progress)
    os.utime(f, (time.time() - 3600,) * 2)
  damage(os.path.join(path, "meta.json"))
  logs = []
  assert cache.load(path, log=logs.append) is None
  assert len(logs) == 1 and path in logs[0] and "meta.json" in logs[0]


def test_rewrite_replaces_the_entry_and_collects_old_files(tmp_path, monkeypatch):
  path, _, old = _entry(tmp_path)
  monkeypatch.setattr(cache, "_GRACE_S", -1)   # old files are collected at once
  cache.save(path, {"x": np.zeros(3)})
  assert list(cache.load(path, log=pytest.fail)) == ["x"]
  assert not any(os.path.exists(f) for f in old.values())


_WRITER = textwrap.dedent("""
  import sys
  import numpy as np
  from fi_jax.extract import cache
  path, w = sys.argv[1], int(sys.argv[2])
  for i in range(200):
    v = w * 1000 + i
    cache.save(path, {"features": np.full((64, 32), v, np.float32), "label": np.full(64, v),
                      "score/odin": np.full(64, v, np.float64)}, {"writer": w, "i": i})
""")

_READER = textwrap.dedent("""
  import json, os, sys
  import numpy as np
  from fi_jax.extract import cache
  path, stop = sys.argv[1], sys.argv[2]
  reads, absent, bad, logs = 0, 0, [], []
  while not os.path.exists(stop) or reads < 5:
    got = cache.load(path, log=logs.append)
    if got is None:
      absent += 1
      continue
    reads += 1
    ok = (sorted(got) == ["features", "label", "score/odin"] and got["features"].shape == (64, 32)
          and len({float(got[k].reshape(-1)[0]) for k in got}) == 1
          and all((got[k] == got[k].reshape(-1)[0]).all() for k in got))
    if not ok:
      bad.append({k: v.shape for k, v in got.items()})
  print(json.dumps(dict(reads=reads, absent=absent, bad=len(bad), logs=logs)))
""")


@pytest.mark.slow
def test_two_writers_and_a_reader(tmp_path):
  """Two processes write the same entry 200 times each while a third reads it: no exception,
  every read is one writer's complete entry, nothing is reported damaged."""
  path, stop = str(tmp_path / "entry"), str(tmp_path / "stop")
  env = {**os.environ, "PYTHONPATH": ROOT}
  popen = lambda code, *a: subprocess.Popen([sys.executable, "-c", code, *a], env=env,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                            text=True)
  reader = popen(_READER, path, stop)
  writers = [popen(_WRITER, path, str(w)) for w in (1, 2)]
  for w in writers:
    out, err = w.communicate(timeout=300)
    assert w.returncode == 0, err[-3000:]
  open(stop, "w").close()
  out, err = reader.communicate(timeout=300)
  assert reader.returncode == 0, err[-3000:]
  res = json.loads(out.strip().splitlines()[-1])
  assert res["reads"] >= 5 and res["bad"] == 0 and res["logs"] == [], res
  final = cache.load(path, log=pytest.fail)
  assert float(final["label"][0]) in (1199.0, 2199.0)


# ----------------------------------------------------------------------------- resumable input

def test_batches_skip_steps_resume_exactly(tmp_path):
  """Skipping k steps gives exactly the batches k.. of a full pass, on every process."""
  spec = dict(source="digits", split="test", classes=(0, 1, 2))
  pp = lambda ex: ex
  for count in (1, 2):
    for index in range(count):
      full, steps, _ = data.batches(spec, pp, 32, process_index=index, process_count=count)
      full = list(full)
      assert len(full) == steps > 3
      for skip in (1, 3, steps):
        rest, steps2, _ = data.batches(spec, pp, 32, process_index=index, process_count=count,
                                       skip_steps=skip)
        rest = list(rest)
        assert steps2 == steps and len(rest) == steps - skip
        for a, b in zip(full[skip:], rest):
          assert all(np.array_equal(a[k], b[k]) for k in a)


# ----------------------------------------------------------------------------- non-finite outputs

def test_nonfinite_outputs_error_names_set_count_and_ids():
  sets = {"id_fit": {"features": np.ones((5, 2)), "logits": np.ones((5, 3)),
                     "label": np.arange(5)},
          "ood/x": {"features": np.ones((6, 2)), "logits": np.ones((6, 3)),
                    "label": -np.ones(6, int)}}
  sets["ood/x"]["features"][[1, 4], 0] = np.nan
  sets["ood/x"]["logits"][2, 1] = np.inf
  with pytest.raises(ValueError, match=r"'ood/x'.* 3 of 6 examples .*\[1, 2, 4\]"):
    pipeline.drop_nonfinite(sets, "error")
  out, dropped = pipeline.drop_nonfinite(sets, "drop")
  assert dropped == {"ood/x": 3}
  assert np.array_equal(out["ood/x"]["label"], -np.ones(3, int))
  assert out["id_fit"] is sets["id_fit"]


def test_dropped_rows_leave_the_others_their_example_ids(tmp_path):
  """nonfinite=drop keeps each remaining row's index in its set (`_id`), and the scores file
  names the examples by it: ids 0, 3, 5 of 6, never 0, 1, 2."""
  sets = {"id_test": {"features": np.ones((4, 2)), "logits": np.ones((4, 3)),
                      "label": np.arange(4)},
          "ood/x": {"features": np.ones((6, 2)), "logits": np.ones((6, 3)),
                    "label": -np.ones(6, int)}}
  sets["ood/x"]["features"][[1, 4], 0] = np.nan
  sets["ood/x"]["logits"][2, 1] = np.inf
  out, _ = pipeline.drop_nonfinite(sets, "drop")
  np.testing.assert_array_equal(out["ood/x"]["_id"], [0, 3, 5])
  assert "_id" not in out["id_test"]
  scores = {"msp": {"id_test": np.arange(4.0), "ood/x": np.array([10.0, 13.0, 15.0])}}
  report.write_scores(str(tmp_path), scores, out, run_id="r1")
  z = report.load_scores(str(tmp_path), "ood/x")
  np.testing.assert_array_equal(z["id"], [0, 3, 5])
  np.testing.assert_array_equal(z["msp"], [10.0, 13.0, 15.0])
  np.testing.assert_array_equal(report.load_scores(str(tmp_path), "id_test")["id"], np.arange(4))
  # rows that already carry their ids (brought together from several processes) keep them
  again, _ = pipeline.drop_nonfinite(
      {"ood/x": {"features": np.array([[1.0], [np.nan]]), "logits": np.ones((2, 1)),
                 "_id": np.array([40, 41])}}, "drop")
  np.testing.assert_array_equal(again["ood/x"]["_id"], [40])


# ----------------------------------------------------------------------------- checkpoints

def _safetensors(path, header, body):
  h = json.dumps(header).encode()
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + body)


def _bad_files(d):
  np.savez(d / "good.npz", a=np.arange(1000.0).reshape(10, 100), b=np.ones(3))
  raw = (d / "good.npz").read_bytes()
  (d / "truncated.npz").write_bytes(raw[:len(raw) // 2])
  (d / "empty.npz").write_bytes(b"")
  crc = bytearray(raw)
  crc[200] ^= 0xFF   # inside member 'a'
  (d / "crc.npz").write_bytes(bytes(crc))
  f32 = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}
  _safetensors(d / "nodtype.safetensors", {"w": {"shape": [2, 2], "data_offsets": [0, 16]}},
               b"\0" * 16)
  _safetensors(d / "truncated.safetensors", {"w": f32}, b"\0" * 8)
  torch.save({"w": torch.ones(50, 50)}, d / "good.pt")
  raw = (d / "good.pt").read_bytes()
  (d / "truncated.pt").write_bytes(raw[:len(raw) // 2])
  (d / "empty.pt").write_bytes(b"")


@pytest.mark.parametrize("name, tensor", [
    ("truncated.npz", None), ("empty.npz", None), ("crc.npz", "a"),
    ("nodtype.safetensors", "w"), ("truncated.safetensors", "w"),
    ("truncated.pt", None), ("empty.pt", None)])
def test_unreadable_checkpoint_is_a_checkpoint_error(tmp_path, name, tensor):
  _bad_files(tmp_path)
  with pytest.raises(CheckpointError) as e:
    readers.read_state_dict(str(tmp_path / name))
  assert name in str(e.value)
  if tensor:
    assert f"tensor {tensor!r}" in str(e.value)


def _tiny_vit():
  cfg = dict(num_classes=3, patch_size=(2, 2), width=16, depth=1, mlp_dim=32, num_heads=2,
             pool_type="gap", posemb="learn")
  model = vit.Model(**cfg)
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 8, 8, 1)))["params"]
  return cfg, jax.tree.map(np.asarray, params)


def test_nan_head_kernel_is_a_checkpoint_error(tmp_path):
  cfg, params = _tiny_vit()
  file = str(tmp_path / "nan_head.npz")
  params["head"]["kernel"] = np.full_like(params["head"]["kernel"], np.nan)
  readers.save_npz(file, params)
  with pytest.raises(CheckpointError, match=r"nan_head\.npz.*'head/kernel'.* 48 non-finite"):
    vit.load(params, file, cfg)
  params["head"]["kernel"] = np.zeros_like(params["head"]["kernel"])
  readers.save_npz(file, params)
  vit.load(params, file, cfg)   # finite: loads


@pytest.mark.slow
def test_cli_bad_checkpoint_is_one_line(tmp_path):
  (tmp_path / "empty.npz").write_bytes(b"")
  res = _main("--config=configs/demo.py:quick", f"--config.model_init={tmp_path}/empty.npz",
              f"--workdir={tmp_path}/w")
  assert res.returncode == 2, res.stderr[-3000:]
  lines = res.stderr.strip().splitlines()
  assert lines[-1].startswith("main.py: error: ") and "empty.npz" in lines[-1]
  assert "Traceback" not in res.stderr


# ----------------------------------------------------------------------------- config values

def _quick(**overrides):
  c = demo.get_config("quick")
  c.train.steps = 20
  c.detectors = ("msp", "energy")
  for k, v in overrides.items():
    node = c
    *parents, leaf = k.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = v
  return c


@pytest.mark.parametrize("overrides, msg", [
    ({"train.steps": -5}, r"config.train.steps must be an integer >= 1, got -5"),
    ({"batch_size": 0}, r"config.batch_size must be an integer >= 1, got 0"),
    ({"cache_shard_size": 0}, r"config.cache_shard_size must be an integer >= 1"),
    ({"metrics.tpr": 1.5}, r"config.metrics.tpr must be a number in \(0.0, 1.0\), got 1.5"),
    ({"metrics.tpr": 0.0}, r"config.metrics.tpr"),
    ({"metrics.n_bootstrap": -1}, r"config.metrics.n_bootstrap must be an integer >= 0"),
    ({"train.lr": -1.0}, r"config.train.lr"),
    ({"nonfinite": "ignore"}, r"config.nonfinite must be one of \['error', 'drop'\]"),
    ({"detectors": ("msp", "nope")}, r"Unknown detector 'nope'"),
    ({"detector_hparams": {"msp": {"k": 3}}}, r"hyper-parameter"),
])
def test_bad_config_values_fail_before_any_work(tmp_path, overrides, msg):
  with pytest.raises(ValueError, match=msg):
    validate.validate_config(_quick(**overrides), str(tmp_path / "w"))
  assert not os.path.exists(tmp_path / "w")   # the workdir is checked last


def test_workdir_under_a_file(tmp_path):
  (tmp_path / "file").write_text("x")
  with pytest.raises(ValueError, match=r"--workdir=.*file/w.* cannot be created"):
    validate.validate_config(_quick(), str(tmp_path / "file" / "w"))
  validate.validate_config(_quick(), str(tmp_path / "ok"))
  assert os.path.isdir(tmp_path / "ok")


@pytest.mark.parametrize("args, msg", [
    (["--config.train.steps=-5"], "config.train.steps must be an integer >= 1, got -5"),
    (["--config.metrics.tpr=1.5"], "config.metrics.tpr must be a number in (0.0, 1.0)"),
])
def test_cli_bad_values_one_line_exit_2_within_seconds(tmp_path, args, msg):
  t = time.time()
  res = _main("--config=configs/demo.py:quick", *args, f"--workdir={tmp_path}/w")
  assert res.returncode == 2 and time.time() - t < 60
  lines = res.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(f"main.py: error: {msg}"), res.stderr
  assert not os.path.exists(tmp_path / "w")


def test_cli_workdir_under_a_file(tmp_path):
  (tmp_path / "file").write_text("x")
  res = _main("--config=configs/demo.py:quick", f"--workdir={tmp_path}/file/w")
  assert res.returncode == 2 and "Traceback" not in res.stderr
  assert res.stderr.strip().splitlines() == [
      f"main.py: error: --workdir='{tmp_path}/file/w' cannot be created (Not a directory); "
      "choose a folder path whose parents are folders you can write to."]


# ----------------------------------------------------------------------------- whole runs

def _run(config, workdir):
  """(results.json as written, the run's log)."""
  logs = []
  run.run(config, str(workdir), log=logs.append)
  with open(os.path.join(workdir, "results.json")) as f:
    return json.load(f), "\n".join(logs)


def _arrays(workdir):
  """{relative entry path: arrays} of every cached set (and the head, params)."""
  out = {}
  root = os.path.join(workdir, "cache")
  for key in os.listdir(root):
    for entry in os.listdir(os.path.join(root, key)):
      out[f"{key}/{entry}"] = cache.load(os.path.join(root, key, entry), log=pytest.fail)
  return out


@pytest.mark.slow
def test_damaged_cache_is_recomputed_with_a_warning(tmp_path):
  """Flip a byte in, truncate and delete cached arrays (and the manifest): each run warns
  with the file's name, recomputes that set, and gives the clean run's rows."""
  workdir = tmp_path / "w"
  clean, log = _run(_quick(), workdir)
  assert "Training vit" in log
  entries = os.path.join(workdir, "cache", run_model.model_key(_quick()))
  by_set = {n.split("-")[0]: os.path.join(entries, n) for n in os.listdir(entries)}

  def file_of(set_name, key):
    files = json.load(open(os.path.join(by_set[set_name], "meta.json")))["files"]
    return os.path.join(by_set[set_name], files[key]["file"])

  for set_name, key, damage, reason in [
      ("id_test", "features", _flip_last_byte, "checksum mismatch"),
      ("id_fit", "logits", _truncate, "unreadable"),
      ("ood_digits_6", "features", os.remove, "missing"),
      ("head", "w", _flip_last_byte, "checksum mismatch")]:
    file = file_of(set_name, key)
    damage(file)
    results, log = _run(_quick(), workdir)
    warning = [line for line in log.splitlines() if os.path.basename(file) in line]
    assert warning and reason in warning[0], log
    assert "Training" not in log   # the trained parameters come from the cache
    assert results["rows"] == clean["rows"]
  _truncate(os.path.join(by_set["id_test"], "meta.json"))
  results, log = _run(_quick(), workdir)
  assert f"cache entry {by_set['id_test']}: unreadable meta.json" in log
  assert results["rows"] == clean["rows"]


def test_nonfinite_model_outputs_name_the_set(tmp_path):
  """A pp string that divides by zero gives NaN images, so NaN features: one error naming the
  set, the count and the first ids (the features stay cached: a rerun with nonfinite=drop
  needs no forward pass)."""
  config = _quick(pp="value_range(-1, 1, 0, 0)")
  config.train.steps = 2
  with pytest.raises(ValueError, match=r"set 'id_fit'.* for 758 of 758 examples .*\[0, 1, 2, "):
    _run(config, tmp_path)


_KILL_AT_SHARD = textwrap.dedent("""
  import os, signal, sys
  from fi_jax.extract import cache
  save = cache.save
  def kill_at(path, *a, **k):   # SIGKILL while shard 4 of id_fit is in flight
    if "id_fit" in path and path.endswith("shard-00003"):
      os.kill(os.getpid(), signal.SIGKILL)
    return save(path, *a, **k)
  cache.save = kill_at
  sys.argv = ["main.py", *sys.argv[1:]]
  from fi_jax.run import cli
  cli.main()
""")


@pytest.mark.slow
def test_killed_run_resumes_at_the_shard_in_flight(tmp_path):
  """A run killed with SIGKILL inside a 6-shard set: the rerun reuses the trained parameters
  and the 3 finished shards, recomputes only from the shard in flight, and ends with the
  uninterrupted run's arrays (bit-identical) and rows."""
  args = ["--config=configs/demo.py:quick", "--config.train.steps=20",
          "--config.cache_shard_size=128"]
  clean = _main(*args, f"--workdir={tmp_path}/clean")
  assert clean.returncode == 0, clean.stderr[-3000:]
  assert "id_fit: 758 examples, 6 batches of 128, 6 shards" in clean.stdout

  killed = _python(_KILL_AT_SHARD, *args, f"--workdir={tmp_path}/w")
  assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
  assert "id_fit: shard 3/6 saved" in killed.stdout and "shard 4/6" not in killed.stdout

  rerun = _main(*args, f"--workdir={tmp_path}/w")
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  out = rerun.stdout
  assert "Training" not in out and "Trained parameters from cache" in out
  assert "id_fit: resuming at shard 4/6 (3 finished shard(s), 384 examples" in out
  assert [line for line in out.splitlines() if "id_fit: shard" in line] == [
      "id_fit: shard 4/6 saved", "id_fit: shard 5/6 saved"]   # shard 6 goes into the set entry

  clean_arrays, arrays = _arrays(f"{tmp_path}/clean"), _arrays(f"{tmp_path}/w")
  assert sorted(arrays) == sorted(clean_arrays)
  for entry, a in arrays.items():
    for k, v in a.items():
      assert v.dtype == clean_arrays[entry][k].dtype and np.array_equal(
          v, clean_arrays[entry][k]), (entry, k)
  rows = lambda d: json.load(open(os.path.join(d, "results.json")))["rows"]
  assert rows(f"{tmp_path}/w") == rows(f"{tmp_path}/clean")
  assert not [d for _, dirs, _ in os.walk(f"{tmp_path}/w/cache") for d in dirs
              if ".shards-" in d]   # the shards are removed once the set is complete
