"""The visual PLE study: the sweep file names every config the issue asks for, the report's rules on hand-made
results, and `plelab report` on a tiny real vision sweep (diagnostics cached for the second report)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "vision"))
from sweep_helpers import study_file  # noqa: E402
from vision_helpers import serve_planted_corpus  # noqa: E402

from plelab.cli.main import main  # noqa: E402
from plelab.cli.vision import TOKENIZER_CHOICES  # noqa: E402
from plelab.experiments.sweep import DB_FILE, load_sweep  # noqa: E402
from plelab.experiments.sweep_runner import run_sweep  # noqa: E402
from plelab.experiments.sweep_store import SweepStore  # noqa: E402
from plelab.studies.visual import analysis as study  # noqa: E402
from plelab.studies.visual.analysis import DIAG_FILE, analyze_vision_study, is_vision_sweep  # noqa: E402
from plelab.studies.visual.report import write_vision_report  # noqa: E402
from plelab.vision.diagnostics import table_report, vision_verdict  # noqa: E402

STUDY = study_file("visual-ple-study.toml")


def test_the_study_sweep_expands_to_every_config_the_issue_asks_for():
    sweep = load_sweep(STUDY)
    configs = {p.variant: p.config.vision for p in sweep.points}
    seeds = {p.variant: set() for p in sweep.points}
    for p in sweep.points:
        seeds[p.variant].add(p.config.seed)
    assert all(len(s) >= 3 for s in seeds.values())
    assert sweep.baseline == "none" and configs["none"].ple_dim == 0 and configs["none"].aux_weight == 0
    visual = {v: c for v, c in configs.items() if c.ple_dim > 0}
    assert all(c.codebook == 256 and c.patch_size == 7 for c in configs.values())
    no_aux = {v: c for v, c in visual.items() if c.aux_weight == 0}
    # One no-aux config per tokenizer, the random control among them, each on its own corpus.
    by_kind = {kind: [v for v, c in no_aux.items() if c.corpus.endswith(f"-{kind}-k256")] for kind in TOKENIZER_CHOICES}
    assert all(len(names) == 1 for names in by_kind.values()), by_kind
    # The fix: one tokenizer's corpus with >= 2 distinct lambdas.
    fixes = {v: c for v, c in visual.items() if c.aux_weight > 0}
    assert len({c.aux_weight for c in fixes.values()}) >= 2
    assert len({c.corpus for c in fixes.values()}) == 1
    assert next(iter(fixes.values())).corpus in {c.corpus for c in no_aux.values()}
    assert not any(c.corpus.endswith("-random-k256") for c in fixes.values())
    # Every config trains the same trunk the same way: only [vision] differs.
    trunks = {json.dumps(p.config_dict()["model"], sort_keys=True) for p in sweep.points}
    assert len(trunks) == 1 and {p.config.max_steps for p in sweep.points} == {sweep.points[0].config.max_steps}


# ----------------------------------------------------------------------------------------------- rules
def _diag(structured: bool, seed: int, ablation: float = 0.0) -> dict:
    g = torch.Generator().manual_seed(seed)
    init = torch.randn(64, 2, 8, generator=g)
    table = init + (torch.randn(64, 1, generator=g) @ torch.randn(1, 16, generator=g)).view(64, 2, 8) * 3 \
        if structured else torch.randn(64, 2, 8, generator=g)
    report = table_report(table, init)
    abl = {"delta": ablation, "se": 0.001, "n": 8}
    return {"visual_ple": True, "table": report, "ablation": abl, "injection_ratio": {0: 0.1, 1: 0.3},
            "verdict": vision_verdict(report["random_like"], abl)}


def _facts(corpus: str, tokenizer: str | None, ple_dim: int = 8, aux: float = 0.0, mi: float | None = None) -> dict:
    return {"corpus": corpus, "tokenizer": tokenizer, "ple_dim": ple_dim, "aux_weight": aux, "mi_bits": mi}


def _finals(losses: dict[int, float]) -> dict:
    return {s: {"captions": {"loss": v}} for s, v in losses.items()}


BASE = {1: 2.00, 2: 2.10, 3: 1.90}
FACTS = {
    "none": _facts("c/random", None, ple_dim=0),
    "dct": _facts("c/dct", "dct-kmeans", mi=0.30),
    "vq": _facts("c/vq", "vqvae", mi=0.45),
    "rand": _facts("c/random", "random", mi=0.90),  # MI of the control never makes it "best"
    "fix": _facts("c/dct", "dct-kmeans", aux=1.0, mi=0.30),
    "fixsmall": _facts("c/dct", "dct-kmeans", aux=0.1, mi=0.30),
}


def analysis() -> dict:
    finals = {
        "none": _finals(BASE),
        "dct": _finals({s: v + d for (s, v), d in zip(BASE.items(), (0.002, -0.001, 0.001), strict=True)}),
        "vq": _finals({s: v + d for (s, v), d in zip(BASE.items(), (0.03, 0.031, 0.029), strict=True)}),
        "rand": _finals({1: 2.001}),
        "fix": _finals({s: v - d for (s, v), d in zip(BASE.items(), (0.05, 0.051, 0.049), strict=True)}),
        "fixsmall": _finals(BASE),
    }
    diags = {"dct": {s: _diag(False, s) for s in BASE}, "vq": {s: _diag(True, s) for s in BASE},
             "rand": {s: _diag(False, s + 10) for s in BASE},
             "fix": {s: _diag(True, s, 0.05) for s in BASE},
             "fixsmall": {1: _diag(True, 1), 2: _diag(False, 2), 3: _diag(False, 3)}}
    return analyze_vision_study(finals, "none", list(FACTS), FACTS, diags)


def test_helps_and_hurts_follow_the_paired_t_rule():
    rows = analysis()["rows"]
    # published-like: within noise, so neither helps nor hurts (not "no")
    assert rows["dct"]["helps"] is None and rows["dct"]["delta_sig"] == 0 and rows["dct"]["outcome"] == "not resolved"
    assert rows["vq"]["delta_sig"] == 1 and rows["vq"]["helps"] is False  # consistently worse: hurts
    assert rows["fix"]["helps"] is True and rows["fix"]["delta"] == pytest.approx(-0.05)
    assert rows["rand"]["helps"] is None and rows["rand"]["delta_n"] == 1  # one paired seed: no test
    assert rows["none"]["loss"] == pytest.approx(2.0) and "delta" not in rows["none"]


def test_structured_needs_every_seed_and_the_fix_is_judged_against_its_own_corpus():
    a = analysis()
    rows = a["rows"]
    assert rows["dct"]["table"]["structured"] == "random-like"
    assert rows["fix"]["table"]["structured"] == "structured"
    assert rows["fixsmall"]["table"]["structured"] == "mixed"
    assert rows["fix"]["table"]["verdicts"] == {"used": 3}
    assert rows["dct"]["table"]["verdicts"] == {"random-like": 3}
    fixes = {f["variant"]: f for f in a["fix"]}
    assert fixes["fix"]["reference"] == "dct" and fixes["fix"]["turned_structured"] is True
    assert fixes["fixsmall"]["turned_structured"] is False
    assert fixes["fix"]["delta_vs_reference"] == pytest.approx(-0.05 - 0.000667, abs=1e-4)


def test_id_structure_is_judged_against_the_random_id_control_paired_by_seed():
    a = analysis()
    rows = a["rows"]
    assert a["control"] == "rand"
    assert rows["vq"]["vs_control"]["structured"] is True and rows["vq"]["vs_control"]["delta"] < -0.5
    assert rows["dct"]["vs_control"]["structured"] is False
    assert "vs_control" not in rows["rand"] and "vs_control" not in rows["none"]
    assert any("beyond the random-id control (rand) in 1/2 tested (vq)" in c for c in a["conclusions"])


def test_fix_and_control_pair_only_with_configs_of_the_same_setting():
    # Two lengths (settings): the fix at the long one is judged against the same corpus at the long one, and
    # each config's id structure against the random-id control of its own length.
    cfg = {"max_steps": 1800, "seed": 1,
           "vision": {"corpus": "c/dct", "ple_dim": 8, "aux_weight": 0.0, "pixels": False}}
    short = {**cfg, "max_steps": 281, "seed": 2, "vision": {**cfg["vision"], "corpus": "c/random", "aux_weight": 1.0}}
    assert study.config_facts(cfg, {})["setting"] != study.config_facts(short, {})["setting"]
    assert study.config_facts(cfg, {})["setting"] == study.config_facts({**short, "max_steps": 1800}, {})["setting"]
    facts = {v: {**f, "setting": "long"} for v, f in FACTS.items()}
    facts["dct-short"] = {**FACTS["dct"], "setting": "short"}
    facts["rand-short"] = {**FACTS["rand"], "setting": "short"}
    facts["fix-short"] = {**FACTS["fix"], "setting": "short"}
    finals = {v: _finals(BASE) for v in facts}
    diags = {v: {s: _diag(v.startswith("fix"), s + (10 if v.startswith("rand") else 0)) for s in BASE} for v in facts}
    a = analyze_vision_study(finals, "none", list(facts), facts, diags)
    fixes = {f["variant"]: f["reference"] for f in a["fix"]}
    assert fixes["fix"] == "dct" and fixes["fix-short"] == "dct-short"
    assert a["rows"]["dct"]["control"] == "rand" and a["rows"]["dct-short"]["control"] == "rand-short"
    # no no-table config of the short setting: its Δ falls back to the sweep's baseline; with one, it pairs there
    assert a["rows"]["dct-short"]["reference"] == "none"
    facts["none-short"] = {**FACTS["none"], "setting": "short"}
    finals["none-short"] = _finals({s: v + 1 for s, v in BASE.items()})
    b = analyze_vision_study(finals, "none", list(facts), facts, diags)
    assert b["rows"]["dct-short"]["reference"] == "none-short" and b["rows"]["dct-short"]["delta"] == pytest.approx(-1)
    assert b["rows"]["dct"]["reference"] == "none" and b["rows"]["none-short"]["reference"] == "none"


def test_the_best_tokenizer_is_the_highest_mi_one_and_a_fix_on_another_corpus_is_flagged():
    a = analysis()
    assert a["best_tokenizer"]["tokenizer"] == "vqvae"  # not the random control, whatever its MI says
    assert any("rerun them on c/vq" in c for c in a["conclusions"])
    assert any(c.startswith("Fix fix (λ = 1): turned the table structured") for c in a["conclusions"])


def test_the_report_renders_every_section_on_hand_made_results(tmp_path):
    a = {"sweep": "s", "folder": "f", "counts": {"done": 16}, "total_runs": 16, **analysis()}
    paths = write_vision_report(a, tmp_path)
    md = (tmp_path / "report.md").read_text()
    for heading in ("## Caption loss", "## The visual table", "## The fix", "## Published figures beside ours",
                    "## Rules", "255.1/256"):
        assert heading in md
    assert {p.name for p in paths} >= {"report.md", "report.html", "vision_delta.png", "vision_table.png"}


# ----------------------------------------------------------------------------------------------- a real sweep
def test_plelab_report_on_a_vision_sweep_diagnoses_once_and_caches(monkeypatch, tmp_path, capsys):
    corpus = serve_planted_corpus(monkeypatch, tmp_path / "corpus")
    base = dict(batch_size=32, max_steps=2, warmup_steps=1, lr=1e-2, log_every=10, ckpt_every=1000, device="cpu",
                dtype="fp32", model={"vocab_size": 32, "hidden_size": 32, "num_layers": 2, "num_heads": 2,
                                     "max_seq_len": 8, "ffn": {"intermediate_size": 64}},
                vision={"corpus": str(corpus)})
    sweep = load_sweep({"sweep": {"baseline": "none"}, "base": base, "grid": {"seed": [1, 2]},
                        "variants": {"none": {}, "fix": {"vision.ple_dim": 8, "vision.aux_weight": 1.0}}},
                       out=tmp_path / "sweep")
    assert run_sweep(sweep, quiet=True, say=lambda _: None) == {"done": 4}
    assert is_vision_sweep(tmp_path / "sweep")
    with SweepStore(tmp_path / "sweep" / DB_FILE) as store:  # the sweep counts the model it trains
        added = {r["name"].split(",")[0]: r["params_added"] for r in store.runs()}
    assert added["variant=none"] == 0 and added["variant=fix"] > 0
    assert main(["report", str(tmp_path / "sweep"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["rows"]) == {"none", "fix"} and out["rows"]["fix"]["delta_n"] == 2
    assert out["rows"]["fix"]["table"]["diagnosed"] == 2 and out["rows"]["none"]["table"] is None
    assert (tmp_path / "sweep" / "report.md").is_file() and (tmp_path / "sweep" / DIAG_FILE).is_file()

    def fail(*args, **kwargs):
        raise AssertionError("diagnosed again although the checkpoints did not change")

    monkeypatch.setattr("plelab.vision.diagnostics.diagnose_run", fail)
    assert main(["report", str(tmp_path / "sweep"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"]["fix"]["table"]["diagnosed"] == 2
    # records.json beside the report: the report and its verdicts recomputed from it alone, no run folders.
    assert main(["report", str(tmp_path / "sweep" / "records.json"), "--out", str(tmp_path / "again")]) == 0
    capsys.readouterr()
    assert (tmp_path / "again" / "report.md").read_text() == (tmp_path / "sweep" / "report.md").read_text()
    assert main(["report", str(tmp_path / "sweep"), "--measure-decode"]) == 2  # the FFN study's option
