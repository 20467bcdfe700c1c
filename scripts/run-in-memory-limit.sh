#!/usr/bin/env bash
# Runs a command inside a fresh memory cgroup with a hard limit, and reports what it used.
#
#   scripts/run-in-memory-limit.sh --limit 12G [--name NAME] [--report FILE] [--parent PATH] -- cmd args...
#
# --limit SIZE    bytes, or with a K/M/G/T suffix (powers of 1024; "12G", "1536M", "12GiB").
# --name NAME     the cgroup's name (default run-in-memory-limit-PID); refused if it exists.
# --report FILE   also append the report as one JSON line to FILE.
# --parent PATH   create the cgroup under PATH (relative to the controller's mount) instead of
#                 the default: v1, this shell's own memory (and blkio) cgroup, so every limit
#                 above still applies; v2, the nearest ancestor of this shell's cgroup that
#                 delegates the memory controller to its children (cgroup.subtree_control).
#
# Whichever hierarchy has the memory controller is used:
#  - cgroup v1: memory.limit_in_bytes = SIZE, and memory.memsw.limit_in_bytes = SIZE when the
#    kernel accounts swap (so swap cannot extend the limit); peak = memory.max_usage_in_bytes;
#    OOM kills = memory.oom_control's oom_kill; disk reads = the "Read" bytes of
#    blkio.throttle.io_service_bytes_recursive of a blkio cgroup of the same name. Linux 6.x
#    counts those only on disks where blk-throttle is set up, so the script writes the no-limit
#    rule "MAJ:MIN 0" to that cgroup's blkio.throttle.read_bps_device for every disk (not loop,
#    ram, zram): nothing is throttled, and the set-up stays with the disk until reboot.
#  - cgroup v2: memory.max = SIZE, memory.swap.max = 0; peak = memory.peak (else memory.current
#    sampled every 0.1 s); OOM kills = memory.events' oom_kill; disk reads = rbytes of io.stat
#    (when the io controller is delegated too).
# Page cache is charged to the cgroup in both (pages a process of the cgroup first reads), so a
# file larger than the limit can be read: the kernel reclaims the cgroup's cache. Pages already
# cached when the command starts stay charged to whoever read them first and are not read from
# disk: drop the caches first (echo 3 > /proc/sys/vm/drop_caches) for a cold measurement.
# When no cgroup counts disk reads, read_bytes is /proc/<pid>/io's read_bytes of the process that
# runs the command (it includes the command and every descendant it reaped); it is reported in
# any case as proc_read_bytes.
#
# Report, on stderr at exit and as JSON with --report: limit, peak memory, whether the OOM killer
# fired (and how often), bytes read from disk, exit code and wall time. The exit code is the
# command's (128 + signal when it was killed, e.g. 137 after an OOM kill). On SIGINT / SIGTERM /
# SIGHUP the signal is forwarded to every process of the cgroup (a second one sends SIGKILL);
# the cgroup is removed at the end in every case, after killing any process the command left
# behind in it. Needs root.
set -uo pipefail

me="run-in-memory-limit"
die() { echo "$me: $*" >&2; exit 2; }
usage() { sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }

limit_arg="" name="" report="" parent=""
while (($#)); do
  case "$1" in
    --limit) limit_arg="${2:-}"; shift 2 || usage ;;
    --limit=*) limit_arg="${1#*=}"; shift ;;
    --name) name="${2:-}"; shift 2 || usage ;;
    --name=*) name="${1#*=}"; shift ;;
    --report) report="${2:-}"; shift 2 || usage ;;
    --report=*) report="${1#*=}"; shift ;;
    --parent) parent="${2:-}"; shift 2 || usage ;;
    --parent=*) parent="${1#*=}"; shift ;;
    -h | --help) usage ;;
    --) shift; break ;;
    *) echo "$me: unknown option '$1' (the command goes after --)" >&2; usage ;;
  esac
