"""One interface for the engines that run a .ple file: the NumPy reference, the C runtime on this machine, and the
C runtime on an emulated microcontroller board.

`plelab run --engine NAME` builds one with `get_engine`, asks it what it lacks (`missing`: the Debian package, the
compiler) and whether it can serve the request (`check`), then iterates `generate` and reads `report`. An engine
never prints; the request holds ids already checked against the model's vocabulary and context.

    engine = get_engine("mcu", board="mps3-an547")
    engine.check(request)            # EngineError in one line: what is missing or unsupported
    ids = list(engine.generate(request))
    engine.report()                  # tokens/s or instructions per token, traffic per tier per token, memory
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plelab.errors import PlelabError
from plelab.inference.sampling import Sampling

ENGINES = ("numpy", "c", "mcu")
VERIFY = ("full", "core", "none")  # checksums checked on open: every byte, all but the row tables, none


class EngineError(PlelabError):
    """An engine cannot run here (a tool is missing) or cannot serve this request."""


@dataclass(frozen=True)
class Request:
    """One generation: prompt ids (in range, fitted to the context) and how to decode them."""

    model: Path
    prompt: list[int]
    max_new_tokens: int
    sampling: Sampling = field(default_factory=Sampling)
    stop_id: int | None = None
    """A token id that ends the generation (kept as its last id), e.g. the tokenizer's end of text."""
    act: str = "fp32"
    """Activations into int8 / int4 weights: fp32, or int8 codes with one scale per vector."""
    kv_dtype: str = "fp32"
    head_skip: bool = False
    """Greedy head that computes only the rows that can still win (C runtimes, int8 activations)."""
    verify: str = "full"
    device: str | None = None
    """A device profile: traffic is counted per tier of its plan (default: the host's file and RAM)."""
    devices_file: str | None = None
    placement: dict[str, str] | None = None
    """The plan's placement of every item on `device` (the NumPy engine counts traffic by it)."""

    @property
    def positions(self) -> int:
        """Positions the model runs: the prompt and every generated token but the last."""
        return len(self.prompt) + self.max_new_tokens - 1


class Engine(ABC):
    """What `plelab run` needs of an engine."""

    name: str

    def missing(self) -> str | None:
        """What this machine lacks to run the engine (one line naming the package), or None when it has it."""
        return None

    def check(self, request: Request) -> None:
        """EngineError when the engine lacks a tool or cannot serve `request` (before any work is done)."""
        lacking = self.missing()
        if lacking:
            raise EngineError(lacking)
        if request.verify not in VERIFY:
            raise EngineError(f"verify must be one of {VERIFY}, got {request.verify!r}")
        if request.head_skip and (request.act != "int8" or request.sampling.temperature > 0):
            raise EngineError("--head-skip needs --act int8 and greedy decoding (--temperature 0)")

    @abstractmethod
    def generate(self, request: Request) -> Iterator[int]:
        """Yield the generated ids (up to max_new_tokens; the stop id, when generated, is the last)."""

    @abstractmethod
    def report(self) -> dict[str, Any]:
        """After `generate` is exhausted: speed, traffic per tier per token, memory, engine specifics."""


def _until_stop(ids: list[int], stop_id: int | None) -> list[int]:
    """ids up to and including the first stop id (engines that decode past it, in one call)."""
    return ids[: ids.index(stop_id) + 1] if stop_id is not None and stop_id in ids else ids


class NumpyEngine(Engine):
    """The NumPy runtime (plelab.edge.runtime): the reference; streams ids as it decodes them."""

    name = "numpy"

    def check(self, request: Request) -> None:
        """No compiler needed; no head skip (it exists in the C runtimes only)."""
        if request.head_skip:
            raise EngineError("--head-skip needs --engine c or mcu (the NumPy engine computes every head row), "
                              "--act int8 and greedy decoding (--temperature 0)")
        super().check(request)

    def generate(self, request: Request) -> Iterator[int]:
        """Open the file and decode, one id at a time."""
        from plelab.edge.runtime import EdgeModel

        self._model = EdgeModel(request.model, request.verify, request.placement, kv_dtype=request.kv_dtype,
                                act=request.act)
        self._device, self._prompt = request.device, len(request.prompt)
        try:
            yield from self._model.generate(request.prompt, request.max_new_tokens, request.sampling,
                                            request.stop_id)
        finally:
            self._model.close()

    def report(self) -> dict[str, Any]:
        """Prefill and decode tokens/s as timed, traffic as counted."""
        model, tm = self._model, self._model.timing
        return {
            "prefill_tokens_per_s": self._prompt / tm["prefill_s"] if tm["prefill_s"] else None,
            "tokens_per_s": tm["decoded"] / tm["decode_s"] if tm["decode_s"] else None,
            "tokens_counted": model.traffic.tokens,
            **model.traffic.per_token(),
            "tiers": "device plan: " + self._device if self._device else
            "host: file = mmap'd rows, ram = float32 copies",
            "resident_bytes": model.resident_bytes,
        }


