"""The visual tokenizer interface: fit on images, map each patch to an id in [0, K), save and load verified.

A saved tokenizer is a folder: `tokenizer.json` (kind, codebook size, patch size, seed, image shape, the
kind's settings, and the name, size and sha256 of its weights file) and `weights-<sha256 prefix>.safetensors`.
The weights are written first under a name of their own and the json last, each atomically, so a reader sees
the old tokenizer or the new one, never a mix; a file changed afterwards fails its checksum on load.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import numpy as np

from plelab.errors import PlelabError
from plelab.util.fs import atomic_write_bytes
from plelab.vision.config import MAX_CODEBOOK
from plelab.vision.patches import check_images, patch_grid

FORMAT = "plelab-visual-tokenizer"
FORMAT_VERSION = 1
META_NAME = "tokenizer.json"


class TokenizerError(PlelabError):
    """A visual tokenizer misused (bad settings, not fitted, other image size) or a saved one unreadable."""


def check_int(name: str, value: object, minimum: int, maximum: int | None = None) -> int:
    """`value` as an int in [minimum, maximum]; TokenizerError naming `name` otherwise (bools are refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum \
            or (maximum is not None and value > maximum):
        what = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise TokenizerError(f"{name} must be an integer {what}, got {value!r}")
    return int(value)


def vision_import(module: str) -> ModuleType:
    """Import a dependency of the `vision` extra; a one-line TokenizerError naming the extra when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise TokenizerError(f"visual tokenizers need {e.name or module} (pip install 'plelab[vision]')") from None


@contextlib.contextmanager
def deterministic_torch(seed: int | None = None) -> Iterator[None]:
    """Run torch on one thread inside the block and, given a seed, on a seeded global generator; restore both.

    Float sums over a different number of threads differ in the last bits, and a fit amplifies that into
    other codebooks (measured: 20-90 % of ids differ between 1 and 2 threads), so ids are reproducible only
    at a fixed thread count; one thread is also what the fit budget (< 60 s on MNIST) assumes. The quantizer
    library draws from the global generator (k-means init, dead-code restarts), hence the seeding; forking
    keeps the caller's random stream untouched.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if seed is None:
            yield
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                yield
    finally:
        torch.set_num_threads(threads)


class VisualTokenizer:
    """Maps (N, H, W) grayscale images to (N, P) int64 patch ids in [0, codebook), P patches row-major.

    Subclasses set `kind` (and `option_defaults`) and implement `_fit`, `_encode`, and where they keep
    parameters `_state` and `_restore`; `settings` lists what is saved with the tokenizer and checked on load.
    """

    kind: ClassVar[str] = ""
    # Tunable fit settings (positive numbers) and their defaults; `make_tokenizer(..., **options)` overrides them.
    option_defaults: ClassVar[dict[str, int | float]] = {}

    def __init__(self, codebook: int, patch_size: int = 7, seed: int = 0, **options: int | float) -> None:
        self.codebook = check_int("codebook size", codebook, 2, MAX_CODEBOOK)
        self.patch_size = check_int("patch size", patch_size, 1)
        self.seed = check_int("seed", seed, 0)
        self.image_shape: tuple[int, int] | None = None
        unknown = sorted(set(options) - set(self.option_defaults))
        if unknown:
            raise TokenizerError(f"{self.kind} has no option {', '.join(unknown)}; its options are "
                                 f"{', '.join(self.option_defaults) or 'none'}")
        for name, value in options.items():
            wanted = int if isinstance(self.option_defaults[name], int) else (int, float)
            if isinstance(value, bool) or not isinstance(value, wanted) or not value > 0:
                raise TokenizerError(f"{self.kind} option {name} must be a positive "
                                     f"{'integer' if wanted is int else 'number'}, got {value!r}")
        self.options = {**self.option_defaults, **options}

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(kind={self.kind!r}, codebook={self.codebook}, "
                f"patch_size={self.patch_size}, image_shape={self.image_shape})")

    @property
    def grid(self) -> tuple[int, int]:
        """(rows, columns) of the patch grid of the fitted image size."""
        return patch_grid(self._fitted_shape(), self.patch_size)

    @property
    def num_patches(self) -> int:
        """P, patches per image."""
        rows, cols = self.grid
        return rows * cols

    def settings(self) -> dict[str, Any]:
        """The kind's options and fixed hyperparameters (JSON values): saved, and compared on load."""
        return dict(self.options)

    def fit(self, images: np.ndarray) -> VisualTokenizer:
        """Fit on (N, H, W) uint8 images (or float in [0, 1]); deterministic for a given seed; returns self."""
        images = check_images(images)
        patch_grid(images.shape[1:], self.patch_size)
        if len(images) == 0:
            raise TokenizerError(f"{self.kind}: cannot fit on an empty image set")
        self._fit(images)
        self.image_shape = (int(images.shape[1]), int(images.shape[2]))
        return self

    def encode(self, images: np.ndarray, patch_size: int | None = None) -> np.ndarray:
        """(N, H, W) images of the fitted size -> (N, P) int64 ids in [0, codebook).

        `patch_size`, when given, is the caller's idea of the patch size and must equal the fitted one.
        """
        self._check_input(images, patch_size)
        ids = np.asarray(self._encode(images), dtype=np.int64)
        if ids.shape != (len(images), self.num_patches) or (ids.size and (ids.min() < 0 or ids.max() >= self.codebook)):
            raise AssertionError(f"{self.kind} produced ids of shape {ids.shape} outside [0, {self.codebook})")
        return ids

    def reconstruct(self, images: np.ndarray) -> np.ndarray | None:
        """(N, P, p*p) float32 patches decoded from the ids, or None where the kind has no decoder."""
        self._check_input(images, None)
        return self._reconstruct(images)

    def save(self, path: str | Path) -> Path:
        """Write the fitted tokenizer into folder `path` (created if missing); see the module doc."""
        from safetensors.numpy import save as save_tensors

        shape = self._fitted_shape()
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise TokenizerError(f"cannot save tokenizer: {path} exists and is not a folder")
        path.mkdir(parents=True, exist_ok=True)
        blob = save_tensors({k: np.ascontiguousarray(v) for k, v in self._state().items()})
        sha = hashlib.sha256(blob).hexdigest()
        weights = f"weights-{sha[:16]}.safetensors"
        atomic_write_bytes(path / weights, blob)
        meta = {"format": FORMAT, "version": FORMAT_VERSION, "kind": self.kind, "codebook": self.codebook,
                "patch_size": self.patch_size, "seed": self.seed, "image_shape": list(shape),
                "settings": self.settings(), "weights": {"file": weights, "bytes": len(blob), "sha256": sha}}
        atomic_write_bytes(path / META_NAME, (json.dumps(meta, indent=2) + "\n").encode("utf-8"))
        for old in path.glob("weights-*.safetensors"):  # an earlier save's weights, no longer referenced
            if old.name != weights:
                old.unlink(missing_ok=True)
        return path

    # --- for subclasses -------------------------------------------------------------------------------------

    def _fit(self, images: np.ndarray) -> None:
        raise NotImplementedError

    def _encode(self, images: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _reconstruct(self, images: np.ndarray) -> np.ndarray | None:
        return None

    def _state(self) -> dict[str, np.ndarray]:
        return {}

    def _restore(self, tensors: dict[str, np.ndarray]) -> None:
        if tensors:
            raise TokenizerError(f"{self.kind}: saved weights hold unexpected arrays {sorted(tensors)}")

    # --- checks ---------------------------------------------------------------------------------------------

    def _fitted_shape(self) -> tuple[int, int]:
        if self.image_shape is None:
            raise TokenizerError(f"{self.kind} tokenizer is not fitted; call fit(images) or load a saved one")
        return self.image_shape

    def _check_input(self, images: np.ndarray, patch_size: int | None) -> None:
        shape = self._fitted_shape()
        if patch_size is not None and patch_size != self.patch_size:
            raise TokenizerError(f"{self.kind} tokenizer was fitted with patch size {self.patch_size}, "
                                 f"not {patch_size}")
        images = check_images(images)
        if tuple(images.shape[1:]) != shape:
            raise TokenizerError(f"{self.kind} tokenizer was fitted on {shape[0]}x{shape[1]} images, "
                                 f"got {images.shape[1]}x{images.shape[2]}")


def read_saved(path: str | Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(meta, arrays) of a saved tokenizer folder (or its tokenizer.json), checksum verified; one-line errors."""
    from safetensors.numpy import load as load_tensors

    path = Path(path)
    meta_path = path if path.name == META_NAME else path / META_NAME
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TokenizerError(f"{path} is not a saved visual tokenizer (no {META_NAME})") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenizerError(f"cannot read {meta_path}: {e}".replace("\n", " ")) from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise TokenizerError(f"{meta_path} is not a plelab visual tokenizer (format {FORMAT!r} expected)")
    if meta.get("version") != FORMAT_VERSION:
        raise TokenizerError(f"{meta_path} has format version {meta.get('version')!r}; this plelab reads "
                             f"{FORMAT_VERSION}")
    try:
        weights = meta["weights"]
        blob = (meta_path.parent / Path(weights["file"]).name).read_bytes()
        expected_sha = weights["sha256"]
    except (KeyError, TypeError) as e:
        raise TokenizerError(f"{meta_path} lacks the weights entry {e}") from None
    except OSError as e:
        raise TokenizerError(f"cannot read the weights of {meta_path}: {e.strerror}: {e.filename}") from None
    if hashlib.sha256(blob).hexdigest() != expected_sha:
        raise TokenizerError(f"weights of {meta_path} fail their sha256 checksum (file changed or corrupt)")
    return meta, load_tensors(blob)
