"""`plelab export / plan / run` through the console entry: outputs, and one-line errors (exit 2) on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from edge_helpers import lively_model

from plelab.cli.main import main
from plelab.data.tokenizer import Tokenizer
from plelab.edge.export import ExportOptions, export_model


def one_line_error(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    return err


@pytest.fixture
def small(tmp_path) -> Path:
    out = tmp_path / "tiny.ple"
    assert main(["export", "tiny", "--quant", "int8", "--group", "32", "--out", str(out)]) == 0
    return out


def test_export_plan_run_roundtrip(small, capsys):
    capsys.readouterr()
    assert main(["place", str(small), "--device", "desktop", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    for key in ("fits", "placement", "bytes_per_token", "reads_per_token", "est_ms_per_token"):
        assert key in plan
    assert plan["placement"]["table:ple"] == "nvme" and plan["reads_per_token"]["nvme"] == 1
    assert main(["run", str(small), "--ids", "1,2,3", "--max-new-tokens", "5", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)
    assert len(run["generated_ids"]) == 5 and run["tokens_per_s"] > 0
    assert run["reads_per_token"]["file"] == 1  # one PLE record per token, the tied embedding row is in RAM


def test_plan_text_says_what_goes_where(small, capsys):
    assert main(["place", str(small), "--device", "esp32-s3"]) == 0
    out = capsys.readouterr().out
    assert "sram" in out and "flash" in out and "table:ple" in out and "ms/token" in out


def test_run_with_the_tokenizer_from_a_checkpoint(tmp_path, capsys):
    tok = Tokenizer.byte_level()
    model = lively_model(f"vocab_size={tok.vocab_size}")
    out = tmp_path / "m.ple"
    export_model(model, out, ExportOptions(quant="fp16"), tokenizer_json=tok.to_json())
    assert main(["run", str(out), "--prompt", "hello", "--max-new-tokens", "3", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)
    assert run["prompt_tokens"] == 5 and isinstance(run["text"], str)


def test_bad_files_give_one_line_errors(small, tmp_path, capsys):
    raw = small.read_bytes()
    cut = tmp_path / "cut.ple"
    cut.write_bytes(raw[: len(raw) // 2])
    assert "truncated" in one_line_error(capsys, "run", str(cut), "--ids", "1")
    flipped = bytearray(raw)
    flipped[-300] ^= 0xFF
    bad = tmp_path / "flip.ple"
    bad.write_bytes(bytes(flipped))
    assert "checksum" in one_line_error(capsys, "run", str(bad), "--ids", "1")
    magic = tmp_path / "magic.ple"
    magic.write_bytes(b"NOTAPLE!" + raw[8:])
    assert "not a .ple file" in one_line_error(capsys, "run", str(magic), "--ids", "1")
    assert "no such file" in one_line_error(capsys, "run", str(tmp_path / "missing.ple"), "--ids", "1").lower()


def test_bad_ids_and_devices(small, capsys):
    assert "[0, 256)" in one_line_error(capsys, "run", str(small), "--ids", "1,2,999")
    assert "comma-separated" in one_line_error(capsys, "run", str(small), "--ids", "a,b")
    assert "unknown device" in one_line_error(capsys, "place", str(small), "--device", "toaster")


def test_too_big_for_the_device(capsys):
    err = one_line_error(capsys, "place", "esp32-28m", "--quant", "fp32", "--device", "esp32-s3")
    assert "does not fit esp32-s3" in err and "missing" in err and "flash" in err
    err = one_line_error(capsys, "place", "esp32-28m", "--quant", "int8", "--set", "hidden_size=512",
                         "--device", "esp32-s3")
    assert "does not fit" in err


def test_user_device_file(small, tmp_path, capsys):
    dev = tmp_path / "devs.toml"
    dev.write_text(
        '[devices.tinymcu]\ndescription = "x"\nflops_per_s = 1e8\n'
        '[[devices.tinymcu.tiers]]\nname = "ram"\nkind = "ram"\ncapacity = 1000\nread_mb_s = 100\n'
        '[[devices.tinymcu.tiers]]\nname = "rom"\nkind = "storage"\ncapacity = 100000000\nread_mb_s = 10\n'
    )
    err = one_line_error(capsys, "place", str(small), "--device", "tinymcu", "--devices", str(dev))
    assert "ram" in err and "missing" in err


def test_console_entry_has_no_traceback_on_corrupt_input(small, tmp_path):
    bad = tmp_path / "bad.ple"
    bad.write_bytes(small.read_bytes()[:-7])
    out = subprocess.run([sys.executable, "-m", "plelab", "run", str(bad), "--ids", "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().startswith("plelab run: error:") and "truncated" in out.stderr


def test_export_and_plan_a_checkpoint_with_its_tokenizer(tmp_path, capsys):
    from plelab.runs.checkpoint import save_checkpoint

    tok = Tokenizer.byte_level()
    tok_file = tok.save(tmp_path / "tokenizer.json")
    model = lively_model(f"vocab_size={tok.vocab_size}")
    ckpt = save_checkpoint(tmp_path / "run" / "checkpoints" / "step_00000001", model, tokenizer=tok_file)
    out = tmp_path / "ckpt.ple"
    assert main(["export", str(tmp_path / "run"), "--quant", "int8", "--out", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["sections"]["tokenizer"]["bytes"] > 0 and info["file_bytes"] == out.stat().st_size
    assert main(["place", str(ckpt), "--quant", "int8", "--device", "esp32-p4", "--json"]) == 0
    from_ckpt = json.loads(capsys.readouterr().out)
    assert main(["place", str(out), "--device", "esp32-p4", "--json"]) == 0
    from_file = json.loads(capsys.readouterr().out)
    # Planning the checkpoint analytically gives the file's numbers (the tokenizer is host-side).
    assert from_ckpt["bytes_per_token"] == from_file["bytes_per_token"]
    assert main(["run", str(out), "--prompt", "hi", "--max-new-tokens", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["prompt_tokens"] == 2


# --- output safety ------------------------------------------------------------------------------------------


def test_export_refuses_to_overwrite_unless_asked(small, capsys):
    before = small.read_bytes()
    err = one_line_error(capsys, "export", "tiny", "--quant", "int8", "--seed", "1", "--out", str(small))
    assert "already exists" in err and "--overwrite" in err and small.read_bytes() == before
    assert main(["export", "tiny", "--quant", "int8", "--seed", "1", "--out", str(small), "--overwrite"]) == 0
    assert small.read_bytes() != before


def test_export_never_writes_over_its_input(tmp_path, capsys):
    from plelab.runs.checkpoint import save_checkpoint

    ckpt = save_checkpoint(tmp_path / "run" / "checkpoints" / "step_00000001", lively_model())
    weights = next(p for p in ckpt.iterdir() if p.name.startswith("model"))
    before = weights.read_bytes()
    err = one_line_error(capsys, "export", str(tmp_path / "run"), "--out", str(weights), "--overwrite")
    assert "also an input" in err and weights.read_bytes() == before
    cfg = tmp_path / "m.toml"
    cfg.write_text('preset = "tiny"\n')
    assert "also an input" in one_line_error(capsys, "export", str(cfg), "--out", str(cfg), "--overwrite")


def test_bad_output_paths_are_one_line(tmp_path, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    dangling = tmp_path / "dangling.ple"
    dangling.symlink_to(tmp_path / "nowhere" / "x.ple")
    for out, says in ((tmp_path, "is a folder"), (a_file / "m.ple", "not a writable folder"),
                      (dangling, "dangling"), (tmp_path / "gone" / "x.ple", None)):
        argv = ["export", "tiny", "--quant", "int8", "--out", str(out)]
        if says is None:  # a missing parent folder is created
            assert main(argv) == 0 and out.is_file()
        else:
            assert says in one_line_error(capsys, *argv)
    assert a_file.read_text() == "x"


@pytest.mark.skipif(hasattr(__import__("os"), "geteuid") and __import__("os").geteuid() == 0,
                    reason="root can write into read-only folders")
def test_read_only_folder_is_one_line(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    assert "not a writable folder" in one_line_error(capsys, "export", "tiny", "--out", str(ro / "m.ple"))


def test_a_killed_export_leaves_a_temp_file_the_next_export_removes(tmp_path):
    import os
    import signal
    import time

    out = tmp_path / "big.ple"
    proc = subprocess.Popen([sys.executable, "-m", "plelab", "export", "esp32-28m", "--quant", "int4",
                             "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 120
    try:
        while not list(tmp_path.glob(".big.ple.*.tmp")) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    stale = list(tmp_path.glob(".big.ple.*.tmp"))
    assert len(stale) == 1 and f".{proc.pid}." in stale[0].name and not out.exists()
    live = tmp_path / f".other.ple.{os.getpid()}.abcd1234.tmp"  # a write in progress in a living process
    live.write_bytes(b"x")
    assert main(["export", "tiny", "--quant", "int8", "--out", str(tmp_path / "small.ple")]) == 0
    assert not stale[0].exists() and live.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, "small.ple"])


# --- plan: flags that cannot apply, device profiles -----------------------------------------------------------


def test_plan_refuses_flags_that_would_be_ignored(small, tmp_path, capsys):
    from plelab.runs.checkpoint import save_checkpoint

    for flags in (["--quant", "int4"], ["--group", "64"], ["--embed-in-record"], ["--align", "8"], ["--page", "4096"]):
        err = one_line_error(capsys, "place", str(small), "--device", "desktop", *flags)
        assert flags[0] in err and "re-export" in err
    assert "--set" in one_line_error(capsys, "place", str(small), "--device", "desktop", "--set", "hidden_size=64")
    run = tmp_path / "run"
    save_checkpoint(run / "checkpoints" / "step_00000001", lively_model())
    assert "--set" in one_line_error(capsys, "place", str(run), "--device", "desktop", "--set", "num_layers=9")
    # Honoured where they apply: a preset is laid out as the flags say.
    assert main(["place", "tiny", "--device", "desktop", "--quant", "int8", "--set", "num_layers=3", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert sum(1 for it in plan["items"] if it["name"].endswith("0.input_layernorm.weight")) == 1
    assert not any(it["name"].startswith("layers.3.") for it in plan["items"])


def test_plan_context_beyond_the_model_is_refused(small, capsys):
    assert "beyond the model's context" in one_line_error(capsys, "place", str(small), "--device", "desktop",
                                                           "--context", "100000")


DEVICE = ('[devices.d]\ndescription = "x"\nflops_per_s = {flops}\n'
          '[[devices.d.tiers]]\nname = "ram"\nkind = "ram"\ncapacity = {cap}\nread_mb_s = {ram_bw}\n'
          '[[devices.d.tiers]]\nname = "rom"\nkind = "storage"\ncapacity = 100000000\nread_mb_s = 10\n'
          'latency_us = {lat}\npage = {page}\n')
GOOD = {"flops": "1e9", "cap": "1000000000", "ram_bw": "100", "lat": "1.0", "page": "1"}


@pytest.mark.parametrize(("field", "value", "names"), [
    ("ram_bw", "0", "read_mb_s"), ("ram_bw", "nan", "read_mb_s"), ("ram_bw", "inf", "read_mb_s"),
    ("cap", "-5", "capacity"), ("cap", "1.5", "capacity"), ("flops", "0", "flops_per_s"),
    ("lat", "-1", "latency_us"), ("page", "0", "page"), ("ram_bw", '"fast"', "read_mb_s"),
])
def test_bad_device_profile_values_name_the_profile_and_field(small, tmp_path, capsys, field, value, names):
    dev = tmp_path / "devs.toml"
    dev.write_text(DEVICE.format(**{**GOOD, field: value}))
    err = one_line_error(capsys, "place", str(small), "--device", "d", "--devices", str(dev))
    assert "device 'd'" in err and names in err


def test_the_shipped_device_profiles_pass_the_checks():
    from plelab.edge.placement import load_devices

    assert {"esp32-s3", "esp32-p4", "phone-ufs4", "desktop"} <= set(load_devices())


# --- corrupt or non-UTF-8 inputs ------------------------------------------------------------------------------


def test_non_utf8_and_corrupt_inputs_are_one_line(small, tmp_path, capsys):
    latin = tmp_path / "model.toml"
    latin.write_bytes('preset = "tiny"\n# caf\xe9\n'.encode("latin-1"))
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    for argv in (["params", str(latin)], ["place", str(latin), "--device", "desktop"],
                 ["export", str(latin), "--out", str(tmp_path / "a.ple")], ["params", str(junk)],
                 ["place", str(junk), "--device", "desktop"]):
        one_line_error(capsys, *argv)
    devs = tmp_path / "devs.toml"
    devs.write_bytes(b"[devices.d]\ndescription = \"\xff\xfe\"\n")
    assert "device file" in one_line_error(capsys, "place", str(small), "--device", "d", "--devices", str(devs))
    tok = tmp_path / "tok.json"
    tok.write_bytes(b"\xff\xfe{}")
    bare = tmp_path / "bare.ple"
    export_model(lively_model(), bare, ExportOptions(quant="int8"))
    one_line_error(capsys, "run", str(bare), "--prompt", "hi", "--tokenizer", str(tok))
    run = tmp_path / "run" / "checkpoints" / "step_00000001"
    from plelab.runs.checkpoint import save_checkpoint

    save_checkpoint(run, lively_model())
    (run / "config.json").write_bytes(b"\xff\xfe not json")
    for argv in (["place", str(tmp_path / "run"), "--device", "desktop"],
                 ["export", str(tmp_path / "run"), "--out", str(tmp_path / "b.ple")]):
        one_line_error(capsys, *argv)


def test_run_on_a_folder_or_with_a_corrupt_embedded_tokenizer_is_one_line(tmp_path, capsys):
    from plelab.edge.format import PleFile

    assert "is a folder" in one_line_error(capsys, "run", str(tmp_path), "--ids", "1")
    tok = Tokenizer.byte_level()
    out = tmp_path / "m.ple"
    export_model(lively_model(f"vocab_size={tok.vocab_size}"), out, ExportOptions(quant="int8"),
                 tokenizer_json=tok.to_json())
    with PleFile(out) as f:
        sec = f.layout.section("tokenizer")
    raw = bytearray(out.read_bytes())
    raw[sec.offset + sec.nbytes // 2] ^= 0xFF
    out.write_bytes(bytes(raw))
    assert "tokenizer" in one_line_error(capsys, "run", str(out), "--prompt", "hi", "--verify", "core")


def test_plelab_run_never_imports_torch(small):
    code = ("import sys; from plelab.cli.main import main; "
            f"rc = main(['run', {str(small)!r}, '--ids', '1,2', '--max-new-tokens', '3', '--temperature', '0.7']); "
            "print(rc, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "0 False", out.stderr


def test_an_absurd_align_is_one_line_not_a_memory_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["export", "tiny", "--out", str(tmp_path / "a.ple"), "--align", "1000000000"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and err.count("\n") == 0 and "--align" in err and "65536" in err, err
    assert not (tmp_path / "a.ple").exists()
    from plelab.errors import PlelabError

    with pytest.raises(PlelabError, match="65536"):  # the library refuses it too
        export_model(lively_model(), tmp_path / "b.ple", ExportOptions(quant="int8", align=10**9))


def test_running_out_of_memory_is_one_line(tmp_path, capsys, monkeypatch):
    """A simulation: the MemoryError numpy raises (its own words) is injected where the export starts, since a real
    one would need a test to exhaust the machine's memory."""

    def exhausted(*args, **kwargs):
        raise MemoryError("Unable to allocate 7.28 TiB for an array with shape (1000000000000,) and data type int64")

    monkeypatch.setattr("plelab.edge.export.export_source", exhausted)
    err = one_line_error(capsys, "export", "tiny", "--out", str(tmp_path / "a.ple"))
    assert "out of memory" in err and "7.28 TiB" in err
