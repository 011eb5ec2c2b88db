"""Where output goes: a Jupyter kernel (figures and tqdm widgets render), a terminal (a live bar redraws in place) or
a batch job's log file (Slurm, nohup, CI), where a bar's carriage returns become a wall of half-lines."""

from __future__ import annotations

import sys


def in_kernel() -> bool:
    """Whether this code runs in a Jupyter (ipykernel) kernel, where outputs are notebook outputs."""
    ipython = sys.modules.get("IPython")  # not imported: no kernel (and importing IPython here costs a second)
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and type(shell).__module__.startswith("ipykernel.")


#: When set to 1 (by the CLI's papermill commands, for the kernels they start), long work prints plain lines even
#: in a kernel: papermill streams those to the console, where a widget would show nothing.
PLAIN_PROGRESS_ENV = "BRORL_PLAIN_PROGRESS"


def live_bars() -> bool:
    """Whether a tqdm.auto bar renders: a terminal, or a kernel (a widget; the kernel's stderr is no tty). Elsewhere
    (a batch job's log, a kernel whose output papermill streams to a console) long work prints plain lines."""
    import os

    if os.environ.get(PLAIN_PROGRESS_ENV) == "1":
        return False
    return sys.stderr.isatty() or in_kernel()


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or SIGTERM (how Slurm and Kubernetes stop a job) ending a command: ``signum`` says which, and
    the CLI exits ``128 + signum`` (130, 143) with one line, as a shell reports a signal."""

    def __init__(self, signum: int = 2):
        super().__init__(signum)
        self.signum = signum


def raise_on_sigterm():
    """Make SIGTERM raise :class:`Interrupted` (as SIGINT raises KeyboardInterrupt) in the main thread, so that a
    terminated command unwinds: status says interrupted, locks are released, the exit status is 143. Returns the
    handler it replaced (to put back when the command is done), or None outside the main thread."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise Interrupted(signum)

    return signal.signal(signal.SIGTERM, handler)
