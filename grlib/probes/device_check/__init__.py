"""The CUDA paths in one command on a bare GPU machine: versions, the Triton attention against the
padded reference, kernel timings, bf16 training steps of the paper preset; JSON result rows.

    python -m grlib.probes.device_check [OUT]       # make device-check; OUT: a folder (default $OUT)
    DEVICE_CHECK_INTERPRET=1 python -m grlib.probes.device_check OUT   # CPU, tiny shapes (about 20 s)

It needs only torch, triton, numpy and pyyaml besides the project tree (no polars, altair,
papermill, dvc, psutil or compiled grlib._C; no network, no install). Parts, each bounded in time
(a part out of time says so, keeps what it measured, and the next part runs; the whole check
stays under 8 minutes on an H100):

    versions     device, driver, CUDA, torch, triton (and fbgemm-gpu where importable)
    correctness  grlib.ops.triton.attention forward and every gradient (q, k, v, both bias tables)
                 against the padded reference on random ragged batches (empty and length-1
                 sequences in each), fp32 and bf16: the error of each, relative to the largest
                 value of the exact (float64 reference) tensor, is at most max(4 x the error of the
                 reference run in the same dtype, a floor per dtype); a mismatch fails the check
                 (exit status 1) after the rest has run. On CUDA, tl.dot multiplies fp32 inputs as
                 TF32, so the fp32 reference it is compared with runs its einsums with TF32 too
    gemm_peak    the bf16 GEMM peak of this device (square GEMMs, median of CUDA-event timings,
                 best size), before the kernels and again after the training steps: MFU divides
                 by the higher reading
    kernels      Triton vs the padded reference (and fbgemm-gpu's HSTU attention where importable)
                 at max_len 1024 and 4096, KuaiRand-27K-like lengths truncated and scaled
                 (grlib.data.synthetic.kuairand_lengths), fp32 and bf16, H x D of the paper preset (12 x 128):
                 forward and forward+backward medians of CUDA-event timings, peak memory
                 (torch.cuda.max_memory_allocated above the inputs); rows as bench_kernels'
    train        bf16 training steps of the paper preset (params.yaml scale paper-cpu: 16 x 12
                 layers, d 1536, max_len 4096, TurboGR's negative path) on batches of
                 KuaiRand-27K-like lengths cut at 4096, the largest batch of BATCHES that fits;
                 each step is grlib.train.step.TrainStep (forward, loss, backward, optimizer) as
                 `bench train` times it, here with CUDA events; MFU = grlib.perf's FLOPs per second
                 against the GPU's nominal bf16 peak (grlib.hardware.nominal.VENDOR_PEAKS, named in the
                 row) and against the bf16 GEMM peak measured in this run; the padded reference
                 attention (layers recomputed) is the baseline row of the same run; rows as
                 bench_train's

DEVICE_CHECK_INTERPRET=1 runs the same parts on CPU at tiny shapes under Triton's interpreter
(TRITON_INTERPRET=1; every other op on its PyTorch reference, no grlib._C); timings there are wall
clock and say nothing about a GPU. Without CUDA and without that variable it refuses in one line.

The output, OUT/device_check.json: {"device", "versions", "parts": {name: {"status", "seconds",
"note"}}, "checks": [...], "rows": [...]}, every row carrying its table (bench_kernels or
bench_train), scale and the result tables' metadata (run_id, git_rev, params_hash, hardware with
the device named, UTC timestamp) so that `python -m grlib import-rows OUT/device_check.json`
(grlib.cli.import_rows) appends them to results/tables/<table>/scale=<scale> beside the CPU rows.
"""
