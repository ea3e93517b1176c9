#!/usr/bin/env bash
# device run (not committed): regime-map sweeps on 16 cores; simulator figures are machine-independent
# except cell timeouts (wall clock).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MPLBACKEND=Agg
nproc; python3 -c "import numpy, yaml, matplotlib, numba, rich, tqdm; print('deps ok', numpy.__version__)" || exit 3
T0=$(date +%s); mkdir -p /tmp/res
S="python3 -m timelyllm_ros.cli sweep --workers 16"
# A: the quick grid, both capability columns
timeout ${TA:-200} $S --quick --engine-kinds stock,preserve --cell-timeout 190 --cache-dir /tmp/cA --out /tmp/res/quick.json --markdown /tmp/res/quick.md > $OUT/quick.txt 2>&1
echo "A rc=$? $(( $(date +%s) - T0 )) s"
# B: our own workloads at default batching and cap 8, rtx4090 and the edge board, both columns
timeout ${TB:-170} $S --loads arm_heavy,chat_flood,burst_fleet --capacities default,cap8 --profiles rtx4090_llama3_8b,orin_nano_llama3_2_3b --engine-kinds stock,preserve --cell-timeout 160 --cache-dir /tmp/cB --out /tmp/res/own.json --markdown /tmp/res/own.md > $OUT/own.txt 2>&1
echo "B rc=$? $(( $(date +%s) - T0 )) s"
# C: the full grid's stock column on rtx4090, as far as the time allows (cached cells kept)
timeout ${TC:-180} $S --profiles rtx4090_llama3_8b --engine-kinds stock --cell-timeout 170 --cache-dir /tmp/cC --out /tmp/res/full_rtx_stock.json --markdown /tmp/res/full_rtx_stock.md > $OUT/full.txt 2>&1
echo "C rc=$? $(( $(date +%s) - T0 )) s"
tar czf $OUT/res.tgz -C /tmp res cA cB cC 2>/dev/null; ls -la $OUT
