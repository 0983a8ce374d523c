#!/usr/bin/env bash
# bash benchmarks/device/study.sh   (one device call: command "bash benchmarks/device/study.sh", carry ["benchmarks/device/carry"], timeout_s 540; REHEARSE=1 OUT=DIR: the same on the CPU)
# The GPU ladder (benchmarks/device/study.py): the arms of arms.json not yet done that fit before the deadline.
# $OUT gets arms.json, study.json and runs.tar.xz after every arm, report.md at the end, study.log as it goes.
set -o pipefail
source "$(dirname "$0")/env.sh" || exit 1
if [ -z "${REHEARSE:-}" ]; then
    if ! ls "$CARRY"/corpora/*.jsonl.xz >/dev/null 2>&1; then
        echo "error: no corpus in $CARRY/corpora: run bash benchmarks/device/prepare.sh here (CORPUS=docs_en)" | tee "$OUT/study.log"
        exit 1
    fi
    args=()
else
    read -r -a data <<<"${REHEARSE_DATA:-}"
    args=(--rehearse --max-arms "${REHEARSE_ARMS:-4}" --data "${data[@]}")
fi
"$PY" benchmarks/device/study.py --out "$OUT" --deadline-s "${DEADLINE_S:-480}" "${args[@]}" 2>&1 | tee "$OUT/study.log"
status=$?
"$PY" benchmarks/device/kit.py verify "$OUT" | tee -a "$OUT/study.log"
exit $status
