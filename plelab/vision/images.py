"""Load grayscale image sets: MNIST idx files, scikit-learn's digits csv, `.npz` arrays and single picture files.

Every loader returns an `ImageSet` of uint8 images (N, H, W) and, where the source has them, int64 labels (N,).
Anything unreadable (missing, empty, truncated, wrong magic number, wrong shape or dtype) is an `ImageError`
whose message is one line naming the file.

Formats, chosen by name:
- `*idx3-ubyte[.gz]`: MNIST images (magic 0x00000803: unsigned bytes, 3 dimensions); labels come from the
  sibling file with `images-idx3` replaced by `labels-idx1` (magic 0x00000801) when it exists.
- `*.csv[.gz]`: scikit-learn's digits layout, one image per row: s*s pixel values in 0..16, then the label;
  pixels are scaled to 0..255 (v * 255 / 16, rounded).
- `*.npz`: an array `images` (N, H, W) uint8 and optionally `labels` (N,) of integers.
- anything else: a picture file PIL can read (converted to 8-bit grayscale, N = 1, no label); meant for
  tokenizer sanity checks, not for captioned corpora.
A folder holding exactly one of these sources loads it (a folder of pictures of one size loads them all).
"""

from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from plelab.errors import PlelabError

IDX_IMAGES_MAGIC = 0x00000803
IDX_LABELS_MAGIC = 0x00000801
# idx type byte -> what it holds (only 0x08 is accepted; the others are named in the error).
_IDX_TYPES = {0x08: "unsigned byte", 0x09: "signed byte", 0x0B: "short", 0x0C: "int", 0x0D: "float", 0x0E: "double"}
DIGITS_CSV_MAX = 16  # scikit-learn digits count "on" pixels in 4x4 blocks: 0..16
_PICTURE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".pgm", ".ppm")


class ImageError(PlelabError):
    """An image source that is missing, unreadable, corrupt, or not grayscale uint8 (N, H, W)."""


@dataclass(frozen=True)
class ImageSet:
    """Images (N, H, W) uint8, labels (N,) int64 or None, and where they came from."""

    images: np.ndarray
    labels: np.ndarray | None
    source: str

    def __post_init__(self) -> None:
        check_images(self.images, self.source)
        if self.labels is not None:
            object.__setattr__(self, "labels", _check_labels(self.labels, len(self.images), self.source))

    def __len__(self) -> int:
        return len(self.images)

    @property
    def shape(self) -> tuple[int, int]:
        """(H, W) of every image."""
        return self.images.shape[1], self.images.shape[2]


def check_images(images: object, where: str = "images") -> np.ndarray:
    """Raise ImageError unless `images` is a non-empty uint8 array (N, H, W); return it."""
    if not isinstance(images, np.ndarray):
        raise ImageError(f"{where}: expected a numpy array of images, got {type(images).__name__}")
    if images.dtype != np.uint8:
        raise ImageError(f"{where}: images must be uint8 (0..255 grayscale), got dtype {images.dtype}")
    if images.ndim != 3:
        raise ImageError(f"{where}: images must have shape (N, H, W), got {images.shape}")
    if 0 in images.shape:
        raise ImageError(f"{where}: no images (shape {images.shape})")
    return images


def _check_labels(labels: object, n: int, where: str) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or len(labels) != n:
        raise ImageError(f"{where}: labels must have shape ({n},) to match the images, got {labels.shape}")
    if not np.issubdtype(labels.dtype, np.integer):
        raise ImageError(f"{where}: labels must be integers, got dtype {labels.dtype}")
    if (labels < 0).any():
        raise ImageError(f"{where}: labels must be >= 0, found {int(labels.min())}")
    return labels.astype(np.int64, copy=False)


def load_images(path: str | Path) -> ImageSet:
    """Load an image set from a file or a folder holding one (see the module docstring for the formats)."""
    p = Path(path)
    if p.is_dir():
        return _load_folder(p)
    if not p.exists():
        raise ImageError(f"{p}: no such file or folder")
    if not p.is_file():
        raise ImageError(f"{p}: not a regular file")
    if p.stat().st_size == 0:
        raise ImageError(f"{p}: empty file")
    name = p.name.lower()
    if "idx3-ubyte" in name:
        return load_idx(p)
    if name.endswith((".csv", ".csv.gz")):
        return load_digits_csv(p)
    if name.endswith(".npz"):
        return load_npz(p)
    return load_pictures([p])


def _load_folder(folder: Path) -> ImageSet:
    files = sorted(f for f in folder.iterdir() if f.is_file() and not f.name.startswith("."))
    names = [f.name.lower() for f in files]
    sets = [f for f, n in zip(files, names, strict=True)
            if "idx3-ubyte" in n or n.endswith((".csv", ".csv.gz", ".npz"))]
    pictures = [f for f, n in zip(files, names, strict=True) if n.endswith(_PICTURE_SUFFIXES)]
    if len(sets) == 1:
        return load_images(sets[0])
    if len(sets) > 1:
        raise ImageError(f"{folder}: holds several image sets ({', '.join(f.name for f in sets)}); name one file")
    if pictures:
        return load_pictures(pictures, source=str(folder))
    raise ImageError(f"{folder}: no images found (expected *idx3-ubyte[.gz], *.csv[.gz], *.npz or pictures)")


