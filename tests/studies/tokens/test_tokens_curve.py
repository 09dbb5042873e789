"""The gain of each dP against training tokens: lined up across the groups of one sweep that differ in length,
refused where the groups do not each hold one length, drawn into the dead-zone report, and the study `plelab report`
picks for a sweep whose finished groups trained different lengths."""

from __future__ import annotations

import pytest
from sweep_helpers import VARIANTS, fake_study

from plelab.experiments.sweep import load_sweep
from plelab.experiments.sweep_store import SweepStore
from plelab.studies.deadzone.analysis import paired_table
from plelab.studies.deadzone.report import build_blocks, render_figures
from plelab.studies.registry import choose_study
from plelab.studies.tokens.curve import gain_vs_tokens, gain_vs_tokens_png, tokens_blocks


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
    curve = gain_vs_tokens(GROUPS)
    analysis = {"sweep": "t", "folder": "f", "counts": {"done": 12}, "total_runs": 12, "groups": [],
                "tokens_curve": curve, "rules": {}}
    figures = render_figures(analysis)
    blocks = build_blocks(analysis, figures, tokens_blocks(curve, gain_vs_tokens_png(curve)))
    heads = [b[2] for b in blocks if b[0] == "h"]
    assert "Gain against tokens" in heads
    table = next(b for b in blocks if b[0] == "table" and b[1][0] == "dP")
    assert table[1][1].startswith("0.31M tokens") and table[2][0][0] == "1"
    img = next(b for b in blocks if b[0] == "img")
    assert img[1] == "gain_vs_tokens" and img[3][:4] == b"\x89PNG"


def _lengths_sweep(folder, steps: dict[str, int], done: tuple[str, ...]):
    """A dP x seed sweep whose [variants] set max_steps (the tokens study's shape); the `done` lengths finished."""
    sweep = load_sweep({"sweep": {"out": str(folder)}, "base": {"model": {"preset": "tiny"}},
                        "grid": {"seed": [1], "model.ple.dim": [0, 4]},
                        "variants": {name: {"max_steps": n} for name, n in steps.items()}})
    with SweepStore(sweep.db_path) as store:
        store.sync_points(sweep.points)
        for p in sweep.points:
            if p.variant in done:
                n = steps[p.variant]
                store.mark_done(p.name, {"final_eval": {"domains": {"val": {"loss": 3.0}}}, "steps": n,
                                         "tokens": n * 1000})
    return folder


def test_a_sweep_whose_finished_groups_trained_two_lengths_is_the_tokens_study(tmp_path):
    steps = {"t10": 10, "t40": 40}
    assert choose_study(_lengths_sweep(tmp_path / "both", steps, ("t10", "t40"))).name == "tokens"
    # one length finished so far: the plain dead-zone report, as gain_vs_tokens would draw nothing
    assert choose_study(_lengths_sweep(tmp_path / "one", steps, ("t10",))).name == "dead-zone"
    # variants that do not change the length are dose groups, not a tokens axis
    same = {"a": 10, "b": 10}
    assert choose_study(_lengths_sweep(tmp_path / "same", same, ("a", "b"))).name == "dead-zone"
    assert choose_study(fake_study(tmp_path / "ffn", VARIANTS)).name == "FFN"
