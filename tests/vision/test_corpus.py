"""The tokenized corpus: round trip, determinism, refusal to overwrite, verification of every file on load."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from plelab.errors import PlelabError
from plelab.vision.captions import DIGIT_WORDS
from plelab.vision.corpus import CorpusError, VisionCorpus, prepare_corpus, read_manifest, split_bounds
from plelab.vision.patches import patchify


def synthetic_digits(n: int = 40, side: int = 28, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`n` images of random blobs and strokes with labels 0..9: enough variety for tertiles and tokenizers."""
    rng = np.random.default_rng(seed)
    images = np.zeros((n, side, side), np.uint8)
    for img in images:
        top, height = rng.integers(0, side // 2), rng.integers(side // 3, side // 2)
        left, width = rng.integers(0, side // 2), rng.integers(1, side // 3)
        img[top:top + height, left:left + width] = rng.integers(100, 256)
    return images, np.arange(n, dtype=np.int64) % 10


@pytest.fixture(scope="module")
def images_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("images") / "digits.npz"
    images, labels = synthetic_digits()
    np.savez(path, images=images, labels=labels)
    return path


@pytest.fixture(scope="module")
def corpus_dir(images_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus") / "c"
    prepare_corpus(images_file, "random", 8, out, heldout=10)
    return out


def test_round_trip(images_file, corpus_dir):
    images, labels = synthetic_digits()
    m = read_manifest(corpus_dir)
    assert (m["tokenizer_kind"], m["codebook"], m["patch_size"], m["patches_per_image"]) == ("random", 8, 7, 16)
    assert m["splits"] == {"train": {"start": 0, "stop": 30, "n": 30}, "valid": {"start": 30, "stop": 40, "n": 10}}
    for split, part in (("train", slice(0, 30)), ("valid", slice(30, 40))):
        c = VisionCorpus.load(corpus_dir, split)
        assert len(c) == part.stop - part.start
        np.testing.assert_array_equal(c.pixels, patchify(images[part], 7))
        np.testing.assert_array_equal(c.labels, labels[part])
        assert c.patch_ids.dtype == np.int64 and c.patch_ids.shape == (len(c), 16) and c.patch_ids.max() < 8
        np.testing.assert_array_equal(c.patch_ids, c.visual_tokenizer().encode(images[part]))
        tok = c.caption_tokenizer()
        texts = (corpus_dir / split / "captions.txt").read_text().splitlines()
        for row, length, text, label in zip(c.captions, c.caption_lengths, texts, c.labels, strict=True):
            assert row[0] == c.bos_id == tok.eot_id and row[length - 1] == m["eos_id"]
            assert (row[length:] == c.pad_id).all()
            assert tok.decode(row[1:length - 1]) == text
            assert [w for w in re.findall(r"[a-z]+", text) if w in DIGIT_WORDS] == [DIGIT_WORDS[label]]
    assert set(m["codebook_report"]) >= {"usage_perplexity", "codes_used_fraction", "mi_bits", "mi_bits_random"}
    assert set(m["caption_thresholds"]) == {"thickness", "slant", "size", "position", "ink"}


def test_two_prepares_write_identical_files(images_file, corpus_dir, tmp_path):
    again = tmp_path / "again"
    prepare_corpus(images_file, "random", 8, again, heldout=10)
    first = sorted(p.relative_to(corpus_dir) for p in corpus_dir.rglob("*") if p.is_file())
    assert first == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    for rel in first:
        assert (corpus_dir / rel).read_bytes() == (again / rel).read_bytes(), rel


def test_caption_tokenizer_does_not_depend_on_the_visual_tokenizer(images_file, corpus_dir, tmp_path):
    other = tmp_path / "other"
    prepare_corpus(images_file, "random", 16, other, heldout=10, seed=0)
    for rel in ("caption_tokenizer.json", "train/captions.npy", "valid/captions.npy"):
        assert (other / rel).read_bytes() == (corpus_dir / rel).read_bytes()


def test_refuses_existing_output_unless_overwrite(images_file, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(PlelabError, match="not empty"):
        prepare_corpus(images_file, "random", 8, out, heldout=10)
    with pytest.raises(PlelabError, match="not a prepared corpus"):
        prepare_corpus(images_file, "random", 8, out, heldout=10, overwrite=True)
    assert (out / "keep.txt").read_text() == "mine"
    (out / "keep.txt").unlink()
    prepare_corpus(images_file, "random", 8, out, heldout=10)
    with pytest.raises(PlelabError, match="--overwrite"):
        prepare_corpus(images_file, "random", 8, out, heldout=10)
    prepare_corpus(images_file, "random", 4, out, heldout=10, overwrite=True)
    assert read_manifest(out)["codebook"] == 4
    assert not list(tmp_path.glob(".out.*"))  # no staging leftovers


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"tokenizer_kind": "sift"}, "unknown visual tokenizer"),
    ({"codebook": 1}, "in 2..65536"),
    ({"codebook": 10**12}, "in 2..65536"),
    ({"heldout": 40}, "heldout"),
    ({"patch_size": 5}, "divide"),
])
def test_bad_arguments_are_one_line(images_file, tmp_path, kwargs, match):
    args = {"images_path": images_file, "tokenizer_kind": "random", "codebook": 8, "out": tmp_path / "o",
            "heldout": 10, **kwargs}
    with pytest.raises(PlelabError, match=match) as exc:
        prepare_corpus(**args)
    assert "\n" not in str(exc.value)
    assert not (tmp_path / "o").exists()


