#!/usr/bin/env bash
# The GPU suite: everything hostir can test on a machine with (at least) 2 GPUs, NCCL and
# real CUDA streams. From a checkout, with no install and no network:
#
#   test/gpu/run_gpu_suite.sh
#
# Python packages come from the interpreter ($PYTHON, default python3) plus, if the
# directory exists, $HOSTIR_SITE (default /tmp/site: xdsl, filecheck, lit, pytest installed
# there with `pip install --target`). Steps, each run even if an earlier one failed:
#   1. the pytest suite but the lit, docs, fuzz and package tests (which CI runs), the end-to-end
#      tests on NCCL ranks among them (HOSTIR_TEST_DEVICE=cuda; world 4 needs 4 GPUs), whose
#      GPU-only tests (CuPy kernels, CUDA streams, NCCL collectives, copy engines) run here
#      instead of skipping;
#   2. hir-run --check on every example and every reference fusion (test/gpu/hir_run_all.py),
#      several runs at once;
#   3. the tests that assert overlap in time (marked gpu_timing), one at a time.
# One step at a time, each with the machine to itself. Each may run HOSTIR_GPU_STEP_TIMEOUT_S
# seconds (default 300, 360 with 4 GPUs or more, where the tests at world 4 run too). Exit
# status 1 if any step failed. docs/hir-run.md describes the suite.
set -uo pipefail
cd "$(dirname "$0")/../.."

PYTHON="${PYTHON:-python3}"
SITE="${HOSTIR_SITE:-/tmp/site}"
# hostir installed in $SITE comes before the checkout: its package `hostir` holds the
# checkout's rooms (pyproject.toml's package-dir), where the checkout's own hostir/ folder,
# found first from the checkout's root, holds none. So pytest runs with the working
# directory off its path (`-P`, inherited by its workers) and without the root first
# (`-o pythonpath=`); the checkout still comes after $SITE for what is not installed.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -d "$SITE" ]; then
    export PYTHONPATH="$SITE:$PYTHONPATH"
    export PATH="$SITE/bin:$PATH"
fi

"$PYTHON" - <<'EOF' || exit 1
import sys

import torch
import xdsl

count = torch.cuda.device_count()
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, xdsl {xdsl.__version__}, {count} GPU(s)")
for i in range(count):
    print(f"  cuda:{i} {torch.cuda.get_device_name(i)}")
if count < 2:
    sys.exit("the GPU suite needs at least 2 GPUs")
EOF

failed=()
# Every test's ranks put a CUDA context with NCCL's buffers (0.5 to 1 GiB) on each GPU they
# use, and a worker that runs CUDA itself one more: on 4 H100 (80 GB) pytest's default of a
# worker per core (64), every rank 0 on GPU 0, ran GPU 0 out of memory. Each worker sees the
# GPUs rotated (HOSTIR_TEST_GPUS: conftest.py), so rank 0s spread over all of them: one
# worker per 8 GiB of the GPUs' memory together, at most one per core.
read -r gpus workers < <("$PYTHON" -c "import os, torch; n = torch.cuda.device_count(); print(n, max(2, min(os.cpu_count(), n * torch.cuda.get_device_properties(0).total_memory // 2**33)))")
export HOSTIR_TEST_GPUS="$gpus"
# With 4 GPUs the tests and examples at world 4 run too: on 4 H200 the pytest step alone took
# 276 s; on 2 GPUs it takes 3 minutes.
STEP_TIMEOUT_S="${HOSTIR_GPU_STEP_TIMEOUT_S:-$([ "$gpus" -ge 4 ] && echo 360 || echo 300)}"
# Each step is bounded: one that runs past STEP_TIMEOUT_S gets SIGINT, on which pytest
# still prints its failures so far (a kill from outside would lose them), then SIGKILL 30 s
# later. A step's output is printed whole when it ends, with its time.
step() {
    local name="$1" log="$2"
    shift 2
    local began=$SECONDS
    if timeout -s INT -k 30 "$STEP_TIMEOUT_S" "$@" >"$log" 2>&1; then
        echo "passed" >"$log.status"
    else
        echo "FAILED" >"$log.status"
    fi
    echo "$((SECONDS - began))" >"$log.seconds"
}
report() {
    local name="$1" log="$2"
    echo
    echo "=== $name"
    cat "$log"
    if [ -s "$log.jsonl" ] && [ "$(cat "$log.status")" != passed ]; then
        echo "--- failures, as pytest-reportlog kept them when each test ended"
        "$PYTHON" - "$log.jsonl" <<'EOF_FAILURES'
import json
import sys

for line in open(sys.argv[1]):
    report = json.loads(line)
    if report.get("$report_type") == "TestReport" and report["outcome"] == "failed":
        crash = (report.get("longrepr") or {}).get("reprcrash") or {}
        print(f"FAILED {report['nodeid']} ({report['when']}): {crash.get('message', '')[:2000]}")
EOF_FAILURES
    fi
    echo "=== $name: $(cat "$log.status") in $(cat "$log.seconds") s"
    if [ "$(cat "$log.status")" != passed ]; then
        failed+=("$name")
    fi
}
logs=$(mktemp -d)
began=$SECONDS

