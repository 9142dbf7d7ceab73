#!/bin/bash
# Samples /proc/stat every 5 s: time, jiffies of all CPUs, idle jiffies (idle + iowait) since the last
# sample. Run beside make test (./cpu_idle.sh > cpu_idle_<sha>.txt &), stop it after; the idle fraction
# is awk '{t += $2; i += $3} END {print i / t}' cpu_idle_<sha>.txt.
prev=($(head -1 /proc/stat))
while true; do
  sleep 5
  cur=($(head -1 /proc/stat))
  idle=$(( (${cur[4]} + ${cur[5]}) - (${prev[4]} + ${prev[5]}) ))
  total=0; for i in 1 2 3 4 5 6 7 8; do total=$(( total + ${cur[$i]} - ${prev[$i]} )); done
  echo "$(date +%H:%M:%S) $total $idle"
  prev=("${cur[@]}")
done
