"""Diagnose a Hugging Face Gemma 3n / Gemma 4 checkpoint's PLE: the report `plelab diagnose` gives for runs.

Everything is measured with hooks on the transformers modules of each decoder layer:
    per_layer_input_gate       its input is h (the layer's hidden state right before PLE), its output the
                               gate pre-activation (g = act_fn(.)), so one hook gives the gate statistics
    post_per_layer_input_norm  its output is the injection y; ablation replaces it (zero / shuffle)
    embed_tokens_per_layer     the streamed table lookup; 'table' ablation permutes a layer's slice
Gemma 4 adds y to the residual; Gemma 3n adds it to the AltUp streams other than the active one, so there
the injection ratio compares y with the active stream h. The table is read from disk (plelab.hf): the
ablation reads the rows of each batch, table health only the rows of the most frequent tokens.

Expected peak RSS: the text model's non-table parameters x bytes per value (4 in float32) + activations of
one batch (logits are computed LOGIT_CHUNK positions at a time) + the table rows of one batch and of table
health (top_k x L x dP x 4 bytes). For Gemma 3n E2B (2.42e9 text parameters besides the 2.01e9-value
table) that is ~9.7 GB + ~0.5 GB at 8 x 256 tokens in float32, ~4.8 GB + ~0.5 GB with --dtype bf16;
the table (4.0 GB in bf16) adds only page cache. Measured on a 1.07 GB float32 table (tests/hf/test_memory.py):
peak RSS +71 MB over the process after its imports for a diagnosis, +62 MB for an int4 export.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from plelab.data.loader import is_prepared_dataset
from plelab.data.tokenizer import Tokenizer, tokenizer_difference
from plelab.diagnostics import verdict as V
from plelab.diagnostics.ablation import ABLATION_MODES, compare_losses, injection_hook, pooled_loss, table_hook
from plelab.diagnostics.batches import token_frequencies, top_tokens
from plelab.diagnostics.data_sources import DiagnosticDataError
from plelab.diagnostics.diagnose import DEFINITIONS, THRESHOLDS, layer_record
from plelab.diagnostics.gates import GATE_NEAR_ZERO, GateAccumulator
from plelab.diagnostics.table_health import BASELINE_SEED, DEFAULT_TOP_K, compare_to_random
from plelab.diagnostics.table_health import DEFINITIONS as TABLE_DEFINITIONS
from plelab.errors import PlelabError
from plelab.hf.checkpoint import HFCheckpoint
from plelab.hf.model import HFTextModel
from plelab.training.standard_callbacks import format_eta
from plelab.util.json_values import jsonable
from plelab.util.safetensors import gather_rows

HF_NOTES = {
    "gemma3n": "Gemma 3n adds the injection y to its AltUp streams other than the active one; the injection "
    "ratio divides by the RMS of the active stream h that feeds the gate",
    "gemma4": "Gemma 4 adds the injection y to the residual h right after the FFN (then scales by layer_scalar)",
}


@contextmanager
def hf_ple_ablated(model: HFTextModel, layers: Iterable[int], mode: str, seed: int = 0) -> Iterator[None]:
    """Within the block, the PLE of `layers` is switched off in one of ABLATION_MODES (see ablation.py)."""
    if mode not in ABLATION_MODES:
        raise ValueError(f"ablation mode must be one of {ABLATION_MODES}, got {mode!r}")
    generator = torch.Generator().manual_seed(seed)
    if mode == "table":
        handles = [model.table.register_forward_hook(table_hook(list(layers), model.ckpt.num_layers, generator))]
    else:
        hook = injection_hook(mode, generator)
        handles = [model.layers[i].post_per_layer_input_norm.register_forward_hook(hook) for i in layers]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@torch.no_grad()
def hf_batch_losses(model: HFTextModel, batches: list) -> list[tuple[float, int]]:
    """(mean loss, target count) of each (x, y) batch."""
    out = []
    for x, y in batches:
        loss, n = model.lm_loss(x, y)
        out.append((loss.item(), n))
    return out


class _Probe:
    """Sums of squares of h and y plus gate statistics for one layer, from two hooks."""

    def __init__(self, act_fn):
        self.act_fn, self.hh, self.yy = act_fn, 0.0, 0.0
        self.gate = GateAccumulator(GATE_NEAR_ZERO)

    def on_gate(self, module, args, output) -> None:
        h = args[0].detach()
        self.hh += h.float().pow(2).sum().item()
        g = self.act_fn(output.detach())
        self.gate.add(SimpleNamespace(gate_values=lambda _h: g), h)

    def on_output(self, module, args, output) -> None:
        self.yy += output.detach().float().pow(2).sum().item()

    def result(self) -> dict[str, float]:
        ratio = math.sqrt(self.yy / self.hh) if self.hh > 0 else float("nan")  # h and y have the same shape
        return {"injection_ratio": ratio, **self.gate.result()}


@torch.no_grad()
def hf_probe_layers(model: HFTextModel, batches: list, layers: list[int]) -> dict[int, dict[str, float]]:
    """Injection ratio, mean |gate| and near-zero gate fraction per layer, pooled over `batches`."""
    probes = {i: _Probe(model.layers[i].act_fn) for i in layers}
    handles = []
    for i in layers:
        handles.append(model.layers[i].per_layer_input_gate.register_forward_hook(probes[i].on_gate))
        handles.append(model.layers[i].post_per_layer_input_norm.register_forward_hook(probes[i].on_output))
    try:
        for x, _ in batches:
            model.text(input_ids=x, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return {i: probes[i].result() for i in layers}


def _summary(full: list, ablated: dict[str, list], idx: list[int]) -> dict:
    out = {m: compare_losses([full[i] for i in idx], [a[i] for i in idx]) for m, a in ablated.items()}
    primary = min(out, key=lambda m: out[m]["delta"])
    out.update(delta=out[primary]["delta"], se=out[primary]["se"], n=out[primary]["n"], primary_mode=primary)
    return out


class PassClock:
    """Counts passes over the evaluation batches and tells `report` an estimate of the whole once the first pass is
    timed, then the progress after each labelled pass (at Gemma's shapes a diagnosis takes an hour on a CPU)."""

    def __init__(self, total: int, report: Callable[[str], None] | None = None):
        self.total, self.report, self.done = total, report, 0
        self.start = time.perf_counter()

    def passed(self, label: str | None = None) -> None:
        """One pass finished (`label`: what the passes so far completed)."""
        self.done += 1
        elapsed = time.perf_counter() - self.start
        if self.report is None:
            return
        if self.done == 1:
            self.report(f"the first pass took {elapsed:.1f} s: about {format_eta(elapsed * self.total)} for all "
                        f"{self.total}")
        elif label:
            left = elapsed / self.done * (self.total - self.done)
            self.report(f"{label}: {self.done}/{self.total} passes, {format_eta(elapsed)} elapsed, about "
                        f"{format_eta(left)} left")


def hf_ablation(model: HFTextModel, batches: list, domains: list[str], layers: list[int],
                modes: Iterable[str] = ABLATION_MODES, seed: int = 0, clock: PassClock | None = None) -> dict:
    """ablation_study's result for an HF model, plus 'domains': the all-layers ablation per batch domain."""
    modes = tuple(modes)
    clock = clock or PassClock(0)
    full = hf_batch_losses(model, batches)
    if not math.isfinite(pooled_loss(full)):
        raise PlelabError(f"{model.ckpt.path}: the model's loss on the evaluation data is {pooled_loss(full)}: a "
                          "weight of the checkpoint holds NaN or infinite values, so no ablation can be measured")
    clock.passed("the model as it is")
    everything = list(range(len(batches)))

    def run(which: list[int], what: str) -> dict[str, list]:
        per_mode = {}
        for k, mode in enumerate(modes):
            with hf_ple_ablated(model, which, mode, seed):
                per_mode[mode] = hf_batch_losses(model, batches)
            clock.passed(what if k == len(modes) - 1 else None)
        return per_mode

    result = {"loss_full": pooled_loss(full), "n_batches": len(batches), "n_tokens": sum(n for _, n in full),
              "modes": list(modes),
              "layers": {i: _summary(full, run([i], f"layer {i} ablated"), everything) for i in layers}}
    all_off = run(layers, "all layers ablated")
    result["all"] = _summary(full, all_off, everything)
    result["domains"] = {}
    for name in dict.fromkeys(domains):
        idx = [k for k, d in enumerate(domains) if d == name]
        s = _summary(full, all_off, idx)
        judged = V.used_verdict(s["delta"], s["se"], len(idx))
        result["domains"][name] = {"batches": len(idx), "loss_full": pooled_loss([full[k] for k in idx]),
                                   **s, "noise": V.noise_of(s["se"]), "verdict": judged["verdict"],
                                   "reason": judged["reason"]}
    return result


def hf_table_health(model: HFTextModel, layers: list[int], token_ids: np.ndarray | None, top_k: int,
                    freq_source: str) -> dict:
    """Table health of the rows of the `top_k` most frequent tokens, read from disk; no 'delta' view."""
    ckpt = model.ckpt
    if token_ids is not None and len(token_ids):
        counts = token_frequencies(token_ids, ckpt.ple_vocab_size)
        rows = top_tokens(counts, top_k)
        desc = (f"the {len(rows)} most frequent token ids in {freq_source} ({int(counts.sum()):,} tokens): rare "
                "rows barely move in training, so whole-table numbers would mostly measure the initialisation")
    else:
        g = torch.Generator().manual_seed(BASELINE_SEED)
        rows = torch.randperm(ckpt.ple_vocab_size, generator=g)[:top_k].numpy()
        desc = f"{len(rows)} random rows (no token data given: this mostly measures the initialisation)"
    sel = model.table.read_rows(rows).view(len(rows), ckpt.num_layers, ckpt.ple_dim)
    views = {
        "frequent": {"available": True, "rows": desc, "layers": {i: compare_to_random(sel[:, i]) for i in layers}},
        "delta": {"available": False, "rows": None,
                  "reason": "a released checkpoint carries no table at initialisation"},
    }
    return {"top_k": top_k, "views": views, "definitions": TABLE_DEFINITIONS}


def diagnose_hf(model: HFTextModel, batches: list | None = None, domains: list[str] | None = None,
                token_ids: np.ndarray | None = None, freq_source: str = "the evaluation batches",
                layers: list[int] | None = None, top_k: int = DEFAULT_TOP_K, probe_shape: tuple[int, int] = (2, 32),
                progress: Callable[[str], None] | None = None) -> dict:
    """Every PLE diagnostic plus the used verdicts for an HF Gemma model, in diagnose_model's JSON-ready format
    (pays: not measured, since a released checkpoint has no dP = 0 twin trained on the same tokens).

    batches: (x, y) evaluation batches, `domains` the domain name of each (per-domain deltas);
    layers: which decoder layers to diagnose (default all); without batches only proxies, on random tokens.
    progress: told the plan, an estimate after the first pass over the batches, and each layer's end.
    """
    ckpt = model.ckpt
    layers = list(range(ckpt.num_layers)) if layers is None else sorted(set(layers))
    bad = [i for i in layers if not 0 <= i < ckpt.num_layers]
    if bad or not layers:
        raise DiagnosticDataError(f"--layers must lie in [0, {ckpt.num_layers}), got {bad or 'none'}")
    tc = ckpt.text_config
    report: dict = {
        "model": {"source": str(ckpt.path), "architecture": ckpt.family, "hidden_size": tc["hidden_size"],
                  "num_layers": ckpt.num_layers, "ple_dim": ckpt.ple_dim, "ple_layers": layers,
                  "ple_vocab_size": ckpt.ple_vocab_size, "in_memory_bytes": model.parameter_bytes(),
                  "table_bytes_on_disk": ckpt.table.shape[0] * ckpt.table.row_bytes},
        "rules": V.RULES, "thresholds": THRESHOLDS, "definitions": DEFINITIONS, "notes": [HF_NOTES[ckpt.family]],
    }
    device = next(model.lm.parameters()).device
    batches = [(x.to(device), y.to(device)) for x, y in batches or []]
    if batches:
        probe_data = batches
        report["data"] = {"batches": len(batches), "tokens": sum(int(x.numel()) for x, _ in batches)}
        if token_ids is None:
            token_ids = torch.cat([x.reshape(-1) for x, _ in batches]).cpu().numpy()
    else:
        b, t = probe_shape
        g = torch.Generator().manual_seed(0)
        high = min(tc["vocab_size"], ckpt.ple_vocab_size)  # Gemma 4 does not map ids beyond the table to row 0
        probe_data = [(torch.randint(0, high, (b, t), generator=g).to(device), None) for _ in range(2)]
        report["data"] = {"batches": 0, "tokens": 0}
        report["notes"].append("no evaluation data: injection and gate statistics come from random token batches, "
                               "and the verdict rests on proxies; ablation (the primary evidence) needs data")
    passes = 1 + (1 + (len(layers) + 1) * len(ABLATION_MODES) if batches else 0)
    if progress is not None:
        x = probe_data[0][0]
        progress(f"diagnosing {len(layers)} layer(s) of {ckpt.path}: {passes} passes over {len(probe_data)} "
                 f"batch(es) of {x.shape[0]} x {x.shape[1]} tokens (statistics, the model as it is, then its PLE "
                 f"switched off {len(ABLATION_MODES)} ways in each layer and in all)")
    clock = PassClock(passes, progress)
    probes = hf_probe_layers(model, probe_data, layers)
    clock.passed("gate and injection statistics")
    abl = hf_ablation(model, batches, domains or ["all"] * len(batches), layers, clock=clock) if batches else None
    if abl and abl["n_batches"] < 2:
        report["notes"].append("one evaluation batch: no noise estimate, so the noise band is taken as 0")
    table = hf_table_health(model, layers, token_ids, top_k, freq_source)
    recs = [layer_record(i, probes[i], abl["layers"][i] if abl else None, table, None) for i in layers]
    used = V.overall_verdict([r["verdict"] for r in recs], abl["all"] if abl else None)
    if abl:
        used.update(loss_full=abl["loss_full"], ablation_delta_loss=abl["all"]["delta"],
                       ablation_se=abl["all"]["se"], noise=V.noise_of(abl["all"]["se"]),
                       **{f"ablation_delta_loss_{m}": abl["all"][m]["delta"] for m in abl["modes"]})
        report["domains"] = abl["domains"]
    if len(layers) < ckpt.num_layers:
        used["reason"] += f" (layers {layers} only)"
    pays = V.pays_not_measured("a released checkpoint has no dP = 0 twin trained on the same tokens (--base "
                               "compares PLE use before and after a fine-tune, which is dependence too)")
    report.update(used=used, pays=pays, layers=recs)
    report["table_health"] = {
        "top_k": table["top_k"],
        "views": {k: {kk: vv for kk, vv in v.items() if kk != "layers"} for k, v in table["views"].items()},
        "definitions": table["definitions"],
    }
    return jsonable(report)


def hf_eval_batches(path: str, ckpt: HFCheckpoint, batch_size: int, seq_len: int, n_batches: int,
                    seed: int = 0) -> tuple[list, list[str], np.ndarray, str]:
    """(batches, domain of each, all their tokens, description) from a folder/file of .txt domains (tokenized
    with the checkpoint's tokenizer.json), a prepared dataset folder (tokenized with that tokenizer) or a .npy
    token array; every domain gets at least 2 batches. Needs only the checkpoint's files, not its model."""
    from plelab.diagnostics.batches import batches_from_tokens

    p = Path(path)
    if not p.exists():
        raise DiagnosticDataError(f"{path}: no such file or directory")
    if p.suffix == ".npy":
        try:
            streams = {p.stem: np.load(p, mmap_mode="r").reshape(-1)}
        except (ValueError, OSError) as exc:
            raise DiagnosticDataError(f"{p}: not a readable .npy token array ({exc})") from None
        if not np.issubdtype(streams[p.stem].dtype, np.integer):
            raise DiagnosticDataError(f"{p} holds {streams[p.stem].dtype} values, not integer token ids")
        how = "as given"
    elif is_prepared_dataset(p):
        streams, how = _prepared_streams(p, ckpt)
    else:
        from plelab.data.prepare import load_eval_domains

        streams = {k: d.tokens for k, d in load_eval_domains(p, _checkpoint_tokenizer(ckpt, path)).items()}
        how = f"tokenized with {ckpt.tokenizer_json}"
    vocab = ckpt.text_config["vocab_size"]
    per_domain = max(2, -(-n_batches // len(streams)))
    batches, domains = [], []
    for k, (name, tokens) in enumerate(streams.items()):
        if len(tokens) and (int(np.max(tokens)) >= vocab or int(np.min(tokens)) < 0):
            bad = int(np.max(tokens)) if int(np.max(tokens)) >= vocab else int(np.min(tokens))
            raise DiagnosticDataError(f"{name} holds token id {bad}; the model's vocabulary is 0..{vocab - 1}")
        got = batches_from_tokens(tokens, batch_size, seq_len, per_domain, seed + k)
        batches += got
        domains += [name] * len(got)
    tokens = np.concatenate([x.reshape(-1).numpy() for x, _ in batches])
    desc = f"{len(streams)} domain(s) in {path}, {how}, {per_domain} batch(es) of {batch_size} x {seq_len} each"
    return batches, domains, tokens, desc


def _checkpoint_tokenizer(ckpt: HFCheckpoint, data: str | Path) -> Tokenizer:
    if ckpt.tokenizer_json is None:
        raise DiagnosticDataError(f"{ckpt.path} has no tokenizer.json to tokenize {data} with; pass a .npy token "
                                  "array instead")
    return Tokenizer.load(ckpt.tokenizer_json)


def _prepared_streams(path: Path, ckpt: HFCheckpoint) -> tuple[dict[str, np.ndarray], str]:
    """A prepared dataset's held-out split (its training split when it has none) as one domain, refused when it was
    tokenized with a tokenizer that gives other ids than the checkpoint's."""
    from plelab.data.loader import TokenDataset, read_manifest
    from plelab.diagnostics.data_sources import EVAL_MAX_TOKENS, VALIDATION_SPLITS

    diff = tokenizer_difference(Tokenizer.load(path), _checkpoint_tokenizer(ckpt, path))
    if diff:
        raise DiagnosticDataError(f"{path} was tokenized with another tokenizer than {ckpt.tokenizer_json} ({diff}); "
                                  f"prepare it with `plelab data prepare SOURCES --tokenizer {ckpt.tokenizer_json} "
                                  "--out DIR`")
    splits = read_manifest(path)["splits"]
    split = next((s for s in VALIDATION_SPLITS if s in splits), "train")
    data = TokenDataset(path, split)
    tokens = np.asarray(data.get(0, min(len(data), EVAL_MAX_TOKENS)))
    note = "" if split != "train" else " (it has no validation split: text a fine-tune on it has seen)"
    return {path.name: tokens}, f"split {split!r} of a prepared dataset{note}"


def check_table_rows(ckpt: HFCheckpoint, tokens: np.ndarray) -> None:
    """Refuse (one line) a PLE table whose rows for `tokens` hold NaN or infinity: every loss would be NaN and the
    diagnosis meaningless. Reads only those rows."""
    ids = np.unique(np.asarray(tokens, dtype=np.int64))
    ids = np.where(ids < ckpt.ple_vocab_size, ids, 0)  # ids past the table read row 0 (Gemma 3n)
    rows = gather_rows(ckpt.table, ids)
    bad = ~torch.isfinite(rows).all(dim=1)
    if bool(bad.any()):
        first = int(ids[int(torch.nonzero(bad)[0])])
        raise PlelabError(f"{ckpt.path}: the PLE table's row {first} (a token of the evaluation data; {int(bad.sum())} "
                          "such row(s)) holds NaN or infinite values: the checkpoint is damaged")


def open_for_diagnosis(path: str | Path, data: str | None = None, *, layers: list[int] | None = None,
                       dtype: str = "fp32", device: str = "cpu", batches: int = 8, batch_size: int = 8,
                       seq_len: int | None = None, top_k: int | None = None,
                       seed: int = 0) -> tuple[HFTextModel, dict[str, Any], str | None]:
    """A Gemma folder's text model (its PLE table on disk) with `diagnose_hf`'s arguments and a description of
    the data. dtype: of the in-memory text model, fp32 or bf16 (float32 / bfloat16 are accepted too)."""
    from plelab.hf.model import load_text_model
    from plelab.inference.evaluate import check_seq_len
    from plelab.util.device import OLD_PRECISION_NAMES, TORCH_DTYPES, pick_device

    dtype = OLD_PRECISION_NAMES.get(dtype, dtype)
    if dtype not in TORCH_DTYPES:
        raise PlelabError(f"--dtype must be one of {', '.join(TORCH_DTYPES)}, got {dtype!r}")
    ckpt = HFCheckpoint.open(path)
    if layers is not None and max(layers) >= ckpt.num_layers:  # before loading gigabytes
        raise PlelabError(f"--layers: {path} has layers 0..{ckpt.num_layers - 1}, got {max(layers)}")
    context = ckpt.text_config.get("max_position_embeddings") or 256
    seq_len = check_seq_len(seq_len or min(256, context), context)
    kwargs: dict = {"layers": layers, "top_k": top_k or DEFAULT_TOP_K}
    data_desc = None
    if data:  # read, tokenized and checked before the model's gigabytes are loaded
        found, domains, tokens, data_desc = hf_eval_batches(data, ckpt, batch_size, seq_len, batches, seed)
        check_table_rows(ckpt, tokens)
        kwargs.update(batches=found, domains=domains, token_ids=tokens, freq_source="the evaluation batches")
    model = load_text_model(ckpt, TORCH_DTYPES[dtype])
    model.lm.to(pick_device(device))
    return model, kwargs, data_desc


def folder_report(model: HFTextModel, kwargs: dict[str, Any], data_desc: str | None,
                  progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """`diagnose_hf` on a model `open_for_diagnosis` gave, as the report `diagnose_run` gives for runs."""
    report = {"checkpoint": str(model.ckpt.path), "run_dir": None, **diagnose_hf(model, **kwargs, progress=progress)}
    report.setdefault("data", {})["source"] = data_desc
    return report


def diagnose_hf_folder(path: str | Path, data: str | None = None, progress: Callable[[str], None] | None = None,
                       **options: Any) -> dict[str, Any]:
    """The diagnosis of a Hugging Face Gemma 3n / Gemma 4 folder, with per-domain deltas; its PLE table stays on
    disk. options: those of `open_for_diagnosis`; progress: see `diagnose_hf`."""
    return folder_report(*open_for_diagnosis(path, data, **options), progress=progress)
