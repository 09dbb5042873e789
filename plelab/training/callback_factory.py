"""The callbacks a training config asks for, built in one place for the CLI, sweeps and Python users alike.

Each callback registers itself (plelab.training.callbacks.register_callback) in the module that defines it; the
modules below hold the built-in ones and are imported here so that every run sees them. Their order here is
the order of the callbacks in a run, whatever order they were imported in: speed and progress first (a step's
speed figures exist before anything logs them), evaluation before the checkpoint of the same step, then the
loggers, the PLE monitor and the FFN callbacks.
"""

from __future__ import annotations

from collections.abc import Callable

from plelab.training import ffn_callbacks, loggers, ple_monitor, standard_callbacks
from plelab.training.callbacks import Callback, registered_callbacks

BUILT_IN_MODULES = (standard_callbacks, loggers, ple_monitor, ffn_callbacks)
"""Imported for their registrations (in this order)."""


def callbacks_for(cfg: object, note: Callable[[str], None] = print) -> list[Callback]:
    """Every registered callback `cfg` asks for: the built-in modules' in the order above (each module's in its
    registration order), then any other module's in registration order.

    `note` receives one line per requested callback that cannot be used (e.g. a logger that is not installed).
    """
    order = [m.__name__ for m in BUILT_IN_MODULES]
    builders = sorted(registered_callbacks().values(),  # sorted() is stable: registration order within a module
                      key=lambda b: order.index(b.__module__) if b.__module__ in order else len(order))
    built = (build(cfg, note) for build in builders)
    return [cb for cb in built if cb is not None]
