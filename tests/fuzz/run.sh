#!/bin/sh
# Run one libFuzzer target for a while:
#   run.sh FUZZER SEED_DIR WORK_DIR SECONDS [more libFuzzer flags...]
# SLUICE_FUZZ_SECONDS in the environment overrides SECONDS. New inputs go to
# WORK_DIR/corpus (the seeds in the repository are only read), crashes to
# WORK_DIR/artifacts/; SEED_DIR.dict, when present, is the dictionary.
# Reproduce a crash: FUZZER WORK_DIR/artifacts/crash-...
set -eu
fuzzer=$1 seeds=$2 work=$3 seconds=${SLUICE_FUZZ_SECONDS:-$4}
shift 4
mkdir -p "$work/corpus" "$work/artifacts"
set -- -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$work/artifacts/" "$@"
if [ -f "$seeds.dict" ]; then
  set -- -dict="$seeds.dict" "$@"
fi
echo "run.sh: $(basename "$fuzzer") for ${seconds}s, seeds $seeds, corpus $work/corpus"
exec "$fuzzer" "$@" "$work/corpus" "$seeds"
