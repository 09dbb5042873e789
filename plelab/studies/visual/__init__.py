"""The visual PLE study (docs/visual-ple-study.md): do image-patch ids work as a PLE table? Visual tokenizers,
random ids, an auxiliary loss, paired by seed against no visual PLE, with the table's diagnostics."""
