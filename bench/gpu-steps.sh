#!/usr/bin/env bash
# The GPU machine's benchmark and test steps, one function each
# (step_NAME for step NAME), and the helpers they share. scripts/gpu.sh
# sources this on the device machine and runs the steps it is given; the
# table of steps is in bench/README.md.
# shellcheck shell=bash

export PATH="$PWD/.stage/bin:$PATH"
# The staged CRIU 4 (the machine has none): freeze/thaw and their tests.
export ZEROHOP_CRIU="$PWD/.stage/criu/criu"
HOT=/dev/shm/zerohop-bench.safetensors
DISK=/var/tmp/zerohop-bench.safetensors
SIZE=${ZEROHOP_BENCH_SIZE:-8GiB}
ensure_hot() { [ -f $HOT ] || zerohop gen --size "$SIZE" $HOT; }
ensure_disk() { [ -f $DISK ] || { ensure_hot; cp $HOT $DISK; sync; }; }
# zerohop's wheel and the peers' (.whl, see bench/fetch-peer-wheels.sh),
# each set in a folder of its own: a warm machine keeps what an earlier
# call installed, which may have been zerohop's alone.
install_wheels() {
    local set dir
    for set in .stage/wheel .whl .whl-s3; do
        dir=/tmp/site-${set//[.\/]/}
        [ -d "$set" ] && [ ! -d "$dir" ] && install_compiled "$dir" "$set"/*.whl
        PYTHONPATH=$dir${PYTHONPATH:+:$PYTHONPATH}
    done
    export PYTHONPATH
}
# Wheels into folder $1, with their modules compiled to bytecode, as
# `pip install` leaves them for a user. The GPU machine sets
# PYTHONDONTWRITEBYTECODE=1, so modules installed without bytecode are
# compiled again by every process that imports them: `import zerohop`
# took 23 - 36 ms that way against 4.1 - 4.7 ms compiled (H200,
# bench/probe/import_time.py), inside every first call the matrix times.
install_compiled() {
    local dir=$1; shift
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$dir" "$@"
    python3 -m compileall -q "$dir" > /dev/null
}
# The ledger's name for this machine: its GPU's model (the device tool
# lends H200 and H100 machines alike) and its kernel.
machine_label() {
    local gpu
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | head -1)
    case "$gpu" in
        *H200*) gpu=h200 ;;
        *H100*) gpu=h100 ;;
        "") gpu=no-gpu ;;
        *) gpu=${gpu// /-} ;;
    esac
    echo "$gpu $(uname -r)"
}
# The VM grows its memory on first touch (~0.6 s per GiB): touch it
# once, so no timed run pays for that. bench/peers.py does the same
# itself at its start (--warm-gib, 24 GiB by default), so the peers
# steps do not call this.
warm_memory() {
    python3 bench/peers.py --warm-only --warm-gib "${ZEROHOP_WARM_GIB:-40}"
}
# bench/peers.py for one or more of its sections, output to
# $OUT/peers-NAME.{txt,json,png}, ledger lines to $OUT/results.jsonl;
# ZEROHOP_PEERS_ARGS adds options
# (e.g. "--rounds 5" or "--hot-loaders zerohop-py,instanttensor").
peers_run() {
    local name=$1; shift
    # shellcheck disable=SC2086 # ZEROHOP_PEERS_ARGS is a list of options
    PYTHONUNBUFFERED=1 python3 bench/peers.py "$@" --zerohop .stage/bin/zerohop ${ZEROHOP_PEERS_ARGS:-} \
        --json-out "$OUT/peers-$name.json" --chart "$OUT/peers-$name.png" \
        --ledger "$OUT/results.jsonl" --machine "$(machine_label)" --commit "$(cat .stage/commit)" \
        | tee "$OUT/peers-$name.txt"
}
# The S3 server's binary: s3s-fs, or Garage with ZEROHOP_S3_SERVER=garage
# (staged after `bash scripts/gpu.sh garage` here).
s3_server() {
    [ "${ZEROHOP_S3_SERVER:-s3s-fs}" = garage ] || { echo .stage/bin/s3s-fs; return; }
    [ -f .stage/garage.xz ] || { echo "no .stage/garage.xz: run 'bash scripts/gpu.sh garage' here, then stage" >&2; exit 2; }
    local bin=/tmp/zerohop-garage/garage
    mkdir -p /tmp/zerohop-garage
    [ -x $bin ] || python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
        .stage/garage.xz $bin
    chmod +x $bin
    echo $bin
}

step_warm() {
    warm_memory
}

step_info() {
    nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv
    uname -r; nproc; free -g; df -h / /var/tmp /dev/shm
    zerohop info /var/tmp | tee -a "$OUT/info-and-tests.txt"
}

step_tests() {
    # The GPU tests are #[ignore]d where cargo test runs without a
    # GPU; here they run, and fail if the GPU is missing. Every
    # binary runs; the step fails after them if any failed.
    failed=()
    for t in .stage/tests/*; do
        echo "--- $t"
        "$t" --include-ignored --test-threads 1 --nocapture 2>&1 | tee -a "$OUT/info-and-tests.txt" \
            | { grep -E "skipped|GB/s|test result|FAILED|panicked" || true; } \
            || failed+=("${t##*/} (exit ${PIPESTATUS[0]})")
    done
    if [ ${#failed[@]} -gt 0 ]; then
        echo "=== tests FAILED: ${failed[*]} (whole output: info-and-tests.txt)"
        exit 1
    fi
}

step_s3() {
    # Object storage (issue 15): the model as one object of an
    # S3-compatible server on this machine (s3s-fs, over tmpfs),
    # uploaded by curl; the server's raw parallel ranged GETs
    # against zerohop loading it into the GPU, rounds alternating.
    ensure_hot
    local root=/dev/shm/zerohop-s3 port=9400
    rm -rf $root && mkdir -p $root/models
    s3s-fs --host 127.0.0.1 --port $port --access-key zk --secret-key zs $root > "$OUT/s3-server.log" 2>&1 &
    local server=$!
    export AWS_ENDPOINT_URL=http://127.0.0.1:$port AWS_ACCESS_KEY_ID=zk AWS_SECRET_ACCESS_KEY=zs
    sleep 1
    local t0=$SECONDS
    curl -sS --fail --aws-sigv4 aws:amz:us-east-1:s3 --user zk:zs -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" \
        -T $HOT $AWS_ENDPOINT_URL/models/model.safetensors
    echo "uploaded $(stat -c %s $HOT) bytes in $((SECONDS - t0)) s" | tee "$OUT/s3.txt"
    local obj=s3://models/model.safetensors round t b
    for round in 1 2 3; do
        for t in 16 32 64; do
            for b in 4MiB 16MiB; do
                echo "raw-get round $round threads $t block $b $(zerohop-lab raw-read $obj --threads $t --block $b --json)"
            done
        done
        echo "load round $round default $(zerohop load $obj --device cuda --json)"
        echo "load round $round threads-32 $(zerohop load $obj --device cuda --json --threads 32 --staging 256MiB)"
        echo "load round $round threads-64 $(zerohop load $obj --device cuda --json --threads 64 --staging 512MiB)"
        install_wheels
        echo "load_file round $round $(python3 -c "
import time, torch, zerohop
torch.cuda.init(); torch.empty(1, device='cuda')
t = time.perf_counter(); m = zerohop.load_file('$obj', device='cuda:0'); torch.cuda.synchronize()
s = time.perf_counter() - t; n = sum(x.numel() * x.element_size() for x in m.values())
print(f'{n / s / 1e9:.2f} GB/s {s:.3f} s {len(m)} tensors')")"
    done 2>&1 | tee -a "$OUT/s3.txt"
    kill $server
    rm -rf $root
}

step_s3_checkpoint() {
    # Checkpoints to an object store (issue 15): 16 GiB of GPU
    # memory saved to a server over tmpfs (s3s-fs, or Garage with
    # ZEROHOP_S3_SERVER=garage) and restored, against the server's
    # raw multipart upload and ranged GET rates and with the
    # process's resident memory sampled (zerohop-lab checkpoint).
    # Host memory touched once first (as much as a bench stores),
    # so no upload into tmpfs pays the VM's first-touch cost.
    ZEROHOP_WARM_GIB=${ZEROHOP_WARM_GIB:-72} warm_memory
    df -h /dev/shm
    server=$(s3_server)
    # The machine's CPU (vmstat) and the busiest processes (top),
    # each second, beside the bench's lines with their times: is
    # the server or the client short of CPU in a phase?
    vmstat -t 1 > "$OUT/s3-checkpoint-vmstat.txt" &
    local vmstat=$!
    top -b -d 1 -w 160 | grep --line-buffered -E '^top|garage|s3s-fs|zerohop' > "$OUT/s3-checkpoint-top.txt" &
    local top=$!
    # A fresh server for each bench: one stores about 64 GiB (two
    # rounds of a 16 GiB save and two 8 GiB raw uploads; Garage
    # frees deleted blocks only ten minutes later).
    for n in 1 2; do
        # shellcheck disable=SC2016 # expanded by the inner shell
        python3 bench/peers_s3.py "$server" /dev/shm -- bash -c '
            zerohop-lab checkpoint --size "${ZEROHOP_S3_CKPT_SIZE:-16GiB}" --dir s3://models/ckpt \
                --rounds "${ZEROHOP_S3_CKPT_ROUNDS:-2}" --device cuda ${ZEROHOP_S3_CKPT_ARGS:-} 2>&1' | sed -u "s/^/server $n: /"
    done | while IFS= read -r line; do echo "$(date -u +%T) $line"; done | tee "$OUT/s3-checkpoint.txt"
    kill $vmstat $top 2> /dev/null || true
}

step_hot() {
    ensure_hot
    zerohop bench load $HOT --compare-routes --repeat 3 | tee "$OUT/bench-hot-tmpfs.txt"
}

step_cold() {
    ensure_disk
    zerohop bench load $DISK --cold --repeat 2 | tee "$OUT/bench-cold-disk.txt"
    zerohop bench load $DISK --cold --repeat 2 --slot 8MiB --staging 256MiB | tee "$OUT/bench-cold-disk-8m.txt"
}

step_probe() {
    # The hot route's ceiling without the engine (bench/probe/
    # hot_copy.cu, built here with nvcc): ZEROHOP_PROBE is a
    # ';'-separated list of option sets, each run 3 times. Then the
    # first read of fresh tmpfs pages against the second
    # (bench/probe/first_read.py), what load_file's allocations cost
    # (bench/probe/alloc.py), and the disk's queue limits,
    # which cold reads meet.
    ensure_hot
    /usr/local/cuda/bin/nvcc -O2 -std=c++17 -o /tmp/hot_copy bench/probe/hot_copy.cu
    IFS=';' read -ra configs <<< "${ZEROHOP_PROBE:---threads 16 --chunk 4 --slots 2 --wait poll --dontneed}"
    for args in "${configs[@]}"; do
        # shellcheck disable=SC2086 # an option set
        /tmp/hot_copy $HOT $args | tee -a "$OUT/probe.txt"
    done
    python3 bench/probe/first_read.py /dev/shm | tee -a "$OUT/probe.txt"
    python3 bench/probe/alloc.py | tee -a "$OUT/probe.txt"
    for q in /sys/block/*/queue; do
        echo "$q: $(for f in max_sectors_kb max_hw_sectors_kb nr_requests read_ahead_kb scheduler; do
            printf '%s=%s ' $f "$(cat $q/$f)"; done) queues=$(ls "${q%/queue}/mq" 2>/dev/null | wc -l)" | tee -a "$OUT/probe.txt"
    done
}

step_sweep() {
    # Hot-route settings on the tmpfs file: GB/s per configuration.
    ensure_hot
    echo "transparent huge pages: $(cat /sys/kernel/mm/transparent_hugepage/enabled)"
    # ZEROHOP_SWEEP: ';'-separated load option sets to compare.
    IFS=';' read -ra configs <<< "${ZEROHOP_SWEEP:---hot-route staged;--hot-route dma}"
    for args in "${configs[@]}"; do
        r=$(zerohop load $HOT --json $args | python3 -c 'import json,sys; s=json.load(sys.stdin); p=s["profile"]; w=p["worker_seconds"] or 1; print("%6.2f GB/s cpu %.2fs read %2.0f%% wait %2.0f%%" % (s["gbps"], s["cpu_seconds"], 100*p["io_seconds"]/w, 100*p["copy_wait_seconds"]/w))')
        echo "sweep  $r  ${ZEROHOP_SWEEP_LABEL:-} $args" | tee -a "$OUT/sweep.txt"
    done
}

step_cold_sweep() {
    # Cold settings, each read once: ZEROHOP_COLD_LOADS and
    # ZEROHOP_COLD_RAW are ';'-separated option sets for `zerohop
    # load` and `zerohop-lab raw-read`, taking turns; run as one
    # round of cold-patterns (below), which does the fresh files.
    IFS=';' read -ra loads <<< "${ZEROHOP_COLD_LOADS:-}"
    IFS=';' read -ra raws <<< "${ZEROHOP_COLD_RAW:-}"
    pats=()
    for k in $(seq 0 $(( ${#loads[@]} > ${#raws[@]} ? ${#loads[@]} : ${#raws[@]} ))); do
        [ -n "${loads[$k]:-}" ] && pats+=("zerohop:${loads[$k]}")
        [ -n "${raws[$k]:-}" ] && pats+=("raw:${raws[$k]}")
    done
    warm_memory
    python3 bench/probe/cold_patterns.py --rounds 1 "${pats[@]}" | tee -a "$OUT/cold-sweep.txt"
}

step_cold_patterns() {
    # Ways of reading a cold file side by side, a fresh file each
    # (bench/probe/cold_patterns.py): ZEROHOP_COLD_PATTERNS is a
    # ';'-separated list of its patterns, the first the baseline.
    IFS=';' read -ra pats <<< "${ZEROHOP_COLD_PATTERNS:-read:1MiB:8:buffered;zerohop:}"
    warm_memory
    python3 bench/probe/cold_patterns.py --rounds "${ZEROHOP_COLD_ROUNDS:-3}" "${pats[@]}" | tee -a "$OUT/cold-patterns.txt"
}

step_restore_routes() {
    # A checkpoint's restore from tmpfs by route (mapped copies or
    # read()), with and without dropping the page cache first: the
    # drop cannot evict tmpfs pages, yet mapped restores of them
    # ran at a third of the rate after it (measured on the H200),
    # which is why benchmarks do not
    # drop the cache of memory file systems.
    warm_memory; ensure_hot
    ck=/dev/shm/zerohop-restore-routes
    rm -rf $ck; zerohop checkpoint save --from $HOT $ck > /dev/null
    for round in 1 2 3; do
        for drop in no yes; do
            for route in ${ZEROHOP_RESTORE_ROUTES:-mapped staged}; do
                [ $drop = yes ] && { sync; echo 3 > /proc/sys/vm/drop_caches; }
                r=$(zerohop checkpoint restore $ck --hot-route $route --json | python3 bench/probe/transfer_line.py)
                echo "restore r$round drop=$drop $route $r" | tee -a "$OUT/restore-routes.txt"
            done
        done
    done
    rm -rf $ck
}

step_phases() {
    # Where the time of one Python load_file goes, call by call: in a
    # fresh process, and after a tiny warm-up load.
    ensure_hot; install_wheels
    python3 bench/load_phases.py $HOT | tee -a "$OUT/load-phases.txt"
    python3 bench/load_phases.py $HOT --warm-up --allocations 3000 | tee -a "$OUT/load-phases.txt"
}

step_timeline() {
    # One load_file's wall time, stamp by stamp, in fresh processes
    # as bench/peers.py times it, against variants (bench/probe/
    # load_timeline.py).
    warm_memory; ensure_hot; install_wheels
    python3 bench/probe/load_timeline.py $HOT --runs "${ZEROHOP_TIMELINE_RUNS:-5}" | tee -a "$OUT/load-timeline.txt"
}

step_import() {
    # What `import zerohop` costs after torch's CUDA context, and where
    # (bench/probe/import_time.py).
    install_wheels
    python3 bench/probe/import_time.py | tee "$OUT/import.txt"
}

step_checkpoint() {
    # Save/restore 16 GiB of device memory to disk and to tmpfs:
    # zerohop (with raw write/read limits) and its peers, same run.
    install_wheels
    for pair in disk:/var/tmp/zerohop-ckpt tmpfs:/dev/shm/zerohop-ckpt; do
        name=${pair%%:*} target=${pair#*:}
        PYTHONUNBUFFERED=1 python3 bench/checkpoint_peers.py --size-gib "${ZEROHOP_CKPT_GIB:-16}" --dir "$target" \
            --zerohop .stage/bin/zerohop --json-out "$OUT/checkpoint-$name.json" | tee "$OUT/checkpoint-$name.txt"
        rm -rf "$target"
    done
}

step_suspend() {
    # A PyTorch process's 16 GiB of GPU tensors paused and resumed:
    # zerohop in-process and as checkpoint-process's transport, the
    # driver's process checkpoint alone, torch_memory_saver (from
    # .whl); tmpfs then disk, with their raw rates (about 6 minutes).
    warm_memory; install_wheels
    # shellcheck disable=SC2086 # ZEROHOP_SUSPEND_ARGS is a list of options
    PYTHONUNBUFFERED=1 python3 bench/suspend.py --zerohop .stage/bin/zerohop ${ZEROHOP_SUSPEND_ARGS:-} \
        --json-out "$OUT/suspend.json" --ledger "$OUT/results.jsonl" --machine "$(machine_label)" \
        --commit "$(cat .stage/commit)" 2>&1 | tee "$OUT/suspend.txt"
}

step_coldstart() {
    # An inference server of a 16 GiB model: a fresh start against
    # `zerohop thaw` of it frozen, zerohop's freeze against NVIDIA's
    # flow (driver to host RAM + CRIU), tmpfs then disk (about 4
    # minutes; ZEROHOP_COLDSTART_ARGS adds options).
    ZEROHOP_WARM_GIB=${ZEROHOP_WARM_GIB:-64} warm_memory; install_wheels
    # shellcheck disable=SC2086 # a list of options
    PYTHONUNBUFFERED=1 python3 bench/coldstart.py --zerohop .stage/bin/zerohop ${ZEROHOP_COLDSTART_ARGS:-} \
        --json-out "$OUT/coldstart.json" 2>&1 | tee "$OUT/coldstart.txt"
    rm -rf /dev/shm/zerohop-coldstart /var/tmp/zerohop-coldstart
}
step_matrix() {
    # Every operation x every shape, first calls in fresh processes,
    # zerohop beside its peers (bench/matrix.py); ZEROHOP_MATRIX_ARGS
    # picks operations, size and rounds. Figures go to
    # $OUT/results.jsonl, in the ledger's form: append its lines to
    # bench/results.jsonl.
    # With .before/wheel (the commit before a change, see
    # bench/README.md), that build runs beside this one.
    warm_memory; install_wheels
    local before=()
    if compgen -G ".before/wheel/*.whl" > /dev/null; then
        [ -d /tmp/site-before ] || install_compiled /tmp/site-before .before/wheel/*.whl
        before=(--before /tmp/site-before --before-commit "$(cat .before/commit 2> /dev/null || echo unknown)")
    fi
    # shellcheck disable=SC2086 # ZEROHOP_MATRIX_ARGS is a list of options
    PYTHONUNBUFFERED=1 python3 bench/matrix.py --machine "$(machine_label)" --commit "$(cat .stage/commit)" \
        --ledger "$OUT/results.jsonl" --json-out "$OUT/matrix.json" "${before[@]}" ${ZEROHOP_MATRIX_ARGS:-} \
        2>&1 | tee -a "$OUT/matrix.txt"
}

# The README's targets in one machine start: four steps, each a call of
# the device tool (within its 600 s), carrying .stage and .whl. Their
# figures go to $OUT/results.jsonl: append those to bench/results.jsonl,
# and `python3 bench/targets.py --commit C` judges them.
step_targets_loads() {
    step_info
    ZEROHOP_MATRIX_ARGS="--ops load_file,get_slice --rounds 3 --peer-rounds 2 --tools zerohop,instanttensor,limits --time-limit 300" \
        step_matrix
}

step_targets_saves() {
    ZEROHOP_MATRIX_ARGS="--ops checkpoint-save --shapes one,four,sixty-four,small-fp8 --rounds 3 --peer-rounds 2 --tools zerohop,raw-16-files --time-limit 330" \
        step_matrix
}

step_targets_suspend() {
    local gib
    for gib in 16 8; do
        # 16 GiB: suspend and resume, in the process and of an unaware
        # one; 8 GiB: checkpoint-process and restore-process.
        local rows=zerohop,preload-suspend,preload,driver
        [ $gib = 8 ] && rows=preload,driver
        ZEROHOP_SUSPEND_ARGS="--size-gib $gib --tensor-mib $((gib * 1024)) --rows $rows --no-disk --reuse --mlp" step_suspend
        local ext
        for ext in txt json; do
            [ ! -f "$OUT/suspend.$ext" ] || mv "$OUT/suspend.$ext" "$OUT/suspend-${gib}gib.$ext"
        done
    done
}

step_targets_writes_cold() {
    ZEROHOP_MATRIX_ARGS="--ops save_file --shapes one,small-fp8 --rounds 3 --peer-rounds 1 --tools zerohop,raw-1-file-mapped --time-limit 100" \
        step_matrix
    ZEROHOP_PEERS_ARGS="--warm-gib 0 --cold-loaders zerohop-py,fastsafetensors --cold-rounds 3 --sweep-threads 8,16 --sweep-blocks 1MiB,4MiB --time-limit 300" \
        step_peers_cold
}

step_write_probe() {
    # One large file written, and pinned staging allocated, each way
    # (bench/probe/write_and_pin.c).
    warm_memory
    .stage/probe/write_and_pin /dev/shm /var/tmp 8 2>&1 | tee "$OUT/write-and-pin.txt"
}

step_context_memory() {
    # What a CUDA context holds beyond allocations, and what its
    # limits account for (issue 14: what the driver's process
    # checkpoint stages after a zerohop suspend).
    python3 bench/probe/context_memory.py 2>&1 | tee "$OUT/context-memory.txt"
}

step_save() {
    # zerohop alone: 16 GiB saved and restored, tmpfs twice, disk once,
    # each against the raw write/read rates measured in the same run.
    for target in /dev/shm /dev/shm /var/tmp; do
        zerohop-lab checkpoint --size "${ZEROHOP_CKPT_GIB:-16}GiB" --dir "$target" | tee -a "$OUT/bench-checkpoint.txt"
    done
}

step_agent() {
    # The I/O agent: a client process reading the model into its own
    # GPU memory (IPC handle, non-zero offset, verified) against the
    # in-process engine, hot and cold; then 32 clients x 10,000 I/Os.
    ensure_hot; ensure_disk
    zerohop-lab agent $HOT --repeat 3 | tee "$OUT/bench-agent-hot.txt"
    zerohop-lab agent $DISK --cold --repeat 2 | tee "$OUT/bench-agent-cold.txt"
    zerohop-lab agent $HOT --repeat 2 --vmm | tee "$OUT/bench-agent-vmm.txt"
    zerohop-lab agent-stress --clients 32 --ios 10000 --dir /dev/shm/zerohop-stress | tee "$OUT/agent-stress.txt"
}

step_python() {
    # The Python package's tests, torch and GPU ones included.
    install_wheels
    # ZEROHOP_PYTESTS: test files to run instead of all (and then
    # not the compatibility tests).
    # shellcheck disable=SC2086 # a list of files
    ZEROHOP_BIN="$PWD/.stage/bin/zerohop" ZEROHOP_PRELOAD="$PWD/.stage/bin/libzerohop_preload.so" \
        ZEROHOP_USRBIO_LIB_DIR="$PWD/.stage/bin" python3 -m pytest -q -rs -p no:cacheprovider ${ZEROHOP_PYTESTS:-python/tests} \
        2>&1 | tee "$OUT/python-tests.txt"
    # safetensors 0.8's PyTorch tests against zerohop (the machine
    # has safetensors 0.8.0 installed).
    [ -n "${ZEROHOP_PYTESTS:-}" ] || python3 python/compat/run.py --cache .stage/compat 2>&1 | tee "$OUT/python-compat.txt"
}

step_compare() {
    # Before/after a change, same machine start: the binary in
    # .before/zerohop (built from the commit before it, see the
    # README) against .stage/bin/zerohop, each in turn, the order
    # swapped in the second round: hot and cold loads of the 8 GiB
    # model. (About 7 minutes; compare-save is the other half.)
    [ -x .before/zerohop ] || { echo "build .before/zerohop first (README, GPU runs)"; exit 2; }
    warm_memory; ensure_hot
    for round in 1 2; do
        bins=(.before/zerohop .stage/bin/zerohop)
        [ "$round" = 2 ] && bins=(.stage/bin/zerohop .before/zerohop)
        for bin in "${bins[@]}"; do
            name=$([ "$bin" = .before/zerohop ] && echo before || echo after)
            echo "--- $name round $round: hot" | tee -a "$OUT/compare.txt"
            $bin bench load $HOT --repeat 3 2>&1 | grep -E "^(limit|run|result|zerohop: error|warning)" | tee -a "$OUT/compare.txt"
            # Cold: a fresh copy per binary and round, so no read
            # finds what an earlier one left in the host's cache.
            cold=/var/tmp/zerohop-cold-$name-$round.safetensors
            cp $HOT $cold; sync
            echo "--- $name round $round: cold" | tee -a "$OUT/compare.txt"
            $bin bench load $cold --cold --repeat 2 2>&1 | grep -E "^(limit|run|result|cold|zerohop: error|warning)" | tee -a "$OUT/compare.txt"
            rm -f $cold
        done
    done
}

step_compare_s3_load() {
    # Before/after a change to the object store read path: the
    # binary in .before/zerohop against .stage/bin/zerohop, each
    # loading the 8 GiB model into the GPU from one fresh server
    # (Garage with ZEROHOP_S3_SERVER=garage), in turn, four rounds,
    # the order swapped each round, with the raw GETs of the same
    # object (16 MiB x 32) between them.
    [ -x .before/zerohop ] || { echo "build .before/zerohop first (README, GPU runs)"; exit 2; }
    warm_memory; ensure_hot
    server=$(s3_server)
    # shellcheck disable=SC2016 # expanded by the inner shell
    python3 bench/peers_s3.py "$server" /dev/shm -- bash -c '
        curl -sS --fail --aws-sigv4 aws:amz:us-east-1:s3 --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
            -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" -T "$0" "$AWS_ENDPOINT_URL/models/model.safetensors"
        url=s3://models/model.safetensors
        for round in 1 2 3 4; do
            bins=".before/zerohop .stage/bin/zerohop"
            [ $((round % 2)) = 0 ] && bins=".stage/bin/zerohop .before/zerohop"
            for bin in $bins; do
                echo "--- $bin, round $round: load"
                $bin load $url --device cuda 2>&1 | grep -E "GB/s|error"
            done
            echo "--- round $round: raw GETs"
            zerohop-lab raw-read $url --threads 32 --block 16MiB 2>&1 | grep -E "GB/s|error"
        done' $HOT 2>&1 | tee "$OUT/compare-s3-load.txt"
}

step_compare_save() {
    # The other half: a 16 GiB checkpoint save and restore to tmpfs
    # (before first) and to disk (after first), each against the raw
    # write and read rates of its own run. (About 8 minutes.)
    [ -x .before/zerohop ] || { echo "build .before/zerohop first (README, GPU runs)"; exit 2; }
    warm_memory
    for run in /dev/shm:.before/zerohop /dev/shm:.stage/bin/zerohop \
        /var/tmp:.stage/bin/zerohop /var/tmp:.before/zerohop; do
        dir=${run%%:*} bin=${run#*:}
        echo "--- $bin: 16 GiB checkpoint save to $dir" | tee -a "$OUT/compare-save.txt"
        "${bin}-lab" checkpoint --size 16GiB --dir $dir 2>&1 \
            | grep -E "^(limit|save|restore|result|checksum|host|zerohop: error|warning)" | tee -a "$OUT/compare-save.txt"
    done
}

step_peers() {
    # Peer loaders against zerohop on the tmpfs model, 3 rounds:
    # hot (about 2.5 minutes; peers-hot stops there), then shapes
    # (shards, small tensors, FP8; about 3 minutes; peers-shapes
    # runs them alone). Each run stops
    # starting rounds at its --time-limit, so the step ends within
    # the device tool's call.
    start=$SECONDS
    # A model file written fresh: on this VM, one written earlier in
    # the machine start was once mapped at a third of the usual rate
    # by every loader that maps it.
    rm -f $HOT; ensure_hot; install_wheels
    [ "$step" = peers-shapes ] || peers_run hot $HOT --modes hot --time-limit 240
    [ "$step" = peers-hot ] || peers_run shapes $HOT --modes shapes --time-limit $((540 - (SECONDS - start)))
}
step_peers_hot() { step_peers "$@"; }
step_peers_shapes() { step_peers "$@"; }

step_peers_s3() {
    # The s3 section of bench/peers.py (a call of its own, carrying
    # .stage and .whl-s3: bench/fetch-peer-wheels.sh s3): the model
    # as an object of s3s-fs over tmpfs, zerohop against Run:ai's
    # S3 backend and boto3 + safetensors, and the raw GETs.
    # ZEROHOP_S3_SERVER=garage serves it from Garage instead (staged
    # after `bash scripts/gpu.sh garage` here).
    rm -f $HOT; ensure_hot; install_wheels
    server=$(s3_server)
    peers_run s3 $HOT --modes s3 --s3-server "$server" --time-limit 540
}

step_peers_cold() {
    # Cold loads and the raw-read sweep, a fresh 3 GiB copy on disk
    # per load (about 5 minutes): a call of its own.
    install_wheels
    peers_run cold --modes cold --time-limit 540
}

step_distributed() {
    # zerohop.distributed on every GPU of the machine (the
    # nvidia-h200-x2 kind: run(kind="nvidia-h200-x2")), one process
    # per GPU over NCCL: the Python tests (gloo ranks) and
    # bench/distributed.py (cold read-once against every rank
    # reading the whole file, hot TP=2 against one GPU, DCP through
    # zerohop against DCP's own, sharded saves against the raw
    # parallel write rate; ZEROHOP_DIST_ARGS adds options).
    install_wheels; ensure_hot
    ZEROHOP_BIN="$PWD/.stage/bin/zerohop" python3 -m pytest -q -rs -p no:cacheprovider \
        python/tests/test_distributed.py python/tests/test_sharded_checkpoint.py 2>&1 | tee "$OUT/distributed-tests.txt"
    # shellcheck disable=SC2086 # ZEROHOP_DIST_ARGS is a list of options
    PYTHONUNBUFFERED=1 torchrun --nproc-per-node "$(nvidia-smi -L | wc -l)" bench/distributed.py \
        --zerohop .stage/bin/zerohop --cold-dir /var/tmp --hot $HOT \
        ${ZEROHOP_DIST_ARGS:-} --json-out "$OUT/distributed.json" 2>&1 | tee "$OUT/distributed.txt"
}
