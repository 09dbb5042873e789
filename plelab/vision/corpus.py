"""The tokenized image+caption corpus: `prepare_corpus` writes it, `VisionCorpus.load` reads and verifies it.

Split: the last `heldout` images are `valid`, the rest `train` (deterministic, no shuffling). Only the
training split fits anything: the visual tokenizer (unless one saved earlier is reused), the caption property
thresholds (tertiles, see
`plelab.vision.captions`) and the caption BPE. The caption tokenizer depends only on the images, the split and
the seed, never on the visual tokenizer, so corpora made with different visual tokenizers share it and their
caption losses are comparable.

Layout of a corpus folder (every file but manifest.json has its sha256 in the manifest, checked on load):
    manifest.json               what is below, the codebook report, the caption thresholds
    caption_tokenizer.json      byte-level BPE trained on the training captions (plelab.data.tokenizer)
    visual_tokenizer/           the fitted visual tokenizer (`plelab.vision.tokenizers.load_tokenizer`)
    {train,valid}/pixels.npy           (N, P, p*p) float32 in [0, 1], patches row-major
    {train,valid}/patch_ids.npy        (N, P) int64 in [0, K)
    {train,valid}/captions.npy         (N, T) int64: [bos] + caption tokens + [eos], right-padded with pad_id
    {train,valid}/caption_lengths.npy  (N,) int64, bos and eos included
    {train,valid}/labels.npy           (N,) int64 digit labels
    {train,valid}/captions.txt         the caption texts, one a line
bos and eos are both the caption tokenizer's `<|endoftext|>` (id 0); pad is `<|pad|>` (id 1).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from plelab.errors import PlelabError
from plelab.util.fs import atomic_writer, check_output_path, resolve_path, sha256_file
from plelab.vision.config import MAX_CODEBOOK

FORMAT = "plelab-vision-corpus"
VERSION = 1
SPLITS = ("train", "valid")
ARRAYS = ("pixels", "patch_ids", "captions", "caption_lengths", "labels")
CAPTION_VOCAB = 512  # the captions use ~40 distinct words: 512 byte-level BPE entries hold them all whole
VISUAL_TOKENIZER_DIR = "visual_tokenizer"
CAPTION_TOKENIZER_FILE = "caption_tokenizer.json"


class CorpusError(PlelabError):
    """A vision corpus that cannot be prepared (bad arguments) or loaded (missing, corrupt, inconsistent)."""


def _note(progress: Callable[[str], None] | None, message: str) -> None:
    if progress is not None:
        progress(message)


def split_bounds(n: int, heldout: int) -> dict[str, tuple[int, int]]:
    """[start, stop) of each split: the last `heldout` images are `valid`."""
    if heldout < 1 or heldout >= n:
        raise CorpusError(f"--heldout must be in [1, {n - 1}] for {n} images, got {heldout}")
    return {"train": (0, n - heldout), "valid": (n - heldout, n)}


def caption_rows(tokenizer, captions: list[str]) -> list[list[int]]:
    """Token ids `[bos] + caption + [eos]` of each caption (bos = eos = the tokenizer's end-of-text id)."""
    return [[tokenizer.eot_id, *ids, tokenizer.eot_id] for ids in tokenizer.encode_batch(captions)]


def pad_rows(rows: list[list[int]], width: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(N, width) int64 right-padded with `pad_id`, and the (N,) row lengths."""
    out = np.full((len(rows), width), pad_id, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out, np.array([len(r) for r in rows], dtype=np.int64)


def _check_output(out: Path, images_path: str | Path, overwrite: bool) -> None:
    """Refuse, before any work, an output that would lose data (`staging_dir` checks again when writing)."""
    check_output_path(out, overwrite=True, inputs=(images_path,), is_dir=True)
    if resolve_path(images_path).is_relative_to(resolve_path(out)):
        raise CorpusError(f"the images {images_path} lie inside the output folder {out}; choose another --out")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise CorpusError(f"output {out} already exists and is not empty; pass --overwrite to replace it")
        if not (out / "manifest.json").exists():
            raise CorpusError(f"output {out} is not empty and is not a prepared corpus; refusing to replace it")


def _reused_tokenizer(path: str | Path, kind: str, codebook: int, patch_size: int):
    """A saved visual tokenizer (or a corpus folder's) that must be `kind` with `codebook` on `patch_size`."""
    from plelab.vision.tokenizers import load_tokenizer

    folder = Path(path)
    visual = load_tokenizer(folder / VISUAL_TOKENIZER_DIR if (folder / VISUAL_TOKENIZER_DIR).is_dir() else folder)
    if (visual.kind, visual.codebook, visual.patch_size) != (kind, codebook, patch_size):
        raise CorpusError(f"{path}: a {visual.kind} tokenizer with K = {visual.codebook} fitted on "
                          f"{visual.patch_size}x{visual.patch_size} patches, not {kind} with K = {codebook} on "
                          f"{patch_size}x{patch_size} patches as asked")
    return visual


def _images_sha256(images: np.ndarray, labels: np.ndarray) -> str:
    h = hashlib.sha256()
    h.update(repr(images.shape).encode())
    h.update(np.ascontiguousarray(images).tobytes())
    h.update(np.ascontiguousarray(labels, dtype=np.int64).tobytes())
    return h.hexdigest()


def _save_array(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_writer(path) as f:
        np.save(f, array, allow_pickle=False)


def _save_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_writer(path) as f:
        f.write(text.encode("utf-8"))


def prepare_corpus(images_path: str | Path, tokenizer_kind: str, codebook: int, out: str | Path,
                   patch_size: int = 7, seed: int = 0, heldout: int = 1000, overwrite: bool = False,
                   progress: Callable[[str], None] | None = None, reuse_tokenizer: str | Path | None = None) -> dict:
    """Fit the visual and caption tokenizers on the training split, write the corpus to `out`; return the manifest.

    `reuse_tokenizer` (a saved visual tokenizer, or a corpus folder holding one) encodes with that tokenizer
    instead of fitting one; its kind, codebook and patch size must be the ones asked for.
    """
    from plelab.data.prepare import staging_dir
    from plelab.data.tokenizer import Tokenizer
    from plelab.vision.captions import TEMPLATES, fit_thresholds, make_captions, measure
    from plelab.vision.images import load_images
    from plelab.vision.patches import patch_grid, patchify

    if not 2 <= codebook <= MAX_CODEBOOK:
        raise CorpusError(f"codebook size must be in 2..{MAX_CODEBOOK}, got {codebook} (every visual tokenizer and "
                          "the codebook statistics grow with it)")
    out = Path(out)
    _check_output(out, images_path, overwrite)
    image_set = load_images(images_path)
    if image_set.labels is None:
        raise CorpusError(f"{image_set.source}: has no labels; captions name the digit, so a labelled set is needed")
    images, labels = image_set.images, image_set.labels
    grid = patch_grid(images.shape[1:], patch_size)
    bounds = split_bounds(len(images), heldout)
    parts = {s: slice(*bounds[s]) for s in SPLITS}

    # Imported only now: they load torch and the quantizer libraries, and bad images should fail fast.
    from plelab.vision.codebook_stats import codebook_report
    from plelab.vision.tokenizers import TOKENIZERS, make_tokenizer

    if tokenizer_kind not in TOKENIZERS:
        raise CorpusError(f"unknown visual tokenizer {tokenizer_kind!r}; choose one of {', '.join(TOKENIZERS)}")
    visual = None if reuse_tokenizer is None else _reused_tokenizer(reuse_tokenizer, tokenizer_kind, codebook,
                                                                     patch_size)

    if visual is None:
        _note(progress, f"fitting {tokenizer_kind} (K={codebook}, {patch_size}x{patch_size} patches) on "
                        f"{bounds['train'][1]} training images of {image_set.source}")
        visual = make_tokenizer(tokenizer_kind, codebook, patch_size=patch_size, seed=seed).fit(images[parts["train"]])
    patch_ids = {s: np.asarray(visual.encode(images[parts[s]], patch_size=patch_size), dtype=np.int64) for s in SPLITS}

    _note(progress, "captioning and training the caption tokenizer on the training captions")
    thresholds = fit_thresholds(measure(images[parts["train"]]))
    captions = {s: make_captions(images[parts[s]], labels[parts[s]], thresholds, seed=[seed, i])
                for i, s in enumerate(SPLITS)}
    caption_tok = Tokenizer.train_bpe(captions["train"], CAPTION_VOCAB)
    rows = {s: caption_rows(caption_tok, captions[s]) for s in SPLITS}
    width = max(len(r) for s in SPLITS for r in rows[s])
    encoded = {s: pad_rows(rows[s], width, caption_tok.pad_id) for s in SPLITS}

    _note(progress, "measuring the codebook on the held-out split")
    report = codebook_report(visual, images[parts["valid"]], labels[parts["valid"]])

    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "images": str(images_path),
        "images_sha256": _images_sha256(images, labels),
        "image_shape": list(images.shape[1:]),
        "tokenizer_kind": tokenizer_kind,
        "codebook": int(codebook),
        "patch_size": int(patch_size),
        "patch_grid": list(grid),
        "patches_per_image": grid[0] * grid[1],
        "patch_dim": patch_size * patch_size,
        "seed": int(seed),
        "heldout": int(heldout),
        "splits": {s: {"start": a, "stop": b, "n": b - a} for s, (a, b) in bounds.items()},
        "visual_tokenizer": VISUAL_TOKENIZER_DIR,
        "caption_tokenizer": CAPTION_TOKENIZER_FILE,
        "caption_vocab_size": caption_tok.vocab_size,
        "caption_length": width,
        "pad_id": caption_tok.pad_id,
        "bos_id": caption_tok.eot_id,
        "eos_id": caption_tok.eot_id,
        "caption_templates": len(TEMPLATES),
        "caption_thresholds": thresholds,
        "tokenizer_reused_from": None if reuse_tokenizer is None else str(reuse_tokenizer),
        "codebook_report_split": "valid",
        "codebook_report": report,
        "arrays": {},
        "files": {},
    }
    with staging_dir(out, overwrite) as tmp:
        visual.save(tmp / VISUAL_TOKENIZER_DIR)
        _save_text(tmp / CAPTION_TOKENIZER_FILE, caption_tok.to_json())
        for s in SPLITS:
            arrays = {
                "pixels": patchify(images[parts[s]], patch_size),
                "patch_ids": patch_ids[s],
                "captions": encoded[s][0],
                "caption_lengths": encoded[s][1],
                "labels": labels[parts[s]],
            }
            _note(progress, f"writing {s}: {len(arrays['labels'])} images")
            for name, array in arrays.items():
                _save_array(tmp / s / f"{name}.npy", array)
                manifest["arrays"][f"{s}/{name}"] = {"shape": list(array.shape), "dtype": str(array.dtype)}
            _save_text(tmp / s / "captions.txt", "".join(c + "\n" for c in captions[s]))
        manifest["files"] = {f.relative_to(tmp).as_posix(): sha256_file(f)
                             for f in sorted(tmp.rglob("*")) if f.is_file()}
        _save_text(tmp / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def read_manifest(path: str | Path) -> dict:
    """The manifest of a corpus folder; CorpusError (one line) if it is missing or not a vision corpus."""
    p = Path(path) / "manifest.json"
    try:
        manifest = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CorpusError(f"{path}: not a vision corpus (no manifest.json); make one with `plelab vision prepare`"
                          ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorpusError(f"{p}: unreadable manifest ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CorpusError(f"{p}: not a {FORMAT} manifest")
    if manifest.get("version") != VERSION:
        raise CorpusError(f"{p}: corpus format version {manifest.get('version')}, this plelab reads {VERSION}")
    return manifest


def verify_file(root: Path, relpath: str, manifest: dict) -> Path:
    """The path of a corpus file whose sha256 matches the manifest; CorpusError naming it otherwise."""
    p = root / relpath
    want = manifest["files"].get(relpath)
    if want is None:
        raise CorpusError(f"{root}: manifest lists no {relpath}")
    if not p.is_file():
        raise CorpusError(f"{p}: missing from the corpus")
    if sha256_file(p) != want:
        raise CorpusError(f"{p}: sha256 does not match the manifest (file changed or corrupt); prepare the corpus "
                          "again")
    return p


@dataclass
class VisionCorpus:
    """One split of a prepared corpus: patch pixels, patch ids, caption ids, lengths, labels and the manifest."""

    pixels: np.ndarray
    patch_ids: np.ndarray
    captions: np.ndarray
    caption_lengths: np.ndarray
    labels: np.ndarray
    manifest: dict
    split: str
    path: Path

    @classmethod
    def load(cls, path: str | Path, split: str = "train") -> VisionCorpus:
        """Load a split, verifying every file's sha256 and every array's shape, dtype and range."""
        root = Path(path)
        manifest = read_manifest(root)
        if split not in SPLITS:
            raise CorpusError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
        arrays = {}
        for name in ARRAYS:
            rel = f"{split}/{name}.npy"
            p = verify_file(root, rel, manifest)
            try:
                arrays[name] = np.load(p, allow_pickle=False)
            except (OSError, ValueError, EOFError) as exc:
                raise CorpusError(f"{p}: unreadable array ({exc})") from exc
            want = manifest["arrays"].get(f"{split}/{name}", {})
            got = {"shape": list(arrays[name].shape), "dtype": str(arrays[name].dtype)}
            if got != want:
                raise CorpusError(f"{p}: array is {got['dtype']} {got['shape']}, manifest says "
                                  f"{want.get('dtype')} {want.get('shape')}")
        corpus = cls(**arrays, manifest=manifest, split=split, path=root)
        corpus._check()
        return corpus

    def _check(self) -> None:
        m, n = self.manifest, len(self.labels)
        P, D, K, T = m["patches_per_image"], m["patch_dim"], m["codebook"], m["caption_length"]
        expected = {"pixels": (n, P, D), "patch_ids": (n, P), "captions": (n, T), "caption_lengths": (n,)}
        for name, shape in expected.items():
            if getattr(self, name).shape != shape:
                raise CorpusError(f"{self.path}/{self.split}/{name}.npy: shape {getattr(self, name).shape}, "
                                  f"expected {shape} from the manifest")
        if n and (self.patch_ids.min() < 0 or self.patch_ids.max() >= K):
            raise CorpusError(f"{self.path}/{self.split}: patch ids outside [0, {K})")
        if n and (self.captions.min() < 0 or self.captions.max() >= m["caption_vocab_size"]):
            raise CorpusError(f"{self.path}/{self.split}: caption ids outside the caption vocabulary")
        if n and (self.caption_lengths.min() < 2 or self.caption_lengths.max() > T):
            raise CorpusError(f"{self.path}/{self.split}: caption lengths outside [2, {T}]")

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def pad_id(self) -> int:
        """Caption padding id."""
        return int(self.manifest["pad_id"])

    @property
    def bos_id(self) -> int:
        """Id that starts every caption."""
        return int(self.manifest["bos_id"])

    def caption_tokenizer(self):
        """The caption `plelab.data.tokenizer.Tokenizer` (verified against the manifest)."""
        from plelab.data.tokenizer import Tokenizer

        return Tokenizer.load(verify_file(self.path, self.manifest["caption_tokenizer"], self.manifest))

    def visual_tokenizer(self):
        """The fitted visual tokenizer this corpus was encoded with."""
        from plelab.vision.tokenizers import load_tokenizer

        return load_tokenizer(self.path / self.manifest["visual_tokenizer"])
