#!/bin/bash
# One device call: GPU tests of both branches (in parallel), then each op's new-vs-main benchmark.
R=$PWD; S=$R/.scratch; O=$OUT/r; mkdir -p $O/attn $O/norm
PY=python3
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  $PY -c "import sys,torch,triton;print('python',sys.version.split()[0],'torch',torch.__version__,'triton',triton.__version__,'cuda',torch.version.cuda)"
  $PY -c "import xdist;print('xdist',xdist.__version__)" 2>&1 | tail -1
  date -u +%Y-%m-%dT%H:%M:%SZ; cat $S/REVS; } > $O/device.txt 2>&1
NX=""; $PY -c "import xdist" 2>/dev/null && NX="-n 4"
export PYTHONDONTWRITEBYTECODE=1
CACHE=$R/packages/inkling-cache/src
( cd $S/attn && t0=$(date +%s); PYTHONPATH=$S/attn/src:$CACHE timeout 170 $PY -m pytest -q $NX -rfE -p no:cacheprovider \
    tests/test_rel_attention_triton.py tests/test_rel_attention.py > $O/attn/tests.log 2>&1; \
  echo "rc=$? $(( $(date +%s) - t0 )) s" >> $O/attn/tests.log ) &
( cd $S/norm && t0=$(date +%s); PYTHONPATH=$S/norm/src:$CACHE timeout 170 $PY -m pytest -q $NX -rfE -p no:cacheprovider \
    tests/test_sconv_add_rmsnorm.py > $O/norm/tests.log 2>&1; \
  echo "rc=$? $(( $(date +%s) - t0 )) s" >> $O/norm/tests.log ) &
wait
tail -3 $O/attn/tests.log $O/norm/tests.log
mkdir -p /tmp/bl && cp -r $S/main_kernels/src/inkling_kernels/rel_attention /tmp/bl/relattn_main
cd $R; t0=$(date +%s)
PYTHONPATH=$S/attn/src:$CACHE:/tmp/bl timeout 100 $PY $S/attn/benchmarks/bench_rel_attention.py --baseline relattn_main \
  --no-flex --no-torch --no-sweep --rounds 3 --json $O/attn/bench.json --md $O/attn/bench.md > $O/attn/bench.log 2>&1
echo "rc=$? $(( $(date +%s) - t0 )) s" >> $O/attn/bench.log; tail -12 $O/attn/bench.log
t0=$(date +%s)
PYTHONPATH=$S/norm/src:$CACHE timeout 110 $PY $S/norm/benchmarks/bench_sconv_add_rmsnorm.py \
  --old-kernel inkling_kernels.sconv_add_rmsnorm.kernel_main --rounds 3 --no-unfused \
  --extra-decode 8,16,32,128,1024,2048 --json $O/norm/bench.json > $O/norm/bench.log 2>&1
echo "rc=$? $(( $(date +%s) - t0 )) s" >> $O/norm/bench.log; tail -16 $O/norm/bench.log
date -u +%Y-%m-%dT%H:%M:%SZ >> $O/device.txt
cd $OUT && tar czf results.tar.gz r && rm -rf r && ls -la $OUT
