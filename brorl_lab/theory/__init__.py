"""theory: the mass balance of one RLVR step (THEORY.md, BroRL Sec. 2): exact, expected, Monte Carlo, and the
paper's 128k-token simulation. Pure numpy/torch math: it knows nothing of engines, training or widgets."""

from brorl_lab.theory.balance import *  # noqa: F401,F403
from brorl_lab.theory.balance import __all__  # noqa: F401
