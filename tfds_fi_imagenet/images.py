"""Image checks and download checksums of the builders.

Every builder here stores images byte-for-byte when they are JPEG or PNG (what TFDS's
`Image` feature and `tf.io.decode_image` handle as HxWx3) and re-encodes anything else
(NINCO's GIF) to PNG, after decoding each image once with PIL so that a corrupt file stops
the build with its name instead of failing later inside a tf.data pipeline.
"""
from __future__ import annotations

import hashlib
import io

from etils import epath
from PIL import Image

_KEPT_FORMATS = ("JPEG", "MPO", "PNG")  # MPO = JPEG with appended frames; TF reads the first


def checked_image(data: bytes, where: str) -> bytes:
  """Returns image bytes that tf.io.decode_image reads as HxWx3.

  JPEG and PNG are returned unchanged; other formats (GIF, WebP, BMP, TIFF) are re-encoded
  to PNG from their first frame in RGB. The image is fully decoded once (JPEGs at 1/8
  scale, which still reads every entropy-coded byte), so truncated or garbage files raise.

  Raises:
    ValueError: naming `where` when PIL cannot decode the bytes.
  """
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
