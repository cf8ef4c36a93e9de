#!/usr/bin/env bash
# make dist-check: what a user gets from `pip install pitstop` works, away from this checkout.
#   1. `python -m build` makes the sdist and the wheel (the wheel with the C event loop compiled).
#   2. The wheel goes into a fresh venv with torch and transformers (the demo trains a tiny Llama), and
#      `pitstop doctor --demo` runs there, from a folder outside the checkout.
#   3. The sdist is built again into a wheel by pip in a fresh venv (its own build isolation), installed, and
#      must hold exactly the files of the first wheel: a file the sdist forgot (the C source, the .pth, package
#      data) fails here. Its C event loop must import and the CLI must run.
# Usage: tools/dist_check.sh PYTHON TORCH [TORCH_INDEX]   (the Makefile passes its own)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
TORCH=${2:-torch==2.13.0}
TORCH_INDEX=${3:-}
WORK=build/dist-check
rm -rf "$WORK" && mkdir -p "$WORK/run"
pip_in() { "$1/bin/pip" install --quiet --disable-pip-version-check "${@:2}"; }

"$PY" -m build --outdir "$WORK/dist" . >"$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log"; exit 1; }
WHEEL=$(ls "$WORK"/dist/*.whl)
SDIST=$(ls "$WORK"/dist/*.tar.gz)
tar -tzf "$SDIST" >"$WORK/sdist-files.txt"
grep -q '/src/pitstop/trace/_eventloop.c$' "$WORK/sdist-files.txt" || { echo "sdist lacks _eventloop.c"; exit 1; }

# the same transformers as the dev venv, so the check does not wait on a resolver
TRANSFORMERS=$("$PY" -c 'import transformers; print(transformers.__version__)')
"$PY" -m venv "$WORK/wheel-venv"
pip_in "$WORK/wheel-venv" "$TORCH" ${TORCH_INDEX:+--index-url "$TORCH_INDEX" --extra-index-url https://pypi.org/simple}
pip_in "$WORK/wheel-venv" "transformers==$TRANSFORMERS" "$WHEEL"

"$PY" -m venv "$WORK/sdist-venv"
"$WORK/sdist-venv/bin/pip" wheel --quiet --disable-pip-version-check --no-deps -w "$WORK/from-sdist" "$SDIST"
pip_in "$WORK/sdist-venv" "$WORK"/from-sdist/*.whl

files() { "$PY" -c 'import sys, zipfile; print("\n".join(sorted(n for n in zipfile.ZipFile(sys.argv[1]).namelist() if ".dist-info/RECORD" not in n)))' "$1"; }
diff <(files "$WHEEL") <(files "$WORK"/from-sdist/*.whl) || { echo "the wheel built from the sdist differs (above)"; exit 1; }

cd "$WORK/run"   # away from src/: only the installed package can be imported
for venv in wheel-venv sdist-venv; do
    ../$venv/bin/python -c 'import pitstop, pitstop.trace._eventloop as c; assert "site-packages" in pitstop.__file__, pitstop.__file__; print("'$venv'", pitstop.__version__, "C loop", c.__name__)'
    ../$venv/bin/pitstop causes >/dev/null
done
../wheel-venv/bin/pitstop doctor --demo --no-history
echo "dist-check: $(basename "$SDIST") and $(basename "$WHEEL") install and run"
