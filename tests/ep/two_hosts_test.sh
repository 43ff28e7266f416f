#!/usr/bin/env bash
# Expert parallelism across two hosts: each host a network namespace with its own network
# stack, joined by a veth pair, and mpirun launching from a hostfile through an rsh agent that
# enters the namespace (in place of ssh). Open MPI sees two nodes, so the ranks reach each
# other only over TCP and the windows are MPI one-sided puts, as across real machines.
#
#   two_hosts_test.sh PEERSERVE DIST_EP_MPI_DRIVER MODEL_DIR SCRATCH_DIR
#
# Checks, with mpirun's default transport choice (no --mca options):
# - the exchange driver's fp32 dispatch is bitwise equal to the local backend on both hosts;
# - `score --ep 2 --ep-dispatch-dtype fp32` writes the same logits, bit for bit, as one process;
# - `generate --ep 2` (int8 dispatch) gives the same greedy tokens as one process;
# - a host cut off mid-run (its link down): rank 0 reports the lost peer within --ep-timeout-ms
#   and exits non-zero, rank 1 exits non-zero too, and mpirun ends (no hang).
# Needs root (network namespaces); exits 77 (skipped) where namespaces cannot be made.
set -uo pipefail
peerserve=$1 driver=$2 model=$3 scratch=$4
mkdir -p "$scratch"
tag=$$
ns_a=ps${tag}a ns_b=ps${tag}b
ip_a=10.77.0.1 ip_b=10.77.0.2

cleanup() {
  for ns in "$ns_a" "$ns_b"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
}
trap cleanup EXIT

if ! ip netns add "$ns_a" 2>/dev/null; then
  echo "SKIP: cannot create a network namespace here (needs root and iproute2)"
  exit 77
fi
ip netns add "$ns_b" &&
  ip link add "v${tag}a" type veth peer name "v${tag}b" &&
  ip link set "v${tag}a" netns "$ns_a" && ip link set "v${tag}b" netns "$ns_b" &&
  ip -n "$ns_a" addr add "$ip_a/24" dev "v${tag}a" && ip -n "$ns_b" addr add "$ip_b/24" dev "v${tag}b" &&
  ip -n "$ns_a" link set lo up && ip -n "$ns_b" link set lo up &&
  ip -n "$ns_a" link set "v${tag}a" up && ip -n "$ns_b" link set "v${tag}b" up ||
  { echo "FAIL: could not set up the two hosts"; exit 1; }

# The rsh agent: mpirun calls it as `agent HOST COMMAND...`, as it would call ssh.
agent=$scratch/netns_agent.sh
cat >"$agent" <<EOF
#!/bin/sh
host=\$1; shift
case \$host in
  $ip_a) ns=$ns_a ;;
  $ip_b) ns=$ns_b ;;
  *) echo "netns agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec \$ns sh -c "\$*"
EOF
chmod +x "$agent"
printf '%s slots=1\n%s slots=1\n' "$ip_a" "$ip_b" >"$scratch/hosts"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Started on host a; --mca plm_rsh_agent replaces ssh, nothing else is chosen for MPI.
two_hosts=(ip netns exec "$ns_a" mpirun --hostfile "$scratch/hosts" -np 2
  --mca plm_rsh_agent "$agent")
fail=0
check() {  # check NAME CONDITION_STATUS DETAIL
  if (($2 == 0)); then echo "PASS $1"; else echo "FAIL $1: $3"; fail=1; fi
}

# 1. The exchange itself, fp32 dispatch against the local backend.
out=$(timeout 120 "${two_hosts[@]}" "$driver" --dtype fp32 --steps 6 2>&1)
rc=$?
exact=$(grep -c ", 0 elements differ bitwise" <<<"$out")
check "driver fp32 across two hosts" $((rc != 0 || exact != 2)) "exit $rc, $exact of 2 ranks exact: $out"

# 2. score: logits bit for bit those of one process.
prompt=1,17,42,99,3,250,7,8,19,200,33
timeout 120 "$peerserve" score --model "$model" --prompt-ids "$prompt" --threads 1 \
  --out "$scratch/one.json" >/dev/null 2>"$scratch/one.err" ||
  { echo "FAIL: one process score: $(cat "$scratch/one.err")"; exit 1; }
