"""Diagnostics of the visual PLE table (SPEC §4): has it learned structure, and does the caption loss use it?

Table statistics (each beside the same statistic of a random Gaussian matrix of the same shape, drawn with
plelab.diagnostics.table_health's fixed seed; the published random PC1 was 0.004):
  mean |cos|      mean |cos(row_i, row_j)| over the pairs i != j of the K id embeddings (random: ~sqrt(2/(pi d)));
                  the signed mean cosine (published: ~0.000) is reported beside it;
  effective rank  exp of the entropy of the singular values normalised to sum 1 (Roy & Vetterli), the
                  statistic the published "255.1/256" reads (random: close to min(K, d));
  PC1 variance    the largest eigenvalue's share of the column-centred rows' variance.
They are computed per layer slice (K x dP) and for the whole table (K x L*dP), in two views: the table itself
(what the published numbers describe) and its change since initialisation, less the change every row shares
(table - table_at_init, centred over the K rows: what the loss wrote that tells ids apart; a drift common to all
rows is a bias, and random ids show one; the initial table is rebuilt from the run's seed as the Trainer built it).

Rules (also in RULES):
  random-like view  effective rank >= 0.95 x the baseline's, PC1 <= 3 x the baseline's (table_health's rule)
                    and mean |cos| <= 1.5 x the baseline's, in the whole table and in every slice;
  random-like table the change view decides when the initial table is known, else the table itself
                    ("structured" otherwise). A slice with fewer than two changed rows has no statistics and
                    is left out. These statistics are spectral: rows that cluster into more groups than dP has
                    dimensions can still pass as random; the ablation below is the test of use. And the
                    Gaussian is the null of an isotropic table: optimisation noise that is alike for every id
                    but anisotropic fails it too, so a study compares with its random-id control
                    (plelab.studies.visual.analysis);
  ablation          caption loss on held-out batches with the visual PLE input zeroed ('zero': no injection at
                    all) and with the patch ids shuffled across the batch's patch positions ('shuffle_ids':
                    the table, gate and context path still run, the id's identity is gone); delta = ablated -
                    full, s.e. of the paired per-batch deltas; the primary delta is the smaller of the two;
  verdict           random-like if the table is random-like (whatever the ablation says: SPEC §4's failure is a
                    table the loss never shaped; random rows are still distinct, so a trunk can read them, and an
                    ablation cost then says the *ids* are used, not that the table learned); otherwise the
                    ablation's used verdict (plelab.diagnostics.verdict.used_verdict: used / used, within
                    margin / unused / not resolved / harmful, within margin / harmful). Dependence, not
                    benefit: what the table buys is the study's paired comparison against the same model
                    without it.
Injection ratio: RMS of the visual PLE contribution / RMS of the hidden state it is added to, per PLE layer,
at patch positions only (caption positions get no visual PLE, and counting them would dilute the ratio).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from plelab.diagnostics.ablation import compare_losses, pooled_loss
from plelab.diagnostics.table_health import BASELINE_SEED, compare_to_random
from plelab.diagnostics.table_health import DEFINITIONS as TABLE_DEFINITIONS
from plelab.diagnostics.verdict import used_verdict
from plelab.errors import PlelabError
from plelab.vision.model import VisionBatch, VisionPLEModel

ABS_COSINE_FACTOR = 1.5
"""A view is random-like only if its mean |cos| is at most this multiple of the random baseline's."""
ABLATION_MODES = ("zero", "shuffle_ids")
"""How the visual PLE is switched off (see the module docstring); the primary delta is the smaller."""
VERDICTS = ("random-like", "used", "used, within margin", "unused", "not resolved", "harmful, within margin",
            "harmful")

