"""rollout: what produces and scores samples. Task families (reasoning-gym, math-verify, code) and their frozen
eval sets, rewards, the code sandbox, and the engines (torch, hf, vllm, ray) behind generate / sync_weights / close.
Imports only core; knows nothing of losses or training."""
