"""PLE diagnostics: does a model *use* its per-layer table (dependence), does the table *pay* (benefit against the
dP = 0 twin trained on the same tokens), and does the early warning say so?

Entry points:
    diagnose_model(model, batches, ...)    every diagnostic plus the used verdicts as one JSON-ready dict (diagnose.py)
    ablation_study / ple_ablated           loss with PLE switched off per layer and all at once (ablation.py)
    paired_gain(model, twin, batches)      the pays verdict: the paired loss difference to the twin (benefit.py)
    find_twin / check_twin                 a run's dP = 0 twin beside it, or a named one checked (twin.py)
    probe_layers                           injection ratio and gate statistics per layer (injection.py, gates.py)
    grad_norm_ratios                       gate / projection / table gradient norms over the trunk's (grads.py)
    table_health                           table rows vs random baselines, frequent and delta views (table_health.py)
    diagnose_hashing                       an n-gram table: rows per token and step, load, collisions, rows never
                                           trained (hashing.py)
    verdict.RULES and its constants        the used and pays rules (verdict.py)
    diagnose_run(path, data, twin, ...)    a run or checkpoint loaded and diagnosed; format_report (diagnose_run.py)
    predict_from_run(run_dir, rule)        the early rule on a run's logged signals (early.py)
`plelab diagnose RUN_DIR_OR_CKPT [--data DIR] [--twin RUN] [--json]` prints diagnose_run's report. The trainer
callback that measures while training (PLEMonitor) is plelab.training.ple_monitor; what it leaves in
RUN_DIR/diagnostics is read by run_files.py.
"""
