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
sed_arm() {  # sed_arm DIR FILE EXPR: a copy of protospec/ (and data/configs) in DIR with EXPR applied to FILE, a
  # constant changed, no switch added; shows the change, and fails (2) where the expression changed nothing
  rm -rf "$1" && mkdir -p "$1/data" && cp -r protospec "$1/" && cp -r data/configs "$1/data/"
  sed -i "$3" "$1/$2"
  if cmp -s "$2" "$1/$2"; then echo "the sed expression changed nothing in $2" >&2; return 2; fi
  diff "$2" "$1/$2"
  return 0
}
