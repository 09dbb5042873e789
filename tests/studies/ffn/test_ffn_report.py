"""`plelab report DIR` on a sweep with [variants]: the FFN study's JSON, markdown/HTML report, plots and decode cost.

The sweep database is filled with constructed results (no training): the report is arithmetic on it.
"""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path

import pytest
from sweep_helpers import TOKENS, VARIANTS, fake_study

from plelab.cli.main import main
from plelab.errors import PlelabError
from plelab.experiments.sweep import load_sweep
from plelab.experiments.sweep_store import SweepStore
from plelab.studies.ffn.analysis import DECODE_FILE, PUBLISHED_DOMAINS


@pytest.fixture
def study(tmp_path: Path) -> Path:
    return fake_study(tmp_path / "study", VARIANTS)


def test_json_has_the_variants_domains_timeline_and_rules(study, capsys):
    assert main(["report", str(study), "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    assert list(a["variants"]) == ["swiglu", "mglu"] and a["baseline"] == "swiglu"
    m, s = a["variants"]["mglu"], a["variants"]["swiglu"]
    for row in (m, s):
        for key in ("params", "active_params_per_token", "inference_bytes", "domains_worse"):
            assert isinstance(row[key], int), key
        assert isinstance(row["macro_delta"], float) and isinstance(row["verdict"], str)
    assert s["macro_delta"] == 0 and s["verdict"] == "baseline"
    assert m["params"] < s["params"]  # MGLU shares gate/up at the same width
    assert m["verdict"] == "uniform degradation" and m["domains_worse"] == 16
    assert m["macro_delta"] == pytest.approx(0.04, abs=1e-3)
    assert m["illusory_convergence"] is True and m["illusory_at"]["reopened_tokens"] == 4000
    assert set(a["domains"]) == set(PUBLISHED_DOMAINS) | {"val"}
    assert set(a["domains"]["code"]["mglu"]) >= {"delta", "se", "delta_bpb"}
    assert [p["tokens"] for p in a["timeline"]["mglu"]] == list(TOKENS)
    assert all(isinstance(p["gap"], float) and isinstance(p["se"], float) for p in a["timeline"]["mglu"])
    assert isinstance(a["rules"], dict) and "illusory_convergence" in a["rules"]
    assert a["published_variant"] == "mglu"
    assert (study / "report.md").is_file()  # the sweep folder's own report is (re)written too


def test_markdown_and_html_report_with_plots_rules_and_the_published_table(study, tmp_path, capsys):
    out = tmp_path / "docs"
    assert main(["report", str(study), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "mglu: macro Δ +0.04" in printed and "uniform degradation" in printed
    md, html = (out / "report.md").read_text(), (out / "report.html").read_text()
    for text in ("Variants", "Rules", "Per-domain Δ vs `swiglu` (loss)", "Per-domain Δ vs `swiglu` (bits per byte)",
                 "Gap timeline", "Published result (SPEC §5) beside this study", "two-sided paired t test",
                 "Registered analysis", "Power at this study's size (post hoc)", "MGLU costs loss here",
                 "**illusory convergence**", "uniform degradation (16/16 worse)", "val (held-out split"):
        assert text in md, text
    assert "en_math" in md and "1.6904 → 1.7353" in md
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert set(links) == {"plots/ffn_gap.png", "plots/ffn_loss.png"} and all((out / x).is_file() for x in links)
    srcs = re.findall(r'src="([^"]*)"', html)
    assert len(srcs) == 2 and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert "decode tokens/s" not in md  # no decode.json, no --measure-decode
    assert main(["report", str(study), "--out", str(out)]) == 2  # an existing report elsewhere needs --overwrite
    assert "already exists; pass --overwrite" in capsys.readouterr().err


def test_decode_json_adds_the_decode_columns(study, capsys):
    (study / DECODE_FILE).write_text(json.dumps({"mglu": {"tokens_per_s": 55.5, "bytes_per_token": 1234}}))
    assert main(["report", str(study), "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    assert a["variants"]["mglu"]["tokens_per_s"] == 55.5 and a["variants"]["mglu"]["bytes_per_token"] == 1234
    assert "tokens_per_s" not in a["variants"]["swiglu"]
    md = (study / "report.md").read_text()
    assert "decode tokens/s" in md and "55.5" in md and "1,234" in md


def test_measure_decode_times_each_variants_first_seed_and_writes_decode_json(study, monkeypatch, capsys):
    calls = []
    # the constructed runs have records but no checkpoints, as after `plelab sweep --restore` on a new machine:
    # only runs whose checkpoint is on this disk can be exported and timed (swiglu's seed 1 has only its
    # restored training log)
    for name in ("variant=swiglu,seed=2", "variant=swiglu,seed=3", "variant=mglu,seed=1"):
        (study / "runs" / name / "checkpoints" / "step_10").mkdir(parents=True)
        (study / "runs" / name / "checkpoints" / "step_10" / "manifest.json").write_text("{}")
    (study / "runs" / "variant=swiglu,seed=1").mkdir()
    (study / "runs" / "variant=swiglu,seed=1" / "metrics.jsonl").write_text("")

    def measure_decode(run_dir, tokens=64, runtime="numpy", quant="fp32", **_):
        calls.append((Path(run_dir).name, tokens, runtime, quant))
        if "mglu" in str(run_dir):
            raise PlelabError("mglu FFN not supported by the c runtime yet")
        return {"tokens_per_s": 10.0, "bytes_per_token": 999, "runtime": runtime}

    monkeypatch.setitem(sys.modules, "plelab.edge.decode_cost", types.SimpleNamespace(measure_decode=measure_decode))
    assert main(["report", str(study), "--measure-decode", "--decode-tokens", "8", "--decode-runtime", "c",
                 "--json"]) == 0
    captured = capsys.readouterr()
    # each variant's first seed with a folder, exported at the precision the inference-bytes column counts
    assert sorted(calls) == [("variant=mglu,seed=1", 8, "c", "fp16"), ("variant=swiglu,seed=2", 8, "c", "fp16")]
    assert "idle machine" in captured.err and "decode: mglu: mglu FFN not supported" in captured.err
    a = json.loads(captured.out)
    assert a["variants"]["swiglu"]["bytes_per_token"] == 999 and "tokens_per_s" not in a["variants"]["mglu"]
    assert "variant 'mglu': decode not measured (mglu FFN not supported by the c runtime yet)" in a["notes"]
    saved = json.loads((study / DECODE_FILE).read_text())
    assert saved["swiglu"]["seed"] == 2 and saved["swiglu"]["tokens_per_s"] == 10.0 and "error" in saved["mglu"]


def test_missing_variants_are_noted_and_the_report_still_renders(tmp_path, capsys):
    folder = fake_study(tmp_path / "partial", {**VARIANTS, "moe": {"model.ffn.kind": "moe"}})
    assert main(["report", str(folder), "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    assert a["variants"]["moe"]["verdict"] == "n/a" and a["variants"]["moe"]["macro_delta"] is None
    assert a["variants"]["moe"]["active_params_per_token"] < a["variants"]["moe"]["params"]
    assert "variant 'moe' has no finished runs yet" in a["notes"]
    assert "Notes on missing data" in (folder / "report.md").read_text()


def test_measure_decode_on_a_sweep_without_variants_is_one_line(tmp_path, capsys):
    sweep = load_sweep({"sweep": {"out": str(tmp_path / "plain")}, "base": {"model": {"preset": "tiny"}},
                        "grid": {"seed": [1]}})
    with SweepStore(sweep.db_path) as store:
        store.sync_points(sweep.points)
    assert main(["report", str(sweep.folder), "--measure-decode"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--measure-decode works only on the FFN study's sweeps" in err
    with pytest.raises(SystemExit) as exc:
        main(["report", str(sweep.folder), "--decode-tokens", "0"])
    assert exc.value.code == 2 and "--decode-tokens: must be >= 1" in capsys.readouterr().err


def test_a_grid_over_more_than_seeds_is_refused_in_one_line(tmp_path, capsys):
    folder = fake_study(tmp_path / "lr", VARIANTS, done=(), grid={"seed": [1], "lr": [0.001, 0.002]})
    assert main(["report", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pairs variants by seed, but this sweep's grid also varies lr" in err


def test_the_report_commits_its_per_seed_records_and_recomputes_from_them(study, tmp_path, capsys):
    """A reviewer without the sweep folder regenerates the report, verdicts included, from records.json alone."""
    out = tmp_path / "docs"
    assert main(["report", str(study), "--out", str(out)]) == 0
    records = json.loads((out / "records.json").read_text())
    assert records["kind"] == "ffn-study" and set(records["finals"]["mglu"]) == {"1", "2", "3"}
    assert records["plan_inputs"]["record"]["plan"]["name"] == "ffn-test"
    capsys.readouterr()
    again = tmp_path / "again"
    assert main(["report", str(out / "records.json"), "--out", str(again)]) == 0
    assert (again / "report.md").read_text() == (out / "report.md").read_text()
    assert main(["report", str(out / "report.md")]) == 2  # not a records file: one line
    assert "not a readable records file" in capsys.readouterr().err


def test_a_variant_sweep_that_also_varies_dp_gets_the_general_sweep_report(tmp_path):
    # e.g. the dead-zone tokens study: training lengths as variants, crossed with dP: dose groups, not FFN variants
    from plelab.studies.registry import choose_study

    folder = fake_study(tmp_path / "tokens", VARIANTS, done=(), grid={"seed": [1], "model.ple.dim": [0, 4]})
    assert choose_study(folder).name == "dead-zone"
    assert choose_study(fake_study(tmp_path / "ffn", VARIANTS, done=())).name == "FFN"


def test_the_timeline_says_which_loss_it_measures():
    from plelab.studies.ffn.report import _timeline_metric, timeline_blocks

    a = {"baseline": "swiglu", "variants": {"narrow": {"illusory_at": None}},
         "timeline": {"narrow": [{"tokens": t, "metric": "val", "gap": 0.02, "se": 0.005, "n": 3, "status": "open"}
                                 for t in (1e5, 1e6)]}}
    assert _timeline_metric(a) == "held-out split loss"
    text = " ".join(str(b) for b in timeline_blocks(a, {}))
    assert "Paired gap in held-out split loss" in text and "the final one included" in text
    for p in a["timeline"]["narrow"]:
        p["metric"] = "macro"
    assert _timeline_metric(a) == "macro loss"
    assert "the final one included" not in " ".join(str(b) for b in timeline_blocks(a, {}))
