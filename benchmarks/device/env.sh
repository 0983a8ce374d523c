# sourced by benchmarks/device/check.sh and study.sh: the Python, packages, cache and $OUT of one phase.
# On the device (REHEARSE unset): installs the carried wheels into /tmp/site and the carried corpus into a
# fresh cache. With REHEARSE=1 (CPU, tests/test_device_kit.py): the Python given as $PYTHON, as it is.
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
: "${OUT:?OUT must name the folder the results go to (the device tool sets it)}"
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 COLUMNS=200
CARRY=benchmarks/device/carry
if [ -z "${REHEARSE:-}" ]; then
    if ! ls "$CARRY"/wheels/*.whl >/dev/null 2>&1; then
        echo "error: no wheels in $CARRY/wheels: run bash benchmarks/device/prepare.sh here, and carry $CARRY"
        exit 1
    fi
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$CARRY"/wheels/*.whl || exit 1
    export PYTHONPATH="/tmp/site:$PWD"
    export TIECLI_CACHE_DIR=${TIECLI_CACHE_DIR:-/tmp/tiecli-cache}
    mkdir -p "$TIECLI_CACHE_DIR/corpora"
    cp "$CARRY"/corpora/*.jsonl.xz "$TIECLI_CACHE_DIR/corpora/" 2>/dev/null || true
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