# test_lit.py runs lit and the installed console scripts, which need hostir installed in
# an environment (as CI does, `pip install -e .`), not run from a checkout: CI runs it.
# test_docs.py (the docs' examples, those that need a GPU marked no-ci) and test_fuzz.py
# (the parsers and passes under Hypothesis) need no GPU: CI runs them too. The examples'
# runs come after pytest's, not beside them: both mostly start processes, CUDA contexts
# and NCCL communicators, and on 4 H200 together they took 450 s where pytest alone took
# 276 s, with six tests failed that pass alone.
echo "pytest workers: $workers"
# pytest prints its failures at the end of the session, after its workers have exited: a
# step cut at its limit before then loses them all. pytest-reportlog (the `test` extra)
# writes each test's report as it ends; `report` prints the failures from it.
reportlog=()
if "$PYTHON" -c "import pytest_reportlog" 2>/dev/null; then
    reportlog=(--report-log "$logs/pytest.jsonl")
fi
# test_package.py checks the checkout's installs (editable, non-editable, none), which CI
# makes; here hostir is installed in $SITE.
step "pytest suite on GPUs (end-to-end tests on NCCL included)" "$logs/pytest" \
    env HOSTIR_TEST_DEVICE=cuda "$PYTHON" -P -m pytest -o pythonpath= -q -rfEs -n "$workers" -m "not gpu_timing" --durations=25 "${reportlog[@]}" test/py \
    --ignore=test/py/test_lit.py --ignore=test/py/test_docs.py --ignore=test/py/test_fuzz.py \
    --ignore=test/py/test_package.py
report "pytest suite on GPUs (end-to-end tests on NCCL included)" "$logs/pytest"
step "hir-run --check on every example" "$logs/examples" \
    "$PYTHON" test/gpu/hir_run_all.py --jobs "$(( workers / 4 > 1 ? workers / 4 : 1 ))"
report "hir-run --check on every example" "$logs/examples"
# Tests that assert GPU work overlaps in time, one at a time: beside other tests' processes
# on the same GPUs, their kernels interleave with others' and the overlap may not show.
step "GPU timing tests, alone" "$logs/timing" \
    "$PYTHON" -P -m pytest -o pythonpath= -q -rs -n 0 -m gpu_timing test/py/test_copy_engine.py test/py/test_trace.py
report "GPU timing tests, alone" "$logs/timing"

echo
if [ ${#failed[@]} -eq 0 ]; then
    echo "GPU suite: all steps passed in $((SECONDS - began)) s"
else
    printf 'GPU suite: FAILED: %s\n' "${failed[@]}"
    exit 1
fi