done
(($#)) || { echo "$me: no command given (after --)" >&2; usage; }
[[ -n "$limit_arg" ]] || { echo "$me: --limit is required" >&2; usage; }

# SIZE -> bytes.
parse_size() {
  local s="${1^^}" n u
  s="${s%IB}"; s="${s%B}"
  [[ "$s" =~ ^([0-9]+(\.[0-9]+)?)([KMGT]?)$ ]] || return 1
  n="${BASH_REMATCH[1]}" u="${BASH_REMATCH[3]}"
  case "$u" in "") u=1 ;; K) u=1024 ;; M) u=$((1024 ** 2)) ;; G) u=$((1024 ** 3)) ;; T) u=$((1024 ** 4)) ;; esac
  awk -v n="$n" -v u="$u" 'BEGIN { printf "%.0f\n", n * u }'
}
limit=$(parse_size "$limit_arg") || die "--limit '$limit_arg' is not a size (bytes, or with a K/M/G/T suffix)"
((limit >= 4096 * 16)) || die "--limit $limit bytes is too small"
name="${name:-$me-$$}"
[[ "$name" =~ ^[A-Za-z0-9._-]+$ ]] || die "--name '$name': use letters, digits, '.', '_' and '-'"
[[ $EUID -eq 0 ]] || die "needs root (it creates a cgroup and moves the command into it); run it with sudo"

# --- which hierarchy has the memory controller ---------------------------------------------
v1_mount() { awk -v c="$1" '$3 == "cgroup" { n = split($4, o, ","); for (i = 1; i <= n; i++) if (o[i] == c) { print $2; exit } }' /proc/mounts; }
own_path() { awk -F: -v c="$1" '{ n = split($2, o, ","); for (i = 1; i <= n; i++) if (o[i] == c) { print $3; exit } }' /proc/self/cgroup; }
mem_mount=$(v1_mount memory)
v2_root=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)
blk_cg="" blk_mount="" poller="" mode=""
if [[ -n "$mem_mount" ]]; then
  mode=1
  base="${parent:-$(own_path memory)}"
  mem_cg="${mem_mount}${base%/}/$name"
  blk_mount=$(v1_mount blkio)
  [[ -n "$blk_mount" ]] && blk_base="${parent:-$(own_path blkio)}" && blk_cg="${blk_mount}${blk_base%/}/$name"
elif [[ -n "$v2_root" ]] && grep -qw memory "$v2_root/cgroup.controllers" 2>/dev/null; then
  mode=2
  if [[ -n "$parent" ]]; then
    base="$parent"
  else
    base=$(awk -F: '$1 == "0" { print $3; exit }' /proc/self/cgroup)
    # The nearest ancestor whose children get the memory controller (the root always qualifies
    # once memory is enabled in its subtree_control; a cgroup with processes never does).
    while [[ "$base" != "/" ]] && ! grep -qw memory "$v2_root$base/cgroup.subtree_control" 2>/dev/null; do
      base=$(dirname "$base")
    done
  fi
  if ! grep -qw memory "$v2_root${base%/}/cgroup.subtree_control" 2>/dev/null; then
    [[ "$base" == "/" ]] || die "cgroup v2: $v2_root$base does not delegate the memory controller (cgroup.subtree_control); pass another --parent"
    echo "+memory" > "$v2_root/cgroup.subtree_control" 2>/dev/null ||
      die "cgroup v2: cannot enable the memory controller in $v2_root/cgroup.subtree_control"
  fi
  grep -qw io "$v2_root${base%/}/cgroup.subtree_control" 2>/dev/null ||
    { [[ "$base" == "/" ]] && grep -qw io "$v2_root/cgroup.controllers" && echo "+io" > "$v2_root/cgroup.subtree_control" 2>/dev/null; }
  mem_cg="$v2_root${base%/}/$name"
else
  die "no memory cgroup controller is mounted (neither a cgroup v1 'memory' hierarchy nor cgroup2 with 'memory' in cgroup.controllers)"
fi

[[ -e "$mem_cg" ]] && die "cgroup $mem_cg exists already (another run with --name $name?)"
[[ -n "$blk_cg" && -e "$blk_cg" ]] && die "cgroup $blk_cg exists already (another run with --name $name?)"
tmp=$(mktemp -d "/tmp/$me.XXXXXX") || die "mktemp failed"
child="" signals=0 rc="" removed=0

