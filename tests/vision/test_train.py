"""VisionTrainer: held-out caption evaluation in the sweep's shape, exact resume, config/corpus checks, and the
planted case where only the visual table can explain the captions."""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from vision_helpers import K, serve_planted_corpus, vision_config

from plelab.cli.main import main
from plelab.training.callbacks import Callback
from plelab.training.config import TrainConfig, train_config_dict
from plelab.util.dataclass_config import ConfigError
from plelab.vision.train import CaptionEvaluator, VisionProgress, VisionTrainer, caption_loss, load_vision_model


@pytest.fixture
def planted_corpus(monkeypatch, tmp_path) -> Path:
    return serve_planted_corpus(monkeypatch, tmp_path / "corpus")


def step_losses(run: Path) -> dict[int, tuple[float, float | None]]:
    out = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if "eval" not in m:
            out[m["step"]] = (m["loss"], m.get("patch_id"))
    return out


class StopAt(Callback):
    """Ask the trainer to stop (as SIGTERM does: checkpoint, then KeyboardInterrupt) after `step`."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, trainer, metrics) -> None:
        if trainer.step == self.step:
            trainer._stop_signal = signal.SIGTERM


def test_trains_evaluates_the_whole_heldout_split_and_logs_aux_apart(planted_corpus, tmp_path):
    cfg = vision_config(planted_corpus, vision={"ple_dim": 8, "aux_weight": 0.5}, eval_every=10)
    trainer = VisionTrainer(cfg, tmp_path / "run", quiet=True)
    assert {type(cb) for cb in trainer.callbacks} >= {CaptionEvaluator, VisionProgress}
    final = trainer.run()
    ev = final["final_eval"]
    # 64 held-out captions of 2 tokens each, in the shape sweep_runner.collect_result reads.
    assert ev["domains"]["captions"]["tokens"] == 128
    assert ev["macro"]["loss"] == ev["domains"]["captions"]["loss"]
    evals = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if "eval" in line]
    assert [e["step"] for e in evals] == [10, 20]
    losses = step_losses(tmp_path / "run")
    assert all(aux is not None for _, aux in losses.values())  # patch_id logged, apart from loss
    assert trainer.evaluate()["macro"]["loss"] == ev["macro"]["loss"]  # deterministic
    model, meta = load_vision_model(tmp_path / "run")
    assert meta["train"]["vision"]["ple_dim"] == 8 and model.visual_table().shape == (K, 2, 8)
    reloaded = caption_loss(model, trainer.data, batch_size=64)["loss"]
    assert reloaded == pytest.approx(ev["macro"]["loss"], rel=1e-5)


def test_kill_and_resume_gives_the_same_loss_curve(planted_corpus, tmp_path):
    # 12 steps of 32 images cross an epoch of 256 (8 batches); the stop lands mid-epoch.
    cfg = vision_config(planted_corpus, vision={"ple_dim": 8, "aux_weight": 0.5}, max_steps=12, ckpt_every=4)
    whole = VisionTrainer(cfg, tmp_path / "whole", quiet=True).run()
    with pytest.raises(KeyboardInterrupt):
        VisionTrainer(cfg, tmp_path / "cut", quiet=True, callbacks=[StopAt(6)]).run()
    resumed = VisionTrainer(cfg, tmp_path / "cut", quiet=True, resume=True).run()
    assert step_losses(tmp_path / "cut") == step_losses(tmp_path / "whole")
    assert resumed["final_eval"] == whole["final_eval"]


def test_plelab_train_runs_a_vision_config_and_resumes_it(planted_corpus, tmp_path, capsys):
    cfg = tmp_path / "vision.toml"
    cfg.write_text("max_steps = 6\nbatch_size = 32\nwarmup_steps = 2\ndevice = \"cpu\"\ndtype = \"fp32\"\n"
                   "[model]\nvocab_size = 32\nhidden_size = 32\nnum_layers = 2\nnum_heads = 2\nmax_seq_len = 8\n"
                   f"[vision]\ncorpus = \"{planted_corpus}\"\nple_dim = 8\naux_weight = 0.5\n")
    out = tmp_path / "run"
    assert main(["train", str(cfg), "--out", str(out), "--quiet"]) == 0
    assert main(["train", "--out", str(out), "--resume", "--quiet", "--set", "max_steps=8"]) == 0
    assert max(step_losses(out)) == 8
    capsys.readouterr()
    assert main(["train", str(cfg), "--out", str(tmp_path / "bad"), "--set", "vision.aux_weight=-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "vision.aux_weight" in err and "\n" not in err


@pytest.fixture(scope="module")
def prepared_corpus(tmp_path_factory) -> Path:
    """A corpus written by plelab.vision.corpus: 80 noise 8x8 images with labels, random ids, 4x4 patches."""
    from plelab.vision.corpus import prepare_corpus

    root = tmp_path_factory.mktemp("prepared")
    rng = np.random.default_rng(0)
    images = (rng.random((80, 8, 8)) * 255).astype(np.uint8)
    np.savez(root / "images.npz", images=images, labels=rng.integers(0, 10, 80))
    prepare_corpus(root / "images.npz", "random", 8, root / "corpus", patch_size=4, heldout=16)
    return root / "corpus"


def test_trains_on_a_corpus_that_plelab_vision_prepared(prepared_corpus, tmp_path):
    from plelab.vision.corpus import VisionCorpus

    cfg = vision_config(prepared_corpus, batch_size=16, max_steps=3, model={"vocab_size": 512, "max_seq_len": 64},
                        vision={"ple_dim": 4, "codebook": 8, "patches": 4, "patch_size": 4})
    final = VisionTrainer(cfg, tmp_path / "run", quiet=True).run()
    valid = VisionCorpus.load(prepared_corpus, "valid")
    # Every held-out caption token is a target except the leading start token (input only).
    assert final["final_eval"]["domains"]["captions"]["tokens"] == int(valid.caption_lengths.sum()) - 16
    assert (tmp_path / "run" / "checkpoints" / "step_00000003" / "tokenizer.json").is_file()


def test_resume_on_a_replaced_corpus_is_refused(tmp_path):
    """Text runs refuse to resume on other data (the loader's fingerprint); a vision run does the same."""
    from plelab.errors import PlelabError
    from plelab.vision.corpus import prepare_corpus

    def prepare(seed: int) -> None:
        rng = np.random.default_rng(seed)
        images = (rng.random((80, 8, 8)) * 255).astype(np.uint8)
        np.savez(tmp_path / "images.npz", images=images, labels=rng.integers(0, 10, 80))
        prepare_corpus(tmp_path / "images.npz", "random", 8, tmp_path / "corpus", patch_size=4, heldout=16,
                       overwrite=True)

    prepare(0)
    cfg = vision_config(tmp_path / "corpus", batch_size=16, max_steps=6, ckpt_every=2,
                        model={"vocab_size": 512, "max_seq_len": 64}, vision={"ple_dim": 4})
    with pytest.raises(KeyboardInterrupt):
        VisionTrainer(cfg, tmp_path / "run", quiet=True, callbacks=[StopAt(2)]).run()
    prepare(1)  # another image set prepared into the same folder: same shapes, other images and ids
    with pytest.raises(PlelabError, match="corpus .* is not the one this run trained on"):
        VisionTrainer(cfg, tmp_path / "run", quiet=True, resume=True)
    prepare(0)  # the same corpus again (prepare is deterministic): the run resumes
    VisionTrainer(cfg, tmp_path / "run", quiet=True, resume=True).run()


def test_text_commands_on_a_vision_run_say_it_is_a_vision_run(planted_corpus, tmp_path, capsys):
    VisionTrainer(vision_config(planted_corpus, vision={"ple_dim": 8}, max_steps=1), tmp_path / "run",
                  quiet=True).run()
    run = str(tmp_path / "run")
    (tmp_path / "valid.txt").write_text("some text\n")
    capsys.readouterr()
    for argv in (["eval", run, "--data", str(tmp_path / "valid.txt")], ["export", run, "--out", str(tmp_path / "x")],
                 ["generate", run, "--prompt", "a"], ["diagnose", run], ["export-hf", run, str(tmp_path / "hf")]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "is a vision run" in err and "plelab vision diagnose" in err, err


def test_text_configs_record_no_vision_section():
    assert "vision" not in train_config_dict(TrainConfig())  # existing run configs and sweep hashes unchanged
    cfg = vision_config(Path("c"), vision={"ple_dim": 4})
    assert train_config_dict(cfg)["vision"]["ple_dim"] == 4


@pytest.mark.parametrize(("fields", "key"), [
    ({"vision": {"codebook": K // 2}}, "vision.codebook"),
    ({"vision": {"patches": 9}}, "vision.patches"),
    ({"model": {"vocab_size": 16}}, "model.vocab_size"),
    ({"model": {"max_seq_len": 4}}, "model.max_seq_len"),
])
def test_config_and_corpus_disagreeing_is_one_line(planted_corpus, tmp_path, fields, key):
    with pytest.raises(ConfigError, match=key) as err:
        VisionTrainer(vision_config(planted_corpus, **fields), tmp_path / "run", quiet=True)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("fields", "key"), [
    ({"model": {"ple": {"dim": 8}}}, "model.ple.dim"),
    ({"data": "tokens"}, "data"),
    ({"diagnostics_every": 5}, "diagnostics_every"),
])
def test_text_settings_a_vision_run_cannot_honour(fields, key):
    with pytest.raises(ConfigError, match=key):
        vision_config(Path("c"), **fields)


def train_planted(corpus: Path, run: Path, vision: dict) -> tuple[VisionTrainer, dict]:
    """A trainer after 80 tiny steps on the planted corpus, and its final metrics."""
    cfg = vision_config(corpus, vision=vision, max_steps=80, warmup_steps=10, lr=2e-2, log_every=100)
    trainer = VisionTrainer(cfg, run, quiet=True)
    return trainer, trainer.run()


def test_planted_captions_make_the_aux_loss_model_learn_a_structured_table(planted_corpus, tmp_path):
    """Pixels are noise, patch ids follow a fixed chain and the caption is a function of patch 0's id: only the
    visual table can name the ids, so only with it can the caption or the next id be predicted."""
    torch.set_num_threads(1)
    _, no_table = train_planted(planted_corpus, tmp_path / "aux", {"aux_weight": 0.5})
    trainer, with_table = train_planted(planted_corpus, tmp_path / "ple", {"ple_dim": 8, "aux_weight": 0.5})
    base, loss = no_table["final_eval"]["macro"]["loss"], with_table["final_eval"]["macro"]["loss"]
    # Without the table the first caption word stays at chance (ln 8; the mean over both words is ~1.39 nats)
    # and so does the next id (ln K); with it both are learnt.
    assert base > 1.2 and loss < base - 1.0, (loss, base)
    assert no_table["patch_id"] / 0.5 > 0.9 * math.log(K) > 0.3 * math.log(K) > with_table["patch_id"] / 0.5
    # The knowledge sits in the table's rows: give each id another id's row and the captions are lost again.
    table = trainer.model.visual_ple.embed_tokens_per_layer.weight
    with torch.no_grad():
        table.copy_(table[torch.roll(torch.arange(K), 1)])
    shuffled = caption_loss(trainer.model, trainer.data, batch_size=64)["loss"]
    assert shuffled > base + 0.5, (shuffled, base)


def test_an_ids_only_run_trains_reloads_and_diagnoses(planted_corpus, tmp_path, capsys):
    """vision.pixels = false: no patch embedding is trained or saved; the run reloads (its config says ids-only)
    and `plelab vision diagnose` reads it against its corpus."""
    from plelab.cli.main import main

    cfg = vision_config(planted_corpus, vision={"ple_dim": 8, "pixels": False}, max_steps=20)
    final = VisionTrainer(cfg, tmp_path / "run", quiet=True).run()
    model, meta = load_vision_model(tmp_path / "run")
    assert model.patch_embed is None and meta["train"]["vision"]["pixels"] is False
    assert not any(name.startswith("patch_embed") for name, _ in model.named_parameters())
    data = VisionTrainer(cfg, tmp_path / "again", quiet=True).data
    assert caption_loss(model, data, batch_size=64)["loss"] == pytest.approx(final["final_eval"]["macro"]["loss"],
                                                                            rel=1e-5)
    capsys.readouterr()
    assert main(["vision", "diagnose", str(tmp_path / "run"), "--corpus", str(planted_corpus), "--json"]) == 0
    assert "verdict" in capsys.readouterr().out
