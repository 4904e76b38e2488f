#!/usr/bin/env bash
# Everything the Triton kernels need a GPU for, in one call on a lent H100/H200 (the
# `device` tool: run(command="bash benchmarks/device.sh", timeout_s=600)):
#   1. versions: the GPU, torch, triton (the machine's own python3 and packages: the
#      project's pins do not apply there);
#   2. hopper_fit: the sm_90 compile report of every autotuning candidate under that
#      machine's triton (registers, spills, shared memory);
#   3. tests: tests/kernels/test_triton_flash.py compiled on the GPU (outputs and
#      gradients against float64 references), in parallel where pytest-xdist is there;
#   4. half_masks: the half-precision tests with float32 masks of finfo(float32).min and
#      with scores past float16's range, on CUDA (kernel_bias saturates masks there);
#   5. gpu: benchmarks/gpu.py, qkv against SDPA's flash, cuDNN and efficient kernels;
#      its JSON file is rewritten after every case.
# Each step has its own time limit (590 s together), so a slow one cannot starve the
# benchmark. Logs and gpu.json go to $OUT (the device tool's folder; else
# /tmp/qkv-device). Exit status 1 if any step failed. Without a GPU it runs too (tests in
# Triton's interpreter, the benchmark says there is nothing to measure): a dry run.
#
# Steps named as arguments run alone: `bash benchmarks/device.sh lab_parallelism` is the
# lab's parallelism experiment (`qkv lab parallelism`, docs/claims.md section 3) in one
# call of its own (at most 560 s): the chain and FLOPs, the CPU with 1 and 2 threads and
# the GPU, each timed in a fresh process; result.json and the figure go to
# $OUT/lab-parallelism. It is not among the default steps (they fill the 600 s of a call).
set -u
ONLY=" $* "
OUT=${OUT:-/tmp/qkv-device}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
status=0

wanted() {  # wanted NAME: the steps named as arguments, else every default step
    if [ "$ONLY" = "  " ]; then [ "$1" != lab_parallelism ]; else [[ "$ONLY" == *" $1 "* ]]; fi
}

step() {  # step LIMIT_S NAME COMMAND...: run it, log to $OUT/NAME.log, show the log's end
    local limit=$1 name=$2
    wanted "$name" || return 0
    shift 2
    echo "== $name (at most ${limit} s)"
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    tail -n "${TAIL_LINES:-20}" "$OUT/$name.log"
    echo "== $name: exit $rc"
    [ "$rc" -eq 0 ] || status=1
}

step 40 versions "$PY" -c "
import subprocess, torch, triton
print('torch', torch.__version__, 'triton', triton.__version__)
if torch.cuda.is_available():
    print(torch.cuda.get_device_name(), torch.cuda.get_device_capability())
    print(subprocess.run(['nvidia-smi', '-L'], capture_output=True, text=True).stdout)
else:
    print('no CUDA device: a dry run')
"
step 85 hopper_fit "$PY" benchmarks/hopper_fit.py --head-sizes 64 128 --dtypes bf16 fp32
xdist=()
if "$PY" -c "import xdist" 2>/dev/null; then xdist=(-n 8); fi
step 185 tests "$PY" -m pytest -q -x -p no:cacheprovider "${xdist[@]}" \
    tests/kernels/test_triton_flash.py -k "not fits_hopper"
device=$("$PY" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
step 30 half_masks env QKV_TEST_DEVICE="$device" "$PY" -m pytest -q -x -p no:cacheprovider \
    tests/test_functional.py -k "huge_negatives or past_its_largest"
TAIL_LINES=40 step 250 gpu "$PY" benchmarks/gpu.py "$OUT" --budget-s 200
TAIL_LINES=40 step 560 lab_parallelism "$PY" -m qkv lab parallelism --out "$OUT/lab-parallelism"
exit $status
