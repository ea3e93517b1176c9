#!/usr/bin/env bash
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MPLBACKEND=Agg
mkdir -p /tmp/res; T0=$(date +%s)
timeout 330 python3 -m timelyllm_ros.cli sweep --workers 16 --profiles rtx4090_llama3_8b --engine-kinds stock --cell-timeout 280 --out /tmp/res/full_rtx_stock.json --markdown /tmp/res/full_rtx_stock.md > $OUT/full.txt 2>&1
echo "C rc=$? $(( $(date +%s) - T0 )) s"
tar czf $OUT/res.tgz -C /tmp res; ls -la $OUT
