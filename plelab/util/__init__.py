"""plelab.util."""
