#!/usr/bin/env bash
# The whole test suite: Rust unit and end-to-end tests, then the Python and
# Go driver tests against the real `sluice` binary. Installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
target=${CARGO_TARGET_DIR:-$root/target}

# One build for the binaries and every test target. `cargo build --bins` alone
# would resolve features without the dev-dependencies (proptest's regex and
# the storage tests' flatbuffers turn on features of crates under Arrow and
# DataFusion), and `cargo test` would then build the whole dependency stack a
# second time: 21 of a cold run's 42 minutes of compiling.
echo "== building sluice and the tests (debug)"
cargo build --workspace --bins --tests

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

echo "== node-postgres tests"
if command -v npm >/dev/null 2>&1 && command -v node >/dev/null 2>&1; then
  (cd tests/node && npm ci --no-audit --no-fund --loglevel=error \
    && SLUICE_BIN="$target/debug/sluice" node --test --test-reporter=tap) 2>&1 | tee "$target/node-test.log"
  node_status=${PIPESTATUS[0]}
else
  echo "SKIPPED: \`node\`/\`npm\` are not on PATH" | tee "$target/node-test.log"
  node_status=0
fi

echo "== pgjdbc tests"
if command -v mvn >/dev/null 2>&1; then
  (cd tests/java && SLUICE_BIN="$target/debug/sluice" mvn -B -ntp test) 2>&1 | tee "$target/java-test.log"
  java_status=${PIPESTATUS[0]}
else
  echo "SKIPPED: \`mvn\` is not on PATH" | tee "$target/java-test.log"
  java_status=0
fi
set -e

# One closing line over all runners.
rust_passed=$(grep -Eo '[0-9]+ passed' "$target/cargo-test.log" | awk '{s+=$1} END {print s+0}' || true)
rust_failed=$(grep -Eo '[0-9]+ failed' "$target/cargo-test.log" | awk '{s+=$1} END {print s+0}' || true)
if [ "$rust_status" -ne 0 ] && [ "$rust_failed" -eq 0 ]; then
  # a test binary that failed without a "N failed" line (harness = false, a crash, a
  # build error) counts once for each target cargo names as failed
  rust_failed=$(grep -Ec '^error: test failed|^error: could not compile' "$target/cargo-test.log" || true)
  [ "$rust_failed" -gt 0 ] || rust_failed=1
fi
py_passed=$(grep -Eo '[0-9]+ passed' "$target/pytest.log" | tail -1 | awk '{print $1+0}' || true)
py_failed=$(grep -Eo '[0-9]+ failed' "$target/pytest.log" | tail -1 | awk '{print $1+0}' || true)
go_passed=$(grep -Ec '^[[:space:]]*--- PASS' "$target/go-test.log" || true)
go_failed=$(grep -Ec '^[[:space:]]*--- FAIL' "$target/go-test.log" || true)
node_passed=$(grep -Eo '^# pass [0-9]+' "$target/node-test.log" | awk '{s+=$3} END {print s+0}' || true)
node_failed=$(grep -Eo '^# fail [0-9]+' "$target/node-test.log" | awk '{s+=$3} END {print s+0}' || true)
# surefire's last "Tests run:" line is the total over all classes
java_line=$(grep -E 'Tests run: [0-9]+, Failures: [0-9]+, Errors: [0-9]+, Skipped: [0-9]+$' "$target/java-test.log" | tail -1 || true)
java_run=$(echo "$java_line" | sed -E 's/.*Tests run: ([0-9]+).*/\1/;t;s/.*/0/')
java_bad=$(echo "$java_line" | sed -E 's/.*Failures: ([0-9]+), Errors: ([0-9]+).*/\1 \2/;t;s/.*/0 0/' | awk '{print $1+$2}')
java_skipped=$(echo "$java_line" | sed -E 's/.*Skipped: ([0-9]+).*/\1/;t;s/.*/0/')
java_passed=$(( ${java_run:-0} - ${java_bad:-0} - ${java_skipped:-0} ))
passed=$((rust_passed + ${py_passed:-0} + go_passed + ${node_passed:-0} + java_passed))
failed=$((rust_failed + ${py_failed:-0} + go_failed + ${node_failed:-0} + ${java_bad:-0}))
echo
echo "Summary: $passed passed, $failed failed"
echo "  (cargo $rust_passed/$rust_failed, pytest ${py_passed:-0}/${py_failed:-0}, go $go_passed/$go_failed, node ${node_passed:-0}/${node_failed:-0}, jdbc $java_passed/${java_bad:-0} passed/failed)"
if [ "$rust_status" -ne 0 ] || [ "$py_status" -ne 0 ] || [ "$go_status" -ne 0 ] \
  || [ "$node_status" -ne 0 ] || [ "$java_status" -ne 0 ] || [ "$failed" -ne 0 ]; then
  exit 1
fi
