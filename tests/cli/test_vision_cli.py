"""`plelab vision prepare` through the real CLI: a summary or JSON on success, and every bad input -> one line
on stderr, exit 2."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from plelab.cli.main import main
from plelab.cli.vision import TOKENIZER_CHOICES

REPO = Path(__file__).resolve().parents[2]


def digits(n: int = 40, side: int = 28) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    images = np.zeros((n, side, side), np.uint8)
    for img in images:
        top, left = rng.integers(0, side // 2, size=2)
        img[top:top + rng.integers(6, side // 2), left:left + rng.integers(1, 6)] = rng.integers(100, 256)
    return images, np.arange(n, dtype=np.int64) % 10


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("img") / "digits.npz"
    np.savez(path, images=digits()[0], labels=digits()[1])
    return path


def prepare_argv(images, out, *extra: str) -> list[str]:
    return ["vision", "prepare", "--images", str(images), "--tokenizer", "random", "--codebook", "8",
            "--heldout", "10", "--out", str(out), *extra]


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(argv, capsys, *words: str) -> str:
    code, out, err = run(argv, capsys)
    assert code == 2, (code, out, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err
    return err


def test_choices_are_the_tokenizer_kinds():
    from plelab.vision.tokenizers import TOKENIZERS

    assert TOKENIZER_CHOICES == tuple(TOKENIZERS)


def test_help_has_an_example(capsys):
    code, out, _ = run(["vision", "prepare", "--help"], capsys)
    assert code == 0 and "Example" in out and "plelab vision prepare --images" in out and "--codebook" in out


def test_prepare_prints_a_summary_and_progress(images, tmp_path, capsys):
    code, out, err = run(prepare_argv(images, tmp_path / "c"), capsys)
    assert code == 0, err
    assert "30 train + 10 valid images of 28x28, 16 patches of 7x7" in out and "MI(patch id; digit)" in out
    assert "plelab vision: fitting random" in err
    code, out, _ = run(prepare_argv(images, tmp_path / "j", "--json"), capsys)
    assert code == 0 and json.loads(out)["codebook"] == 8


def test_reused_tokenizer_must_match(images, tmp_path, capsys):
    assert run(prepare_argv(images, tmp_path / "c"), capsys)[0] == 0
    code, _, err = run(prepare_argv(images, tmp_path / "again", "--reuse-tokenizer", str(tmp_path / "c")), capsys)
    assert code == 0 and "fitting" not in err
    assert (tmp_path / "c" / "train" / "patch_ids.npy").read_bytes() == \
        (tmp_path / "again" / "train" / "patch_ids.npy").read_bytes()
    assert_one_line_error(prepare_argv(images, tmp_path / "p4", "--patch-size", "4", "--reuse-tokenizer",
                                       str(tmp_path / "c")), capsys, "7x7 patches", "4x4")
    assert_one_line_error(["vision", "prepare", "--images", str(images), "--tokenizer", "random", "--codebook", "16",
                           "--heldout", "10", "--out", str(tmp_path / "k"), "--reuse-tokenizer", str(tmp_path / "c")],
                          capsys, "K = 8")


def bad_files(folder: Path) -> dict[str, tuple[Path, tuple[str, ...]]]:
    """name -> (an image source that must be refused, words the error must contain)."""
    images, labels = digits()
    made = {}
    p = folder / "float.npz"
    np.savez(p, images=images.astype(np.float32), labels=labels)
    made["wrong dtype"] = (p, ("uint8", "float32"))
    p = folder / "rgb.npz"
    np.savez(p, images=np.repeat(images[..., None], 3, axis=3), labels=labels)
    made["wrong shape"] = (p, ("(N, H, W)",))
    p = folder / "empty-images-idx3-ubyte.gz"
    p.write_bytes(b"")
    made["empty file"] = (p, ("empty file",))
    p = folder / "cut-images-idx3-ubyte.gz"
    p.write_bytes(gzip.compress(b"\x00\x00\x08\x03" + (40).to_bytes(4, "big") + (28).to_bytes(4, "big") * 2
                                + images.tobytes())[:-50])
    made["corrupt gzip"] = (p, ("gzip",))
    p = folder / "short-images-idx3-ubyte"
    p.write_bytes(b"\x00\x00\x08\x03" + (40).to_bytes(4, "big") + (28).to_bytes(4, "big") * 2 + images.tobytes()[:99])
    made["truncated idx"] = (p, ("truncated",))
    p = folder / "photo.png"
    p.write_bytes(b"\x89PNG\r\n\x1a\n but not really")
    made["corrupt picture"] = (p, ("not a readable image",))
    p = folder / "loop"
    p.symlink_to(folder / "loop-back")
    (folder / "loop-back").symlink_to(p)
    made["symlink loop"] = (p, ("symbolic link",))
    return made


@pytest.mark.parametrize("case", ["wrong dtype", "wrong shape", "empty file", "corrupt gzip", "truncated idx",
                                  "corrupt picture", "symlink loop"])
def test_bad_images_are_one_line_exit_2(case, tmp_path, capsys):
    path, words = bad_files(tmp_path)[case]
    assert_one_line_error(prepare_argv(path, tmp_path / "out"), capsys, str(path.name), *words)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("flags", "words"), [
    (["--tokenizer", "sift"], ("--tokenizer", "invalid choice")),
    (["--codebook", "1"], ("--codebook", "[2, 65536]")),
    (["--codebook", "100000000"], ("--codebook", "[2, 65536]", "100000000")),
    (["--patch-size", "5"], ("28x28", "5x5")),
    (["--heldout", "40"], ("--heldout",)),
])
def test_bad_options_are_one_line_exit_2(flags, words, images, tmp_path, capsys):
    assert_one_line_error([*prepare_argv(images, tmp_path / "out"), *flags], capsys, *words)


def test_existing_output_needs_overwrite(images, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("keep")
    assert_one_line_error(prepare_argv(images, tmp_path / "out"), capsys, "--overwrite")
    assert_one_line_error(prepare_argv(images, images.parent), capsys, "inside the output folder")


def test_unlabelled_images_are_refused(tmp_path, capsys):
    path = tmp_path / "nolabels.npz"
    np.savez(path, images=digits()[0])
    assert_one_line_error(prepare_argv(path, tmp_path / "out"), capsys, "no labels")


def test_console_entry_point_reports_one_line(tmp_path):
    """The real process: exit status 2 and one stderr line, no traceback."""
    path, _ = bad_files(tmp_path)["empty file"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "plelab", *prepare_argv(path, tmp_path / "o")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "empty file" in proc.stderr, proc.stderr
