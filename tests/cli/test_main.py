"""Every `plelab` subcommand has --help that ends with a runnable example."""

from __future__ import annotations

import pytest

from plelab.cli.main import COMMANDS, main


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_subcommand_has_help_with_an_example(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "Example:" in out and f"plelab {command}" in out.split("Example:", 1)[1]
