"""`plelab demo --data` checks its folder before preparing or training anything."""

from __future__ import annotations

import pytest

from plelab.cli.main import main


class _NoTraining:
    def __init__(self, *args, **kwargs):
        raise AssertionError("the demo started training before checking --data")


@pytest.mark.parametrize("layout, message", [
    ((), "no train/ or valid/ folder"),
    (("train",), "no valid/ folder"),
    (("valid",), "no train/ folder"),
    (("train", "valid"), "valid/ holds no domain .txt files"),
])
def test_demo_data_without_train_and_valid_is_refused_before_training(tmp_path, capsys, monkeypatch, layout, message):
    monkeypatch.setattr("plelab.experiments.demo.Trainer", _NoTraining)
    data = tmp_path / "data"
    data.mkdir()
    (data / "notes.txt").write_text("Some text that is not laid out as train/ and valid/.\n" * 200)
    for name in layout:
        (data / name).mkdir()
        if name == "train":
            (data / name / "a.txt").write_text("Training text for the demo.\n" * 200)
    assert main(["demo", "--data", str(data), "--out", str(tmp_path / "out"), "--steps", "20"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "out").exists()


def test_demo_data_that_is_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "corpus.txt").write_text("text\n")
    assert main(["demo", "--data", str(tmp_path / "corpus.txt"), "--out", str(tmp_path / "out")]) == 2
    assert "not a folder" in capsys.readouterr().err
