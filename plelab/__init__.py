"""plelab: build, count, train, diagnose and ship per-layer-embedding (PLE) language models."""

__version__ = "0.1.0"
