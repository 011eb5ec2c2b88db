"""Where output goes: a Jupyter kernel (figures and tqdm widgets render), a terminal (a live bar redraws in place) or
a batch job's log file (Slurm, nohup, CI), where a bar's carriage returns become a wall of half-lines."""

from __future__ import annotations

import sys


def in_kernel() -> bool:
    """Whether this code runs in a Jupyter (ipykernel) kernel, where outputs are notebook outputs."""
    ipython = sys.modules.get("IPython")  # not imported: no kernel (and importing IPython here costs a second)
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and type(shell).__module__.startswith("ipykernel.")


def live_bars() -> bool:
    """Whether a tqdm.auto bar renders: a terminal, or a kernel (a widget; the kernel's stderr is no tty). Elsewhere
    long work prints plain lines instead."""
    return sys.stderr.isatty() or in_kernel()
