#!/usr/bin/env bash
# Device check at real model size (see bench/gpu_check.py): rollout samples/s and tokens/s of brorl_lab's torch
# engine for N in {16, 64, 256, 512} at 512 samples per call, and one update step's time and peak memory at N=512,
# on a random-weight model of the Qwen2-1.5B shape; and the long-response figures of bench/bench_long.py at that
# shape (every response exactly --new-tokens long; transformers generate beside the torch engine, N=512/N=16,
# matmul peak, decode MFU with a torch.profiler profile, update MFU, update memory N=512 vs N=16).
# Needs torch + transformers, never downloads anything.
#
#   bash bench/gpu_check.sh            # on a CUDA machine (under 8 minutes on one H200)
#   bash bench/gpu_check.sh --smoke    # tiny shapes on CPU, a few seconds
#   bash bench/gpu_check.sh --ns 16,512 --new-tokens 128     # any other bench/gpu_check.py option
#
# Environment: PYTHON (default: the repo's .venv, else python3), GPU_CHECK_TIMEOUT (seconds, default 470: the
# check is interrupted then and keeps the stages it finished), OUT (JSON goes to $OUT/gpu_check.json).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-}"
if [[ -z "$py" ]]; then
  if [[ -x "$repo/.venv/bin/python" ]]; then py="$repo/.venv/bin/python"; else py="$(command -v python3 || command -v python)"; fi
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1   # nothing is downloaded, ever
export TOKENIZERS_PARALLELISM=false VLLM_ENABLE_V1_MULTIPROCESSING=0
export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"  # less fragmentation at N=512
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
if [[ " $* " == *" --smoke "* ]]; then
  # CPU smoke: one thread (tiny ops thrash with more on a shared machine) and the other cores left alone
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}"
fi
cd "$repo"
"$py" -c 'import importlib.util as u, sys; sys.exit(not (u.find_spec("torch") and u.find_spec("transformers")))' \
  || { echo "gpu_check: $py has no torch and transformers (set PYTHON=...)" >&2; exit 2; }
exec timeout --signal=INT --kill-after=30 "${GPU_CHECK_TIMEOUT:-470}" "$py" "$repo/bench/gpu_check.py" "$@"
