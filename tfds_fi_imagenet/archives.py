"""Reading the builders' inputs: a folder, .zip, .tar or compressed tar of images
(`ImageArchive`), found in a manual or extracted dir by `find_first` / `find_dir`.

Archives are read through `epath` and `tarfile` / `zipfile` (no `os`, no builtin `open`),
so the code also works under `tfds.testing.DatasetBuilderTestCase`, which forbids both.
"""
from __future__ import annotations

import contextlib
import tarfile
import zipfile
from typing import Iterable, Iterator, Optional

from etils import epath

from tfds_fi_imagenet.errors import UsageError

# what tarfile / zipfile raise on a truncated or corrupt archive
_ARCHIVE_ERRORS = (tarfile.TarError, zipfile.BadZipFile, zipfile.LargeZipFile, EOFError,
                   OSError, ValueError)


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

  @contextlib.contextmanager
  def _reading(self, member: Optional[str] = None):
    """Turns a truncated / corrupt archive into one UsageError naming the file (and member)."""
    try:
      yield
    except UsageError:
      raise
    except _ARCHIVE_ERRORS as e:
      where = f" (member {member!r})" if member else ""
      raise UsageError(
          f"Cannot read {self.path}{where}: {type(e).__name__}: {e}. The file is truncated or "
          f"corrupt; download it again (compare its size / checksum with the source's).") from None

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
      with self._reading():
        self._members = self._list_members()
    return sorted(self._members)

  def _list_members(self) -> dict[str, object]:
    """{name: member} of a folder, zip or tar (the tar's headers are read to its end)."""
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
    return members

  def read(self, name: str) -> bytes:
    """Bytes of one member (random-access kinds only)."""
    self.names()
    member = self._members[name]
    with self._reading(name):
      if self.kind == "dir":
        return member.read_bytes()
      if self.kind == "zip":
        return self._open().read(member)
      data = self._open().extractfile(member).read()
      if len(data) != member.size:
        raise EOFError(f"{len(data)} of {member.size} bytes")
      return data

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
    with self._reading(), self.path.open("rb") as f, tarfile.open(fileobj=f, mode="r|*") as tar:
      for info in tar:
        name = info.name[2:] if info.name.startswith("./") else info.name
        if info.isfile() and not _is_hidden(name):
          data = tar.extractfile(info).read()
          if len(data) != info.size:
            raise EOFError(f"member {name!r}: {len(data)} of {info.size} bytes")
          yield name, data

  def close(self) -> None:
    if self._handle is not None:
      self._handle.close()
      self._file.close()
      self._handle = self._file = None


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
