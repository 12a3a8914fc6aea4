# Sourced by the device scripts: numba-cuda needs numpy < 2.5 (the image has 2.5), so the numpy wheel
# carried in .whl/ (../shared/tools/device-wheels.sh fetches it) goes first on the path; `quiet`
# drops progress bars and known warnings from a command's output. Results go under $OUT.
# Installed once per machine: a second install while another process imports numpy breaks that import.
wheel=$(ls .whl/numpy-*.whl); version=$(basename "$wheel" | cut -d- -f2)
[ -d "/tmp/site/numpy-$version.dist-info" ] \
  || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$wheel" \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
quiet() { grep -v -e "it/s" -e "MinNewTokens" -e "sync_debug_mode" -e "FutureWarning" -e "return forward_call" \
  -e "warnings.warn" -e "_warn_once" -e "NumbaPerformanceWarning" -e "warn(errors" -e "^Writing"; }