err=$(timeout 120 "${two_hosts[@]}" "$peerserve" score --model "$model" --prompt-ids "$prompt" \
  --threads 1 --ep 2 --ep-dispatch-dtype fp32 --out "$scratch/two.json" 2>&1 >/dev/null)
rc=$?
check "score fp32 across two hosts equals one process" \
  $((rc != 0)) "exit $rc: ${err: -3000}"
if ((rc == 0)); then
  cmp -s "$scratch/one.json" "$scratch/two.json"
  check "score logits bitwise equal" $? "the logits differ"
  grep -q "exchange tokens through MPI one-sided puts" <<<"$err"
  check "the ranks use puts, not shared memory" $? "$err"
fi

# 3. generate: greedy tokens with int8 dispatch equal one process.
gen=(generate --model "$model" --prompt-ids "$prompt" --max-tokens 16 --ignore-eos --threads 1)
one=$(timeout 120 "$peerserve" "${gen[@]}" 2>/dev/null)
two=$(timeout 120 "${two_hosts[@]}" "$peerserve" "${gen[@]}" --ep 2 2>"$scratch/gen.err")
rc=$?
check "generate int8 across two hosts equals one process" \
  $((rc != 0 || ${#one} == 0)) "exit $rc: $(tail -c 3000 "$scratch/gen.err")"
if ((rc == 0)); then
  [[ "$one" == "$two" ]]
  check "greedy tokens equal" $? "one process: $one / two hosts: $two"
fi

# 4. Host b cut off mid-run. Each rank's stderr and exit status go to files (the hosts share
# the file system, and rank 1's output cannot cross the cut link). The OOB keepalive makes
# mpirun notice the unreachable daemon in seconds (Open MPI's default is 300 s + 9 x 20 s).
rm -f "$scratch"/rank*.err "$scratch"/rank*.rc
start=$(date +%s)
timeout 90 "${two_hosts[@]}" --mca oob_tcp_keepalive_time 2 --mca oob_tcp_keepalive_intvl 1 \
  --mca oob_tcp_keepalive_probes 3 \
  bash -c '"$0" "$@" 2>"'"$scratch"'/rank$OMPI_COMM_WORLD_RANK.err"; echo $? >"'"$scratch"'/rank$OMPI_COMM_WORLD_RANK.rc"' \
  "$peerserve" generate --model "$model" --prompt-ids "$prompt" --max-tokens 1000000 \
  --ignore-eos --threads 1 --ep 2 --ep-timeout-ms 3000 >/dev/null 2>"$scratch/mpirun.err" &
job=$!
for _ in $(seq 1 600); do  # until the ranks are exchanging (at most 60 s)
  grep -q "exchange tokens through" "$scratch/rank0.err" 2>/dev/null && break
  sleep 0.1
done
sleep 1
ip -n "$ns_b" link set "v${tag}b" down
cut=$(date +%s)
wait "$job"
rc=$?
ended=$(date +%s)
check "mpirun ends after the cut" $((rc == 124 || rc == 0)) \
  "exit $rc after $((ended - cut)) s: $(tail -c 2000 "$scratch/mpirun.err")"
rank0_rc=$(cat "$scratch/rank0.rc" 2>/dev/null || echo none)
[[ $rank0_rc =~ ^[1-9][0-9]*$ ]]
check "rank 0 exits non-zero" $? "exit status $rank0_rc"
# Where rank 1 had already entered the step's collective when the link went down, its count
# arrived and rank 0 can only say that a part did not (no MPI call names the peer then).
grep -qE "rank 0: error: rank 1 did not (deliver|complete)|rank 0 of 2: .*every one of the 2 ranks entered it, but not every part arrived within 3000 ms" \
  "$scratch/rank0.err" 2>/dev/null
check "rank 0 reports the lost peer" $? "$(tail -c 2000 "$scratch/rank0.err" 2>/dev/null)"
# Rank 1 is on the far side of the cut: its watchdog must end it too (give it the timeout).
for _ in $(seq 1 100); do [[ -s $scratch/rank1.rc ]] && break; sleep 0.1; done
rank1_rc=$(cat "$scratch/rank1.rc" 2>/dev/null || echo none)
[[ $rank1_rc =~ ^[1-9][0-9]*$ ]]
check "rank 1 exits non-zero" $? "exit status $rank1_rc: $(tail -c 2000 "$scratch/rank1.err" 2>/dev/null)"
echo "the cut host's job ended $((ended - cut)) s after the cut ($((ended - start)) s in all)"
exit $fail
