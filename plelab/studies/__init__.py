"""The studies: one package each (its analysis, report and review), registered in `registry` for `plelab report`.

A study's inputs and results (sweep files, analysis plans, snapshots, reports) live in the repository's
studies/<name>/ folder, beside this code's package plelab/studies/<name>/.
"""
