"""Instructions per token of plelab's C runtime on emulated microcontrollers (QEMU, bare metal), per kernel.

Exports a preset (esp32-28m by default: its real shape, 32,768-row tied head, random weights; the count does not
depend on the weights' values), links it into the flash of each board's bare-metal image (plelab/edge/c/mcu/),
and runs greedy decode under QEMU with `-icount shift=0`, where every instruction advances virtual time by one
nanosecond. The image reads the board's counter around each position: on the Cortex-M boards a hardware timer on
virtual time (mps2-an500: CMSDK APB timer 0, 25 MHz; mps3-an547: the SSE-300 System Counter, 32 MHz), so ticks x
1e9 / clock = instructions; on the RISC-V boards (QEMU `virt`, rv32imafc for the ESP32-P4's cores, rv32imac for the
ESP32-C6's) the instret CSR, which counts them. `plemcu calibrate` checks both on a loop of known length.
Instruction counts do not depend on the host's load.

Runs per board: the float path (fp32 activations, float32 KV cache: the reference) built with plain C loops (and,
on the Cortex-M boards, with GCC's vector extensions), and for each integer kernel the core has (-DPLE_KERNEL=
PLE_KERNEL_PORTABLE / _DSP / _HELIUM / _RV32) the int8 path: int8 activations and an int8 KV cache, with the full
head and with the greedy head skip (whose savings depend on the weights: with random weights they are not what a
trained model gets). Reported: instructions per token (one forward pass plus the greedy argmax), per active
parameter (every dense tensor plus the whole head: what one token multiplies), calls per token of the compiler's
double-precision and 64-bit division helpers and libm's double functions (all 0 is the target on every board),
and the tokens/s that count would give at the clock of the chip the board stands for, one instruction per cycle.
That is an estimate, not a measurement: these are instruction counts, not cycles, and it leaves out flash and
PSRAM latency, caches and wait states (QEMU models none), and that the ESP32-S3's Xtensa LX7 (with its PIE SIMD)
is neither a Cortex-M7 nor a Cortex-M55, and that the P4's own SIMD extension is not used. Prints JSON with the
command that produced it.

    python3 benchmarks/bench_mcu.py                              # esp32-28m int4, every board, every kernel
    python3 benchmarks/bench_mcu.py --kernel rv32 --board virt-rv32imafc --no-fp32
    python3 benchmarks/bench_mcu.py --quick                      # tiny shape: a smoke run in seconds
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from plelab.cli import options  # noqa: E402
from plelab.errors import PlelabError  # noqa: E402

# per board: the clock of the chip its estimate stands for (MHz), and the target in instructions per active
# parameter per token on esp32-28m's core + head (issue 19 for the Cortex-M boards, issue 38 for RISC-V)
CLOCK_MHZ = {"mps2-an500": 240, "mps3-an547": 240, "virt-rv32imafc": 360, "virt-rv32imac": 160}
CLOCK_OF = {"mps2-an500": "the ESP32-S3's 240 MHz", "mps3-an547": "the ESP32-S3's 240 MHz",
            "virt-rv32imafc": "the ESP32-P4's 360 MHz", "virt-rv32imac": "the ESP32-C6's 160 MHz"}
TARGETS = {"mps2-an500": 3.0, "mps3-an547": 1.0, "virt-rv32imafc": 3.0, "virt-rv32imac": 5.0}
PUBLISHED = {"esp32_s3": {"scalar_first_version_tok_s": 9.5, "optimised_tok_s": [62, 67]},
             "esp32_p4": {"scalar_tok_s": 17.0, "simd_tok_s": 63},
             "source": "the published ESP32 runtime for the same 28.9M-parameter model (issues 19 and 38)"}
QUICK_SET = ["vocab_size=4096", "hidden_size=64", "num_layers=2", "ffn.intermediate_size=64", "ple.dim=16",
             "max_seq_len=64"]


def parse(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options."""
    from plelab.edge import mcu

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="esp32-28m", help="model preset (default esp32-28m)")
    p.add_argument("--quant", default="int4", choices=["int4", "int8", "fp16", "fp32"], help="export encoding")
    p.add_argument("--group", type=options.positive_int, default=128, help="quantisation group (default 128)")
    p.add_argument("--board", action="append", choices=list(mcu.BOARDS), help="board(s) (default: every one)")
    p.add_argument("--kernel", action="append", choices=sorted({k for b in mcu.BOARDS.values() for k in b.int_kernels}),
                   help="integer kernel(s) for the int8 path (default: every kernel the board's core runs)")
    p.add_argument("--no-fp32", action="store_true", help="skip the float reference path")
    p.add_argument("--steps", type=options.positive_int, default=8, help="positions run, prompt included (default 8)")
    p.add_argument("--ids", default="1,2,3", help="prompt token ids (default 1,2,3)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per QEMU run before it counts as hung")
    p.add_argument("--quick", action="store_true", help="tiny shape: a smoke run in seconds")
    args = p.parse_args(argv)
    args.overrides = list(QUICK_SET) if args.quick else []
    args.boards = args.board or list(mcu.BOARDS)
    args.prompt = [int(t) for t in args.ids.split(",")]
    return args


