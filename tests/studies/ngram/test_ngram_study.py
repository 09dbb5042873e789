"""The n-gram study's report on constructed results: detected before the FFN study, the registered tests scored,
each variant's gain over no table, and per domain the n-gram table's loss minus the token table's."""

from __future__ import annotations

import json

import pytest
from sweep_helpers import SEEDS, fake_study

from plelab.cli.main import main
from plelab.studies.ngram.analysis import is_ngram_sweep, table_shape
from plelab.studies.registry import choose_study

NGRAM = {"model.ple.index": "ngram", "model.ple.ngram.orders": [2, 3], "model.ple.ngram.heads": 2}
VARIANTS = {"swiglu": {"model.ple.dim": 0}, "token4": {"model.ple.dim": 4},
            "mglu": {"model.ple.dim": 4, **NGRAM}}  # fake_study names its baseline swiglu; every other variant it
# makes worse than the baseline by 0.04 on every domain (0.02 on val), plus the same per-seed wobble
PLAN = {"plan": {"name": "ngram-test", "margin": 0.01, "comparisons": [
    {"name": "ngram_vs_token", "variant": "mglu", "reference": "token4", "metric": "val", "predicted": "better",
     "hits": ["better", "better, within margin"]}]}}


def test_the_ngram_sweep_gets_its_own_report_and_scores_the_plan(tmp_path, capsys):
    folder = fake_study(tmp_path / "s", VARIANTS, done=("swiglu", "token4", "mglu"), plan=PLAN)
    assert is_ngram_sweep(folder) and choose_study(folder).name == "n-gram"
    assert main(["report", str(folder), "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    shapes = a["shapes"]
    # the same table bytes (rows per head: the smallest prime above the vocabulary, here 1.6 % more) and the same
    # values read per token, in four reads instead of one
    assert shapes["mglu"]["table_params"] == pytest.approx(shapes["token4"]["table_params"], rel=2e-2)
    assert shapes["mglu"]["table_params_per_token"] == shapes["token4"]["table_params_per_token"]
    assert (shapes["mglu"]["rows_read_per_token"], shapes["token4"]["rows_read_per_token"]) == (4, 1)
    # both tables are 0.02 worse than no table on val, seed by seed the same: n-gram minus token is exactly 0,
    # equivalent inside the 0.01 margin, and so a miss for a "better" prediction
    result = a["plan"]["evaluation"]["results"][0]
    assert result["outcome"] == "equivalent" and result["prediction"] == "miss"
    assert a["gains"]["token4"]["val"]["mean"] == pytest.approx(0.02, abs=0.002)
    assert a["gains"]["token4"]["val"]["outcome"] == "worse"
    pair = a["ngram_vs_token"][0]
    assert pair["dim"] == 4 and pair["domains"]["code"]["n"] == len(SEEDS)
    assert pair["domains"]["code"]["mean"] == pytest.approx(0.0, abs=1e-9)
    md = (folder / "report.md").read_text()
    assert "per domain (description)" in md and "What each table buys over no table" in md
    # fake_study's runs record no training time: the report says so rather than print zero hours
    assert a["compute"] is None and "Compute: not recorded by these runs." in md
    assert (folder / "plots" / "domains.png").is_file() and (folder / "records.json").is_file()
    # the committed records recompute the same analysis
    assert main(["report", str(folder / "records.json"), "--out", str(tmp_path / "again"), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["ngram_vs_token"] == a["ngram_vs_token"]


def test_table_shape_counts_the_built_model():
    from plelab.model.config import ModelConfig
    from plelab.util.dataclass_config import to_dict

    cfg = ModelConfig(vocab_size=512, hidden_size=32, num_layers=2, num_heads=2, max_seq_len=32)
    cfg.ple.dim = 8
    token = table_shape(to_dict(cfg))
    assert token["table_params"] == 512 * 2 * 8 and token["rows_read_per_token"] == 1


@pytest.mark.parametrize("at4, at16, reading", [
    ("better", "equivalent", "hit"),
    ("better, within margin", "better", "hit"),
    ("equivalent", "equivalent", "hit"),
    ("worse", "better", "miss"),
    ("better", "worse, within margin", "miss"),          # a resolved loss, however small, is a miss
    ("worse, within margin", "not resolved", "miss"),
    ("better", "not resolved", "unresolved"),
    ("not resolved", "not resolved", "unresolved"),
])
def test_the_longcat_reading_follows_its_registered_rule(at4, at16, reading):
    from plelab.studies.ngram.analysis import longcat_reading

    assert longcat_reading({"ngram_vs_token_4": at4, "ngram_vs_token_16": at16}) == reading


def test_the_report_states_the_longcat_reading_from_the_two_tests(tmp_path, capsys):
    tests = [{"name": name, "variant": "mglu", "reference": "token4", "metric": "val", "predicted": "better",
              "hits": ["better", "better, within margin"]} for name in ("ngram_vs_token_4", "ngram_vs_token_16")]
    plan = {"plan": {"name": "ngram-test", "margin": 0.01, "comparisons": tests}}
    folder = fake_study(tmp_path / "s", VARIANTS, done=("swiglu", "token4", "mglu"), plan=plan)
    assert main(["report", str(folder), "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    # n-gram minus token is exactly 0 seed by seed: each test "equivalent" (a miss for its own "better"
    # prediction) and the reading, whose hit is "not worse", a hit
    assert a["longcat"]["outcomes"] == {"ngram_vs_token_4": "equivalent", "ngram_vs_token_16": "equivalent"}
    assert a["longcat"]["reading"] == "hit"
    assert "LongCat reading (n-gram >= token): HIT" in (folder / "report.md").read_text()
    assert main(["report", str(folder)]) == 0
    assert "LongCat reading (n-gram >= token): hit" in capsys.readouterr().out
