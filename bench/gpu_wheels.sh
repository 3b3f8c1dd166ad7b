#!/usr/bin/env bash
# Wheels a lent GPU machine lacks for `python -m emulator`, its workers and `python -m bench.gpu_check`,
# downloaded into .whl/ (git-ignored) for Python 3.12 on manylinux x86_64: that machine has no package
# index, and its image already holds torch, numpy, scipy, pyarrow, msgpack, matplotlib, PyYAML, tqdm,
# opt-einsum and pytest (/work/.library/device/KINDS.md's list). Each at the version installed here,
# the one the test-suite ran against.
#
#     bash bench/gpu_wheels.sh        (in the repository's root, where pip reaches PyPI)
#
# The GPU command then starts with the line this prints last; docs/gpu.md has the whole call.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
# the packages `import emulator`, the workers and the check import that the image lacks (python -X
# importtime of a run, a sweep's reproduction, bench.gpu_check and its tests, against that list)
BINARY=(opacus pyzmq simpy omegaconf hydra-core)
SOURCE_ONLY=(antlr4-python3-runtime)  # an sdist only on PyPI: built into a wheel here (pure Python)

version() { "$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }

rm -rf .whl
mkdir -p .whl
for name in "${BINARY[@]}"; do
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "$name==$(version "$name")"
done
for name in "${SOURCE_ONLY[@]}"; do
    "$PY" -m pip wheel -q --no-deps -w .whl "$name==$(version "$name")"
done
ls -l .whl
du -ch .whl/*.whl | tail -1
echo 'python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit;'