def export(preset: str, overrides: list[str], quant: str, group: int, out: Path) -> Path:
    """`plelab export PRESET` (random weights, seed 0) in this process, its summary kept off stdout."""
    from plelab.cli.main import main as plelab

    argv = ["export", preset, "--quant", quant, "--group", str(group), "--out", str(out),
            *(a for o in overrides for a in ("--set", o))]
    with contextlib.redirect_stdout(io.StringIO()):
        status = plelab(argv)
    if status:
        raise PlelabError(f"plelab {shlex.join(argv)} failed with status {status}")
    return out


def active_parameters(model: Path) -> dict[str, int]:
    """Parameters one token multiplies: every dense tensor and the whole head (rows x hidden)."""
    from plelab.edge.format import PleFile

    with PleFile(model, verify="none") as f:
        layout = f.layout
    m = layout.model
    dense = sum(t.numel for t in layout.tensors)
    head = 0 if any(t.name == "lm_head.weight" for t in layout.tensors) else m["vocab_size"] * m["hidden_size"]
    return {"dense_tensors": dense, "tied_head": head, "total": dense + head,
            "note": "gathered per token, not counted: the PLE record and the embedding row"}


# the float path's builds: plain C loops, and on Cortex-M the float SIMD paths in GCC's vector extensions (a
# RISC-V core without its vector extension has nothing to lower them to: GCC makes scalar code of them)
FLOAT_BUILDS = {"arm": ("portable", "vector"), "riscv": ("portable",)}
# name -> (plemcu options, whether it uses an integer kernel)
PATHS = {"fp32": ({}, False), "int8": ({"act": "int8", "kv": "int8"}, True),
         "int8_head_skip": ({"act": "int8", "kv": "int8", "head_skip": True}, True)}


