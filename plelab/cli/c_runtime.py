"""`plelab c` and `plelab mcu`: the C runtime's own tools, on this machine and on emulated microcontroller boards.

`plelab c build|fuzz|kernels|devices` builds plerun (or the fuzzer, or the integer kernels' self-check), fuzzes
the .ple parser under sanitizers, checks the integer kernel bit for bit, and regenerates devices.inc. `plelab mcu
boards|build|run|fuzz|calibrate|kernels` does the same on QEMU's boards (plelab/edge/c/mcu/README.md); `plelab run
--engine mcu` decodes text there.
"""

from __future__ import annotations

import argparse
import sys

from plelab.cli import options
from plelab.cli.common import add_command, print_json
from plelab.errors import PlelabError


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `c` and `mcu` (each once, however often this is called)."""
    for name, register in (("c", _add_c), ("mcu", _add_mcu)):
        if name not in sub.choices:
            register(sub)


def _group(sub, name: str, help: str, example: str) -> argparse._SubParsersAction:
    p = add_command(sub, name, help, example, lambda args: (p.print_help(), 1)[1])
    return p.add_subparsers(dest=f"{name}_command", metavar="SUBCOMMAND")


def _add_check_flags(p: argparse.ArgumentParser, cases: int, what: str) -> None:
    p.add_argument("--cases", type=options.positive_int, default=cases, help=f"{what} (default {cases})")
    p.add_argument("--seed", type=options.nonneg_int, default=1, help="seed of the cases (default 1)")
    p.add_argument("--json", action="store_true", help="machine-readable result")


# ---- plelab c -------------------------------------------------------------------------------------------------


def _add_c(sub) -> None:
    g = _group(sub, "c", "The C runtime on this machine: build it, fuzz its parser, check its integer kernel.",
               "plelab c build\n  plelab c fuzz --cases 100000\n  plelab c kernels --cases 4000")
    p = add_command(g, "build", "Build plerun (or plefuzz, plektest) with the system compiler, cached; print its path.",
                    "plelab c build --cflags '-O2 -DPLE_KERNEL=PLE_KERNEL_PORTABLE'", run_c_build)
    p.add_argument("--program", default="plerun", choices=["plerun", "plefuzz", "plektest", "plengram"],
                   help="plerun (the runtime, default), plefuzz (the parser fuzzer), plektest (kernel self-check), "
                        "plengram (the n-gram hash on given inputs)")
    p.add_argument("--cflags", default="-O3 -march=native",
                   help="optimisation flags (default -O3 -march=native; one flag alone as --cflags=-O2)")
    p.add_argument("--openmp", action="store_true", help="with OpenMP (plerun --threads N)")
    p.add_argument("--sanitize", action="store_true", help="with AddressSanitizer + UBSan (plefuzz always is)")
    p = add_command(g, "fuzz", "Fuzz the .ple parser: mutated files through ple_open and two decode steps, under "
                    "AddressSanitizer + UBSan. A crash, hang or sanitizer report is exit status 2.",
                    "plelab c fuzz --cases 100000 --seed 3\n  plelab c fuzz --ngram --cases 20000", run_c_fuzz)
    p.add_argument("--model", help="the .ple file to mutate (default: a tiny int4 export)")
    p.add_argument("--ngram", action="store_true",
                   help="the default seed file with an n-gram index and an id map (format version 3's fields)")
    p.add_argument("--timeout", type=options.positive_float, default=600,
                   help="seconds before the run counts as hung (default 600)")
    _add_check_flags(p, 100_000, "mutated files")
    p = add_command(g, "kernels", "Check the integer kernel this build selects against its scalar reference, bit for "
                    "bit, on random odd-sized dot products. Any difference is exit status 1.",
                    "plelab c kernels --cases 4000 --cflags '-O2 -DPLE_KERNEL=PLE_KERNEL_PORTABLE'", run_c_kernels)
    p.add_argument("--cflags", default="-O3 -march=native",
                   help="optimisation flags (default -O3 -march=native; one flag alone as --cflags=-O2)")
    _add_check_flags(p, 2000, "random dot products")
    add_command(g, "devices", "Print plelab/edge/c/devices.inc, the C runtime's built-in device profiles, from "
                "plelab/edge/devices.toml.", "plelab c devices > plelab/edge/c/devices.inc", run_c_devices)


def run_c_build(args: argparse.Namespace) -> int:
    """Print the binary's path."""
    from plelab.edge import c_engine

    print(c_engine.build(args.cflags, args.openmp, args.sanitize or args.program == "plefuzz", args.program))
    return 0