RULES = {
    "random_like_view": "effective rank >= 0.95 x the random baseline's, PC1 variance <= 3 x the baseline's and "
                        f"mean |cos| <= {ABS_COSINE_FACTOR:g} x the baseline's, in the whole table and in every "
                        "layer slice (baseline: a Gaussian matrix of the same shape, fixed seed)",
    "random_like_table": "the change since initialisation (centred over the ids: a drift every id shares is a "
                         "bias) decides when the initial table is known, else the table itself; 'structured' "
                         "otherwise",
    "ablation": "caption loss with the visual PLE input zeroed and with the patch ids shuffled across the batch, "
                "minus the full model's, on held-out batches; primary delta = the smaller; s.e. of the paired "
                "per-batch deltas",
    "verdict": "random-like if the table is random-like (whatever the ablation says); otherwise the ablation's "
               "used verdict (plelab.diagnostics.verdict.RULES: used / unused / not resolved / harmful): "
               "dependence, not benefit",
    "injection_ratio": "RMS(visual PLE contribution) / RMS(hidden state) per PLE layer, at patch positions only",
}
DEFINITIONS = {
    **TABLE_DEFINITIONS,
    "mean_abs_cosine": "mean |cos| over all pairs i != j of the rows; random baseline ~ sqrt(2 / (pi d))",
}

Batches = list[tuple[VisionBatch, torch.Tensor]]


# ------------------------------------------------------------------------------------------- table statistics
def mean_abs_cosine(rows: torch.Tensor) -> float:
    """Mean |cos(row_i, row_j)| over the pairs i != j (an N x N product: fine for a K-row table)."""
    u = rows.double()
    u = u / u.norm(dim=1, keepdim=True)
    n = u.shape[0]
    cos = (u @ u.T).abs()
    return ((cos.sum() - cos.diagonal().sum()) / (n * (n - 1))).item()


@lru_cache(maxsize=64)
def random_abs_cosine(n: int, d: int) -> float:
    """mean |cos| of the same n x d Gaussian matrix table_health.empirical_baseline draws."""
    g = torch.Generator().manual_seed(BASELINE_SEED)
    return mean_abs_cosine(torch.randn(n, d, generator=g, dtype=torch.float64))


def view_stats(m: torch.Tensor) -> dict[str, Any]:
    """table_health.compare_to_random of an N x d matrix, with mean |cos| added and in the random-like rule."""
    out = compare_to_random(m)
    if "metrics" not in out:
        return {**out, "random_like": None}
    rows = m[m.double().norm(dim=1) > 0]
    abs_cos, base = mean_abs_cosine(rows), random_abs_cosine(*rows.shape)
    out["metrics"]["mean_abs_cosine"] = abs_cos
    out["random_empirical"] = {**out["random_empirical"], "mean_abs_cosine": base}
    out["random_like"] = bool(out["random_like"] and abs_cos <= ABS_COSINE_FACTOR * base)
    return out


def view_report(table: torch.Tensor) -> dict[str, Any]:
    """One view of a (K, L, dP) table: the whole table, each layer slice, and whether all are random-like."""
    k, layers, dim = table.shape
    slices = {s: view_stats(table[:, s]) for s in range(layers)}
    overall = view_stats(table.reshape(k, layers * dim))
    # A slice with fewer than two changed rows has no statistics; the others and the whole table still judge.
    flags = [f for f in (overall["random_like"], *(v["random_like"] for v in slices.values())) if f is not None]
    return {"overall": overall, "slices": slices, "random_like": all(flags) if flags else None}


def table_report(table: torch.Tensor, init: torch.Tensor | None = None,
                 init_note: str = "no initial table") -> dict[str, Any]:
    """The table's statistics in the 'table' and 'delta' views beside random baselines (see the module docstring).

    table, init: (K, L, dP); `init_note` says why the initial table is absent.
    """
    table = table.detach().double().cpu()
    views: dict[str, Any] = {"table": view_report(table)}
    if init is None:
        views["delta"] = {"available": False, "reason": init_note}
    elif tuple(init.shape) != tuple(table.shape):
        views["delta"] = {"available": False,
                          "reason": f"initial table has shape {tuple(init.shape)}, the model's is {tuple(table.shape)}"}
    else:
        delta = table - init.detach().double().cpu()
        # What every id's row gained alike is a bias, not id structure (random ids all drift that way).
        delta = delta - delta.mean(0, keepdim=True)
        views["delta"] = view_report(delta) if bool(delta.abs().sum() > 0) else {
            "available": False, "reason": "the table changed alike for every id (or not at all) since initialisation"}
    decides = views["delta"] if views["delta"].get("random_like") is not None else views["table"]
    return {"shape": list(table.shape), "views": views, "random_like": decides["random_like"]}


