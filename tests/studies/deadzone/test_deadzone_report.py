"""`plelab report`: HTML that needs nothing but itself, markdown with its PNGs, the analysis as JSON."""

from __future__ import annotations

import base64
import json
import re

from plelab.cli.main import main
from plelab.studies.deadzone.analysis import analyze_sweep


def test_report_files_are_written_and_the_html_is_self_contained(finished_sweep, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["report", str(finished_sweep), "--out", str(out)]) == 0
    html = (out / "report.html").read_text()
    md = (out / "report.md").read_text()
    # Self-contained: every src is a data: URI; no external links, stylesheets or scripts.
    srcs = re.findall(r'src="([^"]*)"', html)
    assert len(srcs) >= 5 and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert base64.b64decode(srcs[0].split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert not re.search(r"<link|<script|href=\"http|url\(", html)
    for heading in ("Loss vs dP", "Steps between consecutive dP values", "Used (dependence)", "Pays: paired",
                    "Per-domain final loss"):
        assert heading in html and heading in md
    # The markdown links the same figures as files that exist.
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert {"plots/loss_vs_dim.png", "plots/loss_curves.png", "plots/injection_heatmap.png",
            "plots/table_health.png"} <= set(links)
    assert all((out / link).is_file() for link in links)
    assert "dead zone" in md and "2 x noise" in md  # the rule is stated


def test_report_json_is_the_analysis(finished_sweep, tmp_path, capsys):
    assert main(["report", str(finished_sweep), "--out", str(tmp_path), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(json.dumps(analyze_sweep(finished_sweep)))
    group = printed["groups"][0]
    assert [r["ple_dim"] for r in group["table"]] == [0, 8] and group["table"][1]["n"] == 2
    assert [(s["from"], s["to"]) for s in group["steps"]] == [(0, 8)]
    assert group["verdicts"]["rows"][0]["compared"] == 2
    assert len(group["domains"]["rows"]) == 3  # the two folder domains + the prepared held-out split


def test_report_on_a_folder_without_a_sweep_is_a_clear_error(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "no sweep.sqlite" in capsys.readouterr().err


def test_report_out_refuses_existing_report_files_unless_overwrite(finished_sweep, tmp_path, capsys):
    out = tmp_path / "docs"
    out.mkdir()
    (out / "report.md").write_text("my own notes")
    assert main(["report", str(finished_sweep), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already exists; pass --overwrite" in err
    assert (out / "report.md").read_text() == "my own notes" and not (out / "report.html").exists()
    assert main(["report", str(finished_sweep), "--out", str(out), "--overwrite"]) == 0
    assert (out / "report.md").read_text().startswith("#")


def test_report_never_writes_over_the_sweeps_own_files(finished_sweep, capsys):
    db = finished_sweep / "sweep.sqlite"
    before = db.read_bytes()
    assert main(["report", str(finished_sweep), "--out", str(db), "--overwrite"]) == 2
    assert "plelab report: error:" in capsys.readouterr().err
    assert db.read_bytes() == before
    for _ in range(2):  # the sweep folder's own report is simply regenerated
        assert main(["report", str(finished_sweep)]) == 0


def test_report_reads_a_read_only_sweep_folder_and_never_advises_moving_its_database(finished_sweep, tmp_path,
                                                                                      capsys):
    """A real read-only folder: a copy of the sweep on a tmpfs remounted read-only (root only; skipped elsewhere:
    root ignores a folder's permission bits)."""
    import shutil
    import subprocess

    import pytest

    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(ro)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        shutil.copytree(finished_sweep, ro / "sweep")
        subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
        capsys.readouterr()
        assert main(["report", str(ro / "sweep"), "--out", str(tmp_path / "out")]) == 0
        assert (tmp_path / "out" / "report.md").is_file()
        assert main(["report", str(ro / "sweep"), "--json"]) in (0, 2)  # writes into the sweep folder: refused
        err = capsys.readouterr().err
        assert "move it aside" not in err and "not a readable sweep database" not in err, err
        assert main(["sweep", str(ro / "sweep" / "sweep.json"), "--status"]) == 0, capsys.readouterr().err
    finally:
        subprocess.run(["umount", str(ro)], check=True)