procs() { cat "$mem_cg/cgroup.procs" 2>/dev/null; }
kill_all() {  # signal every process of the cgroup (only processes this script started are in it)
  local p
  for p in $(procs); do kill -s "$1" "$p" 2>/dev/null; done
}
remove_cgroups() {
  ((removed)) && return
  removed=1
  [[ -n "$poller" ]] && kill "$poller" 2>/dev/null && wait "$poller" 2>/dev/null
  local i left
  if [[ -d "$mem_cg" ]]; then
    left=$(procs | wc -l)
    if ((left > 0)); then
      echo "$me: killing $left process(es) the command left in the cgroup" >&2
      for i in 1 2 3 4 5 6 7 8 9 10; do kill_all KILL; [[ -z "$(procs)" ]] && break; sleep 0.2; done
    fi
    for i in 1 2 3 4 5 6 7 8 9 10; do rmdir "$mem_cg" 2>/dev/null && break; sleep 0.2; done
    [[ -d "$mem_cg" ]] && echo "$me: could not remove $mem_cg" >&2
  fi
  if [[ -n "$blk_cg" && -d "$blk_cg" ]]; then
    for i in 1 2 3 4 5; do rmdir "$blk_cg" 2>/dev/null && break; sleep 0.2; done
    [[ -d "$blk_cg" ]] && echo "$me: could not remove $blk_cg" >&2
  fi
  rm -rf "$tmp"
}
on_signal() {
  signals=$((signals + 1))
  if ((signals == 1)); then
    echo "$me: got SIG$1, forwarding it to the command (again to kill it)" >&2
    kill_all "$1"
  else
    kill_all KILL
  fi
}
trap remove_cgroups EXIT
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM
trap 'on_signal HUP' HUP

# --- create ---------------------------------------------------------------------------------
mkdir "$mem_cg" || die "cannot create $mem_cg"
if ((mode == 1)); then
  echo "$limit" > "$mem_cg/memory.limit_in_bytes" || die "cannot set $mem_cg/memory.limit_in_bytes"
  [[ -e "$mem_cg/memory.memsw.limit_in_bytes" ]] && { echo "$limit" > "$mem_cg/memory.memsw.limit_in_bytes" ||
    die "cannot set $mem_cg/memory.memsw.limit_in_bytes"; }
  [[ -n "$blk_cg" ]] && { mkdir "$blk_cg" || { echo "$me: cannot create $blk_cg; disk reads from /proc" >&2; blk_cg=""; }; }
  # Since Linux 6.x blk-throttle (and with it the v1 byte counters) is set up on a disk only once
  # a rule is written for it; "MAJ:MIN 0" means "no limit" and sets it up without limiting.
  if [[ -n "$blk_cg" ]]; then
    for dev in /sys/block/*; do
      case "${dev##*/}" in loop* | ram* | zram*) continue ;; esac
      [[ "$(cat "$dev/size" 2>/dev/null)" =~ ^[1-9] ]] || continue
      echo "$(cat "$dev/dev") 0" > "$blk_cg/blkio.throttle.read_bps_device" 2>/dev/null ||
        echo "$me: cannot enable read accounting for ${dev##*/} in $blk_cg" >&2
    done
  fi
else
  echo "$limit" > "$mem_cg/memory.max" || die "cannot set $mem_cg/memory.max"
  [[ -e "$mem_cg/memory.swap.max" ]] && echo 0 > "$mem_cg/memory.swap.max"
  if [[ ! -e "$mem_cg/memory.peak" ]]; then  # kernels before 5.19: sample memory.current
    ( peak=0; while :; do c=$(cat "$mem_cg/memory.current" 2>/dev/null) || exit 0
        ((c > peak)) && peak=$c && echo "$peak" > "$tmp/peak"; sleep 0.1; done ) &
    poller=$!
  fi
fi

# --- run ------------------------------------------------------------------------------------
# The subshell enters the cgroup(s) and runs the command as its child (not exec), so that
# /proc/<subshell>/io, read after the command is reaped, includes the command's reads.
exec 3<&0
t0=$(date +%s%N)
(
  trap - INT TERM HUP QUIT
  exec 0<&3 3<&-
  echo "$BASHPID" > "$mem_cg/cgroup.procs" || exit 125
  [[ -n "$blk_cg" ]] && { echo "$BASHPID" > "$blk_cg/cgroup.procs" || exit 125; }
  "$@"
  status=$?
  awk '$1 == "read_bytes:" { print $2 }' "/proc/$BASHPID/io" > "$tmp/proc_read" 2>/dev/null
  exit "$status"
) &
child=$!
exec 3<&-
# wait returns early when a trapped signal arrives; wait again until the subshell is gone.
while :; do
  wait "$child"
  rc=$?
  kill -0 "$child" 2>/dev/null || break
done
t1=$(date +%s%N)
[[ "$rc" == 125 && ! -s "$tmp/proc_read" ]] && echo "$me: could not move the command into $mem_cg" >&2

