#!/usr/bin/env bash
# bash benchmarks/device/check.sh   (one device call: command "bash benchmarks/device/check.sh", carry ["benchmarks/device/carry"], timeout_s 540; REHEARSE=1 OUT=DIR: the same on the CPU)
# The device check (benchmarks/gpu_check.py) under one deadline: $OUT gets check.json and runs.tar.xz after
# every phase, check.log as it goes, nvidia-smi.txt; at most 5 files (the tool returns 8).
set -o pipefail
source "$(dirname "$0")/env.sh" || exit 1
if [ -z "${REHEARSE:-}" ]; then
    nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
    args=()
else
    read -r -a data <<<"${REHEARSE_DATA:-}"
    args=(--rehearse --data "${data[@]}")
fi
"$PY" benchmarks/gpu_check.py --out "$OUT" --deadline-s "${DEADLINE_S:-480}" "${args[@]}" 2>&1 | tee "$OUT/check.log"
status=$?
"$PY" benchmarks/device/kit.py verify "$OUT" | tee -a "$OUT/check.log"
exit $status
