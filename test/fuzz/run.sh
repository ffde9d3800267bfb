#!/bin/sh
# run.sh TARGET SEED_DIR WORK_DIR SECONDS: run one libFuzzer target for SECONDS
# over the committed seeds (SEED_DIR, read only) and what earlier runs found
# (WORK_DIR/corpus, where new inputs go). A crash, leak, sanitizer report,
# timeout or failed invariant fails the run; the input is printed (hex) and
# kept in WORK_DIR/crashes/ to be added to SEED_DIR as a regression input.
set -u
target=$1 seeds=$2 work=$3 secs=$4
mkdir -p "$work/corpus" "$work/crashes"
rm -f "$work/crashes/"*
log="$work/last.log"
rc=0
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 \
	"$target" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
	-print_final_stats=1 -artifact_prefix="$work/crashes/" "$work/corpus" "$seeds" \
	>"$log" 2>&1 || rc=$?
# the progress lines are many; the rest (the summary, any report) is shown
grep -v '^#[0-9]*[[:space:]]*\(NEW\|REDUCE\|pulse\|RELOAD\)' "$log" | tail -n 80
status=$rc
for f in "$work/crashes/"*; do
	[ -e "$f" ] || continue
	status=1
	echo "fuzz: $(basename "$target") failed on $f ($(wc -c <"$f") bytes):"
	od -A d -t x1z -v "$f" | head -n 64
	echo "add it to $seeds/ (as a regression input) once fixed"
done
# the count tools/test_summary.py reads: one result per target
if [ "$status" -eq 0 ]; then
	echo "fuzz: $(basename "$target"): $secs s over $(ls "$seeds" | wc -l) seeds, no crash"
	echo "1 passed, 0 failed"
else
	echo "fuzz: $(basename "$target") FAILED (exit status $rc)"
	echo "0 passed, 1 failed"
fi
exit $status
