"""A measured quantization recipe: how much each tensor group of a PLE model suffers in each format, and the
cheapest-in-KL format per group for a byte budget.

Method (`plelab quant-recipe`, docs/quantization.md):
  1. Held-out text: the first `tokens` tokens of each domain (a folder of .txt files, tokenized with the model's
     tokenizer, or a .npy of token ids), cut into non-overlapping windows of `seq_len`.
  2. Reference: the unquantized model (float32) gives log p_ref at every position.
  3. One group at a time, in one format at a time (every other weight unquantized): KL(p_ref || p_q) averaged
     over positions (nats/token), and the change of the mean next-token loss, per domain and overall.
  4. For a byte budget and one family of formats (.ple or GGUF): the format per group that minimises the summed
     single-group KL with the weights' bytes within the budget (an exact multiple-choice knapsack over the
     Pareto fronts of each group), then the chosen combination measured for real (all groups quantized at
     once), next to the uniform baselines of that family.
The single-group KLs add up only approximately: the combination's own measurement is what the report leads with.
"""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from plelab.errors import PlelabError
from plelab.hf.quant_formats import Format, available, parse_format
from plelab.hf.recipe_model import RecipeModel
from plelab.hf.tensor_groups import GROUPS

REF_RAM_BYTES = 512 << 20
"""Reference log-probabilities above this size go to a temporary memory-mapped file instead of RAM."""


class RecipeError(PlelabError):
    """Bad recipe input: no data, a budget no recipe meets, formats that cannot be used."""


# ---------------------------------------------------------------------------------------------------------------
# held-out data


@dataclass
class HeldOut:
    """Windows (x, y) of held-out tokens and the domain of each window."""

    x: torch.Tensor
    y: torch.Tensor
    domains: list[str]
    description: str

    @property
    def positions(self) -> int:
        """Scored positions."""
        return int(self.y.numel())


def held_out(path: str | Path, model: RecipeModel, tokens: int, seq_len: int) -> HeldOut:
    """The first `tokens` tokens of every domain in `path` (.txt folder/file or .npy ids), as windows."""
    from plelab.data.prepare import load_eval_domains

    p = Path(path)
    if not p.exists():
        raise RecipeError(f"{path}: no such file or folder (give held-out .txt domains or a .npy of token ids)")
    if model.context and seq_len > model.context:
        raise RecipeError(f"--seq-len {seq_len} is longer than the model's context ({model.context} tokens); "
                          f"give at most {model.context}")
    if p.suffix == ".npy":
        try:
            ids = np.asarray(np.load(p, mmap_mode="r")).reshape(-1)
        except (ValueError, OSError) as exc:
            raise RecipeError(f"{p}: not a readable .npy token array ({exc})") from None
        if not np.issubdtype(ids.dtype, np.integer):
            raise RecipeError(f"{p}: holds {ids.dtype} values; token ids are integers (save them as int32/int64)")
        if len(ids) and int(ids.min()) < 0:
            raise RecipeError(f"{p}: holds token id {int(ids.min())}; ids are 0 or more")
        streams = {p.stem: ids}
        how = "token ids as given"
    else:
        if model.tokenizer is None:
            raise RecipeError(f"{model.source} has no tokenizer.json to tokenize {path} with; give a .npy of ids")
        streams = {k: d.tokens for k, d in load_eval_domains(p, model.tokenizer).items()}
        how = "tokenized with the model's tokenizer"
    if not streams:
        raise RecipeError(f"{path}: no .txt domains found")
    xs, ys, domains = [], [], []
    for name, ids in streams.items():
        ids = np.asarray(ids[: tokens + 1], dtype=np.int64)
        if len(ids) and int(ids.max()) >= model.vocab_size:
            raise RecipeError(f"{name} holds token id {int(ids.max())}; the model's vocabulary is {model.vocab_size}")
        n = (len(ids) - 1) // seq_len
        if n == 0:
            raise RecipeError(f"domain {name} has {len(ids)} tokens, fewer than one window of {seq_len + 1}")
        for k in range(n):
            w = ids[k * seq_len : (k + 1) * seq_len + 1]
            xs.append(w[:-1])
            ys.append(w[1:])
            domains.append(name)
    desc = f"{len(streams)} domain(s) in {path} ({how}), up to {tokens} tokens each in windows of {seq_len}"
    return HeldOut(torch.from_numpy(np.stack(xs)), torch.from_numpy(np.stack(ys)), domains, desc)


# ---------------------------------------------------------------------------------------------------------------
# measuring


