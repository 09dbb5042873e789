"""Reading a committed report's tables: the cells and pipe tables every study's review parses."""

from __future__ import annotations

from plelab.studies.review import markdown_tables, parse_pm


def test_parsing_the_committed_tables():
    assert parse_pm("+0.0124 ± 0.0069 ▲") == (0.0124, 0.0069) and parse_pm("-") is None
    tables = markdown_tables("## A\n\n| x | y \\| z |\n|---|---|\n| 1 | 2 |\n")
    assert tables == [{"heading": "A", "headers": ["x", "y | z"], "rows": [["1", "2"]]}]
