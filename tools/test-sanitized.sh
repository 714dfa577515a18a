#!/usr/bin/env bash
# Builds braid twice more, under AddressSanitizer with UndefinedBehaviorSanitizer
# and under ThreadSanitizer, and runs the whole test suite in each:
#
#   tools/test-sanitized.sh            # both, in build-asan/ and build-tsan/
#   tools/test-sanitized.sh asan       # one of them
#
# meson test makes ASan and UBSan stop at the first report; ThreadSanitizer
# makes a process that reported a race exit 66, which fails its test. The
# sanitized builds run several times slower, hence the longer timeouts.
set -euo pipefail
cd "$(dirname "$0")/.."

declare -A sanitize=([asan]=address,undefined [tsan]=thread)
builds=("$@")
[ ${#builds[@]} -eq 0 ] && builds=(asan tsan)

status=0
for name in "${builds[@]}"; do
  if [ -z "${sanitize[$name]:-}" ]; then
    echo "test-sanitized.sh: unknown build '$name' (asan or tsan)" >&2
    exit 2
  fi
  dir=build-$name
  [ -d "$dir" ] || meson setup "$dir" -Db_sanitize="${sanitize[$name]}" -Db_lundef=false \
    -Dbuildtype=debugoptimized -Dcuda=disabled
  ninja -C "$dir"
  # halt_on_error: a race report ends the process (and fails its test) at
  # once rather than at exit, where a test that forks may not look.
  # die_after_fork=0: the multi-process tests fork ranks from a process that
  # may still run threads of an earlier test, which ThreadSanitizer refuses
  # by default.
  TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:die_after_fork=0} \
    meson test -C "$dir" --timeout-multiplier 4 --print-errorlogs || status=1
done
exit $status