class CEngine(Engine):
    """The C runtime (plelab/edge/c) built with this machine's compiler on first use and cached."""

    name = "c"

    def missing(self) -> str | None:
        """The C compiler, when there is none."""
        from plelab.edge import c_engine

        try:
            c_engine.compiler()
        except c_engine.CEngineError as exc:
            return str(exc)
        return None

    def generate(self, request: Request) -> Iterator[int]:
        """Run plerun once over every position; yield its ids."""
        from plelab.edge import c_engine

        s = request.sampling
        self._device = request.device
        self._r = c_engine.run(request.model, request.prompt, request.positions, s.temperature, s.top_k, s.seed,
                               top_p=s.top_p, verify=request.verify, device=request.device,
                               devices_file=request.devices_file, act=request.act, kv_dtype=request.kv_dtype,
                               extra=["--head-skip"] if request.head_skip else None)
        yield from _until_stop(self._r["tokens"][len(request.prompt):], request.stop_id)

    def report(self) -> dict[str, Any]:
        """plerun's own tok/s, traffic and arena."""
        r = self._r
        return {
            "prefill_tokens_per_s": None,
            "tokens_per_s": r["tok_per_s"] or None,
            "tokens_counted": r["positions"],
            "bytes_per_token": {k: v["bytes_per_token"] for k, v in r["traffic"].items()},
            "reads_per_token": {k: v["reads_per_token"] for k, v in r["traffic"].items()},
            "tiers": "device plan: " + self._device if self._device else
            "host: file = pread rows, ram = weights as stored",
            "resident_bytes": r["arena_bytes"],
            "head_rows_computed_share": r["head_rows_computed"] / r["head_rows"] if r["head_rows"] else None,
        }


class McuEngine(Engine):
    """The C runtime bare-metal on an emulated board (plelab.edge.mcu): the file linked into its flash, greedy."""

    name = "mcu"

    def __init__(self, board: str | None = None, kernel: str | None = None, timeout: float = 600):
        """`board` one of plelab.edge.mcu.BOARDS (default: the first); `kernel` the build switch (default: best)."""
        from plelab.edge import mcu

        self.board = mcu.get_board(board or next(iter(mcu.BOARDS))).name
        self.kernel = mcu.check_kernel(self.board, kernel)
        self.timeout = mcu.check_timeout(timeout)

    def missing(self) -> str | None:
        """The Debian packages the board's toolchain and emulator come in, when any is missing."""
        from plelab.edge import mcu

        lacking = mcu.missing_tools(self.board)
        return mcu.missing_message(self.board, lacking) if lacking else None

    def check(self, request: Request) -> None:
        """Greedy only, built-in device profiles only, the board's step and command-line limits."""
        from plelab.edge import mcu

        if request.sampling.temperature > 0:
            raise EngineError("the mcu engine decodes greedily: pass --temperature 0 (or leave it out)")
        if request.devices_file:
            raise EngineError("the mcu engine knows the built-in device profiles only (no --devices)")
        super().check(request)
        mcu.check_run(request.model, self.board, request.prompt, request.positions)

    def generate(self, request: Request) -> Iterator[int]:
        """Build the image (cached), run every position under QEMU, yield its ids."""
        from plelab.edge import mcu

        self._r = mcu.run_model(self.board, request.model, request.prompt, request.positions, self.kernel,
                                self.timeout, verify=mcu.VERIFY[request.verify], act=request.act,
                                kv=request.kv_dtype, head_skip=request.head_skip,
                                device=request.device or mcu.DEFAULT_DEVICE)
        yield from _until_stop(self._r["tokens"][len(request.prompt):], request.stop_id)

    def report(self) -> dict[str, Any]:
        """Instructions per token (not cycles), the flash and RAM traffic per token, the board's arena."""
        from plelab.edge import mcu

        r = self._r
        per_token = [mcu.instructions(t, r["timer_hz"]) for t in r["token_ticks"]]
        n = max(r["traffic_tokens"], 1)
        return {
            "prefill_tokens_per_s": None,
            "tokens_per_s": None,
            "tokens_counted": r["traffic_tokens"],
            "bytes_per_token": {k: v["bytes"] / n for k, v in r["traffic"].items()},
            "reads_per_token": {k: v["reads"] / n for k, v in r["traffic"].items()},
            "tiers": f"device plan: {r['device']} ({r['board']}'s SRAM and PSRAM regions, the file in its flash)",
            "resident_bytes": r["arena_bytes"],
            "head_rows_computed_share": r["head_rows_computed"] / r["head_rows"] if r["head_rows"] else None,
            "board": r["board"],
            "kernel": r["kernel"],
            "instructions_per_token": sum(per_token) / len(per_token),
            "instructions_note": "instructions counted under QEMU -icount (one per nanosecond of virtual time), "
                                 "not cycles: no caches, wait states or memory latency",
        }


def get_engine(name: str, board: str | None = None, kernel: str | None = None) -> Engine:
    """The engine called `name`; `board` and `kernel` are the mcu engine's (refused for the others)."""
    if name not in ENGINES:
        raise EngineError(f"unknown engine {name!r}; known: {', '.join(ENGINES)}")
    if name != "mcu" and (board or kernel):
        raise EngineError(f"--board and --kernel choose the emulated board of --engine mcu, not of --engine {name}")
    if name == "numpy":
        return NumpyEngine()
    if name == "c":
        return CEngine()
    return McuEngine(board, kernel)
