#!/usr/bin/env bash
# Fault test: one client of an mpirun job is killed with SIGKILL mid-run. The job must end (non-
# zero) within 10 s, and no /dev/shm/tessera-* segment of this job may be left behind.
# Usage: client_killed.sh MPIRUN HELPER
set -u
mpirun=$1
helper=$2
before=$(ls /dev/shm 2>/dev/null | grep '^tessera-' | sort)
start=$(date +%s%N)
timeout 20 "$mpirun" --oversubscribe -np 2 "$helper" >/dev/null 2>&1
status=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
sleep 0.5  # the launcher's cleanup of the killed client's peers
after=$(ls /dev/shm 2>/dev/null | grep '^tessera-' | sort)
leaked=$(comm -13 <(echo "$before") <(echo "$after") | grep . || true)
echo "exit status $status after ${elapsed_ms} ms; leaked segments: ${leaked:-none}"
if [[ $status -eq 0 || $status -eq 124 ]]; then echo "FAIL: the job did not end with an error in time"; exit 1; fi
if (( elapsed_ms > 10000 )); then echo "FAIL: took longer than 10 s"; exit 1; fi
if [[ -n "$leaked" ]]; then echo "FAIL: shared memory left behind"; exit 1; fi
echo "OK"
