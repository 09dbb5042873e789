"""`plelab quant-recipe` end to end: measure the per-group table, choose per family, export, measure the files.

Exports (into the output folder):
    recipe.ple    the .ple recipe. A plelab llama-arch run: the whole model, each tensor in its group's encoding
                  (the .ple format already stores an encoding per tensor and per record part; the choice is
                  recorded under quant.encodings). A Gemma 4 run or an HF Gemma folder: the PLE table and the
                  main embedding only (the runtimes execute the llama-style block), as `plelab export --hf`.
    recipe.gguf   the GGUF recipe, for Gemma 4 (a plelab arch = "gemma4" run or an HF Gemma 4 folder).
Each file is then measured as written: the .ple by the NumPy runtime (whole models) or by plugging its
dequantized tables back into the model (table-only files), the GGUF by llama.cpp (when llama-cpp-python is
installed), each against the same unquantized reference.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from plelab.hf.quant_formats import Format, parse_format
from plelab.hf.quant_recipe import (
    Measurer,
    Recipe,
    RecipeError,
    default_formats,
    fit_budget,
    fixed_bytes,
    held_out,
    make_recipe,
    measure_table,
    summary,
)
from plelab.hf.recipe_model import RecipeModel, open_model
from plelab.hf.tensor_groups import GROUPS, group_of
from plelab.util.fs import staging_dir

BASELINES = {"ple": ["fp16", "int8/32", "int4/32", "int4/128"], "gguf": ["f16", "q8_0", "q4_0", "q4_k"]}
DEFAULT_SEQ_LEN = 128
"""Window length when none is given (shorter for a model made for shorter sequences)."""
EXPORT_FILES = {"ple": "recipe.ple", "gguf": "recipe.gguf"}
"""The exported recipe of each family, in the output folder."""


def _bytes_only_table(model: RecipeModel, formats: list[Format]) -> dict[str, dict[str, Any]]:
    return {g: {f.name: {"bytes": model.group_bytes(g, f), "kl": 0.0} for f in formats}
            for g in GROUPS if g in model.groups()}


def check_budgets(model: RecipeModel, formats: list[Format], budgets: dict[str, str]) -> None:
    """Refuse, before measuring anything, a budget that no combination of the formats meets."""
    table = _bytes_only_table(model, formats)
    for family, text in budgets.items():
        fam = [f for f in formats if f.family == family]
        if not fam:
            continue
        fit_budget(table, fam, family, text, fixed_bytes(model, family))


def ple_encodings(model: RecipeModel, recipe: dict[str, str]) -> dict[str, Any]:
    """ExportOptions.encodings of a .ple recipe: every file tensor and the table parts, by group."""
    from plelab.edge.export import file_tensors
    from plelab.hf.interop import gemma4_hf_name

    out: dict[str, Any] = {}
    if "ple_table" in recipe:
        out["ple"] = parse_format(recipe["ple_table"]).encoding()
    if "embedding" in recipe:
        out["embed"] = parse_format(recipe["embedding"]).encoding()
    if model.kind == "plelab" and model.family == "llama":
        for name, value in file_tensors(model.module.state_dict()).items():
            g = group_of(gemma4_hf_name(name), value.ndim)
            if g in recipe and value.ndim > 1:
                out[name] = parse_format(recipe[g]).encoding()
    return out


def export_ple(model: RecipeModel, recipe: dict[str, str], out: Path) -> dict[str, Any]:
    """Write the .ple recipe (whole model or table-only, see the module docstring); returns what was written."""
    from plelab.edge.export import ExportOptions, export_model
    from plelab.hf.ple_export import export_hf

    opts = ExportOptions(quant="int4", group=32, encodings=ple_encodings(model, recipe))
    if model.kind == "plelab" and model.family == "llama":
        layout = export_model(model.module, out, opts, model.tokenizer.to_json(),
                              {"checkpoint": model.description.get("checkpoint"), "recipe": recipe})
        return {"path": str(out), "file_bytes": layout.file_bytes, "table_only": False}
    if model.kind == "hf":
        layout = export_hf(model.source, out, opts)
    else:  # a plelab Gemma 4 run: through its HF folder, which export --hf reads a chunk of rows at a time
        from plelab.hf.run_export import export_hf as export_run_hf

        tmp = staging_dir(out.with_name("recipe-hf"))
        try:
            export_run_hf(model.source, tmp / "hf", transformers_only=True)
            layout = export_hf(tmp / "hf", out, opts)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return {"path": str(out), "file_bytes": layout.file_bytes, "table_only": True}


def export_gguf_recipe(model: RecipeModel, recipe: dict[str, str], out: Path) -> dict[str, Any]:
    """Write the GGUF recipe (Gemma 4 only)."""
    from plelab.hf.gguf_export import GGUFExportError, TypePlan, hf_source, plan_tensors, run_source, write_gguf

    if model.family != "gemma4":
        raise GGUFExportError(f"GGUF needs a Gemma 4 model; this one is {model.family}")
    source = hf_source(model.source) if model.kind == "hf" else run_source(model.source)
    plan = TypePlan("f16", tuple(recipe.items()))
    result = write_gguf(source, out, plan, plan_tensors(source, plan, strict=True))  # the recipe chose fitting types
    return result.to_json()


def measure_ple_file(measurer: Measurer, path: Path, table_only: bool, recipe: dict[str, str]) -> dict[str, Any]:
    """The written .ple checked against what was measured: a whole model runs in the NumPy runtime on every window
    (KL / Δloss against the reference); a table-only file's rows (those the held-out text uses) must equal the
    recipe's round trip of the original rows."""
    from plelab.edge.format import PleFile

    if not table_only:
        from plelab.edge.runtime import EdgeModel

        with EdgeModel(path) as edge:
            return _measure_logits(measurer, lambda ids: edge.forward(ids, edge.new_cache(len(ids))))
    model = measurer.model
    ids = np.unique(measurer.data.x.numpy())
    worst = 0.0
    with PleFile(path) as f:
        for part, group in (("ple", "ple_table"), ("embed", "embedding")):
            tab = next((t for t in f.layout.tables if t.part(part) is not None), None)
            mats = [m for m in model.groups().get(group, []) if m.name != "lm_head.weight"]
            if tab is None or not mats or group not in recipe:
                continue
            stored = np.stack([f.read_record(tab, int(i))[part] for i in ids])
            original = _original_rows(model, mats[0], ids)
            expected = parse_format(recipe[group]).round_trip(original, True)
            worst = max(worst, float(np.abs(stored - expected).max()))
    return {"rows_checked": int(len(ids)), "max_abs_diff_to_measured": worst}


