"""The one decode loop: no forward after the last token, context cuts said once, text streamed whole chars."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from plelab.data.tokenizer import Tokenizer
from plelab.inference.generate import (
    GenerationError,
    check_fits,
    fit_context,
    generate,
    generate_ids,
    stream_text,
)
from plelab.inference.sampling import Sampling
from plelab.model import LanguageModel, load_model_config


class CountingForward:
    """A fake model: logits favour (last id + 1) % V; records every call."""

    def __init__(self, vocab: int = 10):
        self.vocab, self.calls = vocab, []

    def __call__(self, ids: list[int]) -> np.ndarray:
        self.calls.append(list(ids))
        logits = np.zeros(self.vocab, np.float32)
        logits[(ids[-1] + 1) % self.vocab] = 10.0
        return logits


def test_one_prefill_and_one_forward_per_token_but_the_last():
    fwd = CountingForward()
    out = list(generate_ids(fwd, [1, 2, 3], 5, Sampling(temperature=0)))
    assert out == [4, 5, 6, 7, 8]
    assert fwd.calls == [[1, 2, 3], [4], [5], [6], [7]]  # 8 is never fed back


def test_stop_id_ends_without_being_yielded_or_fed_back():
    fwd = CountingForward()
    assert list(generate_ids(fwd, [1], 10, Sampling(temperature=0), stop_id=4)) == [2, 3]
    assert fwd.calls == [[1], [2], [3]]


def tiny_model(*overrides: str) -> LanguageModel:
    torch.manual_seed(0)
    return LanguageModel(load_model_config("tiny", ["max_seq_len=32", *overrides])).eval()


def test_torch_model_runs_no_forward_after_the_last_token():
    model = tiny_model()
    calls = []
    model.register_forward_hook(lambda *_: calls.append(1))
    out = list(generate(model, [1, 2, 3], 6, temperature=0))
    assert len(out) == 6 and len(calls) == 6  # the prefill + 5 decode steps


def test_greedy_with_the_cache_equals_argmax_of_full_forwards():
    model = tiny_model()
    prompt = [5, 17, 3, 99]
    out = list(generate(model, prompt, 8, temperature=0))
    seq = list(prompt)
    for t in out:
        with torch.no_grad():
            assert t == int(model(torch.tensor([seq]))[0][0, -1].argmax())
        seq.append(t)


def test_same_seed_same_text_and_top_k_one_is_greedy():
    model = tiny_model()
    a = list(generate(model, [1, 2], 8, temperature=1.0, seed=7))
    assert a == list(generate(model, [1, 2], 8, temperature=1.0, seed=7))
    assert list(generate(model, [1, 2], 8, temperature=1.0, top_k=1)) == list(generate(model, [1, 2], 8, temperature=0))


def test_a_prompt_id_outside_the_vocabulary_is_a_clear_error_before_any_forward():
    from plelab.model.transformer import TokenIdError

    model = tiny_model()
    with pytest.raises(TokenIdError, match=r"\[0, 256\)"):
        generate(model, [1, 256], 2)


def test_a_request_that_fills_the_context_exactly_runs_and_one_more_is_refused():
    model = tiny_model()  # context 32: 30 prompt tokens + 3 new = 32 positions (the last is not fed back)
    assert len(list(generate(model, list(range(30)), 3, temperature=0))) == 3
    with pytest.raises(GenerationError, match="context is 32"):
        generate(model, list(range(30)), 4)


def test_fit_context_cuts_the_output_then_the_prompt_and_says_so():
    fit = fit_context([1] * 10, 5, 32)
    assert (len(fit.prompt), fit.max_new_tokens, fit.note) == (10, 5, None)
    fit = fit_context([1] * 30, 10, 32)
    assert len(fit.prompt) == 30 and fit.max_new_tokens == 3 and "generating 3 tokens, not 10" in fit.note
    fit = fit_context(list(range(40)), 10, 32)  # 23 prompt tokens + 10 new = 32 + 1 (the last is not fed)
    assert fit.prompt == list(range(17, 40)) and fit.max_new_tokens == 10
    assert "kept the last 23 of the prompt's 40 tokens" in fit.note and "\n" not in fit.note
    fit = fit_context(list(range(40)), 100, 32)  # a huge budget still keeps half the context of prompt
    assert len(fit.prompt) == 16 and fit.max_new_tokens == 17 and "generating 17 tokens, not 100" in fit.note
    check_fits(fit.prompt, fit.max_new_tokens, 32)
    with pytest.raises(GenerationError, match="empty"):
        fit_context([], 5, 32)


def test_stream_text_waits_out_partial_utf8_characters():
    tok = Tokenizer.byte_level()
    text = "naïve 日本語 🙂 done"
    ids = tok.encode(text)
    pieces = list(stream_text(iter(ids), tok.decode))
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert len(pieces) < len(ids)  # multi-byte characters came out whole, not byte by byte


def test_stream_text_gives_up_on_bytes_that_never_form_a_character():
    tok = Tokenizer.byte_level()
    bad = [0xC3 + 2] * 20  # the byte 0xC3 (a lead byte) alone, twenty times
    assert "".join(stream_text(iter(bad), tok.decode)).count("\ufffd") == 20


def test_edge_runtime_and_pytorch_generate_the_same_tokens(tmp_path):
    from plelab.edge.export import ExportOptions, export_model
    from plelab.edge.runtime import EdgeModel

    model = tiny_model("init_std=0.2")
    export_model(model, tmp_path / "m.ple", ExportOptions(quant="fp32"))
    rt = EdgeModel(tmp_path / "m.ple")
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    for sampling in (Sampling(temperature=0), Sampling(temperature=1.0, top_k=50, top_p=0.9, seed=3)):
        assert list(rt.generate(prompt, 12, sampling)) == list(generate(model, prompt, 12, sampling))
    rt.close()
