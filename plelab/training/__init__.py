"""plelab.training."""