def run_c_fuzz(args: argparse.Namespace) -> int:
    """Fuzz; print the counts (exit 1 when a rejection was not one line)."""
    from plelab.edge.c_fuzz import fuzz

    return _report_fuzz(args, fuzz(args.cases, args.seed, args.model, args.timeout, args.ngram),
                        "no crash or sanitizer report")


def run_c_kernels(args: argparse.Namespace) -> int:
    """Check the kernel; print the counts (exit 1 on a mismatch)."""
    from plelab.edge import c_engine

    return _report_kernels(args, c_engine.kernel_check(args.cases, args.seed, args.cflags), "this machine")


def run_c_devices(args: argparse.Namespace) -> int:
    """Print devices.inc."""
    from plelab.edge import c_engine

    sys.stdout.write(c_engine.devices_inc())
    return 0


def _print_check(args: argparse.Namespace, result: dict, line: str) -> None:
    if args.json:
        print_json(result)
    else:
        print(line)


def _report_fuzz(args: argparse.Namespace, r: dict, no_failure: str) -> int:
    """Print a fuzz run's counts; exit 1 when a rejection was not one line."""
    _print_check(args, r, f"{r['cases']:,} mutated files: {r['accepted']:,} accepted, {r['rejected']:,} rejected, "
                 f"{r['bad_messages']} rejections not in one line, {no_failure}")
    return 1 if r["bad_messages"] else 0


def _report_kernels(args: argparse.Namespace, r: dict, where: str) -> int:
    """Print a kernel self-check's counts; exit 1 on a mismatch."""
    _print_check(args, r, f"{where}, kernel {r['kernel']}: {r['cases']:,} results, {r['mismatches']} differ from the "
                 f"scalar reference (digest {r['digest']})")
    return 1 if r["mismatches"] else 0


# ---- plelab mcu -----------------------------------------------------------------------------------------------


def _add_mcu(sub) -> None:
    g = _group(sub, "mcu", "The C runtime bare-metal on QEMU's microcontroller boards: build an image with a .ple "
               "file in its flash, run it, fuzz it, calibrate its timer, check its integer kernel.",
               "plelab mcu run model.ple --board mps3-an547 --ids 1,2,3 --steps 16\n"
               "  plelab mcu boards\n  plelab mcu fuzz --board mps2-an500 --cases 300")
    add_command(g, "boards", "List the boards, their cores, integer kernels and the Debian packages they need.",
                "plelab mcu boards --json", run_mcu_boards).add_argument(
        "--json", action="store_true", help="machine-readable list")

    p = add_command(g, "build", "Build the board's image with MODEL linked into its flash (cached); print its path.",
                    "plelab mcu build model.ple --board mps2-an500 --kernel portable", run_mcu_build)
    _add_board_flags(p, "required", kernel=True)
    p = add_command(g, "run", "Greedy decode on the board: the harness's whole result (timer ticks per position, "
                    "storage reads, SRAM / PSRAM use, traffic) as JSON.",
                    "plelab mcu run model.ple --board mps3-an547 --act int8 --kv int8 --head-skip --ids 1,2,3 "
                    "--steps 16", run_mcu_run)
    _add_board_flags(p, "required", kernel=True)
    p.add_argument("--ids", default="1", help="prompt token ids, comma separated (default 1)")
    p.add_argument("--steps", type=options.positive_int, default=8,
                   help="positions to run, prompt included (default 8)")
    p.add_argument("--verify", default="full", choices=["full", "core", "none"],
                   help="checksums checked on open: every byte (default), all but the row tables, none")
    p.add_argument("--act", default="fp32", choices=["fp32", "int8"], help="activations of the products")
    p.add_argument("--kv", default="fp32", choices=["fp32", "int8"], help="what the KV cache keeps")
    p.add_argument("--head-skip", action="store_true", help="the greedy head that skips rows (needs --act int8)")
    p.add_argument("--device", default="esp32-s3", help="device profile the model is placed by (default esp32-s3)")
    p = add_command(g, "fuzz", "Mutated copies of the flashed file through ple_open and two decode steps on the "
                    "board: each ends in a one-line message, never a fault (a fault or a message of several lines "
                    "is a non-zero exit).", "plelab mcu fuzz --board mps2-an500 --cases 300 --seed 11", run_mcu_fuzz)
    _add_board_flags(p, "optional", kernel=False)
    _add_check_flags(p, 200, "mutated files")
    p = add_command(g, "calibrate", "Check that the board's timer counts one tick per instruction at its clock "
                    "(a loop of known length under qemu -icount).", "plelab mcu calibrate --board mps3-an547",
                    run_mcu_calibrate)
    _add_board_flags(p, "none", kernel=False)
    p.add_argument("--loops", type=options.positive_int, default=1_000_000,
                   help="loop iterations, two instructions each (default 1000000)")
    p.add_argument("--json", action="store_true", help="machine-readable result")
    p = add_command(g, "kernels", "Check the board's integer kernel against its scalar reference, bit for bit, on "
                    "the board. Any difference is exit status 1.",
                    "plelab mcu kernels --board mps2-an500 --kernel dsp --cases 2000", run_mcu_kernels)
    _add_board_flags(p, "none", kernel=True)
    _add_check_flags(p, 2000, "random dot products")