def _read_maybe_gzip(path: Path) -> bytes:
    """The file's bytes, gunzipped when it is gzip (by magic, not by name)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
        return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise ImageError(f"{path}: corrupt or truncated gzip data ({exc})") from exc


def read_idx(path: str | Path, magic: int) -> np.ndarray:
    """An idx array of unsigned bytes whose magic number must be `magic` (0x803 images, 0x801 labels)."""
    path = Path(path)
    data = _read_maybe_gzip(path)
    if len(data) < 4:
        raise ImageError(f"{path}: too short for an idx file ({len(data)} bytes)")
    zero, kind, ndim = int.from_bytes(data[:2], "big"), data[2], data[3]
    if zero != 0 or kind not in _IDX_TYPES:
        raise ImageError(f"{path}: not an idx file (magic number 0x{int.from_bytes(data[:4], 'big'):08x})")
    if kind != 0x08:
        raise ImageError(f"{path}: idx file holds {_IDX_TYPES[kind]} values; images and labels must be unsigned "
                         "bytes (type 0x08)")
    found = int.from_bytes(data[:4], "big")
    if found != magic:
        want = "images, 3 dimensions" if magic == IDX_IMAGES_MAGIC else "labels, 1 dimension"
        raise ImageError(f"{path}: idx magic number 0x{found:08x} ({ndim} dimensions), expected 0x{magic:08x} "
                         f"({want})")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ImageError(f"{path}: truncated idx header")
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    size = int(np.prod(dims))
    if len(data) - header != size:
        raise ImageError(f"{path}: idx header says {dims} = {size} bytes of data, file has {len(data) - header} "
                         "(truncated or corrupt)")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)


def load_idx(path: str | Path) -> ImageSet:
    """MNIST images from an idx3 file, with labels from its `labels-idx1` sibling when present."""
    path = Path(path)
    images = read_idx(path, IDX_IMAGES_MAGIC)
    labels = None
    label_path = path.with_name(path.name.replace("images-idx3", "labels-idx1"))
    if label_path != path and label_path.exists():
        labels = read_idx(label_path, IDX_LABELS_MAGIC).astype(np.int64)
        if len(labels) != len(images):
            raise ImageError(f"{label_path}: {len(labels)} labels for {len(images)} images in {path.name}")
    return ImageSet(images.copy(), labels, str(path))


def load_digits_csv(path: str | Path) -> ImageSet:
    """scikit-learn digits: rows of s*s pixels in 0..16 then the label; pixels scaled to 0..255."""
    path = Path(path)
    try:
        rows = np.loadtxt(path, delimiter=",", ndmin=2)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise ImageError(f"{path}: corrupt or truncated gzip data ({exc})") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise ImageError(f"{path}: not a numeric csv ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
                         ) from exc
    if rows.size == 0:
        raise ImageError(f"{path}: no rows")
    side = int(round((rows.shape[1] - 1) ** 0.5))
    if side < 1 or side * side != rows.shape[1] - 1:
        raise ImageError(f"{path}: {rows.shape[1]} columns per row; expected s*s pixels and a label (e.g. 65 = 8x8+1)")
    pixels, labels = rows[:, :-1], rows[:, -1]
    if (pixels != np.round(pixels)).any() or pixels.min() < 0 or pixels.max() > DIGITS_CSV_MAX:
        raise ImageError(f"{path}: pixel values must be integers in 0..{DIGITS_CSV_MAX} (scikit-learn digits)")
    if (labels != np.round(labels)).any():
        raise ImageError(f"{path}: the last column (labels) must hold integers")
    images = np.round(pixels * (255 / DIGITS_CSV_MAX)).astype(np.uint8).reshape(-1, side, side)
    return ImageSet(images, labels.astype(np.int64), str(path))


def load_npz(path: str | Path) -> ImageSet:
    """An `.npz` with `images` (N, H, W) uint8 and optional `labels` (N,)."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            if "images" not in z.files:
                raise ImageError(f"{path}: no array named 'images' (found {', '.join(z.files) or 'none'})")
            images = z["images"]
            labels = z["labels"] if "labels" in z.files else None
    except ImageError:
        raise
    except Exception as exc:  # zipfile.BadZipFile, ValueError (pickled objects), EOFError: all mean "corrupt"
        raise ImageError(f"{path}: not a readable .npz ({type(exc).__name__}: {exc})") from exc
    return ImageSet(images, labels, str(path))


def load_pictures(paths: list[Path], source: str | None = None) -> ImageSet:
    """Picture files PIL can read, as 8-bit grayscale; all must have one size."""
    from PIL import Image, UnidentifiedImageError

    arrays = []
    for p in paths:
        try:
            with Image.open(p) as im:
                arrays.append(np.asarray(im.convert("L"), dtype=np.uint8))
        except (UnidentifiedImageError, OSError, ValueError) as exc:
            why = str(exc).splitlines()[0] if str(exc) else "corrupt"
            raise ImageError(f"{p}: not a readable image ({why}); image sets are *idx3-ubyte[.gz], *.csv[.gz] "
                             "or *.npz") from exc
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise ImageError(f"{source or paths[0]}: pictures of different sizes {sorted(shapes)}; one size is needed")
    return ImageSet(np.stack(arrays), None, source or str(paths[0]))
