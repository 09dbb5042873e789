"""The edge reference (SPEC §6): esp32-28m at int4 / group 128 fits the ESP32-S3 with one flash read per token."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plelab.cli.main import main

REFERENCE_FILE_BYTES = 14_912_332  # the published deployment's file
REFERENCE_FLASH_BYTES_PER_TOKEN = 446


def cli_json(capsys, *argv: str) -> tuple[int, dict]:
    code = main(list(argv))
    return code, json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def esp32_file(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("esp32") / "esp32-28m-int4.ple"
    assert main(["export", "esp32-28m", "--quant", "int4", "--group", "128", "--out", str(out)]) == 0
    return out


def test_file_is_no_bigger_than_the_reference(esp32_file):
    assert esp32_file.stat().st_size <= REFERENCE_FILE_BYTES


def test_esp32_s3_plan_fits_with_the_ple_record_in_one_flash_read(esp32_file, capsys):
    code, plan = cli_json(capsys, "place", str(esp32_file), "--device", "esp32-s3", "--json")
    assert code == 0 and plan["fits"]
    assert plan["bytes_per_token"]["flash"] <= REFERENCE_FLASH_BYTES_PER_TOKEN
    assert plan["reads_per_token"]["flash"] == 1
    p = plan["placement"]
    assert p["table:ple"] == "flash"  # 12.98 MB of PLE records stay in flash
    assert p["table:embed"] == "psram"  # the tied head is read whole per token: PSRAM
    assert all(tier == "sram" for name, tier in p.items() if name.startswith("layers."))  # the dense core
    assert plan["est_ms_per_token"] > 0 and plan["tiers"]["sram"]["used"] <= 293 * 1024
    trade = plan["embed_in_record_trade"]["alternative"]
    # tied: the embedding stored twice (50 B a token), plus at most one 64-byte section alignment pad
    assert 0 <= trade["file_bytes_delta"] - 32768 * 50 <= 64 and not trade["fits"]


def test_runtime_reads_one_396_byte_record_per_token_from_flash(esp32_file, capsys):
    code, run = cli_json(capsys, "run", str(esp32_file), "--ids", "11,22,33,44", "--max-new-tokens", "4",
                         "--device", "esp32-s3", "--verify", "core", "--json")
    assert code == 0 and len(run["generated_ids"]) == 4
    assert run["reads_per_token"]["flash"] == 1 and run["bytes_per_token"]["flash"] == 384 + 12


def test_embedding_in_the_record_is_446_bytes_in_one_read_but_needs_more_flash(capsys):
    code = main(["place", "esp32-28m", "--quant", "int4", "--embed-in-record", "--device", "esp32-s3", "--json"])
    plan = json.loads(capsys.readouterr().out)
    assert code == 2 and not plan["fits"]
    assert plan["bytes_per_token"]["flash"] == REFERENCE_FLASH_BYTES_PER_TOKEN and plan["reads_per_token"]["flash"] == 1
    assert plan["problems"][0]["tier"] == "flash" and plan["problems"][0]["missing_bytes"] > 0
