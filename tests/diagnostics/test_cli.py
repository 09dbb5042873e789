"""`plelab diagnose` on saved checkpoints: JSON fields, human table, data sources, dP = 0, missing init table."""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from plelab.cli import diagnose as cli
from plelab.diagnostics.run_files import init_table_path
from plelab.runs.checkpoint import save_checkpoint


def run_cli(argv: list[str], capsys) -> str:
    parser = argparse.ArgumentParser(prog="plelab")
    cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["diagnose", *argv])
    assert args.func(args) == 0
    return capsys.readouterr().out


def _chain_tokens(chain) -> np.ndarray:
    """A stretch of the synthetic chain as one 1-D token array (what a .npy token file holds)."""
    x, y = chain(77, 8, 512)
    return torch.cat([x, y[:, -1:]], dim=1).reshape(-1).numpy().astype(np.uint16)


def test_diagnose_run_dir_with_data_json(tmp_path, capsys, working_model, chain):
    run = tmp_path / "run"
    save_checkpoint(run / "checkpoints" / "step_00000200", working_model)
    np.save(tmp_path / "tokens.npy", _chain_tokens(chain))
    report = json.loads(run_cli([str(run), "--data", str(tmp_path / "tokens.npy"), "--json", "--batches", "4",
                                 "--seq-len", "32"], capsys))
    assert report["used"]["verdict"] == "used"
    assert report["data"]["batches"] == 4 and "tokens.npy" in report["data"]["source"]
    for rec in report["layers"]:
        for key in ("layer", "verdict", "injection_ratio", "ablation_delta_loss", "grad_ratio_table"):
            assert rec[key] is not None, key
    assert report["rules"] and "effective_rank" in report["table_health"]["definitions"]
    delta = report["table_health"]["views"]["delta"]
    assert not delta["available"] and "table_init.npy" in delta["reason"]


def test_diagnose_human_output_with_init_table_and_no_data(tmp_path, capsys, make_model):
    model = make_model()
    run = tmp_path / "run"
    init_table_path(run).parent.mkdir(parents=True)
    np.save(init_table_path(run), model.per_layer_inputs.embed_tokens_per_layer.weight.detach().numpy())
    with torch.no_grad():
        model.per_layer_inputs.embed_tokens_per_layer.weight[:10] += 1.0
    save_checkpoint(run / "checkpoints" / "step_00000010", model)
    out = run_cli([str(run / "checkpoints" / "step_00000010")], capsys)
    assert "used:" in out and "proxies" in out and "provisional" in out
    assert "ablation (the primary evidence) needs data" in out
    assert "table view 'delta': table - table_at_init on the 10 rows that changed most" in out
    assert "rules:" in out and "definitions:" in out


def test_diagnose_dp0(tmp_path, capsys, make_model):
    save_checkpoint(tmp_path / "ckpt", make_model(dim=0))
    report = json.loads(run_cli([str(tmp_path / "ckpt"), "--json"], capsys))
    assert report["used"]["verdict"] == "n/a" and report["layers"] == []