def headline(report: dict[str, Any], view: str = "table") -> dict[str, float | None]:
    """The whole-table statistics of one view and their random baselines, flat (for tables and plots)."""
    v = (report.get("views") or {}).get(view) or {}
    overall = v.get("overall") or {}
    metrics, base = overall.get("metrics") or {}, overall.get("random_empirical") or {}
    keys = ("mean_abs_cosine", "mean_cosine", "effective_rank", "pc1_explained_variance")
    return {**{k: metrics.get(k) for k in keys}, **{f"random_{k}": base.get(k) for k in keys},
            "max_rank": min(overall["rows"], overall["dim"]) if "rows" in overall else None,
            "random_like": v.get("random_like")}


# ---------------------------------------------------------------------------------------- model measurements
@torch.no_grad()
def batch_caption_losses(model: VisionPLEModel, batches: Batches) -> list[tuple[float, int]]:
    """(mean caption loss, caption token count) of each held-out batch, in eval mode."""
    was_training = model.training
    model.eval()
    try:
        out = []
        for inputs, targets in batches:
            _, loss = model(inputs, targets, return_logits=False)
            out.append((float(loss), int((targets != -100).sum())))
        return out
    finally:
        model.train(was_training)


@contextmanager
def visual_ple_ablated(model: VisionPLEModel, mode: str = "zero", seed: int = 0) -> Iterator[None]:
    """Within the block the visual PLE input is zeroed ('zero') or fed shuffled patch ids ('shuffle_ids')."""
    if mode not in ABLATION_MODES:
        raise ValueError(f"visual PLE ablation mode must be one of {ABLATION_MODES}, got {mode!r}")
    ple = model.visual_ple
    if ple is None:
        raise PlelabError("the model has no visual PLE table to ablate")
    generator = torch.Generator().manual_seed(seed)

    def zero(module, args, output):
        return torch.zeros_like(output)

    def shuffle(module, args):
        ids, *rest = args
        perm = torch.randperm(ids.numel(), generator=generator).to(ids.device)
        return (ids.reshape(-1)[perm].view_as(ids), *rest)

    handle = ple.register_forward_hook(zero) if mode == "zero" else ple.register_forward_pre_hook(shuffle)
    try:
        yield
    finally:
        handle.remove()


def ablation(model: VisionPLEModel, batches: Batches, modes: Iterable[str] = ABLATION_MODES,
             seed: int = 0) -> dict[str, Any]:
    """Caption loss with the visual PLE on and switched off per mode: {mode: {loss, delta, se}, delta, se, ...}."""
    modes = tuple(modes)
    full = batch_caption_losses(model, batches)
    out: dict[str, Any] = {"loss_full": pooled_loss(full), "n_batches": len(full),
                           "n_tokens": sum(n for _, n in full)}
    for mode in modes:
        with visual_ple_ablated(model, mode, seed):
            out[mode] = compare_losses(full, batch_caption_losses(model, batches))
    primary = min(modes, key=lambda m: out[m]["delta"])
    return {**out, "delta": out[primary]["delta"], "se": out[primary]["se"], "n": out[primary]["n"],
            "primary_mode": primary}


@torch.no_grad()
def injection_ratios(model: VisionPLEModel, batches: Batches) -> dict[int, float]:
    """RMS(y) / RMS(h) of each PLE layer's injection, pooled over the patch positions of `batches`."""
    P = model.patches
    sums: dict[int, list[float]] = {}

    def probe(i: int):
        def hook(module, args, kwargs, output):
            h = args[0] if args else kwargs["h"]
            acc = sums.setdefault(i, [0.0, 0.0])
            acc[0] += h[:, :P].float().pow(2).sum().item()
            acc[1] += output[:, :P].float().pow(2).sum().item()
        return hook

    layers = [i for i, layer in enumerate(model.trunk.layers) if getattr(layer, "ple", None) is not None]
    handles = [model.trunk.layers[i].ple.register_forward_hook(probe(i), with_kwargs=True) for i in layers]
    try:
        batch_caption_losses(model, batches)
    finally:
        for handle in handles:
            handle.remove()
    return {i: math.sqrt(yy / hh) if hh > 0 else math.nan for i, (hh, yy) in sorted(sums.items())}


