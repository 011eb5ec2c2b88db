"""brorl_lab benchmarks: every figure is a ratio against its peer, measured side by side in the same run.

    python -m brorl_lab bench [--only rollout hw step memory theory] [--smoke] [--json runs/bench/bench.json]
    python -m bench.run_all ...            (the same, plus --threads)

Benchmarks are not timed tests: the test suite runs each figure at ``--smoke`` size so it cannot rot, and never
asserts a speed.
"""
