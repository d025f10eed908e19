#!/usr/bin/env bash
# zoo's GPU check: run once on a machine with a CUDA GPU (about 5 to 8 minutes on one H100 or H200).
#   bash scripts/gpu_check.sh              # from the repository root, with zoo's dependencies installed
# 1. scripts/gpu_check.py --device cuda: every lineage trains a few steps with trainer=gpu compile=true, KV-cache
#    generation equals recomputation in bf16, zoo's attention reaches flash attention through sdpa, and zoo.bench
#    measures model FLOP utilisation at the GPT-2 small shape;
# 2. python train.py trainer=gpu compile=true debug=fast: the command line itself;
# 3. with two GPUs or more, trainer=ddp trainer.devices=2 on a prepared corpus (data=tokens).
# It ends with a summary to paste into docs/benchmarks.md; everything is kept in gpu_check-<date>/ (GPU_CHECK_OUT).
# Extra arguments go to scripts/gpu_check.py (e.g. --steps generate,flash).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
if ! python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_check: this machine has no CUDA GPU that torch can use (torch.cuda.is_available() is False)," \
       "so there is nothing to check here." >&2
  echo "gpu_check: the same steps at toy sizes on CPU, as a dry run: python scripts/gpu_check.py --device cpu --tiny" >&2
  exit 2
fi
out="${GPU_CHECK_OUT:-gpu_check-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
failed=()

python scripts/gpu_check.py --device cuda --out "$out" "$@" || failed+=("scripts/gpu_check.py")

echo "[gpu_check] python train.py trainer=gpu compile=true debug=fast ..."
if python train.py trainer=gpu compile=true debug=fast logger=none "hydra.run.dir=$out/train_py" > "$out/train_py.log" 2>&1; then
  echo "train.py trainer=gpu compile=true debug=fast: ok ($(grep -m1 '^completed' "$out/train_py.log"))" | tee -a "$out/summary.txt"
else
  failed+=("train.py trainer=gpu"); tail -20 "$out/train_py.log"
fi

gpus=$(python -c "import torch; print(torch.cuda.device_count())")
if [ "$gpus" -ge 2 ]; then
  echo "[gpu_check] trainer=ddp trainer.devices=2 data=tokens ..."
  python -c "from zoo.data import load_default_corpus as c; open('$out/plays.txt', 'w').write(c())"
  if python -m zoo.prepare "$out/plays.txt" --out "$out/plays.tokens" --sample-by paragraph --tokenizer byte --quiet \
      > "$out/ddp.log" 2>&1 \
    && python train.py data=tokens "data.path=$out/plays.tokens" trainer=ddp trainer.devices=2 \
      trainer.precision=bf16-mixed debug=fast logger=none "hydra.run.dir=$out/ddp" >> "$out/ddp.log" 2>&1; then
    echo "train.py trainer=ddp trainer.devices=2 data=tokens: ok ($(grep -m1 '^completed' "$out/ddp.log"))" | tee -a "$out/summary.txt"
  else
    failed+=("trainer=ddp"); tail -20 "$out/ddp.log"
  fi
else
  echo "trainer=ddp: not checked ($gpus GPU)" | tee -a "$out/summary.txt"
fi

if [ ${#failed[@]} -eq 0 ]; then
  echo "gpu_check: all passed; summary in $out/summary.txt"
else
  echo "gpu_check: FAILED: ${failed[*]}; see $out/" >&2
  exit 1
fi
