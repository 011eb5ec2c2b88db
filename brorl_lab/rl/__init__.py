"""rl: the learning side. Advantage estimators, losses and KL (algo), per-token logprobs (logprobs), one function per
stage of the RL step (steps), the loop with checkpoints and resets (trainer), pass@k evaluation, and the supervised
warm start of the default model. Imports core, theory and rollout; never lab or the cli."""
