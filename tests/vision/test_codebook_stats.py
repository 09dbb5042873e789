"""Codebook statistics: the Miller-Madow MI estimator, and the random control's MI at its noise floor."""

from __future__ import annotations

import math

import numpy as np
import pytest
from shared_data_helpers import SHARED_DATA

from plelab.errors import PlelabError
from plelab.vision.codebook_stats import codebook_report, entropy_bits, mutual_information_bits
from plelab.vision.tokenizers import make_tokenizer

MNIST = SHARED_DATA / "images" / "mnist"


@pytest.fixture(scope="module")
def mnist():
    if not MNIST.is_dir():
        pytest.skip(f"MNIST not found at {MNIST} (set PLELAB_SHARED_DATA)")
    from plelab.vision.images import load_images

    data = load_images(MNIST)
    return data.images[:600], data.labels[:600]


def test_entropy_is_log2_of_a_uniform_support_plus_the_miller_madow_term():
    counts = np.full(8, 25)
    assert entropy_bits(counts, miller_madow=False) == pytest.approx(3.0)
    assert entropy_bits(counts) == pytest.approx(3.0 + 7 / (2 * 200) / math.log(2))
    assert entropy_bits(np.zeros(4)) == 0.0


def test_mi_of_a_variable_with_itself_is_its_entropy_and_the_correction_removes_the_bias():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 16, 2000)
    assert mutual_information_bits(x, x) == pytest.approx(entropy_bits(np.bincount(x)), abs=1e-9)
    y = rng.integers(0, 10, 2000)  # independent of x: true MI is 0
    plug_in = (entropy_bits(np.bincount(x), False) + entropy_bits(np.bincount(y), False)
               - entropy_bits(np.unique(x * 10 + y, return_counts=True)[1], False))
    assert plug_in > 0.03  # the plug-in bias, about (16-1)(10-1) / (2 N ln 2) = 0.049 bits
    assert abs(mutual_information_bits(x, y)) < 0.01
    with pytest.raises(PlelabError, match="paired"):
        mutual_information_bits(x, y[:-1])


def test_random_control_sits_at_its_floor_and_dct_kmeans_is_clearly_above(mnist):
    images, labels = mnist
    rand = codebook_report(make_tokenizer("random", 16).fit(images), images, labels)
    dct = codebook_report(make_tokenizer("dct-kmeans", 16, kmeans_n_init=1).fit(images), images, labels)
    assert abs(rand["mi_bits"]) < 0.01 and abs(rand["mi_bits"] - rand["mi_bits_random"]) < 0.01
    assert dct["mi_bits"] > dct["mi_bits_random"] + 0.05  # the floor scatters by about 0.005
    assert dct["mi_bits_per_position"] > dct["mi_bits_per_position_random"] + 0.1
    assert rand["codes_used_fraction"] == 1.0 and rand["usage_perplexity"] > 15.5
    assert rand["reconstruction_mse"] is None and 0.0 < dct["reconstruction_mse"] < 0.1
    assert 1.0 < dct["usage_perplexity"] <= 16.0


def test_report_without_labels_and_with_the_wrong_number_of_labels():
    images = np.random.default_rng(0).integers(0, 256, (20, 14, 14)).astype(np.uint8)
    tok = make_tokenizer("random", 4).fit(images)
    report = codebook_report(tok, images, None)
    assert report["mi_bits"] is None and report["patches"] == 80 and report["codebook"] == 4
    with pytest.raises(PlelabError, match="19 labels for 20 images"):
        codebook_report(tok, images, np.zeros(19))
