"""LoRA fine-tuning of a Hugging Face Gemma 3n / Gemma 4 checkpoint whose PLE table never leaves the disk.

    config.py       FinetuneConfig: plelab train's TrainConfig + [finetune] (rank, alpha, targets, table, ...)
    targets.py      which linear layers get adapters (groups attention / mlp / ple, or module names)
    model.py        FinetuneModel: the frozen transformers model + peft LoRA; only what trains is registered
    table_delta.py  optional: the touched table rows train as a sparse float32 delta (lazy sparse Adam)
    trainer.py      FinetuneTrainer: plelab's Trainer with the model and callbacks swapped; RUN/adapter
    adapter.py      the peft adapter folder (names of the checkpoint's own layout) and its record
    merge.py        --merge: adapters and delta folded into a Hugging Face folder, streamed shard by shard
    checks.py       refusals before anything is written (targets, data tokenizer, ...)
    memory.py       train-memory --finetune: per-device memory with and without the table on the device
    compare.py      diagnose --hf on a merged folder: did fine-tuning change how much the PLE is used?

Command: `plelab finetune` (plelab/cli/finetune.py); user guide: docs/finetune.md. Needs transformers and
peft (pip install 'plelab[finetune]').
"""