def _add_board_flags(p: argparse.ArgumentParser, model: str, kernel: bool) -> None:
    """--board, --timeout, and per command MODEL ("required", "optional": a tiny export, "none") and --kernel."""
    from plelab.edge import mcu

    if model == "required":
        p.add_argument("model", help=".ple file to link into the board's flash")
    elif model == "optional":
        p.add_argument("model", nargs="?", help=".ple file to mutate (default: a tiny int4 export)")
    p.add_argument("--board", default=next(iter(mcu.BOARDS)), choices=list(mcu.BOARDS),
                   help=f"the emulated board (default {next(iter(mcu.BOARDS))}; plelab mcu boards lists them)")
    if kernel:
        p.add_argument("--kernel", help="the build switch: portable, vector or an integer kernel of the board's core "
                       "(default: the best it has)")
    p.add_argument("--timeout", type=options.positive_float, default=600,
                   help="seconds before the QEMU run counts as hung (default 600)")


def run_mcu_boards(args: argparse.Namespace) -> int:
    """List the boards."""
    from plelab.edge import mcu

    rows = [{"board": b.name, "cpu": b.cpu, "kernels": list(mcu.kernels_of(b.name)), "flash_bytes": b.flash_bytes,
             "debian_packages": list(b.toolchain.packages), "missing": mcu.missing_tools(b.name)}
            for b in mcu.BOARDS.values()]
    if args.json:
        print_json(rows)
        return 0
    for r in rows:
        state = f"missing {', '.join(r['missing'])}" if r["missing"] else "ready"
        print(f"{r['board']:<12} {r['cpu']:<22} kernels {', '.join(r['kernels']):<34} {state}")
    return 0


def run_mcu_build(args: argparse.Namespace) -> int:
    """Print the image's path."""
    from plelab.edge import mcu

    print(mcu.build_image(args.board, args.model, args.kernel))
    return 0


def run_mcu_run(args: argparse.Namespace) -> int:
    """Print the harness's JSON result."""
    from plelab.edge import mcu

    if args.head_skip and args.act != "int8":
        raise PlelabError("--head-skip needs --act int8")
    image = mcu.build_image(args.board, args.model, args.kernel)
    run_args = mcu.run_args(args.ids, args.steps, mcu.VERIFY[args.verify], args.act, args.kv, args.head_skip,
                            args.device)
    print_json(mcu.run_image(args.board, image, run_args, args.timeout).result)
    return 0


def run_mcu_fuzz(args: argparse.Namespace) -> int:
    """Fuzz on the board; exit 1 when a rejection was not one line."""
    from plelab.edge import mcu

    return _report_fuzz(args, mcu.fuzz(args.board, args.model, args.cases, args.seed, args.timeout),
                        f"no fault on {args.board}")


def run_mcu_calibrate(args: argparse.Namespace) -> int:
    """Print the loop's ticks and the instructions they stand for."""
    from plelab.edge import mcu

    r = mcu.calibrate(args.board, args.loops, args.timeout)
    _print_check(args, r, f"{args.board}: a loop of {r['loop_instructions']:,} instructions took {r['ticks']:,} "
                 f"ticks at {r['timer_hz']:,} Hz = {r['instructions']:,.0f} instructions")
    return 0


def run_mcu_kernels(args: argparse.Namespace) -> int:
    """Check the board's kernel; exit 1 on a mismatch."""
    from plelab.edge import mcu

    return _report_kernels(args, mcu.kernel_check(args.board, args.kernel, args.cases, args.seed, args.timeout),
                           args.board)
