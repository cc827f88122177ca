# A guest script for `fraglab vm --script`: makes the kernel patch its own text (a tracepoint's jump
# label and static calls, as every catcher start and stop does) 400 times while two loops keep both
# vCPUs busy. A write the kernel refuses ends the script (set -e) without writing poke/done.
# Multi-threaded TCG livelocks on this; see docs/vm.md, "KVM or TCG". Run:
#   fraglab vm --kernel debian-cloud --timeout 400s --script scripts/tcg-poke-stress.sh \
#     --extra-bin /usr/bin/mount --extra-bin /usr/bin/cat --extra-bin /usr/bin/sleep --results poke
# and read poke/done (guest uptime at the end); a hang is exit 125 with `soft lockup` on the console.
set -e
[ -d /sys/kernel/tracing/events ] || mount -t tracefs nodev /sys/kernel/tracing
( while :; do sleep 0; done ) &
forks=$!
( while :; do cat /proc/uptime > /dev/null; done ) &
reads=$!
events=/sys/kernel/tracing/events
i=0
while [ $i -lt 400 ]; do
  echo 'stacktrace if order >= 4' > $events/kmem/mm_page_alloc/trigger
  echo 1 > $events/sched/sched_wakeup_new/enable
  echo 0 > $events/sched/sched_wakeup_new/enable
  echo '!stacktrace if order >= 4' > $events/kmem/mm_page_alloc/trigger
  i=$((i + 1))
done
kill $forks $reads
cat /proc/uptime > /results/done
echo "$i rounds"
