"""Visual tokenizers: deterministic fit/encode per seed, ids in [0, K), verified save/load, one-line errors.

Synthetic 28x28 "digits" (a bar whose place and angle depend on the label, plus noise) keep these fast; the
fit settings are cut down (`FAST`) so each kind fits in about a second.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from shared_data_helpers import SHARED_DATA

from plelab.errors import PlelabError
from plelab.vision.patches import PatchError
from plelab.vision.tokenizers import TOKENIZERS, TokenizerError, load_tokenizer, make_tokenizer

K = 16
FAST = {"vqvae": {"steps": 30, "batch_size": 256}, "lfq": {"steps": 30, "batch_size": 256},
        "bsq": {"steps": 30, "batch_size": 256}, "dct-kmeans": {"kmeans_n_init": 1},
        "features-kmeans": {"kmeans_n_init": 1}, "random": {}}


def synthetic_images(n: int, seed: int = 0, size: int = 28) -> np.ndarray:
    """(n, size, size) uint8: a bright bar whose row and slope follow n's label (i % 10), plus noise."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 40, size=(n, size, size)).astype(np.uint8)
    cols = np.arange(size)
    for i in range(n):
        label = i % 10
        rows = np.clip((2 + 2 * label + (label % 3 - 1) * cols / 3).astype(int), 0, size - 1)
        images[i, rows, cols] = 255
    return images


IMAGES = synthetic_images(120)


def fit(kind: str, seed: int = 0, images: np.ndarray = IMAGES):
    return make_tokenizer(kind, K, 7, seed, **FAST[kind]).fit(images)


@pytest.fixture(scope="module", params=TOKENIZERS)
def fitted(request):
    return fit(request.param)


def test_fit_is_deterministic_and_ids_are_in_range(fitted):
    ids = fitted.encode(IMAGES)
    assert ids.shape == (len(IMAGES), 16) and ids.dtype == np.int64
    assert ids.min() >= 0 and ids.max() < K
    np.testing.assert_array_equal(fit(fitted.kind).encode(IMAGES), ids)  # a second fit, same seed
    np.testing.assert_array_equal(fitted.encode(IMAGES), ids)
    assert (fitted.kind, fitted.codebook, fitted.patch_size, fitted.image_shape) == (fitted.kind, K, 7, (28, 28))


def test_save_load_round_trip_gives_identical_ids(fitted, tmp_path):
    fitted.save(tmp_path / "tok")
    loaded = load_tokenizer(tmp_path / "tok", kind=fitted.kind, patch_size=7)
    assert (loaded.kind, loaded.codebook, loaded.patch_size, loaded.image_shape, loaded.settings()) == \
        (fitted.kind, K, 7, (28, 28), fitted.settings())
    np.testing.assert_array_equal(loaded.encode(IMAGES), fitted.encode(IMAGES))
    recon = fitted.reconstruct(IMAGES[:5])
    if recon is None:
        assert loaded.reconstruct(IMAGES[:5]) is None
    else:
        np.testing.assert_array_equal(loaded.reconstruct(IMAGES[:5]), recon)


def test_learned_tokenizers_use_more_than_one_code_and_reconstruct():
    tok = fit("dct-kmeans")
    assert len(np.unique(tok.encode(IMAGES))) > K // 2
    recon = tok.reconstruct(IMAGES)
    assert recon.shape == (len(IMAGES), 16, 49) and 0.0 <= recon.min() and recon.max() <= 1.0
    assert fit("random").reconstruct(IMAGES) is None and fit("features-kmeans").reconstruct(IMAGES) is None


def test_random_ids_depend_on_the_seed_not_on_the_pixels():
    tok = fit("random")
    np.testing.assert_array_equal(tok.encode(IMAGES), tok.encode(255 - IMAGES))
    assert not np.array_equal(tok.encode(IMAGES), fit("random", seed=1).encode(IMAGES))


def test_ids_do_not_depend_on_the_callers_thread_count():
    import torch

    def ids() -> np.ndarray:  # 150 steps: enough for 1 and 2 threads to end in other codebooks if not pinned
        return make_tokenizer("vqvae", K, steps=150, batch_size=256).fit(IMAGES).encode(IMAGES)

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = ids()
        assert torch.get_num_threads() == 2  # restored after fit and encode
        torch.set_num_threads(1)
        np.testing.assert_array_equal(ids(), two)
    finally:
        torch.set_num_threads(before)


def test_seed_changes_a_learned_fit():
    assert not np.array_equal(fit("vqvae").encode(IMAGES), fit("vqvae", seed=1).encode(IMAGES))


def test_a_second_save_replaces_the_first(tmp_path):
    fit("dct-kmeans").save(tmp_path)
    other = fit("dct-kmeans", seed=3).save(tmp_path)
    assert len(list(other.glob("weights-*.safetensors"))) == 1
    np.testing.assert_array_equal(load_tokenizer(tmp_path).encode(IMAGES), fit("dct-kmeans", seed=3).encode(IMAGES))


