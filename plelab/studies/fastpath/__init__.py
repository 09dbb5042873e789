"""Same science on the fast path (check.py): do the bf16-head runs of a study reach the conclusions its fp32
runs reach? The check a study passes before it may train on `dtype = "bf16-head"`."""