def vision_verdict(table_random_like: bool | None, abl: dict[str, Any] | None) -> dict[str, str]:
    """{'verdict', 'reason'} by RULES['verdict'] from the table's random-likeness and the ablation."""
    judged = None if abl is None else used_verdict(abl["delta"], abl["se"], abl.get("n", 0))
    if table_random_like:
        used = "" if judged is None else f"; by the ablation alone it would be {judged['verdict']}: {judged['reason']}"
        return {"verdict": "random-like", "reason": "the table is random-like in every available view" + used}
    if judged is None:
        return {"verdict": "n/a", "reason": "structured table, but no held-out batches to ablate on"}
    return {"verdict": judged["verdict"], "reason": f"structured table; {judged['reason']}"}


def diagnose_vision_model(model: VisionPLEModel, batches: Batches, init_table: torch.Tensor | None = None,
                          init_note: str = "no initial table", seed: int = 0) -> dict[str, Any]:
    """Table statistics, ablation, injection ratios and the verdict of one model on held-out batches."""
    table = model.visual_table()
    if table is None:
        loss = pooled_loss(batch_caption_losses(model, batches)) if batches else None
        return {"visual_ple": False, "loss_full": loss, "verdict": {"verdict": "n/a", "reason": "no visual PLE"}}
    report = table_report(table, init_table, init_note)
    abl = ablation(model, batches, seed=seed) if batches else None
    ratios = injection_ratios(model, batches) if batches else {}
    return {"visual_ple": True, "table": report, "ablation": abl, "injection_ratio": ratios,
            "loss_full": None if abl is None else abl["loss_full"],
            "verdict": vision_verdict(report["random_like"], abl), "rules": RULES}


# ------------------------------------------------------------------------------------------------- a run
def initial_table(model: VisionPLEModel, meta: dict[str, Any]) -> tuple[torch.Tensor | None, str]:
    """(the visual table at initialisation, rebuilt as the Trainer built it from the run's seed, or None; a note)."""
    train = meta.get("train") or {}
    # The checkpoint records the device that ran; older ones only the configured name, where "auto" says nothing.
    device = str(meta.get("device") or train.get("device", "cpu"))
    if device == "auto":
        return None, "the run's device was 'auto' and its checkpoint predates recording the one that ran: " \
                     "its initial table is not rebuilt"
    if device != "cpu":
        return None, f"the run trained on {device}: its initial table is not rebuilt on the CPU"
    with torch.random.fork_rng(devices=[]):
        # The Trainer seeds right before building the model; the trunk initialises first, then the vision parts.
        torch.manual_seed(int(train.get("seed", 0)))
        fresh = VisionPLEModel(model.config, model.patches, model.patch_pixels, model.codebook,
                               model.aux_weight, pixels=model.patch_embed is not None)
    table = fresh.visual_table()
    return (None, "no visual PLE") if table is None else (table.detach(), "rebuilt from the run's seed")


def heldout_batches(corpus: str | Path, batch_size: int = 100, device: str = "cpu",
                    model: VisionPLEModel | None = None, checkpoint: Path | None = None) -> Batches:
    """The held-out split of a prepared corpus as (VisionBatch, targets) batches, in order; with `model` (and the
    `checkpoint` it came from), a corpus the model was not trained on is refused first (`check_corpus_fits`)."""
    from plelab.vision.data import HELDOUT_SPLIT, SplitTensors, corpus_facts, open_corpus

    split = open_corpus(corpus, HELDOUT_SPLIT)
    facts = corpus_facts(split)
    if model is not None:
        check_corpus_fits(model, facts, corpus, checkpoint)
    tensors = SplitTensors(split, torch.device(device), facts["bos_id"])
    return [tensors.batch(slice(s, s + batch_size)) for s in range(0, len(tensors), batch_size)]


