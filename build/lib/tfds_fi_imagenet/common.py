"""Shared pieces of the OOD builders: image checks, archive reading, count checks.

Every builder here stores images byte-for-byte when they are JPEG or PNG (what TFDS's
`Image` feature and `tf.io.decode_image` handle as HxWx3) and re-encodes anything else
(NINCO's GIF) to PNG, after decoding each image once with PIL so that a corrupt file stops
the build with its name instead of failing later inside a tf.data pipeline.

Archives are read through `epath` and `tarfile` / `zipfile` (no `os`, no builtin `open`),
so the code also works under `tfds.testing.DatasetBuilderTestCase`, which forbids both.
"""
from __future__ import annotations

import abc
import hashlib
import io
import re
import tarfile
import zipfile
from typing import Callable, Hashable, Iterable, Iterator, Mapping, Optional

from etils import epath
import numpy as np
import tensorflow_datasets as tfds


class UsageError(ValueError):
  """A wrong name, config, option or count key (the CLI exits with code 2 on it)."""


# --------------------------------------------------------------------------- images

_KEPT_FORMATS = ("JPEG", "MPO", "PNG")  # MPO = JPEG with appended frames; TF reads the first


def checked_image(data: bytes, where: str) -> bytes:
  """Returns image bytes that tf.io.decode_image reads as HxWx3.

  JPEG and PNG are returned unchanged; other formats (GIF, WebP, BMP, TIFF) are re-encoded
  to PNG from their first frame in RGB. The image is fully decoded once (JPEGs at 1/8
  scale, which still reads every entropy-coded byte), so truncated or garbage files raise.

  Raises:
    ValueError: naming `where` when PIL cannot decode the bytes.
  """
  from PIL import Image  # pylint: disable=g-import-not-at-top
  try:
    with Image.open(io.BytesIO(data)) as img:
      fmt = img.format
      if fmt in ("JPEG", "MPO"):
        img.draft("RGB", (max(1, img.width // 8), max(1, img.height // 8)))
      img.load()
      if fmt in _KEPT_FORMATS:
        return data
      rgb = img.convert("RGB")
  except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
    detail = ("not a recognised image format" if isinstance(e, Image.UnidentifiedImageError)
              else f"{type(e).__name__}: {e}")
    raise ValueError(
        f"Corrupt or unreadable image {where}: {detail}. "
        "Replace it with an intact copy (re-download or re-extract the archive).") from None
  buf = io.BytesIO()
  rgb.save(buf, format="PNG")
  return buf.getvalue()


def md5_of(path: epath.PathLike, chunk: int = 1 << 22) -> str:
  """Hex MD5 of a file, read in chunks."""
  h = hashlib.md5()
  with epath.Path(path).open("rb") as f:
    while block := f.read(chunk):
      h.update(block)
  return h.hexdigest()


def verify_md5(path: epath.PathLike, expected: str, what: str) -> None:
  """Raises ValueError when the file's MD5 differs from the published one."""
  got = md5_of(path)
  if got != expected:
    raise ValueError(
        f"{what}: MD5 of {path} is {got}, the published MD5 is {expected}. The download is "
        "damaged or the file changed upstream; delete it and rebuild, or pass "
        "verify_md5=False (CLI: --skip_md5) if you trust this copy.")


# --------------------------------------------------------------------------- archives

def _is_hidden(name: str) -> bool:
  parts = name.split("/")
  return any(p.startswith(".") or p == "__MACOSX" for p in parts) or name.endswith("~")


class ImageArchive:
  """Files of a folder, .zip, .tar (random access) or compressed tar (one pass only).

  Member names are '/'-separated paths relative to the folder / archive root; hidden
  files (a component starting with '.', macOS `__MACOSX/`, editor backups) are skipped
  as TFDS's own `iter_archive` does.
  """

  _STREAM_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")

  def __init__(self, path: epath.PathLike):
    self.path = epath.Path(path)
    name = self.path.name.lower()
    if self.path.is_dir():
      self.kind = "dir"
    elif name.endswith(".zip"):
      self.kind = "zip"
    elif name.endswith(".tar"):
      self.kind = "tar"
    elif name.endswith(self._STREAM_SUFFIXES):
      self.kind = "stream"
    else:
      raise ValueError(f"Cannot read {self.path}: expected a folder, .zip, .tar or "
                       f"compressed tar ({', '.join(self._STREAM_SUFFIXES)}).")
    self._file = None
    self._handle = None
    self._members: Optional[dict[str, object]] = None

  @property
  def random_access(self) -> bool:
    return self.kind != "stream"

  def _open(self):
    if self._handle is None and self.kind in ("zip", "tar"):
      self._file = self.path.open("rb")
      if self.kind == "zip":
        self._handle = zipfile.ZipFile(self._file)
      else:
        self._handle = tarfile.open(fileobj=self._file, mode="r:")
    return self._handle

  def names(self) -> list[str]:
    """Sorted member names (random-access kinds only; reads headers, not data)."""
    if self.kind == "stream":
      raise ValueError(f"{self.path} is a compressed tar: it has no cheap name listing.")
    if self._members is None:
      members: dict[str, object] = {}
      if self.kind == "dir":
        stack = [(self.path, "")]
        while stack:  # iterdir, not rglob: epath's GPath rejects '**' patterns
          folder, prefix = stack.pop()
          for p in folder.iterdir():
            rel = prefix + p.name
            if _is_hidden(rel):
              continue
            if p.is_dir():
              stack.append((p, rel + "/"))
            else:
              members[rel] = p
      elif self.kind == "zip":
        for info in self._open().infolist():
          if not info.is_dir() and not _is_hidden(info.filename):
            members[info.filename.lstrip("/")] = info
      else:
        for info in self._open().getmembers():
          name = info.name[2:] if info.name.startswith("./") else info.name
          if info.isfile() and not _is_hidden(name):
            members[name] = info
      self._members = members
    return sorted(self._members)

  def read(self, name: str) -> bytes:
    """Bytes of one member (random-access kinds only)."""
    self.names()
    member = self._members[name]
    if self.kind == "dir":
      return member.read_bytes()
    if self.kind == "zip":
      return self._open().read(member)
    return self._open().extractfile(member).read()

  def position(self, name: str):
    """Sort key placing members in storage order (fewer seeks when reading many)."""
    self.names()
    member = self._members[name]
    if self.kind == "zip":
      return member.header_offset
    if self.kind == "tar":
      return member.offset_data
    return name

  def iter_files(self) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of every member, in archive order for tars, sorted otherwise."""
    if self.kind != "stream":
      for name in self.names():
        yield name, self.read(name)
      return
    with self.path.open("rb") as f, tarfile.open(fileobj=f, mode="r|*") as tar:
      for info in tar:
        name = info.name[2:] if info.name.startswith("./") else info.name
        if info.isfile() and not _is_hidden(name):
          yield name, tar.extractfile(info).read()

  def close(self) -> None:
    if self._handle is not None:
      self._handle.close()
      self._file.close()
      self._handle = self._file = None


def index_members(names: Iterable[str], key_of: Callable[[str], Optional[Hashable]],
                  where: str) -> dict[Hashable, str]:
  """{key: member name} for every member that `key_of` maps to a key.

  Raises:
    ValueError: when two members map to the same key (e.g. the same image twice).
  """
  index: dict[Hashable, str] = {}
  for name in names:
    key = key_of(name)
    if key is None:
      continue
    if key in index:
      raise ValueError(f"{where} holds the same image twice: {index[key]!r} and {name!r}. "
                       "Remove one of them.")
    index[key] = name
  return index


def raise_if_missing(wanted: Iterable[Hashable], found: Iterable[Hashable],
                     describe: Callable[[Hashable], str], where: str) -> None:
  """FileNotFoundError listing (up to 5 of) the wanted keys absent from `found`."""
  found = set(found)
  missing = [k for k in wanted if k not in found]
  if missing:
    shown = "; ".join(describe(k) for k in missing[:5])
    more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
    raise FileNotFoundError(f"{len(missing)} listed image(s) are missing from {where}: "
                            f"{shown}{more}. Check that the archive is complete.")


def iter_wanted(archive: ImageArchive, key_of: Callable[[str], Optional[Hashable]],
                wanted: Iterable[Hashable], describe: Callable[[Hashable], str],
                index: Optional[Mapping[Hashable, str]] = None,
                ) -> Iterator[tuple[Hashable, str, bytes]]:
  """(key, member name, checked image bytes) for each wanted key, each exactly once.

  Random-access archives read only the wanted members (via `index`, computed when not
  given), in storage order; compressed tars are streamed once. Callers key examples by
  `key`, so the yield order does not matter. Missing keys raise FileNotFoundError and
  duplicate members ValueError, both naming the files.
  """
  wanted = list(wanted)
  wanted_set = set(wanted)
  where = str(archive.path)
  if archive.random_access:
    if index is None:
      index = index_members(archive.names(), key_of, where)
    raise_if_missing(wanted, index, describe, where)
    for key in sorted(wanted, key=lambda k: archive.position(index[k])):
      name = index[key]
      yield key, name, checked_image(archive.read(name), f"{name} in {where}")
    return
  seen: dict[Hashable, str] = {}
  for name, data in archive.iter_files():
    key = key_of(name)
    if key is None or key not in wanted_set:
      continue
    if key in seen:
      raise ValueError(f"{where} holds the same image twice: {seen[key]!r} and {name!r}. "
                       "Remove one of them.")
    seen[key] = name
    yield key, name, checked_image(data, f"{name} in {where}")
  raise_if_missing(wanted, seen, describe, where)


def suffix_key(wanted_paths: Iterable[str]) -> Callable[[str], Optional[str]]:
  """Maps an archive member to the wanted relative path it ends with (or None).

  Lets a builder find `a/b.jpg` whether the archive stores it as `a/b.jpg`,
  `dataset/a/b.jpg` or `images_largescale/dataset/a/b.jpg`.
  """
  wanted = set(wanted_paths)

  def key_of(name: str) -> Optional[str]:
    parts = name.split("/")
    for i in range(len(parts)):
      cand = "/".join(parts[i:])
      if cand in wanted:
        return cand
    return None
  return key_of


def find_first(root: epath.Path, candidates: Iterable[str]) -> Optional[epath.Path]:
  """The first of `candidates` (paths relative to root) that exists, else None."""
  for c in candidates:
    p = root / c
    if p.exists():
      return p
  return None


def find_dir(root: epath.Path, name: str, max_depth: int = 3) -> Optional[epath.Path]:
  """Breadth-first search for a folder called `name` under root (root itself included)."""
  level = [root]
  for _ in range(max_depth + 1):
    for d in level:
      if d.name == name and d.is_dir():
        return d
    level = [c for d in level if d.is_dir() for c in sorted(d.iterdir())
             if c.is_dir() and not c.name.startswith(".")]
  return None


# --------------------------------------------------------------------------- OOD classes

def normalize_class(name: str) -> str:
  """Class names: surrounding quotes and whitespace stripped, inner runs collapsed."""
  name = name.strip()
  if len(name) >= 2 and name[0] == name[-1] == '"':
    name = name[1:-1].replace('""', '"')
  return re.sub(r"\s+", " ", name).strip()


def class_ids(names: Iterable[str]) -> tuple[list[str], dict[str, int]]:
  """Sorted unique non-empty class names and {name: index}; '' maps to -1.

  This is the `ood_class_id` convention of every builder here: the index of the class
  name in the sorted list of the distinct names present in the split(s), -1 when the
  class is unknown. Deterministic for a given set of names.
  """
  classes = sorted({n for n in names if n})
  lookup = {n: i for i, n in enumerate(classes)}
  lookup[""] = -1
  return classes, lookup


def ood_features(**extra) -> tfds.features.FeaturesDict:
  """Features shared by the OOD sets (plus `extra`)."""
  return tfds.features.FeaturesDict({
      "image": tfds.features.Image(shape=(None, None, 3)),
      "file_name": tfds.features.Text(),
      "ood_class": tfds.features.Text(),
      "ood_class_id": tfds.features.Scalar(dtype=np.int64),
      **extra,
  })


# --------------------------------------------------------------------------- base builder

class OodBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Base of the builders here: count checks configurable by a builder kwarg.

  `expected`: {split name or 'classes': count}. None = the published counts
  (`default_expected()`); a mapping replaces them entirely (keys it lacks are not
  checked), which is how tests and later releases of a list set other sizes.
  """

  def __init__(self, *, expected: Optional[Mapping[str, int]] = None, **kwargs):
    super().__init__(**kwargs)
    self._original_state["expected"] = expected
    defaults = self.default_expected()
    if expected is None:
      expected = defaults
    unknown = set(expected) - set(defaults)
    if unknown:
      raise UsageError(f"{self.name}: unknown count key(s) {sorted(unknown)} in expected=; "
                       f"known: {sorted(defaults)}.")
    self.expected = {k: int(v) for k, v in expected.items()}

  @abc.abstractmethod
  def default_expected(self) -> dict[str, int]:
    """Published count per split (and 'classes' where classes are known)."""

  def check_count(self, key: str, got: int, what: str, hint: str = "") -> None:
    """ValueError when a checked count differs from the expected one."""
    want = self.expected.get(key)
    if want is not None and got != want:
      raise ValueError(
          f"{self.name}: {what} has {got} {'classes' if key == 'classes' else 'images'}, "
          f"expected {want}.{(' ' + hint) if hint else ''} For another release pass "
          f"expected={{'{key}': {got}, ...}} (CLI: --expect {key}={got}).")
