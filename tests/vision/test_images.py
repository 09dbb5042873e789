"""Image loading: MNIST idx (gz or not), scikit-learn digits csv, .npz, pictures; every bad input is one line."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from plelab.vision.images import ImageError, ImageSet, check_images, load_images

RNG = np.random.default_rng(0)
IMAGES = RNG.integers(0, 256, size=(5, 4, 6), dtype=np.uint8)
LABELS = np.array([3, 1, 4, 1, 5], dtype=np.int64)


def idx_bytes(array: np.ndarray, kind: int = 0x08) -> bytes:
    return struct.pack(">HBB", 0, kind, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()


def write_mnist(folder, gz: bool = True, images: np.ndarray = IMAGES, labels: np.ndarray | None = LABELS):
    suffix = ".gz" if gz else ""
    opener = gzip.open if gz else open
    path = folder / f"set-images-idx3-ubyte{suffix}"
    with opener(path, "wb") as f:
        f.write(idx_bytes(images))
    if labels is not None:
        with opener(folder / f"set-labels-idx1-ubyte{suffix}", "wb") as f:
            f.write(idx_bytes(labels.astype(np.uint8)))
    return path


def one_line_error(path, *words: str) -> str:
    with pytest.raises(ImageError) as exc:
        load_images(path)
    message = str(exc.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message
    return message


@pytest.mark.parametrize("gz", [True, False])
def test_idx_round_trip_with_labels(tmp_path, gz):
    path = write_mnist(tmp_path, gz)
    for source in (path, tmp_path):  # the file, or the folder holding it
        s = load_images(source)
        np.testing.assert_array_equal(s.images, IMAGES)
        np.testing.assert_array_equal(s.labels, LABELS)
        assert s.images.dtype == np.uint8 and s.labels.dtype == np.int64 and s.shape == (4, 6)


def test_idx_without_labels_file(tmp_path):
    assert load_images(write_mnist(tmp_path, labels=None)).labels is None


def test_idx_bad_inputs_name_the_file(tmp_path):
    path = tmp_path / "a-images-idx3-ubyte"
    path.write_bytes(idx_bytes(LABELS.astype(np.uint8)))  # a labels file under an images name
    one_line_error(path, str(path), "magic", "0x00000801")
    path.write_bytes(idx_bytes(IMAGES.astype(np.float32), kind=0x0D))
    one_line_error(path, "float", "unsigned bytes")
    path.write_bytes(idx_bytes(IMAGES)[:-7])
    one_line_error(path, "truncated")
    path.write_bytes(b"PK\x03\x04 definitely not idx")
    one_line_error(path, "not an idx file")
    path.write_bytes(b"")
    one_line_error(path, "empty file")
    gz = tmp_path / "b-images-idx3-ubyte.gz"
    gz.write_bytes(gzip.compress(idx_bytes(IMAGES))[:-20])
    one_line_error(gz, str(gz), "gzip")


def test_label_count_must_match(tmp_path):
    path = write_mnist(tmp_path, labels=LABELS[:3])
    one_line_error(path, "3 labels for 5 images")


def test_digits_csv_scales_0_16_to_uint8(tmp_path):
    pixels = RNG.integers(0, 17, size=(3, 64))
    pixels[0, 0], pixels[0, 1] = 16, 0
    rows = np.concatenate([pixels, [[7], [0], [9]]], axis=1)
    path = tmp_path / "digits.csv.gz"
    with gzip.open(path, "wt") as f:
        np.savetxt(f, rows, fmt="%d", delimiter=",")
    s = load_images(path)
    assert s.images.shape == (3, 8, 8) and s.images[0, 0, 0] == 255 and s.images[0, 0, 1] == 0
    np.testing.assert_array_equal(s.images.reshape(3, 64), np.round(pixels * 255 / 16).astype(np.uint8))
    np.testing.assert_array_equal(s.labels, [7, 0, 9])


@pytest.mark.parametrize(("text", "words"), [
    ("1,2,3\n", ["columns"]),                     # 2 pixels is no square
    (",".join(["17"] * 4 + ["1"]) + "\n", ["0..16"]),
    ("a,b,c,d,e\n", ["not a numeric csv"]),
])
def test_digits_csv_bad_inputs(tmp_path, text, words):
    path = tmp_path / "d.csv"
    path.write_text(text)
    one_line_error(path, str(path), *words)


def test_truncated_digits_csv_gz(tmp_path):
    path = tmp_path / "cut.csv.gz"
    path.write_bytes(gzip.compress(("0," * 64 + "1\n").encode() * 50)[:-12])
    one_line_error(path, str(path), "truncated gzip")


def test_npz_arrays_are_checked(tmp_path):
    path = tmp_path / "x.npz"
    np.savez(path, images=IMAGES, labels=LABELS)
    np.testing.assert_array_equal(load_images(path).labels, LABELS)
    np.savez(path, images=IMAGES.astype(np.float32))
    one_line_error(path, "uint8", "float32")
    np.savez(path, images=np.zeros((2, 4, 4, 3), np.uint8))
    one_line_error(path, "(N, H, W)")
    np.savez(path, images=IMAGES, labels=LABELS[:2])
    one_line_error(path, "labels")
    np.savez(path, pictures=IMAGES)
    one_line_error(path, "no array named 'images'")
    path.write_bytes(b"PK\x03\x04garbage")
    one_line_error(path, "not a readable .npz")


def test_pictures_become_grayscale(tmp_path):
    from PIL import Image

    rgb = np.zeros((6, 10, 3), np.uint8)
    rgb[..., 0] = 255
    Image.fromarray(rgb).save(tmp_path / "red.png")
    s = load_images(tmp_path / "red.png")
    assert s.images.shape == (1, 6, 10) and s.images.dtype == np.uint8 and s.labels is None
    assert int(s.images[0, 0, 0]) == 76  # ITU-R 601 luma of pure red
    Image.fromarray(rgb[:3]).save(tmp_path / "small.png")
    one_line_error(tmp_path, "different sizes")
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    one_line_error(bad, str(bad), "not a readable image")


def test_folders(tmp_path):
    one_line_error(tmp_path, "no images found")
    write_mnist(tmp_path)
    np.savez(tmp_path / "also.npz", images=IMAGES)
    one_line_error(tmp_path, "several image sets")
    one_line_error(tmp_path / "missing", "no such file")


@pytest.mark.parametrize("bad", [IMAGES.astype(np.int16), IMAGES[0], np.zeros((0, 4, 4), np.uint8), [[[1]]]])
def test_check_images_refuses_wrong_arrays(bad):
    with pytest.raises(ImageError):
        check_images(bad)
    with pytest.raises(ImageError):
        ImageSet(bad, None, "test")


def test_real_image_sets(shared_data):
    mnist = load_images(shared_data / "images" / "mnist")
    assert mnist.images.shape == (10000, 28, 28) and mnist.labels.shape == (10000,)
    assert set(np.unique(mnist.labels)) == set(range(10))
    digits = load_images(shared_data / "images" / "sklearn_digits")
    assert digits.images.shape == (1797, 8, 8) and digits.images.max() == 255
    photos = load_images(shared_data / "images" / "sklearn_photos")
    assert photos.images.shape == (2, 427, 640) and photos.labels is None
