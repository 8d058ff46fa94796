#!/usr/bin/env bash
# Cold epochs on a disk of known speed: runs a command in a cgroup v1 blkio
# group whose reads of the root disk are throttled to RATE bytes/s (root
# only; the host may cache this VM's virtual disk, so un-throttled "cold"
# figures here are not a disk's, throttled ones are).
#
#   bash bench/cold_throttled.sh RATE -- COMMAND [ARGS...]
#   bash bench/cold_throttled.sh 400000000 -- build/tools/npyload-bench \
#       "images=$D/images/train/*.npy.zst" ... --cold --batches 12
#
# npyload-bench --cold evicts the files (posix_fadvise DONTNEED) before each
# run, so every configuration starts cold; keep --batches x --batch-size
# below the dataset's samples so that no run reads a file twice.
set -euo pipefail
rate=${1:?RATE in bytes/s}
shift
[[ ${1:-} == -- ]] && shift
cg=/sys/fs/cgroup/blkio/npyload-cold-$$
dev=$(lsblk -no MAJ:MIN "$(findmnt -no SOURCE /)" | head -1 | tr -d ' ')
[[ -d /sys/fs/cgroup/blkio ]] || { echo "cold_throttled: no cgroup v1 blkio here" >&2; exit 2; }
mkdir -p "$cg"
trap 'rmdir "$cg" 2>/dev/null || true' EXIT
echo "$dev $rate" > "$cg/blkio.throttle.read_bps_device"
t0=$(date +%s.%N)
rc=0
bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$cg" "$@" || rc=$?
t1=$(date +%s.%N)
# What the disk really served (kernel readahead included), to compare with
# what the loader asked for (npyload-bench --json: compressed_bytes_read).
read_bytes=$(awk -v d="$dev" '$1 == d && $2 == "Read" {print $3}' "$cg/blkio.throttle.io_service_bytes")
awk -v b="${read_bytes:-0}" -v t0="$t0" -v t1="$t1" -v r="$rate" 'BEGIN {
  printf "cold_throttled: the disk served %.1f MB of reads in %.1f s (%.0f MB/s average; limit %.0f MB/s)\n",
         b / 1e6, t1 - t0, b / 1e6 / (t1 - t0), r / 1e6 }' >&2
exit $rc
