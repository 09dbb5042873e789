"""The n-gram hash: Python, NumPy and torch pinned to the frozen vectors of docs/ngram-ple-vectors.json, agreeing
on random input, rows sizes refused where they hash badly, and the token-id compression map."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from plelab.data.tokenizer import Tokenizer
from plelab.model import load_model_config
from plelab.model.ngram import (
    PAD_ID,
    NgramError,
    NgramLayout,
    build_id_map,
    canonical_form,
    default_rows,
    fmix32,
    hash_rows_numpy,
    hash_rows_python,
    id_map_document,
    is_prime,
    multiplier,
    read_id_map,
    rows_problem,
)
from plelab.model.ple_index import NgramHash
from plelab.util.dataclass_config import ConfigError

VECTORS = json.loads((Path(__file__).resolve().parents[2] / "docs" / "ngram-ple-vectors.json").read_text())
CASES = VECTORS["cases"]


def layout_of(case: dict) -> NgramLayout:
    return NgramLayout(tuple(case["orders"]), case["heads"], tuple(case["rows"]), case["seed"])


def test_fmix32_is_murmurhash3s_finaliser():
    # 0x514E28B7 is MurmurHash3's published fmix32(1); 0 is its fixed point.
    assert fmix32(1) == 0x514E28B7 and fmix32(0) == 0
    for x, want in VECTORS["fmix32"]:
        assert fmix32(x) == want


def test_multipliers_are_the_frozen_odd_values():
    for seed, n, k, i, want in VECTORS["multiplier"]:
        assert multiplier(seed, n, k, i) == want and want % 2 == 1


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_python_numpy_and_torch_give_the_frozen_rows(case):
    layout = layout_of(case)
    assert layout.offsets == case["offsets"]
    assert layout.multipliers() == case["multipliers"]
    want = case["table_rows"]
    assert hash_rows_python(case["ids"], layout) == want
    assert hash_rows_numpy(np.array(case["ids"]), layout).tolist() == want
    assert NgramHash(layout)(torch.tensor([case["ids"]]))[0].tolist() == want


def test_a_layout_keeps_each_heads_rows_contiguous_and_in_range():
    case = CASES[0]
    layout = layout_of(case)
    rows = np.array(case["table_rows"])
    for j, (offset, size) in enumerate(zip(layout.offsets, layout.head_rows, strict=True)):
        assert ((rows[:, j] >= offset) & (rows[:, j] < offset + size)).all()
    assert layout.total_rows == sum(layout.head_rows) == 2 * 1009 + 2 * 1013


def test_positions_before_the_start_hash_the_pad_id():
    layout = NgramLayout((2,), 1, (1009,), 7)
    first = hash_rows_python([42], layout)[0]
    # By hand: h = PAD * m(2,0,1) XOR 42 * m(2,0,0), all modulo 2**32.
    h = ((42 * multiplier(7, 2, 0, 0)) & 0xFFFFFFFF) ^ ((PAD_ID * multiplier(7, 2, 0, 1)) & 0xFFFFFFFF)
    assert first == [fmix32(h) % 1009]
    # A real id in the pad's place gives another row (the pad is not id 0).
    assert hash_rows_python([0, 42], layout)[1] != first


def test_the_three_implementations_agree_on_random_sequences():
    rng = np.random.default_rng(0)
    for _ in range(20):
        orders = tuple(sorted(rng.choice(np.arange(1, 9), size=rng.integers(1, 4), replace=False).tolist()))
        rows = tuple(int(r) for r in rng.choice([2, 3, 1009, 65537, 4294967291], size=len(orders)))
        layout = NgramLayout(orders, int(rng.integers(1, 5)), rows, int(rng.integers(0, 2**32)))
        ids = rng.integers(0, 2**32 - 1, size=(2, 13), dtype=np.int64)
        want = np.array([hash_rows_python(seq.tolist(), layout) for seq in ids])
        assert (hash_rows_numpy(ids, layout) == want).all()
        assert (NgramHash(layout)(torch.from_numpy(ids)).numpy() == want).all()


def test_torch_hash_of_a_suffix_is_the_tail_of_the_whole_hash():
    layout = layout_of(CASES[1])
    ids = torch.tensor([CASES[1]["ids"]])
    assert NgramHash(layout)(ids, skip=3)[0].tolist() == CASES[1]["table_rows"][3:]


def test_hashed_rows_spread_like_a_random_function_on_real_text(shared_data):
    # Distinct n-grams of real text (words numbered in order of appearance) fill a head's rows as uniformly random
    # rows would: the share of distinct n-grams that share their row with another one is the birthday
    # expectation, within 6 binomial standard errors, for every head of both orders.
    words = (shared_data / "valid" / "en_novel.txt").read_text(encoding="utf-8")[:1_500_000].split()
    numbering: dict[str, int] = {}
    ids = np.array([numbering.setdefault(w, len(numbering)) for w in words], dtype=np.int64)
    layout = NgramLayout((2, 3), 3, (65537, 65537), 0)
    rows = hash_rows_numpy(ids, layout)
    for j, (n, _) in enumerate(layout.head_keys):
        grams = np.stack([ids[n - 1 - i : len(ids) - i] for i in range(n)], axis=1)
        first = np.unique(grams, axis=0, return_index=True)[1] + n - 1  # positions where each n-gram ends
        count = len(first)
        expected = 1 - (1 - 1 / 65537) ** (count - 1)
        _, inverse, per_row = np.unique(rows[first, j], return_inverse=True, return_counts=True)
        shared = (per_row[inverse] > 1).mean()
        assert count > 20_000 and abs(shared - expected) < 6 * (expected * (1 - expected) / count) ** 0.5, \
            (n, j, count, shared, expected)


def test_row_counts_that_hash_badly_are_refused_with_the_reason():
    assert rows_problem(8209, 8192) is None
    assert "multiple of the vocabulary" in rows_problem(16384, 8192)
    assert "not prime" in rows_problem(10000, 8192) and "9973 and 10007" in rows_problem(10000, 8192)
    assert rows_problem(1, 8192) and rows_problem(2**32, 8192)
    assert default_rows(8192) == 8209 and is_prime(8209)
    with pytest.raises(ConfigError, match="not prime"):
        load_model_config("tiny", ["ple.index=ngram", "ple.ngram.rows=[1000]"])
    with pytest.raises(ConfigError, match="multiple of the vocabulary"):
        load_model_config("tiny", ["ple.index=ngram", "ple.ngram.rows=[257, 512]"])


@pytest.mark.parametrize("overrides, message", [
    (["ple.index=ngram", "ple.ngram.heads=3"], "multiple of the 6 hash heads"),
    (["ple.index=ngram", "ple.ngram.orders=[3, 2]"], "ascending"),
    (["ple.index=ngram", "ple.ngram.orders=[0, 2]"], "1..8"),
    (["ple.index=ngram", "ple.ngram.rows=[257, 263, 269]"], "one entry per order"),
    (["ple.index=ngram", "ple.vocab_size=100"], "ple.ngram.rows"),
    (["ple.ngram.rows=[257]"], 'ple.index = "ngram"'),
    (["ple.index=ngram", "ple.ngram.id_map=/nonexistent/map.json"], "cannot read"),
])
def test_bad_ngram_settings_are_one_clear_error(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_model_config("tiny", overrides)


def test_per_order_rows_give_each_order_its_own_head_size():
    cfg = load_model_config("tiny", ["ple.index=ngram", "ple.ngram.rows=[257, 1009]", "ple.ngram.heads=2",
                                     "ple.dim=8"])
    assert cfg.ple_layout.head_rows == [257, 257, 1009, 1009]
    assert cfg.ple_table_rows == 2532 and cfg.ple_row_width == 2 * 8 // 4


# ------------------------------------------------------------------------------------------ id compression


def test_canonical_form_folds_case_accents_and_whitespace():
    assert canonical_form(" Hello") == canonical_form("hello") == canonical_form("HELLO\n") == "hello"
    assert canonical_form("Café") == "cafe" and canonical_form("ﬁne") == "fine"  # NFKC ligature
    assert canonical_form("\n\n") == canonical_form(" ") == " "
    assert canonical_form("") == ""


def test_a_real_tokenizers_map_merges_variants_and_keeps_everything_else(shared_data):
    text = (shared_data / "valid" / "en_news.txt").read_text(encoding="utf-8")[:300_000]
    tok = Tokenizer.train_bpe([text, text.upper(), text.title()], 2000)
    ids = build_id_map(tok.vocab_size, lambda i: tok.decode([i]))
    assert len(ids) == tok.vocab_size and set(ids) == set(range(max(ids) + 1))  # surjective onto 0..N-1
    assert max(ids) + 1 < 0.9 * tok.vocab_size  # it does compress
    single = {w: tok.encode(w) for w in (" the", " The", " THE", "the", " and", " And")}
    single = {w: t[0] for w, t in single.items() if len(t) == 1}
    assert {" the", " The", " and", " And"} <= set(single)
    for a, b in ((" the", " The"), (" the", " THE"), (" the", "the"), (" and", " And")):
        if a in single and b in single:
            assert ids[single[a]] == ids[single[b]], (a, b)
    assert ids[single[" the"]] != ids[single[" and"]]  # different words never merge ...
    partial = [i for i in range(tok.vocab_size) if "\ufffd" in tok.decode([i])]
    assert partial and len({ids[i] for i in partial}) == len(partial)  # ... nor do pieces of a character
    assert all(ids.count(ids[i]) == 1 for i in partial)


def test_an_id_map_file_round_trips_and_a_changed_or_bad_file_is_refused(tmp_path):
    path = tmp_path / "map.json"
    path.write_text(json.dumps(id_map_document([0, 1, 0, 2])))
    found = read_id_map(path, 4)
    assert found.ids == [0, 1, 0, 2] and found.num_ids == 3
    assert read_id_map(path, 4, found.sha256).ids == found.ids
    with pytest.raises(NgramError, match="maps 4 token ids"):
        read_id_map(path, 5)
    path.write_text(json.dumps(id_map_document([0, 1, 1, 2])))
    with pytest.raises(NgramError, match="changed since"):
        read_id_map(path, 4, found.sha256)
    for bad in ({"format": "x", "map": [0]}, {**id_map_document([0, 2]), "map": [0, 2]}, [1, 2]):
        path.write_text(json.dumps(bad))
        with pytest.raises(NgramError):
            read_id_map(path, 2 if isinstance(bad, dict) else 2)


def test_the_config_records_the_maps_hash_and_the_model_carries_the_map(tmp_path):
    from plelab.model import LanguageModel

    path = tmp_path / "map.json"
    path.write_text(json.dumps(id_map_document([i // 2 for i in range(256)])))
    cfg = load_model_config("tiny", ["ple.index=ngram", f"ple.ngram.id_map={path}"])
    assert cfg.ple.ngram.id_map_sha256 == read_id_map(path, 256).sha256
    torch.manual_seed(0)
    model = LanguageModel(cfg)
    assert model.state_dict()["per_layer_inputs.index.id_map"].tolist() == [i // 2 for i in range(256)]
    # Ids 2k and 2k + 1 are one compressed id: the same n-grams, the same rows.
    a = model.per_layer_inputs.identity(torch.tensor([[10, 20, 30]]))
    b = model.per_layer_inputs.identity(torch.tensor([[11, 21, 31]]))
    assert torch.equal(a, b)
    path.write_text(json.dumps(id_map_document(list(range(256)))))
    with pytest.raises(NgramError, match="changed since"):
        model.reset_parameters()
