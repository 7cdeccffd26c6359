#!/bin/bash
# RLSTA cpu preset with LoRA rank 16: A uninterrupted; B killed (SIGKILL) once step 4's metrics are
# written (after the step-3 checkpoint), then rerun on the same workdir (it resumes). Run from the repo root.
rm -rf /tmp/lora_a /tmp/lora_b
T="python -m jaxrl_mt.train --config configs/rlsta.py:cpu --config.lora.rank=16"
/usr/bin/time -v $T --config.workdir=/tmp/lora_a > /tmp/lora_a.log 2>&1; echo "A rc=$? $(date +%T)"
$T --config.workdir=/tmp/lora_b > /tmp/lora_b1.log 2>&1 &
pid=$!
while kill -0 $pid 2>/dev/null; do
  if [ -f /tmp/lora_b/metrics.jsonl ] && grep -q '"step": 4' /tmp/lora_b/metrics.jsonl; then
    kill -9 $pid; echo "B killed after step 4 $(date +%T)"; break; fi
  sleep 2
done
wait $pid; echo "B1 rc=$?"
$T --config.workdir=/tmp/lora_b > /tmp/lora_b2.log 2>&1; echo "B2 rc=$? $(date +%T)"
