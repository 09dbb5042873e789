"""The gain of each dP against training tokens: lined up across the groups of one sweep that differ in length,
refused where the groups do not each hold one length, and drawn into the sweep report."""

from __future__ import annotations

import pytest

from plelab.experiments.analysis import paired_table
from plelab.experiments.report import build_blocks, render_figures
from plelab.experiments.tokens_curve import gain_vs_tokens


def _group(key: str, tokens: int, gains: dict[int, list[float]]) -> dict:
    """A group of runs at one length: dP 0 loss 5 + seed / 10, each dP lower by its per-seed gain."""
    runs = []
    for seed in (1, 2, 3):
        runs.append({"ple_dim": 0, "seed": seed, "heldout": 5 + seed / 10, "tokens": tokens})
        for dim, g in gains.items():
            runs.append({"ple_dim": dim, "seed": seed, "heldout": 5 + seed / 10 - g[seed - 1], "tokens": tokens})
    return {"key": key, "runs": runs, "paired": {"heldout": paired_table(runs, "heldout")}}


GROUPS = [_group("variant=\"t150\"", 307_200, {1: [0.20, 0.22, 0.18], 16: [0.30, 0.31, 0.29]}),
          _group("variant=\"t6000\"", 12_288_000, {1: [0.01, -0.02, 0.01], 16: [0.25, 0.27, 0.23]})]


def test_gains_line_up_against_tokens_with_paired_intervals():
    curve = gain_vs_tokens(GROUPS)
    cell = {(r["ple_dim"], r["tokens"]): r for r in curve["rows"]}
    assert cell[(1, 307_200)]["gain"] == pytest.approx(0.20) and cell[(16, 12_288_000)]["gain"] == pytest.approx(0.25)
    small = cell[(1, 12_288_000)]
    assert small["gain"] == pytest.approx(0.0) and small["ci95"][0] < 0 < small["ci95"][1]  # gone, with its interval
    assert cell[(16, 307_200)]["ci95"][0] > 0.25 and small["n"] == 3


def test_no_curve_without_two_lengths_each_group_of_one():
    assert gain_vs_tokens(GROUPS[:1]) is None
    mixed = _group("all", 1000, {4: [0.1, 0.1, 0.1]})
    mixed["runs"][0]["tokens"] = 2000
    assert gain_vs_tokens([mixed, GROUPS[0]]) is None
    same = _group("other", 307_200, {4: [0.1, 0.1, 0.1]})
    assert gain_vs_tokens([GROUPS[0], same]) is None  # two groups at one length: not a tokens axis


def test_the_sweep_report_shows_the_table_and_the_plot():
    analysis = {"sweep": "t", "folder": "f", "counts": {"done": 12}, "total_runs": 12, "groups": [],
                "tokens_curve": gain_vs_tokens(GROUPS), "rules": {}}
    figures = render_figures(analysis)
    blocks = build_blocks(analysis, figures)
    heads = [b[2] for b in blocks if b[0] == "h"]
    assert "Gain against tokens" in heads
    table = next(b for b in blocks if b[0] == "table" and b[1][0] == "dP")
    assert table[1][1].startswith("0.31M tokens") and table[2][0][0] == "1"
    img = next(b for b in blocks if b[0] == "img")
    assert img[1] == "gain_vs_tokens" and img[3][:4] == b"\x89PNG"
