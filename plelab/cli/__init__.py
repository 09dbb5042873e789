"""plelab.cli."""
