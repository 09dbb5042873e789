"""plelab against llama.cpp on one plelab arch = "gemma4" run: logit parity of both export paths, greedy text, and
KL / held-out Δloss of every GGUF type, measured in llama.cpp (llama-cpp-python) against plelab's fp32 model.

    paths    export-hf -> llama.cpp's convert_hf_to_gguf.py (f32, f16)  and  export-gguf (f32, f16)
    logits   max |Δ| over every position of the held-out windows (f32 files; llama.cpp with an f32 KV cache)
    greedy   24 tokens from a prompt: ids and text identical to plelab's (f32 and f16 files)
    types    KL(p_plelab_fp32 || p_llama.cpp) in nats/token and Δloss, overall and per domain, and file bytes

Needs `bash scripts/setup.sh --test` (llama-cpp-python and the converter). Prints JSON with the command.

    python3 benchmarks/llama_cpp_parity.py --run runs/g4 --eval ../shared/data/valid --tokens 512
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TYPES = ["f16", "q8_0", "q6_k", "q5_k", "q5_0", "q4_k", "q4_0", "iq4_nl", "q3_k", "q2_k"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="plelab arch=gemma4 run with a Gemma-style tokenizer")
    p.add_argument("--eval", required=True, help="held-out .txt domains (folder or file)")
    p.add_argument("--tokens", type=int, default=512, help="held-out tokens per domain")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--prompt", default="Once upon a time")
    p.add_argument("--types", default=",".join(TYPES))
    args = p.parse_args()

    import numpy as np
    import torch

    from plelab.cli.main import main as cli

    def plelab(argv: list[str]) -> int:
        with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the JSON
            return cli(argv)
    from plelab.hf.llama_cpp import LlamaCpp, convert_hf
    from plelab.hf.quant_recipe import Measurer, held_out
    from plelab.hf.recipe_model import plelab_model
    from plelab.hf.recipe_run import measure_gguf_file
    from plelab.inference.generate import generate

    torch.set_num_threads(1)
    model = plelab_model(args.run)
    tok = model.tokenizer
    data = held_out(args.eval, model, args.tokens, args.seq_len)
    measurer = Measurer(model, data)
    result: dict = {"command": "python3 " + shlex.join(sys.argv), "run": args.run, "held_out": data.description,
                    "positions": data.positions, "reference_loss": measurer.reference}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        assert plelab(["export-hf", args.run, str(tmp / "hf")]) == 0
        files = {}
        for t in ("f32", "f16"):
            files[f"converter-{t}"] = convert_hf(tmp / "hf", tmp / f"conv-{t}.gguf", t)
            assert plelab(["export-gguf", args.run, str(tmp / f"ours-{t}.gguf"), "--type", t]) == 0
            files[f"export-gguf-{t}"] = tmp / f"ours-{t}.gguf"
        prompt = [tok.eot_id] + tok.encode(args.prompt)
        want = list(generate(model.module, prompt, 24, temperature=0.0))
        parity = {}
        for name, path in files.items():
            with LlamaCpp(path, n_ctx=max(64, args.seq_len)) as llm:
                diffs = []
                for w in range(len(data.domains)):
                    ids = data.x[w].tolist()
                    with torch.no_grad():
                        ours = model.module(torch.tensor([ids]))[0][0].float().numpy()
                    diffs.append(float(np.abs(llm.logits(ids) - ours).max()))
                got = llm.greedy(prompt, 24, stop=tok.eot_id)
                parity[name] = {"max_abs_logit_diff": max(diffs), "greedy_ids_equal": got == want[: len(got)],
                                "greedy_text_equal": llm.detokenize(got) == tok.decode(want[: len(got)]),
                                "tokenizer_equal": llm.tokenize(args.prompt) == prompt}
        result["parity"] = parity
        kinds = {}
        for t in args.types.split(","):
            path = tmp / f"q-{t}.gguf"
            assert plelab(["export-gguf", args.run, str(path), "--type", t]) == 0
            kinds[t] = {"file_bytes": path.stat().st_size, **measure_gguf_file(measurer, path)}
        result["types"] = kinds
    measurer.close()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
