"""Every piece of Hugging Face / Gemma checkpoint code: local Gemma 3n / Gemma 4 folders read without loading
the PLE table into RAM, plelab models converted to and from HF names, and the exports in both directions.

    checkpoint.py   the folder: config.json, safetensors shards (single or indexed, read by
                    plelab.util.safetensors), tokenizer.json; checks
    model.py        the transformers text model with its PLE table served from disk (StreamedEmbedding)
    interop.py      HF <-> plelab names and configs (Gemma PLE, Gemma 4, Llama); weights into LanguageModel
    run_export.py   `plelab export-hf`: an arch = "gemma4" run as a folder transformers loads
    ple_export.py   `plelab export --hf`: a Gemma folder's PLE table as a table-only .ple file
    diagnose.py     `plelab diagnose --hf`: the PLE diagnosis of a Gemma folder
    finetune/       LoRA fine-tuning (plelab finetune) with the table left on disk; see docs/finetune.md

Memory: the table is never materialised. Diagnosing reads only the rows a batch (or table health) needs,
exporting reads it in chunks of rows; both use os.pread, so the file's pages stay in the page cache
instead of the process's RSS. The rest of the text model is in memory in the chosen dtype, so the
expected peak RSS of a diagnosis is about (text parameters - table) x bytes per value + activations
(see plelab/hf/diagnose.py). transformers is an optional extra (pip install 'plelab[hf]').
"""