def _original_rows(model: RecipeModel, m, ids: np.ndarray) -> np.ndarray:
    if m.tensor is not None:
        return m.tensor.detach().float().cpu().numpy()[ids]
    from plelab.util.safetensors import gather_rows

    return gather_rows(model._streamed.info, ids).numpy()


def _measure_logits(measurer: Measurer, logits_of: Callable[[list[int]], np.ndarray]) -> dict[str, Any]:
    """KL / Δloss of an external runtime's logits (one fresh context per window) against the reference."""
    data, ref = measurer.data, measurer.ref
    T = data.x.shape[1]
    kl = np.zeros(len(data.domains))
    loss = np.zeros(len(data.domains))
    for w in range(len(data.domains)):
        logits = torch.from_numpy(np.asarray(logits_of(data.x[w].tolist()), dtype=np.float32))
        logp = torch.log_softmax(logits.double(), -1)
        r = torch.from_numpy(np.asarray(ref.logp[w * T : (w + 1) * T])).double()
        kl[w] = float((r.exp() * (r - logp)).sum())
        loss[w] = float(-logp.gather(1, data.y[w][:, None]).sum())
    return summary(kl, loss, measurer.base_loss, data, windows=True)


def measure_gguf_file(measurer: Measurer, path: Path) -> dict[str, Any] | None:
    """KL / Δloss of llama.cpp's logits on the written GGUF (None when llama-cpp-python is not installed)."""
    from plelab.hf.llama_cpp import LlamaCpp, available

    if not available():
        return None
    T = measurer.data.x.shape[1]
    with LlamaCpp(path, n_ctx=max(64, T)) as llm:
        return _measure_logits(measurer, llm.logits)


def gguf_blocker(model: RecipeModel) -> str | None:
    """Why no GGUF of this Gemma 4 model can be written (checked before measuring), or None."""
    from plelab.hf.gguf_export import GGUFExportError, check_llama_cpp_layout, folder_special_ids

    if model.tokenizer is None:
        return f"{model.source} has no tokenizer.json, and a GGUF carries its tokenizer"
    try:
        if model.kind == "hf":
            from plelab.hf.interop import HFInteropError, gemma4_config_from_hf

            folder_special_ids(Path(model.source))  # the GGUF's token types come from them
            try:
                cfg = gemma4_config_from_hf(model.module.config.to_dict())
            except HFInteropError as exc:
                return str(exc)
        else:
            cfg = model.module.config
        check_llama_cpp_layout(cfg)
    except GGUFExportError as exc:
        return str(exc)
    return None


