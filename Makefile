# grlib workbench. Every target installs what it needs into .venv on first use, and skips the
# install when nothing it depends on changed (stamp files inside .venv).
#
#   make reproduce   dvc repro at params.yaml's scale (laptop): tables, figures, executed notebooks; then
#                    the claims at a glance (python -m grlib claims)
#   make test        pytest: unit, property, pipeline, notebooks (nbmake)
#   make lab         JupyterLab on notebooks/ (127.0.0.1:8888)
#   make bench       every benchmark command at the laptop scale (--record: rows in results/tables/bench_*)
#   make setup       only the environment and the compiled kernels
#   make clean-tmp   list and remove what killed runs left (python -m grlib clean; DRY_RUN=1: only list)

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
export PATH := $(abspath $(VENV))/bin:$(PATH)
export MAX_JOBS ?= 2
# pytest-xdist workers of `make test`: 2 fill 2 cores (most tests wait on subprocesses: kernels,
# gloo ranks, papermill), 9.7 min against 15.5 min in one process
TEST_WORKERS ?= 2

DEPS_STAMP := $(VENV)/.deps-installed
KERNEL_STAMP := $(VENV)/.kernels-built
TEST_STAMP := $(VENV)/.test-deps-installed
KERNEL_SOURCES := $(wildcard kernels/cpu/*.cpp kernels/cpu/*.h) setup.py

.PHONY: setup reproduce test lab bench clean-venv clean-tmp

setup: $(KERNEL_STAMP)

$(DEPS_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q torch==2.13.0
	GRLIB_SKIP_EXT=1 $(PIP) install -q --no-build-isolation -e '.[cpu,test]'
	mkdir -p $(VENV)/etc/ipython
	printf "c.IPKernelApp.log_level = 'ERROR'\n" > $(VENV)/etc/ipython/ipython_kernel_config.py
	touch $@

$(KERNEL_STAMP): $(DEPS_STAMP) $(KERNEL_SOURCES)
	$(PY) setup.py -q build_ext --inplace
	$(PY) -c "import grlib._C, torch; print('grlib._C built, openmp:', grlib._C.openmp)"
	touch $@

$(TEST_STAMP): $(DEPS_STAMP)
	GRLIB_SKIP_EXT=1 $(PIP) install -q --no-build-isolation -e '.[cpu,test,interpret]'
	touch $@

.dvc/config: | $(DEPS_STAMP)
	test -d .git || git init -q
	dvc init -q
	dvc config core.analytics false

# ends with the claims at a glance (python -m grlib claims: from results/summary/<scale>.md, within 120
# columns); every stage's metrics: dvc metrics show
reproduce: $(KERNEL_STAMP) .dvc/config
	dvc repro
	$(PY) -m grlib claims

test: $(KERNEL_STAMP) $(TEST_STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS)

lab: $(KERNEL_STAMP)
	jupyter lab --no-browser --ip=127.0.0.1 --port=8888 notebooks/

bench: $(KERNEL_STAMP)
	$(PY) -m grlib bench ops --scale laptop --record --json results/metrics/laptop/bench_ops.json
	$(PY) -m grlib bench train --scale laptop --record --json results/metrics/laptop/bench_train.json
	$(PY) -m grlib bench data --scale laptop --record --rows 5000000 10000000 --json results/metrics/laptop/bench_data.json
	$(PY) -m grlib bench kernels --scale laptop --record --json results/metrics/laptop/bench_kernels.json
	$(PY) -m grlib bench balance --scale laptop --record --json results/metrics/laptop/bench_balance.json
	$(PY) -m grlib bench a2a --scale laptop --record --json results/metrics/laptop/bench_a2a.json
	$(PY) -m grlib bench pipeline --scale laptop --record --json results/metrics/laptop/bench_pipeline.json
	$(PY) -m grlib bench negatives --scale laptop --record --seeds 0 1 2 --half-formats fp16 bf16 --train-steps 60 --eval-users 0 --timing-rounds 5 --json results/metrics/laptop/bench_negatives.json

clean-venv:
	rm -rf $(VENV) build

# temporary files and folders of grlib runs that were killed (kill -9, a power cut): data/, results/, the
# download cache (its resumable .part files are listed, kept); CLEAN_PATHS="ckpt runs/a": checkpoint folders too
clean-tmp: $(DEPS_STAMP)
	$(PY) -m grlib clean $(if $(DRY_RUN),--dry-run) $(foreach p,$(CLEAN_PATHS),--path $(p))

# TorchRec 1.8.0, the peer of grlib.distributed.torchrec_peer (tests/test_torchrec_peer.py skip without it). Its
# wheel requires the CUDA fbgemm-gpu, so it goes in with --no-deps beside fbgemm-gpu-cpu, after the
# [torchrec] extra (its other dependencies).
TORCHREC_STAMP := $(VENV)/.torchrec-installed
.PHONY: setup-torchrec
setup-torchrec: $(TORCHREC_STAMP)

$(TORCHREC_STAMP): $(DEPS_STAMP)
	GRLIB_SKIP_EXT=1 $(PIP) install -q --no-build-isolation -e '.[cpu,torchrec]'
	$(PIP) install -q --no-deps torchrec==1.8.0
	$(PY) -c "from grlib.distributed.torchrec_peer import available; ok, why = available(); assert ok, why; print('torchrec ready')"
	touch $@

# The CUDA paths on a bare GPU machine (torch, triton, numpy, pyyaml; no .venv, no grlib._C, nothing
# installed): grlib/probes/device_check/, in under 8 minutes on an H100. Its rows go to
# $(DEVICE_CHECK_OUT)/device_check.json ($OUT where set); on the CPU side
# `python -m grlib import-rows DIR/device_check.json` appends them to results/tables/. With
# DEVICE_CHECK_INTERPRET=1 it runs on CPU at tiny shapes under the Triton interpreter (.venv's triton).
DEVICE_CHECK_OUT ?= $(if $(OUT),$(OUT),results/adhoc/device_check)
.PHONY: device-check
ifeq ($(DEVICE_CHECK_INTERPRET),1)
device-check: $(TEST_STAMP)
	$(PY) -m grlib.probes.device_check $(DEVICE_CHECK_OUT)
else
device-check:
	$(if $(wildcard $(PY)),$(PY),$(PYTHON)) -m grlib.probes.device_check $(DEVICE_CHECK_OUT)
endif
