"""plelab.experiments."""
