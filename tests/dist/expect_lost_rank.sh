#!/usr/bin/env bash
# Kills rank 2 of 4 mid-run and checks that every other rank exits non-zero with an error
# naming rank 2, within the timeout (no hang).
# Usage: expect_lost_rank.sh MPIRUN DRIVER [network|shared] [agreement]
# "network": the windows are MPI one-sided puts over TCP (the path across hosts), where a
# flush to the dead rank blocks inside MPI and the call watchdog must end the survivors.
# "agreement": each step starts with an allgather (the step agreement) and rank 2 dies
# before it, outside any exchange: the others' collective times out and must name it.
# --enable-recovery keeps mpirun from killing the survivors itself, so that their own
# error handling is what is tested; each rank's exit status is printed by a wrapping shell.
set -uo pipefail
mpirun=$1 driver=$2
mca=() transport=() agree=()
if [[ ${3:-} == network ]]; then
  mca=(--mca osc pt2pt --mca btl self,tcp --mca btl_tcp_if_include lo)
  transport=(--transport network)
fi
if [[ ${4:-} == agreement ]]; then agree=(--agree 1); fi
start=$(date +%s)
out=$(timeout 50 "$mpirun" --oversubscribe --bind-to none --enable-recovery "${mca[@]}" -np 4 \
  bash -c '"$0" "$@"; echo "exit status $? of rank $OMPI_COMM_WORLD_RANK"' \
  "$driver" --dtype fp32 --steps 6 --kill-rank 2 --kill-step 2 --timeout-ms 5000 \
  "${transport[@]}" "${agree[@]}" 2>&1)
rc=$?
echo "$out"
elapsed=$(( $(date +%s) - start ))
fail=0
if (( rc == 124 )); then echo "FAIL: mpirun did not finish within 50 s"; fail=1; fi
for rank in 0 1 3; do
  if ! grep -qE "^exit status [1-9][0-9]* of rank $rank\$" <<<"$out"; then
    echo "FAIL: rank $rank did not exit non-zero"; fail=1
  fi
  if ! grep -qE "rank $rank: error: .*rank 2 did not (deliver|complete)" <<<"$out"; then
    echo "FAIL: rank $rank did not name the lost rank 2"; fail=1
  fi
done
echo "lost-rank check finished in ${elapsed} s"
exit $fail
