"""PLE diagnostics: is a model's per-layer embedding alive, weak or dead, and does the early warning say so?

Entry points:
    diagnose_model(model, batches, ...)    every diagnostic plus verdicts as one JSON-ready dict (diagnose.py)
    ablation_study / ple_ablated           loss with PLE switched off per layer and all at once (ablation.py)
    probe_layers                           injection ratio and gate statistics per layer (injection.py, gates.py)
    grad_norm_ratios                       gate / projection / table gradient norms over the trunk's (grads.py)
    table_health                           table rows vs random baselines, frequent and delta views (table_health.py)
    diagnose_hashing                       an n-gram table: rows per token and step, load, collisions, rows never
                                           trained (hashing.py)
    verdict.RULES and its constants        the alive / weak / dead rule (verdict.py)
    diagnose_run(path, data, ...)          a run or checkpoint loaded and diagnosed; format_report (diagnose_run.py)
    predict_from_run(run_dir, rule)        the early rule on a run's logged signals (early.py)
`plelab diagnose RUN_DIR_OR_CKPT [--data DIR] [--json]` prints diagnose_run's report. The trainer callback that
measures while training (PLEMonitor) is plelab.training.ple_monitor; what it leaves in RUN_DIR/diagnostics is
read by run_files.py.
"""