# --- collect --------------------------------------------------------------------------------
[[ -n "$poller" ]] && { kill "$poller" 2>/dev/null; wait "$poller" 2>/dev/null; poller=""; }
peak="" memsw_peak=null oom_kills=null read_bytes="" read_src="" failcnt=0
if ((mode == 1)); then
  peak=$(cat "$mem_cg/memory.max_usage_in_bytes")
  [[ -e "$mem_cg/memory.memsw.max_usage_in_bytes" ]] && memsw_peak=$(cat "$mem_cg/memory.memsw.max_usage_in_bytes")
  oom_kills=$(awk '$1 == "oom_kill" { print $2 }' "$mem_cg/memory.oom_control")
  failcnt=$(cat "$mem_cg/memory.failcnt")
  for f in blkio.throttle.io_service_bytes_recursive blkio.throttle.io_service_bytes; do
    if [[ -n "$blk_cg" && -r "$blk_cg/$f" ]]; then
      read_bytes=$(awk '$2 == "Read" { s += $3 } END { printf "%.0f\n", s }' "$blk_cg/$f")
      read_src="$f"
      break
    fi
  done
else
  if [[ -e "$mem_cg/memory.peak" ]]; then peak=$(cat "$mem_cg/memory.peak"); else peak=$(cat "$tmp/peak" 2>/dev/null || echo 0); fi
  oom_kills=$(awk '$1 == "oom_kill" { print $2 }' "$mem_cg/memory.events")
  if [[ -r "$mem_cg/io.stat" ]]; then
    read_bytes=$(awk '{ for (i = 2; i <= NF; i++) if ($i ~ /^rbytes=/) { sub(/^rbytes=/, "", $i); s += $i } } END { printf "%.0f\n", s }' "$mem_cg/io.stat")
    read_src="io.stat"
  fi
fi
proc_read=$(cat "$tmp/proc_read" 2>/dev/null)
proc_read="${proc_read:-null}"
if [[ -z "$read_bytes" ]]; then
  read_bytes="$proc_read" read_src="/proc/PID/io read_bytes"
fi
oom_kills="${oom_kills:-null}"
if [[ "$oom_kills" == null ]]; then  # no oom_kill counter: a SIGKILL while at the limit
  oom=false; [[ "$rc" == 137 ]] && ((failcnt > 0)) && oom=true
else
  oom=false; ((oom_kills > 0)) && oom=true
fi
wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", (b - a) / 1e9 }')
cg_path="$mem_cg"
remove_cgroups

# --- report ---------------------------------------------------------------------------------
human() { awk -v b="$1" 'BEGIN { if (b == "null") { print "?"; exit } split("B KiB MiB GiB TiB", u, " "); i = 1; while (b >= 1024 && i < 5) { b /= 1024; i++ } printf (i == 1 ? "%d %s" : "%.2f %s"), b, u[i] }'; }
json_str() {
  local s="$1" out="" c i
  for ((i = 0; i < ${#s}; i++)); do
    c="${s:i:1}"
    case "$c" in
      '"') out+='\"' ;; '\') out+='\\' ;;
      $'\n') out+='\n' ;; $'\t') out+='\t' ;; $'\r') out+='\r' ;;
      *) if [[ "$c" < $'\x20' ]]; then out+=$(printf '\\u%04x' "'$c"); else out+="$c"; fi ;;
    esac
  done
  printf '"%s"' "$out"
}
oom_text="no"
[[ "$oom" == true ]] && oom_text="YES (oom_kill ${oom_kills})"
{
  printf '%s: limit %s, peak %s, OOM killer fired: %s, read from disk %s (%s), exit code %s, wall %s s\n' \
    "$me" "$(human "$limit")" "$(human "$peak")" "$oom_text" "$(human "$read_bytes")" "$read_src" "$rc" "$wall"
} >&2
if [[ -n "$report" ]]; then
  cmd_json="" sep=""
  for a in "$@"; do cmd_json+="$sep$(json_str "$a")"; sep=","; done
  printf '{"name":%s,"cgroup_version":%s,"cgroup":%s,"limit_bytes":%s,"peak_bytes":%s,"peak_memsw_bytes":%s,"oom_killed":%s,"oom_kills":%s,"read_bytes":%s,"read_bytes_source":%s,"proc_read_bytes":%s,"exit_code":%s,"wall_seconds":%s,"command":[%s]}\n' \
    "$(json_str "$name")" "$mode" "$(json_str "$cg_path")" "$limit" "${peak:-null}" "$memsw_peak" "$oom" \
    "$oom_kills" "${read_bytes:-null}" "$(json_str "$read_src")" "$proc_read" "$rc" "$wall" "$cmd_json" >> "$report" ||
    echo "$me: cannot write the report to $report" >&2
fi
exit "$rc"