def one_line(err: pytest.ExceptionInfo) -> str:
    assert isinstance(err.value, PlelabError)
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize(("args", "match"), [
    (("vqvae", 1), "codebook size"),
    (("random", 0), "codebook size"),
    (("dct-kmeans", True), "codebook size"),
    (("lfq", 12), "power of two"),
    (("bsq", 100), "power of two"),
    (("vqvae", 16, 0), "patch size"),
    (("vqvae", 16, 7, -1), "seed"),
    (("siglip", 16), "unknown visual tokenizer"),
])
def test_bad_construction_is_a_one_line_error(args, match):
    with pytest.raises(TokenizerError, match=match) as err:
        make_tokenizer(*args)
    one_line(err)


def test_bad_options_are_one_line_errors():
    with pytest.raises(TokenizerError, match="no option") as err:
        make_tokenizer("dct-kmeans", 16, steps=3)
    one_line(err)
    with pytest.raises(TokenizerError, match="positive integer") as err:
        make_tokenizer("vqvae", 16, steps=0)
    one_line(err)


def test_wrong_images_are_one_line_errors():
    tok = fit("random")
    for bad, error, match in [(IMAGES[0], PatchError, "shape"), (IMAGES.astype(np.int32), PatchError, "dtype"),
                              (synthetic_images(4, size=14), TokenizerError, "fitted on 28x28")]:
        with pytest.raises(error, match=match) as err:
            tok.encode(bad)
        one_line(err)
    with pytest.raises(TokenizerError, match="patch size 7, not 4") as err:
        tok.encode(IMAGES, patch_size=4)
    one_line(err)
    with pytest.raises(PatchError, match="divide") as err:
        make_tokenizer("dct-kmeans", 16, patch_size=5).fit(IMAGES)
    one_line(err)
    with pytest.raises(TokenizerError, match="not fitted") as err:
        make_tokenizer("dct-kmeans", 16).encode(IMAGES)
    one_line(err)
    with pytest.raises(TokenizerError, match="cannot fill") as err:
        make_tokenizer("dct-kmeans", 64).fit(IMAGES[:2])
    one_line(err)


def test_load_refuses_other_kind_patch_size_or_changed_files(tmp_path):
    saved = fit("dct-kmeans").save(tmp_path / "tok")
    with pytest.raises(TokenizerError, match="is 'dct-kmeans', not 'vqvae'") as err:
        load_tokenizer(saved, kind="vqvae")
    one_line(err)
    with pytest.raises(TokenizerError, match="patch size 7, not 4") as err:
        load_tokenizer(saved, patch_size=4)
    one_line(err)
    with pytest.raises(TokenizerError, match="no tokenizer.json") as err:
        load_tokenizer(tmp_path / "missing")
    one_line(err)
    meta_path = saved / "tokenizer.json"
    meta = json.loads(meta_path.read_text())
    meta["settings"]["dct_block"] = 3
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(TokenizerError, match="other dct-kmeans settings .*dct_block") as err:
        load_tokenizer(saved)
    one_line(err)
    weights = next(saved.glob("weights-*.safetensors"))
    blob = bytearray(weights.read_bytes())
    blob[-1] ^= 1
    weights.write_bytes(bytes(blob))
    with pytest.raises(TokenizerError, match="sha256") as err:
        load_tokenizer(saved)
    one_line(err)
    meta_path.write_text("{not json")
    with pytest.raises(TokenizerError, match="cannot read") as err:
        load_tokenizer(saved)
    one_line(err)


def test_a_missing_vision_dependency_is_a_one_line_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn.cluster", None)  # import of it now raises ImportError
    with pytest.raises(TokenizerError, match=r"plelab\[vision\]") as err:
        make_tokenizer("dct-kmeans", 16).fit(IMAGES)
    one_line(err)


def test_packaged_efficientnet_weights_fit_the_architecture():
    """The flower photo is a daisy to ImageNet EfficientNet-Lite0 (fails with the wrong padding or normalisation)."""
    photo = SHARED_DATA / "images" / "sklearn_photos" / "flower.jpg"
    if not photo.is_file():
        pytest.skip(f"photo not found at {photo} (set PLELAB_SHARED_DATA)")
    import torch
    from PIL import Image

    from plelab.vision.tokenizers.efficientnet import INPUT_MEAN, INPUT_STD, EfficientNetLite0

    rgb = np.asarray(Image.open(photo).convert("RGB").resize((224, 224), Image.BILINEAR), dtype=np.float32) / 255
    x = (torch.from_numpy(rgb).permute(2, 0, 1)[None] - INPUT_MEAN) / INPUT_STD
    with torch.inference_mode():
        assert int(EfficientNetLite0.pretrained()(x).argmax()) == 985  # ImageNet class "daisy"
