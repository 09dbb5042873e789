"""Visual tokenizers: five ways to turn image patches into ids in [0, K), and a random control (SPEC §4).

`make_tokenizer(kind, codebook, patch_size, seed)` builds one, `.fit(images)` learns it, `.encode(images)`
gives (N, P) int64 ids, `.save(folder)` / `load_tokenizer(folder)` store it with a verified checksum.
Kinds: vqvae, lfq, bsq (learned, `vq.py`), dct-kmeans (`dct.py`), features-kmeans (`features.py`),
random (`random_ids.py`).
"""

from __future__ import annotations

from pathlib import Path

from plelab.vision.patches import patch_grid
from plelab.vision.tokenizers.base import TokenizerError, VisualTokenizer, read_saved
from plelab.vision.tokenizers.dct import DCTKMeansTokenizer
from plelab.vision.tokenizers.features import FeaturesKMeansTokenizer
from plelab.vision.tokenizers.random_ids import RandomTokenizer
from plelab.vision.tokenizers.vq import BSQTokenizer, LFQTokenizer, VQVAETokenizer

_CLASSES: dict[str, type[VisualTokenizer]] = {
    cls.kind: cls for cls in (VQVAETokenizer, LFQTokenizer, BSQTokenizer, DCTKMeansTokenizer,
                              FeaturesKMeansTokenizer, RandomTokenizer)
}
TOKENIZERS = ("vqvae", "lfq", "bsq", "dct-kmeans", "features-kmeans", "random")
assert set(TOKENIZERS) == set(_CLASSES)

__all__ = ["TOKENIZERS", "TokenizerError", "VisualTokenizer", "load_tokenizer", "make_tokenizer"]


def _tokenizer_class(kind: object) -> type[VisualTokenizer]:
    if kind not in _CLASSES:
        raise TokenizerError(f"unknown visual tokenizer {kind!r}; choose one of {', '.join(TOKENIZERS)}")
    return _CLASSES[kind]


def make_tokenizer(kind: str, codebook: int, patch_size: int = 7, seed: int = 0,
                   **options: int | float) -> VisualTokenizer:
    """An unfitted tokenizer of `kind` with K = `codebook` ids; `options` override the kind's `option_defaults`
    (e.g. steps=100 for a quick vqvae); one-line TokenizerError for bad arguments."""
    return _tokenizer_class(kind)(codebook, patch_size, seed, **options)


def load_tokenizer(path: str | Path, kind: str | None = None, patch_size: int | None = None) -> VisualTokenizer:
    """A tokenizer saved by `.save(path)`, checksum verified; `kind`/`patch_size`, when given, must match."""
    meta, tensors = read_saved(path)
    saved_kind = meta.get("kind")
    if kind is not None and saved_kind != kind:
        raise TokenizerError(f"tokenizer at {path} is {saved_kind!r}, not {kind!r}")
    if patch_size is not None and meta.get("patch_size") != patch_size:
        raise TokenizerError(f"tokenizer at {path} uses patch size {meta.get('patch_size')}, not {patch_size}")
    cls = _tokenizer_class(saved_kind)
    try:
        saved_settings = meta["settings"]
        options = {k: saved_settings[k] for k in cls.option_defaults if k in saved_settings}
        tok = cls(meta["codebook"], meta["patch_size"], meta["seed"], **options)
        shape = tuple(int(s) for s in meta["image_shape"])
    except (KeyError, TypeError, ValueError) as e:
        raise TokenizerError(f"tokenizer at {path} has a malformed tokenizer.json ({type(e).__name__}: {e})") from None
    if saved_settings != tok.settings():
        diff = sorted(k for k in set(saved_settings) | set(tok.settings())
                      if saved_settings.get(k) != tok.settings().get(k))
        raise TokenizerError(f"tokenizer at {path} was saved with other {saved_kind} settings than this plelab "
                             f"uses ({', '.join(diff)}); refit it")
    if len(shape) != 2:
        raise TokenizerError(f"tokenizer at {path} has image_shape {list(shape)}; expected [H, W]")
    patch_grid(shape, tok.patch_size)  # PatchError when the saved shape and patch size disagree
    tok.image_shape = shape
    tok._restore(tensors)
    return tok
