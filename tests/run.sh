#!/usr/bin/env bash
# The whole test suite: Rust unit and end-to-end tests, then the Python and
# Go driver tests against the real `sluice` binary. Installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
target=${CARGO_TARGET_DIR:-$root/target}

echo "== building sluice (debug)"
cargo build --workspace --bins

echo "== installing Python test dependencies"
venv="$target/pyenv"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r tests/python/requirements.txt

echo "== cargo test"
set +e
cargo test --workspace --no-fail-fast 2>&1 | tee "$target/cargo-test.log"
rust_status=${PIPESTATUS[0]}

echo "== pytest"
SLUICE_BIN="$target/debug/sluice" "$venv/bin/python" -m pytest -q tests/python 2>&1 | tee "$target/pytest.log"
py_status=${PIPESTATUS[0]}

echo "== go test"
if command -v go >/dev/null 2>&1; then
  (cd tests/go && SLUICE_BIN="$target/debug/sluice" go test -v -count=1 ./...) 2>&1 | tee "$target/go-test.log"
  go_status=${PIPESTATUS[0]}
else
  echo "SKIPPED: \`go\` is not on PATH" | tee "$target/go-test.log"
  go_status=0
fi
set -e

# One closing line over all runners.
rust_passed=$(grep -Eo '[0-9]+ passed' "$target/cargo-test.log" | awk '{s+=$1} END {print s+0}' || true)
rust_failed=$(grep -Eo '[0-9]+ failed' "$target/cargo-test.log" | awk '{s+=$1} END {print s+0}' || true)
py_passed=$(grep -Eo '[0-9]+ passed' "$target/pytest.log" | tail -1 | awk '{print $1+0}' || true)
py_failed=$(grep -Eo '[0-9]+ failed' "$target/pytest.log" | tail -1 | awk '{print $1+0}' || true)
go_passed=$(grep -Ec '^[[:space:]]*--- PASS' "$target/go-test.log" || true)
go_failed=$(grep -Ec '^[[:space:]]*--- FAIL' "$target/go-test.log" || true)
passed=$((rust_passed + ${py_passed:-0} + go_passed))
failed=$((rust_failed + ${py_failed:-0} + go_failed))
echo
echo "Summary: $passed passed, $failed failed"
if [ "$rust_status" -ne 0 ] || [ "$py_status" -ne 0 ] || [ "$go_status" -ne 0 ] || [ "$failed" -ne 0 ]; then
  exit 1
fi
