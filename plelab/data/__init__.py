"""plelab.data."""