class _Reference:
    """log p_ref of every position (RAM, or a temporary memory-mapped file when large) and the ref losses."""

    def __init__(self, positions: int, vocab: int):
        nbytes = positions * vocab * 4
        self.filled = False
        self._tmp = None
        if nbytes > REF_RAM_BYTES:
            self._tmp = tempfile.TemporaryDirectory(prefix="plelab-recipe-")
            self.logp = np.memmap(Path(self._tmp.name) / "ref.f32", np.float32, "w+", shape=(positions, vocab))
        else:
            self.logp = np.empty((positions, vocab), np.float32)

    def close(self) -> None:
        """Drop the temporary file, if any."""
        if self._tmp is not None:
            del self.logp
            self._tmp.cleanup()


def _pass(model: RecipeModel, data: HeldOut, batch: int, ref: _Reference | None,
          device: torch.device) -> tuple[np.ndarray, np.ndarray]:
    """(per-window summed KL to the reference (0 without one), per-window summed loss); fills `ref` if empty."""
    kl = np.zeros(len(data.domains))
    loss = np.zeros(len(data.domains))
    T = data.x.shape[1]
    for a in range(0, len(data.domains), batch):
        x = data.x[a : a + batch].to(device)
        y = data.y[a : a + batch].reshape(-1).to(device)
        base = a * T
        for sl, logp in model.log_probs(x):
            tgt = y[sl]
            nll = -logp.gather(1, tgt[:, None])[:, 0].double().cpu().numpy()
            win = (np.arange(sl.start, sl.stop) // T) + a
            np.add.at(loss, win, nll)
            rows = slice(base + sl.start, base + sl.stop)
            if ref is not None and ref.filled:
                r = torch.from_numpy(np.asarray(ref.logp[rows])).to(logp.device)
                k = (r.exp() * (r - logp)).sum(-1).double().cpu().numpy()
                np.add.at(kl, win, k)
            elif ref is not None:
                ref.logp[rows] = logp.cpu().numpy()
    if ref is not None:
        ref.filled = True
    return kl, loss


def _se(x: np.ndarray) -> float:
    """Standard error of the mean of per-window values (0 for a single window)."""
    return float(np.std(x, ddof=1) / math.sqrt(len(x))) if len(x) > 1 else 0.0


def summary(kl: np.ndarray, loss: np.ndarray, base_loss: np.ndarray, data: HeldOut,
            windows: bool = False) -> dict[str, Any]:
    """Mean KL and Δloss per position (overall and per domain) from per-window sums, with standard errors over
    windows; `windows` keeps the per-window KL (for paired comparisons of two measurements)."""
    T = data.x.shape[1]
    doms = np.array(data.domains)
    kl_w, dl_w = kl / T, (loss - base_loss) / T
    per = {}
    for d in dict.fromkeys(data.domains):
        m = doms == d
        per[d] = {"kl": float(kl_w[m].mean()), "delta_loss": float(dl_w[m].mean()),
                  "delta_loss_se": _se(dl_w[m])}
    out = {"kl": float(kl_w.mean()), "kl_se": _se(kl_w), "delta_loss": float(dl_w.mean()),
           "delta_loss_se": _se(dl_w), "domains": per}
    if windows:
        out["window_kl"] = kl_w.tolist()
    return out


def paired(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    """KL of measurement a minus b, window by window: mean and standard error (both need window_kl)."""
    d = np.array(a["window_kl"]) - np.array(b["window_kl"])
    return {"kl_diff": float(d.mean()), "se": _se(d), "windows": len(d)}


@dataclass
class Measurer:
    """Runs the reference once, then measures any assignment {group: Format} against it."""

    model: RecipeModel
    data: HeldOut
    batch: int = 8
    device: torch.device = torch.device("cpu")

    def __post_init__(self) -> None:
        self.ref = _Reference(self.data.positions, self.model.vocab_size)
        _, self.base_loss = _pass(self.model, self.data, self.batch, self.ref, self.device)
        T = self.data.x.shape[1]
        doms = np.array(self.data.domains)
        self.reference = {"loss": float(self.base_loss.sum() / (len(doms) * T)),
                          "domains": {d: float(self.base_loss[doms == d].sum() / ((doms == d).sum() * T))
                                      for d in dict.fromkeys(self.data.domains)}}

    def measure(self, assignment: dict[str, Format], windows: bool = False) -> dict[str, Any]:
        """KL to the reference and Δloss (overall and per domain) with `assignment` applied."""
        with self.model.quantized(assignment):
            kl, loss = _pass(self.model, self.data, self.batch, self.ref, self.device)
        return summary(kl, loss, self.base_loss, self.data, windows)

    def close(self) -> None:
        """Free the reference."""
        self.ref.close()


# ---------------------------------------------------------------------------------------------------------------
# the per-group table


def fingerprint(model: RecipeModel, data: HeldOut, formats: list[Format]) -> str:
    """What a cached table depends on: the weights' source, the held-out windows and the formats."""
    h = hashlib.sha256()
    h.update(json.dumps([model.source, model.description, [f.name for f in formats]], sort_keys=True).encode())
    h.update(data.x.numpy().tobytes())
    return h.hexdigest()[:16]


def measure_table(measurer: Measurer, formats: list[Format], cache: Path | None = None,
                  progress: Callable[[str], None] | None = None) -> dict[str, dict[str, Any]]:
    """{group: {format: measurement | {"bytes": None} when it cannot hold the group}} with bytes added.

    With `cache` (a JSON file), finished cells are saved as they come and reused by a rerun with the same
    fingerprint, so an interrupted measurement resumes where it stopped.
    """
    model = measurer.model
    key = fingerprint(model, measurer.data, formats)
    done: dict[str, dict[str, Any]] = {}
    if cache is not None and cache.is_file():
        try:
            saved = json.loads(cache.read_text(encoding="utf-8"))
            if saved.get("fingerprint") == key:
                done = saved["table"]
        except (ValueError, KeyError, TypeError):
            done = {}
    groups = [g for g in GROUPS if g in model.groups()]
    for g in groups:
        row = done.setdefault(g, {})
        for f in formats:
            if f.name in row:
                continue
            nbytes = model.group_bytes(g, f)
            if nbytes is None:
                row[f.name] = {"bytes": None, "reason": f"{f.name}'s block does not divide a row of this group"}
            else:
                if progress is not None:
                    progress(f"{g} as {f.name}")
                row[f.name] = {"bytes": nbytes, **measurer.measure({g: f})}
            if cache is not None:
                from plelab.util.fs import atomic_write_bytes

                atomic_write_bytes(cache, json.dumps({"fingerprint": key, "table": done}).encode())
    return {g: done[g] for g in groups}


# ---------------------------------------------------------------------------------------------------------------
# choosing


def fixed_bytes(model: RecipeModel, family: str) -> int:
    """Bytes outside the chosen groups: 1-D weights (f32 in GGUF, fp16 in .ple) and 'other' matrices at 16 bits."""
    total = 0
    for p in model.module.parameters():
        if p.ndim <= 1:
            total += p.numel() * (4 if family == "gguf" else 2)
    for m in model.groups().get("other", []):
        total += 2 * math.prod(m.shape)
    return total


def choose(table: dict[str, dict[str, Any]], formats: list[Format], budget: int) -> tuple[dict[str, str], int, float]:
    """(format per group, its bytes, its summed KL) minimising the summed KL within `budget` bytes.

    Exact: each group's (bytes, KL) options are merged group by group keeping only the Pareto front (no option
    that is both larger and no better in KL), which never drops an optimal combination.
    """
    names = {f.name for f in formats}
    front: list[tuple[int, float, dict[str, str]]] = [(0, 0.0, {})]
    for g, row in table.items():
        options = [(c["bytes"], max(c["kl"], 0.0), f) for f, c in row.items() if f in names and c.get("bytes")]
        if not options:
            raise RecipeError(f"no format of {', '.join(sorted(names))} can hold group {g}")
        merged = sorted(((b0 + b, k0 + k, {**pick, g: f}) for b0, k0, pick in front for b, k, f in options),
                        key=lambda item: (item[0], item[1]))
        front = []
        for b, k, pick in merged:
            if b > budget:
                break
            if not front or k < front[-1][1]:
                front.append((b, k, pick))
        if not front:
            smallest = sum(min(c["bytes"] for f, c in r.items() if f in names and c.get("bytes"))
                           for r in table.values())
            raise BudgetTooSmall(f"the budget of {budget:,} bytes is below the smallest recipe of these formats "
                                 f"({smallest:,} bytes of weights in the chosen groups)", smallest)
    b, k, pick = front[-1]
    return pick, b, k


class BudgetTooSmall(RecipeError):
    """No combination of the formats fits the budget; `smallest`: the bytes the smallest one takes."""

    def __init__(self, message: str, smallest: int):
        super().__init__(message)
        self.smallest = smallest


BUDGET_FLAGS = {"ple": "--budget", "gguf": "--gguf-budget"}
"""The option that sets each family's budget (named in its messages)."""


def fit_budget(table: dict[str, dict[str, Any]], formats: list[Format], family: str, text: str,
               fixed: int) -> tuple[dict[str, str], int, float, int, str]:
    """(format per group, its bytes, its summed KL, the groups' budget, the budget's description) of the best
    recipe of `family`'s `formats` within the budget `text`; `fixed`: the bytes kept unquantized. A budget no
    recipe meets is one line saying, in the option's own terms, what the smallest recipe takes."""
    flag = BUDGET_FLAGS[family]
    budget, desc = parse_budget(text, table, fixed, flag)
    try:
        pick, nbytes, summed = choose(table, formats, budget)
    except BudgetTooSmall as exc:
        names = ", ".join(f.name for f in formats)
        raise RecipeError(f"{flag} {text} is below the smallest recipe of {names}: it takes "
                          f"{exc.smallest + fixed:,} bytes of weights ({exc.smallest:,} in the quantized groups + "
                          f"{fixed:,} kept unquantized), the budget allows {budget + fixed:,}; give at least "
                          f"{exc.smallest + fixed:,} or a smaller format") from None
    return pick, nbytes, summed, budget, desc


def uniform(table: dict[str, dict[str, Any]], fmt: Format) -> tuple[dict[str, str], int] | None:
    """Every group in `fmt` (None when it cannot hold some group)."""
    cells = [row.get(fmt.name) for row in table.values()]
    if any(c is None or not c.get("bytes") for c in cells):
        return None
    return {g: fmt.name for g in table}, sum(c["bytes"] for c in cells)


def parse_budget(text: str, table: dict[str, dict[str, Any]], fixed: int, flag: str = "--budget"
                 ) -> tuple[int, str]:
    """(weight bytes of the chosen groups, description) from '12M' / '3.5MB' (whole weights, fixed part included)
    or a format name (the bytes that format takes uniformly); `flag` names the option in messages."""
    from plelab.util.units import parse_size

    try:
        fmt = parse_format(text)
    except PlelabError:
        fmt = None
    if fmt is not None:
        u = uniform(table, fmt)
        if u is None:
            if not any(fmt.name in row for row in table.values()):
                measured = sorted({f for row in table.values() for f in row})
                raise RecipeError(f"{flag} {text}: {fmt.name} is not among the formats measured "
                                  f"({', '.join(measured)}); add it to --formats or give a size")
            holds_not = [g for g, row in table.items() if not (row.get(fmt.name) or {}).get("bytes")]
            raise RecipeError(f"{flag} {text}: {fmt.name} cannot hold the group(s) {', '.join(holds_not)} of this "
                              "model (their rows do not divide into its blocks); give a size or another format")
        return u[1], f"the bytes of uniform {fmt.name} ({u[1] + fixed:,} B of weights)"
    try:
        total = parse_size(text)
    except PlelabError as exc:
        raise RecipeError(f"{flag}: {exc} (or a format name such as int4/128 or q4_0)") from None
    if total is None:
        raise RecipeError(f"{flag} must be a size (e.g. 12M, 3.5GB) or a format name (e.g. int4/128, q4_0)")
    if total <= fixed:
        raise RecipeError(f"{flag} {text} ({total:,} bytes of weights) is below what the norms and other weights "
                          f"kept unquantized take alone ({fixed:,} bytes)")
    return total - fixed, f"{total:,} B of weights"


@dataclass
class Recipe:
    """A chosen format per group for one family, with its predicted and measured quality."""

    family: str
    budget: int
    budget_text: str
    formats: dict[str, str]
    bytes: int
    summed_kl: float
    measured: dict[str, Any]
    baselines: dict[str, dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        """JSON-ready."""
        return dict(self.__dict__)


def make_recipe(measurer: Measurer, table: dict[str, dict[str, Any]], formats: list[Format], family: str,
                budget_text: str, baselines: list[str]) -> Recipe:
    """Choose for `family` within the budget, then measure the choice and the uniform `baselines` for real."""
    fam = [f for f in formats if f.family == family]
    if not fam:
        raise RecipeError(f"no {family} format among the measured ones")
    fixed = fixed_bytes(measurer.model, family)
    pick, nbytes, summed, budget, desc = fit_budget(table, fam, family, budget_text, fixed)
    measured = measurer.measure({g: parse_format(f) for g, f in pick.items()}, windows=True)
    out_baselines = {}
    for name in baselines:
        fmt = parse_format(name)
        u = uniform(table, fmt) if fmt.family == family else None
        if u is None:
            continue
        res = measurer.measure({g: fmt for g in u[0]}, windows=True)
        out_baselines[name] = {"bytes": u[1] + fixed, **res, "recipe_minus_this": paired(measured, res)}
    return Recipe(family, budget + fixed, desc, pick, nbytes + fixed, summed, measured, out_baselines)


def default_formats(names: list[str] | None) -> tuple[list[Format], list[str]]:
    """(formats to measure, notes): the defaults or `names`, without GGUF types this machine cannot quantize."""
    from plelab.hf.quant_formats import DEFAULT_FORMATS

    wanted = [parse_format(n) for n in (names or DEFAULT_FORMATS)]
    usable = [f for f in wanted if available(f)]
    notes = []
    skipped = [f.name for f in wanted if f not in usable]
    if skipped:
        notes.append(f"not measured ({', '.join(skipped)}): ggml's quantizer needs llama-cpp-python")
    return usable, notes
