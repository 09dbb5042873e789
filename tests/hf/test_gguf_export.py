"""`plelab export-gguf` without llama.cpp: names, types, per-group overrides, streaming from an HF folder, bad input,
and `plelab diagnose --hf` on an `export-hf` folder (pad id 0 / 1 against the one-row stand-in table)."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest
from gguf_helpers import gemma_tokenizer, train_run

pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from plelab.cli.main import main  # noqa: E402
from plelab.hf.gguf_export import TypePlan, gguf_name  # noqa: E402
from plelab.hf.gguf_types import gguf_type, round_trip  # noqa: E402
from plelab.hf.tensor_groups import group_of  # noqa: E402


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gguf")
    return train_run(root, "run", gemma_tokenizer(root), steps=6)


def one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "error:" in err, err
    return err


def read(path: Path) -> tuple[dict, dict]:
    r = gguf.GGUFReader(str(path))
    kv = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    return kv, {t.name: t for t in r.tensors}


def test_names_and_groups():
    assert gguf_name("layers.3.mlp.up_proj.weight", 4) == "blk.3.ffn_up.weight"
    assert gguf_name("layers.0.per_layer_input_gate.weight", 2) == "blk.0.inp_gate.weight"
    assert gguf_name("layers.1.layer_scalar", 2) == "blk.1.layer_output_scale.weight"
    assert gguf_name("embed_tokens_per_layer.weight", 2) == "per_layer_token_embd.weight"
    assert gguf_name("lm_head.weight", 2) == "output.weight"
    assert [group_of(n) for n in ("embed_tokens_per_layer.weight", "model.per_layer_model_projection.weight",
                                  "layers.2.per_layer_projection.weight", "layers.0.per_layer_input_gate.weight",
                                  "layers.1.self_attn.o_proj.weight", "layers.1.mlp.down_proj.weight",
                                  "embed_tokens.weight", "lm_head.weight", "layers.0.post_per_layer_input_norm.weight",
                                  "layers.0.altup.correction_coefs.weight")] == [
        "ple_table", "ple_context", "ple_projection", "ple_gate", "attention", "ffn", "embedding", "embedding",
        "norms", "other"]


def test_type_plan_groups_regex_and_last_wins():
    plan = TypePlan.parse("q4_0", ["ple_table=q8_0", r"blk\.\d+\.proj=f16", "attention=q5_0", r"blk\.1\.attn_q=f32"])
    assert plan.type_for("per_layer_token_embd.weight", "embed_tokens_per_layer.weight").name == "q8_0"
    assert plan.type_for("blk.0.proj.weight", "layers.0.per_layer_projection.weight").name == "f16"
    assert plan.type_for("blk.0.attn_q.weight", "layers.0.self_attn.q_proj.weight").name == "q5_0"
    assert plan.type_for("blk.1.attn_q.weight", "layers.1.self_attn.q_proj.weight").name == "f32"
    assert plan.type_for("blk.1.ffn_up.weight", "layers.1.mlp.up_proj.weight").name == "q4_0"


def test_native_types_round_trip_like_their_definition():
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    q8 = round_trip(x, gguf_type("q8_0"))
    d = np.abs(x.reshape(3, 2, 32)).max(-1, keepdims=True) / 127  # q8_0: d = amax / 127 per 32 values
    assert np.allclose(q8.reshape(3, 2, 32), np.round(x.reshape(3, 2, 32) / d) * d.astype(np.float16), atol=1e-6)
    assert np.abs(round_trip(x, gguf_type("q4_0")) - x).max() < np.abs(x).max() / 7
    assert gguf_type("q4_k").bits_per_value == 4.5 and gguf_type("q8_0").row_bytes(64) == 68


def test_export_gguf_types_overrides_and_metadata(run, capsys, tmp_path):
    out = tmp_path / "m.gguf"
    assert main(["export-gguf", str(run), str(out), "--type", "q4_0", "--tensor-type", "ple_table=q8_0",
                 "--tensor-type", "ple_projection=f16", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["path"] == str(out) and info["file_bytes"] == out.stat().st_size
    kv, tensors = read(out)
    assert kv["general.architecture"] == "gemma4" and kv["gemma4.block_count"] == 2
    assert kv["gemma4.attention.sliding_window_pattern"] == [True, False]
    assert kv["gemma4.embedding_length_per_layer_input"] == 256
    assert kv["tokenizer.ggml.model"] == "gemma4" and kv["tokenizer.ggml.tokens"][-1] == "<unused1>"
    assert kv["tokenizer.ggml.bos_token_id"] == kv["tokenizer.ggml.eos_token_id"] == 1
    types = {n: t.tensor_type.name for n, t in tensors.items()}
    assert types["per_layer_token_embd.weight"] == "Q8_0" and types["blk.0.proj.weight"] == "F16"
    assert types["blk.1.ffn_down.weight"] == "Q4_0" and types["token_embd.weight"] == "Q4_0"
    assert types["blk.0.attn_norm.weight"] == "F32" and types["rope_freqs.weight"] == "F32"
    assert types["blk.1.layer_output_scale.weight"] == "F32"
    # rope_freqs: the full layers' proportional RoPE, 0.25 of 64 dims rotated = 8 pairs, 24 left alone
    freqs = np.asarray(tensors["rope_freqs.weight"].data)
    assert freqs.shape == (32,) and (freqs[:8] == 1).all() and (freqs[8:] == 1e30).all()


def test_hf_folder_streams_to_the_same_file(run, tmp_path):
    hf = tmp_path / "hf"
    assert main(["export-hf", str(run), str(hf)]) == 0
    a, b = tmp_path / "run.gguf", tmp_path / "hf.gguf"
    assert main(["export-gguf", str(run), str(a), "--type", "q8_0"]) == 0
    assert main(["export-gguf", "--hf", str(hf), str(b), "--type", "q8_0"]) == 0
    (ka, ta), (kb, tb) = read(a), read(b)
    assert {k: v for k, v in ka.items() if k != "general.name"} == {k: v for k, v in kb.items() if k != "general.name"}
    assert ta.keys() == tb.keys()
    assert all(np.array_equal(np.asarray(ta[n].data), np.asarray(tb[n].data)) for n in ta)
    # every layer's head width / kv heads are spelled out, and plelab reads the explicit form back
    from plelab.hf.interop import gemma4_folder_config

    explicit = json.loads((hf / "config.json").read_text())["per_layer_config"]
    assert explicit == {str(i): {"head_dim": 64, "num_key_value_heads": 2} for i in range(2)}
    cfg = gemma4_folder_config(hf)
    assert cfg.attention_shape(1) == (2, 64) and cfg.layer_types == ["sliding_attention", "full_attention"]


def test_diagnose_hf_reads_an_export_hf_folder(run, tmp_path, capsys):
    hf = tmp_path / "hf-diag"
    assert main(["export-hf", str(run), str(hf)]) == 0
    assert json.loads((hf / "config.json").read_text())["pad_token_id"] == 0
    capsys.readouterr()
    assert main(["diagnose", "--hf", str(hf), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"]["num_layers"] == 2


def test_diagnose_hf_reads_a_byte_level_export(tmp_path_factory, capsys):
    """The case that crashed: a byte-level tokenizer's pad id is 1, the stand-in PLE table has one row."""
    from gguf_helpers import byte_level_tokenizer

    root = tmp_path_factory.mktemp("bytelevel")
    run = train_run(root, "bl", byte_level_tokenizer(root), steps=1)
    hf = root / "hf"
    err = one_line_error(capsys, ["export-hf", str(run), str(hf)])
    assert "--kind gemma" in err and "--transformers-only" in err and not hf.exists()
    assert main(["export-hf", str(run), str(hf), "--transformers-only"]) == 0
    assert json.loads((hf / "config.json").read_text())["pad_token_id"] == 1
    capsys.readouterr()
    assert main(["diagnose", "--hf", str(hf), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"]["ple_vocab_size"] > 256


def test_bad_input_is_one_line_and_writes_nothing(run, tmp_path, capsys):
    out = tmp_path / "bad.gguf"
    err = one_line_error(capsys, ["export-gguf", str(run), str(out), "--type", "q4_k", "--tensor-type",
                                  r"blk\.0\.ffn_down=iq4_xs", "--tensor-type", "ple_gate=q9_9"])
    assert "unknown GGUF type" in err
    assert "PATTERN=TYPE" in one_line_error(capsys, ["export-gguf", str(run), str(out), "--tensor-type", "q8_0"])
    hf = tmp_path / "hf-bad"
    assert main(["export-hf", str(run), str(hf)]) == 0
    (hf / "tokenizer.json").unlink()
    assert "no tokenizer.json" in one_line_error(capsys, ["export-gguf", "--hf", str(hf), str(out)])
    assert "inside the input folder" in one_line_error(capsys, ["export-gguf", "--hf", str(hf), str(hf / "x.gguf")])
    out.write_text("mine")
    assert "--overwrite" in one_line_error(capsys, ["export-gguf", str(run), str(out)])
    assert out.read_text() == "mine"
    assert not list(tmp_path.glob(".bad.gguf*"))


def test_a_type_that_cannot_hold_a_row_falls_back_per_tensor_and_says_so(tmp_path_factory, capsys):
    """The mini-ple preset's FFN width, 344, divides into no block of 32 (q8_0, q4_0) or 256 (q4_k): those tensors
    are written as llama.cpp's quantizer writes them (f16) and reported; --strict-types refuses instead."""
    root = tmp_path_factory.mktemp("narrow")
    run = train_run(root, "ffn344", gemma_tokenizer(root), steps=1, ffn=344)  # ffn_down rows: 344 values
    out = root / "x.gguf"
    for wanted in ("q8_0", "q4_0"):
        assert main(["export-gguf", str(run), str(out), "--type", wanted, "--overwrite", "--json"]) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["fallbacks"] == [{"tensor": f"blk.{i}.ffn_down.weight", "wanted": wanted, "used": "f16",
                                        "row": 344} for i in range(2)]
        _, tensors = read(out)
        assert tensors["blk.0.ffn_down.weight"].tensor_type.name == "F16"
        assert tensors["blk.0.ffn_up.weight"].tensor_type.name == wanted.upper()
    assert main(["export-gguf", str(run), str(out), "--type", "q8_0", "--overwrite"]) == 0
    assert "blk.0.ffn_down.weight: rows of 344 values do not divide into q8_0's blocks; written as f16" in (
        capsys.readouterr().out)
    err = one_line_error(capsys, ["export-gguf", str(run), str(root / "y.gguf"), "--type", "q4_k", "--strict-types"])
    assert "blk.0.ffn_down.weight has rows of 344 values, not a multiple of q4_k's block of 256" in err
    assert not (root / "y.gguf").exists() and not list(root.glob(".y.gguf*"))


def test_the_fallback_is_llama_cpps():
    from plelab.hf.gguf_types import fitting_type

    assert fitting_type(gguf_type("q4_k"), 384).name == "q5_0"  # 384 = 12 blocks of 32, not of 256
    assert fitting_type(gguf_type("q6_k"), 384).name == "q8_0"
    assert fitting_type(gguf_type("q2_k"), 384).name == "iq4_nl"
    assert fitting_type(gguf_type("q4_k"), 344).name == "f16"
    assert fitting_type(gguf_type("q4_k"), 512).name == "q4_k"


def test_kv_sharing_llama_cpp_computes_differently_is_refused(tmp_path_factory, capsys):
    # transformers: the shared full layer 2 reuses full layer 0; llama.cpp would take layer 1 (sliding)
    root = tmp_path_factory.mktemp("kvshare")
    run = train_run(root, "share", gemma_tokenizer(root), steps=1, layers=3, gemma4="num_kv_shared_layers = 1\n"
                    'layer_types = ["full_attention", "sliding_attention", "full_attention"]\n')
    out = root / "x.gguf"
    err = one_line_error(capsys, ["export-gguf", str(run), str(out)])
    assert "KV-shared" in err and not out.exists()
    run = train_run(root, "allfull", gemma_tokenizer(root), steps=1, gemma4='layer_types = ["full_attention", '
                    '"full_attention"]\n')
    assert "sliding-attention" in one_line_error(capsys, ["export-gguf", str(run), str(out)])


def test_no_export_lands_on_a_file_of_a_run_or_in_its_checkpoints(run, tmp_path, capsys, monkeypatch):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    newest = max((copy / "checkpoints").glob("step_*"))
    older = copy / "checkpoints" / "step_00000001"
    shutil.copytree(newest, older)
    (tmp_path / "link").symlink_to(copy)
    before = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    monkeypatch.chdir(tmp_path)
    rel_newest = newest.relative_to(tmp_path)
    for out in ("run/config.json", str(copy / "config.json"), "link/config.json", "./link/../run/metrics.jsonl"):
        for cmd in (["export-gguf", str(older), out], ["export", str(older), "--out", out]):
            for extra in ((), ("--overwrite",)):
                assert "inside the training run" in one_line_error(capsys, [*cmd, *extra])
    # A new file in another checkpoint folder: the next prune would delete it.
    for out in (f"{rel_newest}/x.gguf", str(newest / "x.gguf"), f"link/checkpoints/{newest.name}/x.gguf"):
        assert "inside the training run" in one_line_error(capsys, ["export-gguf", str(older), out])
    assert "names a folder" in one_line_error(capsys, ["export-gguf", str(older), f"{rel_newest}/"])
    assert {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()} == before


def test_overwrite_never_replaces_a_fifo_or_device(run, tmp_path, capsys):
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    for cmd in (["export-gguf", str(run), str(fifo)], ["export", str(run), "--out", str(fifo)]):
        assert "is a FIFO (named pipe), not a regular file" in one_line_error(capsys, [*cmd, "--overwrite"])
    assert fifo.is_fifo()
    if os.geteuid() == 0:  # a device node of our own (a copy of /dev/null's numbers), never the system's
        node = tmp_path / "null"
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        assert "character device" in one_line_error(capsys, ["export-gguf", str(run), str(node), "--overwrite"])
        assert node.is_char_device()


def test_a_tensor_type_override_that_matches_nothing_is_refused(run, tmp_path, capsys):
    out = tmp_path / "x.gguf"
    for override in ("ple_tabel=q8_0", r"blk\.99\.ffn_down=q8_0", "ffn_down=q8_0"):
        err = one_line_error(capsys, ["export-gguf", str(run), str(out), "--tensor-type", override])
        assert f"--tensor-type {override} matches no matrix of this model" in err and "ple_table" in err, err
    assert not out.exists()
    assert main(["export-gguf", str(run), str(out), "--tensor-type", r"blk\.\d+\.ffn_down=q8_0"]) == 0


def test_a_corrupt_tokenizer_config_is_one_line(run, tmp_path, capsys):
    from plelab.hf.recipe_model import open_model
    from plelab.hf.recipe_run import gguf_blocker

    hf = tmp_path / "hf"
    assert main(["export-hf", str(run), str(hf)]) == 0
    (hf / "tokenizer_config.json").write_text('{"bos_token": ')
    err = one_line_error(capsys, ["export-gguf", "--hf", str(hf), str(tmp_path / "x.gguf")])
    assert "transformers cannot read its tokenizer (JSONDecodeError" in err and "tokenizer_config.json" in err
    assert not (tmp_path / "x.gguf").exists()
    assert "transformers cannot read its tokenizer" in gguf_blocker(open_model(hf, hf=True))  # quant-recipe --hf


def test_a_full_disk_is_one_line_naming_the_file(run, tmp_path, capsys):
    """A real full disk: a 64 KiB tmpfs (root only; skipped elsewhere), far smaller than the GGUF."""
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        err = one_line_error(capsys, ["export-gguf", str(run), str(disk / "x.gguf")])
        assert f"cannot write {disk / 'x.gguf'}: No space left on device (the disk or quota is full)" in err, err
        assert list(disk.iterdir()) == []
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_export_of_a_run_that_checkpoints_and_prunes_while_it_is_read(run, tmp_path, monkeypatch):
    """A run still training with keep_checkpoints = 1 writes a checkpoint and prunes the older one while an export
    reads it (at the E2B shape, on every export). Here that moment is made to come at once: right after the export
    verified its checkpoint, the trainer's own save and prune run. The checkpoint being read must survive."""
    import plelab.inference.load as load
    from plelab.runs.checkpoint import prune_checkpoints

    live = tmp_path / "live"
    shutil.copytree(run, live)
    ckpts = live / "checkpoints"
    verify = load.verify_checkpoint

    def verify_then_train_on(ckpt):
        verify(ckpt)
        newer = ckpts / f"step_{int(ckpt.name.split('_')[1]) + 1:08d}"
        shutil.copytree(ckpt, newer)  # the trainer's next checkpoint ...
        (ckpts / "LATEST").write_text(newer.name)
        prune_checkpoints(ckpts, keep=1)  # ... and its prune, as Trainer.save does

    monkeypatch.setattr(load, "verify_checkpoint", verify_then_train_on)
    assert main(["export-gguf", str(live), str(tmp_path / "live.gguf")]) == 0
    assert read(tmp_path / "live.gguf")[1]
    monkeypatch.undo()
    prune_checkpoints(ckpts, keep=1)  # the trainer's next prune removes the one that was read
    assert len(list(ckpts.glob("step_*"))) == 1
