"""plelab.edge."""
