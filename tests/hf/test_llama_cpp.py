"""plelab against real llama.cpp: its own converter on `export-hf` folders, its runtime (llama-cpp-python) on both
that GGUF and `export-gguf`'s, for tiny trained arch = "gemma4" runs.

    logits        every position of a 60-token sequence (past the 16-token sliding window), fp32: max |Δ| <= 2e-3
    greedy text   the prompt tokenized by llama.cpp = by plelab (BOS = end-of-text first), 24 greedy tokens and
                  their detokenized text identical, for f32 and f16 files
    converter     export-gguf writes the converter's file: same metadata (but the name) and the same tensor bytes
    quantized     q8_0 ... q2_k: KL(plelab fp32 || llama.cpp) and held-out Δloss per type, written to a JSON

Skipped, with the reason, only when llama-cpp-python is not installed (`bash scripts/setup.sh --test` builds it
and unpacks llama.cpp's converter from the same release).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf_helpers import STORY, byte_level_tokenizer, gemma_tokenizer, plelab_logits, sample_ids, train_run

pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (bash scripts/setup.sh --test builds it)")

from plelab.cli.main import main  # noqa: E402
from plelab.data.tokenizer import Tokenizer  # noqa: E402
from plelab.hf.llama_cpp import LlamaCpp, _no_extra_buffers, convert_hf, converter_dir  # noqa: E402
from plelab.inference.generate import generate  # noqa: E402
from plelab.inference.load import load_model  # noqa: E402

TOL = 2e-3
PROMPT = "Once upon a time a little fox"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("llama-cpp")


@pytest.fixture(scope="module")
def run(root) -> Path:
    return train_run(root, "run", gemma_tokenizer(root), steps=40)


@pytest.fixture(scope="module")
def tok(run) -> Tokenizer:
    return Tokenizer.load(load_model(run)[0].checkpoint_dir)


@pytest.fixture(scope="module")
def hf_folder(root, run) -> Path:
    out = root / "hf"
    assert main(["export-hf", str(run), str(out)]) == 0
    return out


def test_converter_is_unpacked():
    assert converter_dir() is not None, "llama.cpp's converter is missing: run bash scripts/setup.sh --test"


def check_logits(path: Path, run: Path, ids: list[int], tol: float = TOL) -> float:
    want = plelab_logits(run, ids)
    with LlamaCpp(path) as llm:
        assert llm.n_vocab == want.shape[1]
        got = llm.logits(ids)
    diff = float(np.abs(got - want).max())
    assert diff <= tol, f"{path.name}: max |Δlogit| {diff:.2e} > {tol}"
    assert (got.argmax(1) == want.argmax(1)).all()
    return diff


def check_greedy_text(path: Path, run: Path, tok: Tokenizer) -> str:
    model, _ = load_model(run)
    prompt = [tok.eot_id] + tok.encode(PROMPT)
    want = list(generate(model, prompt, 24, temperature=0.0))
    with LlamaCpp(path) as llm:
        assert llm.tokenize(PROMPT) == prompt  # llama.cpp's tokenizer from the GGUF = plelab's
        got = llm.greedy(prompt, 24, stop=tok.eot_id)
        text = llm.detokenize(got)
    assert got == want[: len(got)]
    assert text == tok.decode(want[: len(got)])
    return text


def test_export_hf_then_llama_cpps_converter(root, run, tok, hf_folder):
    ids = sample_ids(tok)
    f32 = convert_hf(hf_folder, root / "conv-f32.gguf", "f32")
    check_logits(f32, run, ids)
    f16 = convert_hf(hf_folder, root / "conv-f16.gguf", "f16")
    assert check_greedy_text(f32, run, tok) == check_greedy_text(f16, run, tok)


def test_wider_full_layers_and_shared_kv_convert_too(root):
    # the full layers' head width and kv heads differ from the sliding ones, their values are their keys, and
    # the last layer reuses the keys/values of the full layer before it
    run = train_run(root, "wide", gemma_tokenizer(root), steps=3, seed=3, gemma4="full_head_dim = 128\n"
                    "full_kv_heads = 1\nnum_kv_shared_layers = 1\nattention_k_eq_v = true\n"
                    'layer_types = ["sliding_attention", "full_attention", "full_attention"]\n',
                    layers=3)
    hf = root / "wide-hf"
    assert main(["export-hf", str(run), str(hf)]) == 0
    tok = Tokenizer.load(load_model(run)[0].checkpoint_dir)
    ids = sample_ids(tok)
    check_logits(convert_hf(hf, root / "wide.gguf", "f32"), run, ids)
    out = root / "wide-ours.gguf"
    assert main(["export-gguf", str(run), str(out), "--type", "f32"]) == 0
    check_logits(out, run, ids)


def _read(path: Path):
    import gguf

    r = gguf.GGUFReader(str(path))
    kv = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.") and k not in
          ("general.name", "general.size_label")}
    return kv, {t.name: (t.tensor_type.name, list(t.shape), np.asarray(t.data)) for t in r.tensors}


@pytest.mark.parametrize("outtype", ["f32", "f16"])
def test_export_gguf_writes_the_converters_file(root, run, hf_folder, outtype):
    theirs = convert_hf(hf_folder, root / f"conv-{outtype}.gguf", outtype)
    ours = root / f"ours-{outtype}.gguf"
    assert main(["export-gguf", str(run), str(ours), "--type", outtype, "--overwrite"]) == 0
    (kt, tt), (ko, to) = _read(theirs), _read(ours)
    assert ko == kt
    assert to.keys() == tt.keys()
    for name, (kind, shape, data) in tt.items():
        assert to[name][:2] == (kind, shape), name
        assert np.array_equal(to[name][2], data), name


def test_export_gguf_logits_and_greedy_text(root, run, tok):
    f32, f16 = root / "e-f32.gguf", root / "e-f16.gguf"
    assert main(["export-gguf", str(run), str(f32), "--type", "f32"]) == 0
    assert main(["export-gguf", str(run), str(f16), "--type", "f16"]) == 0
    check_logits(f32, run, sample_ids(tok))
    assert check_greedy_text(f32, run, tok) == check_greedy_text(f16, run, tok)


def test_byte_level_model_converts_with_its_vocabulary(root):
    tok = byte_level_tokenizer(root)
    run = train_run(root, "bytelevel", tok, steps=10)
    out = root / "bytelevel.gguf"
    assert main(["export-gguf", str(run), str(out), "--type", "f32"]) == 0
    texts = [PROMPT, STORY, "naïve café 日本語 🦊\n\n  indented\tand 12345 numbers"]
    with LlamaCpp(out) as llm:
        for text in texts:
            assert llm.tokenize(text) == [tok.eot_id] + tok.encode(text)
    check_logits(out, run, [tok.eot_id] + tok.encode(STORY * 2)[:59])


def test_gemma_tokenizer_in_llama_cpp_is_plelabs(root, run, tok):
    out = root / "tok.gguf"
    assert main(["export-gguf", str(run), str(out), "--type", "f16", "--overwrite"]) == 0
    texts = [STORY, "  two  spaces,\n\n\nthree newlines\n\tand a tab", "naïve café 日本語のテキスト 🦊 ☃"]
    with LlamaCpp(out) as llm:
        for text in texts:
            ids = tok.encode(text)
            assert llm.tokenize(text) == [tok.eot_id] + ids
            assert llm.detokenize(ids) == text


def test_loads_without_llama_cpps_extra_buffers():
    """LlamaCpp loads with use_extra_bufts off: on an AMX CPU, llama.cpp's AMX q4_0/q4_k matmul segfaults the
    process on a batch of more than one token (test_quantized_types_kl_and_delta_loss below crashed CI so)."""
    import llama_cpp.llama as llama_module

    native = llama_module.llama_cpp
    assert native.llama_model_default_params().use_extra_bufts  # llama.cpp's default, which the patch must undo
    with pytest.raises(RuntimeError), _no_extra_buffers(llama_module):
        assert not native.llama_model_default_params().use_extra_bufts
        raise RuntimeError("a failed load")
    assert native.llama_model_default_params().use_extra_bufts  # restored, even after a failure


QUANT_TYPES = ["q8_0", "q6_k", "q5_k", "q5_0", "q4_k", "q4_0", "iq4_nl", "q3_k", "q2_k"]


def test_quantized_types_kl_and_delta_loss(root, run, tok):
    """Measured, not asserted beyond sanity: KL(p_plelab_fp32 || p_llama.cpp) and Δloss on held-out text."""
    texts = {"story": STORY.replace("fox", "cat") * 3, "code": "def mul(a, b):\n    return a * b\n" * 6}
    windows = {d: [tok.eot_id] + tok.encode(t)[:63] for d, t in texts.items()}
    model, _ = load_model(run)
    ref = {}
    with torch.no_grad():
        for d, ids in windows.items():
            ref[d] = torch.log_softmax(model(torch.tensor([ids]))[0][0].double(), -1)
    result = {"model": str(run), "tokens_per_domain": 63, "types": {}}
    for t in ["f32", *QUANT_TYPES]:
        path = root / f"q-{t}.gguf"
        assert main(["export-gguf", str(run), str(path), "--type", t, "--overwrite"]) == 0
        row = {"file_bytes": path.stat().st_size, "domains": {}}
        with LlamaCpp(path) as llm:
            for d, ids in windows.items():
                logp = torch.log_softmax(torch.from_numpy(llm.logits(ids)).double(), -1)
                r = ref[d]
                kl = float((r.exp() * (r - logp)).sum(-1)[:-1].mean())
                y = torch.tensor(ids[1:])
                dl = float(-(logp[:-1].gather(1, y[:, None])).mean() + r[:-1].gather(1, y[:, None]).mean())
                row["domains"][d] = {"kl": kl, "delta_loss": dl}
        row["kl"] = float(np.mean([v["kl"] for v in row["domains"].values()]))
        row["delta_loss"] = float(np.mean([v["delta_loss"] for v in row["domains"].values()]))
        result["types"][t] = row
    out = Path(os.environ.get("PLELAB_LLAMA_CPP_JSON", root / "llama_cpp_quant.json"))
    out.write_text(json.dumps(result, indent=2) + "\n")
    kl = {t: r["kl"] for t, r in result["types"].items()}
    assert all(np.isfinite(v) and v > -1e-6 for v in kl.values())
    assert kl["f32"] < 1e-5  # the fp32 file is plelab's model
    assert kl["q8_0"] < kl["q4_0"] < kl["q2_k"] and kl["q6_k"] < kl["q3_k"]
    assert result["types"]["q4_k"]["file_bytes"] < result["types"]["q8_0"]["file_bytes"]