def test_unlabelled_images_are_refused(tmp_path):
    path = tmp_path / "nolabels.npz"
    np.savez(path, images=synthetic_digits()[0])
    with pytest.raises(CorpusError, match="no labels"):
        prepare_corpus(path, "random", 8, tmp_path / "o", heldout=10)


def test_split_bounds():
    assert split_bounds(10, 3) == {"train": (0, 7), "valid": (7, 10)}
    for bad in (0, 10):
        with pytest.raises(CorpusError):
            split_bounds(10, bad)


def copy_corpus(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_load_detects_corruption(corpus_dir, tmp_path):
    c = copy_corpus(corpus_dir, tmp_path / "c")
    ids = np.load(c / "train" / "patch_ids.npy")
    ids[0, 0] = (ids[0, 0] + 1) % 8
    np.save(c / "train" / "patch_ids.npy", ids)
    with pytest.raises(CorpusError, match="sha256") as exc:
        VisionCorpus.load(c, "train")
    assert "patch_ids.npy" in str(exc.value) and "\n" not in str(exc.value)
    VisionCorpus.load(c, "valid")  # the other split is intact
    (c / "valid" / "labels.npy").unlink()
    with pytest.raises(CorpusError, match="missing"):
        VisionCorpus.load(c, "valid")
    with pytest.raises(CorpusError, match="unknown split"):
        VisionCorpus.load(corpus_dir, "test")
    with pytest.raises(CorpusError, match="no manifest"):
        VisionCorpus.load(tmp_path, "train")
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(CorpusError, match="unreadable manifest"):
        VisionCorpus.load(tmp_path, "train")


def test_load_checks_shapes_against_the_manifest(corpus_dir, tmp_path):
    c = copy_corpus(corpus_dir, tmp_path / "c")
    m = json.loads((c / "manifest.json").read_text())
    m["arrays"]["train/captions"]["shape"][1] += 1
    (c / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(CorpusError, match="manifest says"):
        VisionCorpus.load(c, "train")


@pytest.mark.slow
def test_full_mnist_prepare_is_deterministic(shared_data, tmp_path):
    """The study's default corpus (MNIST, dct-kmeans, K = 256) twice: byte-identical files."""
    for out in ("a", "b"):
        prepare_corpus(shared_data / "images" / "mnist", "dct-kmeans", 256, tmp_path / out)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    for rel in files:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel
    m = read_manifest(tmp_path / "a")
    assert m["codebook_report"]["mi_bits"] > 5 * m["codebook_report"]["mi_bits_random"]


def test_mnist_subset(shared_data, tmp_path):
    from plelab.vision.images import load_images

    mnist = load_images(shared_data / "images" / "mnist")
    path = tmp_path / "mnist300.npz"
    np.savez(path, images=mnist.images[:300], labels=mnist.labels[:300])
    m = prepare_corpus(path, "random", 16, tmp_path / "c", heldout=100)
    c = VisionCorpus.load(tmp_path / "c", "valid")
    assert c.pixels.shape == (100, 16, 49) and m["caption_vocab_size"] <= 512
    assert (c.caption_lengths > 10).all()
    assert m["codebook_report"]["mi_bits"] < 0.05  # random ids say nothing about the digit