def check_corpus_fits(model: VisionPLEModel, facts: dict[str, Any], corpus: str | Path,
                      checkpoint: Path | None = None) -> None:
    """PlelabError (one line) unless `corpus` is one the model can be measured on: its codebook, its patches
    (number and size) and its caption tokenizer those of the corpus the model trained on. Another corpus would
    either fail inside the model or, worse, yield a verdict about ids and captions the model never saw."""
    from plelab.errors import PlelabError
    from plelab.util.fs import sha256_file

    where = f"corpus {corpus}"
    if facts["codebook"] != model.codebook:
        raise PlelabError(f"{where} has a codebook of {facts['codebook']} patch ids; the run's model was trained on "
                          f"{model.codebook}: give the corpus it trained on")
    # An ids-only model (no patch embedding) reads no pixels: only its patch count is checked.
    pixels = model.patch_embed.in_features if model.patch_embed is not None else facts["patch_pixels"]
    if (facts["patches"], facts["patch_pixels"]) != (model.patches, pixels):
        raise PlelabError(f"{where} cuts images into {facts['patches']} patch(es) of {facts['patch_pixels']} pixels; "
                          f"the run's model reads {model.patches} patch(es) of {pixels}: "
                          "give the corpus it trained on")
    if facts["caption_vocab"] > model.config.vocab_size:
        raise PlelabError(f"{where} has a caption tokenizer of {facts['caption_vocab']} ids, more than the run's "
                          f"model knows ({model.config.vocab_size}): give the corpus it trained on")
    theirs = Path(corpus) / facts["tokenizer"] if facts.get("tokenizer") else None
    ours = checkpoint / "tokenizer.json" if checkpoint is not None else None
    if theirs is not None and ours is not None and theirs.is_file() and ours.is_file() \
            and sha256_file(theirs) != sha256_file(ours):
        raise PlelabError(f"{where} has another caption tokenizer than the run trained with ({ours}): its caption "
                          "ids mean other words; give the corpus it trained on")


def diagnose_run(path: str | Path, corpus: str | Path | None = None, batch_size: int = 100,
                 seed: int = 0) -> dict[str, Any]:
    """diagnose_vision_model on a vision run's latest checkpoint and its corpus's held-out split (CPU)."""
    from plelab.runs.checkpoint import resolve_checkpoint
    from plelab.vision.train import load_vision_model

    model, meta = load_vision_model(path, "cpu")
    ckpt = resolve_checkpoint(path)
    corpus = corpus or ((meta.get("train") or {}).get("vision") or {}).get("corpus")
    batches = heldout_batches(corpus, batch_size, model=model, checkpoint=ckpt)
    init, note = initial_table(model, meta)
    out = diagnose_vision_model(model, batches, init, note, seed)
    return {"checkpoint": str(ckpt), "corpus": str(corpus), **out}


def format_diagnosis(result: dict[str, Any]) -> str:
    """A few lines for the terminal: verdict, table statistics beside random, ablation and injection ratios."""
    lines = [f"checkpoint {result.get('checkpoint')}; held-out captions of {result.get('corpus')}",
             f"verdict: {result['verdict']['verdict']} ({result['verdict']['reason']})"]
    if not result.get("visual_ple"):
        return "\n".join(lines)
    for view in ("table", "delta"):
        h = headline(result["table"], view)
        if h["effective_rank"] is None:
            continue
        lines.append(f"{view:>5}: mean |cos| {h['mean_abs_cosine']:.3f} (random {h['random_mean_abs_cosine']:.3f}), "
                     f"mean cos {h['mean_cosine']:+.3f}, effective rank {h['effective_rank']:.1f}/{h['max_rank']} "
                     f"(random {h['random_effective_rank']:.1f}), PC1 {h['pc1_explained_variance']:.3f} "
                     f"(random {h['random_pc1_explained_variance']:.3f}): "
                     f"{'random-like' if h['random_like'] else 'structured'}")
    abl = result.get("ablation")
    if abl:
        modes = ", ".join(f"{m} {abl[m]['delta']:+.4f} ± {abl[m]['se']:.4f}" for m in ABLATION_MODES if m in abl)
        lines.append(f"caption loss {abl['loss_full']:.4f}; ablation Δ: {modes}")
    ratios = result.get("injection_ratio") or {}
    if ratios:
        lines.append("injection ratio at patches: " + ", ".join(f"layer {i} {r:.3f}" for i, r in ratios.items()))
    return "\n".join(lines)