def run_one(board: str, kernel: str | None, options: dict, model: Path, args: argparse.Namespace,
            params: int) -> dict:
    """Build and run one image; its counts, or why it could not be built."""
    from plelab.edge import mcu

    try:
        image = mcu.build_image(board, model, kernel)
    except mcu.McuError as exc:
        return {"skipped": str(exc)}
    run_args = mcu.run_args(args.ids, args.steps, verify=1, **options)
    t0 = time.perf_counter()
    r = mcu.run_image(board, image, run_args, timeout=args.timeout).result
    wall = time.perf_counter() - t0
    per_pos = [mcu.instructions(t, r["timer_hz"]) for t in r["token_ticks"]]
    ipt = statistics.mean(per_pos)
    return {
        "kernel": r["kernel"], "act": r["act"], "kv": r["kv"], "head_skip": r["head_skip"],
        "tokens": r["tokens"],
        "instructions_per_token": ipt,
        "instructions_per_active_parameter": ipt / params,
        "est_tok_s_one_instruction_per_cycle": CLOCK_MHZ[board] * 1e6 / ipt,
        "helper_calls_per_token": {k: v / r["positions"] for k, v in r["helper_calls"].items()},
        "target_instructions_per_active_parameter": TARGETS[board],
        "meets_target": ipt / params <= TARGETS[board],
        "instructions_per_position": [round(x) for x in per_pos],
        "head_rows_computed_share": r["head_rows_computed"] / r["head_rows"],
        "open_instructions": round(mcu.instructions(r["open_ticks"], r["timer_hz"])),
        "flash_reads_per_token": r["storage"]["reads_decode"] / r["positions"],
        "flash_bytes_per_token": r["storage"]["bytes_decode"] / r["positions"],
        "tiers": r["tiers"],
        "sram_region": r["sram_region"],
        "qemu_command": shlex.join(mcu.qemu_command(board, image, run_args)),
        "emulation_wall_s": round(wall, 3),
    }


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark and print its JSON."""
    args = parse(argv)
    command = "python3 " + shlex.join(["benchmarks/bench_mcu.py", *(sys.argv[1:] if argv is None else argv)])
    from plelab.edge import mcu

    missing = list(dict.fromkeys(p for b in args.boards for p in mcu.missing_tools(b)))
    if missing:
        raise PlelabError(f"needs {', '.join(missing)} (bash scripts/setup.sh --test installs them)")
    t_start = time.perf_counter()
    toolchain = {}
    for tc in dict.fromkeys(mcu.BOARDS[b].toolchain for b in args.boards):
        for tool in (tc.cc, tc.qemu):
            toolchain[tool] = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    boards: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench_mcu.") as work:
        model = export(args.preset, args.overrides, args.quant, args.group, Path(work) / "model.ple")
        params = active_parameters(model)
        for board in args.boards:
            b = mcu.BOARDS[board]
            runs = {}
            for path, (options, integer) in PATHS.items():
                if path == "fp32" and args.no_fp32:
                    continue
                arch = "arm" if b.toolchain is mcu.ARM else "riscv"
                wanted = [k for k in (args.kernel or b.int_kernels) if k in b.int_kernels]
                for kernel in wanted if integer else FLOAT_BUILDS[arch]:
                    runs[f"{path}/{kernel}"] = run_one(board, kernel, options, model, args, params["total"])
            ran = [r for r in runs.values() if "tokens" in r]
            best = min(ran, key=lambda r: r["instructions_per_token"]) if ran else None
            boards[board] = {
                "cpu": b.cpu, "stands_for": b.stands_for, "cpu_flags": list(b.cpu_flags), "timer_hz": b.timer_hz,
                "estimate_clock": CLOCK_OF[board],
                "compile_flags": list(mcu.COMPILE_FLAGS),
                "same_tokens_per_path": {p: len({tuple(r["tokens"]) for n, r in runs.items()
                                                 if n.split("/")[0] == p and "tokens" in r}) <= 1 for p in PATHS},
                "fewest_instructions": best and {k: best[k] for k in ("kernel", "act", "kv", "head_skip",
                                                                      "instructions_per_active_parameter",
                                                                      "meets_target", "helper_calls_per_token")},
                "runs": runs,
            }
        file_bytes = model.stat().st_size
    result = {
        "command": command,
        "what": "instruction counts under QEMU -icount shift=0 (1 ns of virtual time per instruction), read from "
                "the board's timer (Cortex-M) or instret (RISC-V); not cycles",
        "model": {"preset": args.preset, "overrides": args.overrides, "quant": args.quant, "group": args.group,
                  "file_bytes": file_bytes, "weights": "random (seed 0): counts do not depend on values",
                  "active_parameters": params},
        "run": {"prompt_ids": args.prompt, "positions": args.steps, "greedy": True,
                "head_skip_note": "its savings depend on the weights; these are random",
                "per_token": "one forward pass plus the argmax over the vocabulary, mean over all positions",
                "verify": "core checksums at open (the 13 MB PLE table is not hashed: open is not what is counted)",
                "device_profile": "esp32-s3 (placement as plelab place --kv-dtype fp32)"},
        "estimate": {
            "clock_mhz": CLOCK_MHZ,
            "formula": "tok/s = clock / instructions per token, at one instruction per cycle",
            "leaves_out": ["flash and PSRAM latency and bandwidth (the head is read from PSRAM every token)",
                           "caches, wait states, pipeline stalls: QEMU models none",
                           "the ESP32-S3's Xtensa LX7 (PIE SIMD) is not a Cortex-M7 or M55: other ISA, other "
                           "instruction counts",
                           "the ESP32-P4's SIMD extension (Xespv) is not used: QEMU does not emulate it"],
            "published": PUBLISHED,
        },
        "toolchain": toolchain,
        "boards": boards,
        "wall_s": time.perf_counter() - t_start,
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    try:
        main()
    except PlelabError as exc:
        print(f"bench_mcu: {exc}", file=sys.stderr)
        sys.exit(2)
