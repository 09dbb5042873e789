"""`plelab data id-map`: a real tokenizer's compression map, written atomically, read back by the model config."""

from __future__ import annotations

import json

from plelab.cli.main import main
from plelab.data.tokenizer import Tokenizer
from plelab.model import load_model_config
from plelab.model.ngram import read_id_map


def test_id_map_of_a_real_tokenizer_is_what_a_model_config_reads(tmp_path, capsys, shared_data):
    text = (shared_data / "valid" / "en_world_knowledge.txt").read_text(encoding="utf-8")[:200_000]
    tok = Tokenizer.train_bpe([text, text.lower(), text.upper()], 1000)
    tok.save(tmp_path / "tok.json")
    out = tmp_path / "map.json"
    assert main(["data", "id-map", str(tmp_path / "tok.json"), "--out", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    found = read_id_map(out, tok.vocab_size)
    assert info["num_ids"] == found.num_ids < tok.vocab_size and info["tokenizer_sha256"] == tok.sha256
    assert all(len(group) > 1 for group in info["examples"])
    assert json.loads(out.read_text())["tokenizer_sha256"] == tok.sha256
    cfg = load_model_config("tiny", ["vocab_size=1000", "ple.index=ngram", f"ple.ngram.id_map={out}"])
    assert cfg.ple.ngram.id_map_sha256 == found.sha256
    # An existing file is replaced only when asked.
    assert main(["data", "id-map", str(tmp_path / "tok.json"), "--out", str(out)]) == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    assert main(["data", "id-map", str(tmp_path / "tok.json"), "--out", str(out), "--overwrite"]) == 0
