"""plelab.diagnostics."""
