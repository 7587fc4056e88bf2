#!/usr/bin/env bash
# The generic recipe on MNIST under the five held-out partition keys (the suite `keys` of benchmarks/suites.toml:
# each a different 10 % hold-out that no setting was chosen on), every key its own process side by side.
#   run(command="bash benchmarks/device_keys.sh", carry=[".whl"], timeout_s=...)
# LIMIT_S and OUT may be set (see benchmarks/device_runs.sh); another recipe: a suite of its own in suites.toml.
set -u
cd "$(dirname "$0")/.."
export SUITE=keys LIMIT_S=${LIMIT_S:-240} OUT=${OUT:-/tmp/keys-out}
exec bash benchmarks/device_runs.sh
