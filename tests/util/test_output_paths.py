"""The output-path guard against every spelling of a path: relative, absolute, through a symlink, trailing slash.

A command's inputs are never its outputs, nothing is written inside a training run's folder (its checkpoints are
pruned, its config.json is read on resume), and --overwrite replaces only regular files.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from plelab.errors import PlelabError
from plelab.util.fs import check_output_path, run_folder_of


@pytest.fixture
def tree(tmp_path, monkeypatch) -> Path:
    """tmp/run (a training run: config.json, metrics, two checkpoints), tmp/hf (a model folder), links to both."""
    run = tmp_path / "run"
    for step in ("step_3", "step_6"):
        (run / "checkpoints" / step).mkdir(parents=True)
        (run / "checkpoints" / step / "manifest.json").write_text("{}")
    (run / "metrics.jsonl").write_text("")
    (run / "config.json").write_text('{"model": {}}')
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text('{"model_type": "gemma4_text"}')
    (tmp_path / "run-link").symlink_to(run)
    (tmp_path / "ckpt-link").symlink_to(run / "checkpoints" / "step_6")
    (tmp_path / "hf-link").symlink_to(hf)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def spellings(tree: Path, relative: str) -> list[str]:
    """The same path written four ways: relative, absolute, through a symlink and "..", and "./"."""
    return [relative, str(tree / relative), str(tree / "run-link" / ".." / relative), f"./{relative}"]


@pytest.mark.parametrize("target", ["run/config.json", "run/metrics.jsonl", "run/checkpoints/step_6/x.gguf",
                                    "run/x.gguf", "run-link/config.json", "ckpt-link/x.gguf",
                                    "run-link/checkpoints/step_3/model.safetensors"])
def test_no_file_is_written_inside_a_run(tree, target):
    for spelling in spellings(tree, target):
        with pytest.raises(PlelabError, match=r"inside the training run .*run.*write it outside the run"):
            check_output_path(spelling, overwrite=True)


@pytest.mark.parametrize("target", ["run", "run/", "run-link", "run-link/", "run/checkpoints/step_6/",
                                    "run/checkpoints/merged"])
def test_no_folder_output_replaces_or_enters_a_run(tree, target):
    for spelling in (target, str(tree / target)):
        with pytest.raises(PlelabError, match="training run"):
            check_output_path(spelling, overwrite=True, is_dir=True)


def test_the_trainer_writes_its_own_run_but_no_run_inside_another(tree):
    for spelling in ("run", "run/", str(tree / "run"), "run-link"):
        assert check_output_path(spelling, overwrite=True, is_dir=True, run=True) == Path(spelling)
    with pytest.raises(PlelabError, match="inside the training run"):
        check_output_path("run-link/checkpoints/other", is_dir=True, run=True)


def test_a_run_before_its_first_checkpoint_is_a_run_and_a_model_folder_is_not(tree):
    shutil.rmtree(tree / "run" / "checkpoints")
    assert run_folder_of(tree / "run" / "config.json") == tree / "run"
    with pytest.raises(PlelabError, match="inside the training run"):
        check_output_path("run/config.json", overwrite=True)
    assert run_folder_of(tree / "hf" / "x.gguf") is None


@pytest.mark.parametrize("target", ["hf", "hf/", "hf-link", "hf-link/"])
def test_an_input_folder_is_never_the_output(tree, target):
    for spelling in (target, str(tree / target)):
        with pytest.raises(PlelabError, match=r"also an input of this command \(hf\)"):
            check_output_path(spelling, overwrite=True, is_dir=True, inputs=("hf",))
        with pytest.raises(PlelabError, match="also an input"):
            check_output_path(spelling, overwrite=True, is_dir=True, inputs=(str(tree / "hf-link") + "/",))


@pytest.mark.parametrize("target", ["hf/config.json", "hf-link/config.json", "hf/new.gguf", "hf-link/sub/new.gguf"])
def test_nothing_is_written_inside_an_input_folder(tree, target):
    for spelling in (target, str(tree / target)):
        with pytest.raises(PlelabError, match="inside the input folder"):
            check_output_path(spelling, overwrite=True, inputs=(str(tree / "hf"),))
    assert (tree / "hf" / "config.json").read_text() == '{"model_type": "gemma4_text"}'


def test_a_file_output_spelled_as_a_folder_is_refused(tree):
    with pytest.raises(PlelabError, match="ends in '/', so it names a folder"):
        check_output_path("out/")
    assert check_output_path("out/", is_dir=True) == Path("out")


def test_overwrite_replaces_only_regular_files(tree):
    fifo = tree / "pipe"
    os.mkfifo(fifo)
    (tree / "pipe-link").symlink_to(fifo)
    for spelling in ("pipe", str(fifo), "pipe-link"):
        with pytest.raises(PlelabError, match=r"is a FIFO \(named pipe\), not a regular file"):
            check_output_path(spelling, overwrite=True)
    with pytest.raises(PlelabError, match="is a character device, not a regular file"):
        check_output_path("/dev/null", overwrite=True)  # only checked: a root process would replace the node
    assert fifo.is_fifo()
