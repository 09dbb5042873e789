"""Run folders and what lives in them: the folder's lock and recorded config, checkpoints, metrics.

The services every part that reads or writes a run shares (training, sweeps, diagnostics, inference, export,
parallel training): one floor below all of them, above the model whose weights a checkpoint holds.
"""