def run_recipe(source: str | Path, eval_path: str | Path, out_dir: str | Path, *, hf: bool = False,
               formats: list[str] | None = None, budgets: dict[str, str] | None = None, tokens: int = 2048,
               seq_len: int | None = None, batch: int = 8, overwrite: bool = False, export: bool = True,
               device: torch.device | None = None, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measure, choose, export and measure the exports; writes OUT/recipe.json and the report; returns the result."""
    from plelab.edge.export import export_inputs
    from plelab.hf.ple_export import hf_export_inputs
    from plelab.util.fs import check_output_path

    budgets = dict(budgets or {"ple": "int4/32", "gguf": "q4_0"})
    inputs = tuple(hf_export_inputs(source) if hf else export_inputs(source)) + (Path(eval_path),)
    out = check_output_path(out_dir, overwrite=True, inputs=inputs, is_dir=True)
    resume = out / "measurements.json"
    if out.is_dir() and any(p for p in out.iterdir() if p.name != resume.name) and not overwrite:
        raise RecipeError(f"output {out} already holds a recipe; pass --overwrite to replace it "
                          "(an interrupted measurement resumes without it)")
    device = device or torch.device("cpu")
    model = open_model(source, hf=hf, device=device)
    fmts, notes = default_formats(formats)
    if model.family != "gemma4":
        budgets.pop("gguf", None)
        fmts_gguf = [f for f in fmts if f.family == "gguf"]
        if fmts_gguf:
            notes.append("GGUF formats are measured but no GGUF is written: llama.cpp's Gemma 4 graph needs a Gemma 4 "
                         f"model, this is {model.family}")
    gguf_file = export and model.family == "gemma4" and "gguf" in budgets
    if gguf_file:
        reason = gguf_blocker(model)
        if reason:
            notes.append(f"no GGUF is written: {reason}")
            gguf_file = False
    check_budgets(model, fmts, budgets)
    data = held_out(eval_path, model, tokens, seq_len or min(DEFAULT_SEQ_LEN, model.context or DEFAULT_SEQ_LEN))
    out.mkdir(parents=True, exist_ok=True)
    measurer = Measurer(model, data, batch, device)
    try:
        table = measure_table(measurer, fmts, resume, progress)
        recipes: dict[str, Recipe] = {}
        for family, text in budgets.items():
            if any(f.family == family for f in fmts):
                if progress is not None:
                    progress(f"choosing the {family} recipe within {text} and measuring it")
                recipes[family] = make_recipe(measurer, table, fmts, family, text, BASELINES[family])
        files: dict[str, Any] = {}
        if export and "ple" in recipes:
            files["ple"] = export_ple(model, recipes["ple"].formats, out / EXPORT_FILES["ple"])
            files["ple"]["measured"] = measure_ple_file(measurer, out / EXPORT_FILES["ple"], files["ple"]["table_only"],
                                                        recipes["ple"].formats)
        if gguf_file and "gguf" in recipes:
            files["gguf"] = export_gguf_recipe(model, recipes["gguf"].formats, out / EXPORT_FILES["gguf"])
            measured = measure_gguf_file(measurer, out / EXPORT_FILES["gguf"])
            if measured is None:
                notes.append("the GGUF was not run: llama-cpp-python is not installed")
            files["gguf"]["measured_in_llama_cpp"] = measured
        result = {
            "source": str(source), "kind": model.kind, "family": model.family, "held_out": data.description,
            "positions": data.positions, "reference": measurer.reference,
            "group_params": {g: int(sum(math.prod(m.shape) for m in ms)) for g, ms in model.groups().items()},
            "formats": [f.name for f in fmts], "table": table,
            "recipes": {k: r.to_json() for k, r in recipes.items()}, "files": files, "notes": notes,
        }
    finally:
        measurer.close()
    from plelab.hf.recipe_report import write_recipe_report

    (out / "recipe.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    for family, name in EXPORT_FILES.items():  # an earlier export this run did not replace would pass for this one
        if family not in files:
            (out / name).unlink(missing_ok=True)
    write_recipe_report(result, out)
    return result
