# Two commands do all set-up on a fresh machine:
#   make demo   -> creates .venv-demo (core + torch) and runs `stepscope demo`
#   make test   -> creates .venv (everything, MindSpore included) and runs the whole suite
PY ?= python3
DEMO_VENV := .venv-demo
TEST_VENV := .venv
# pip takes torch 2.13.0 from the wheel on disk when this pin is in the same install.
TORCH_PIN := torch==2.13.0

.PHONY: demo test lint bench clean

$(DEMO_VENV)/.done: pyproject.toml
	$(PY) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/pip install -q --upgrade pip
	$(DEMO_VENV)/bin/pip install -q "$(TORCH_PIN)" -e ".[torch]"
	touch $@

$(TEST_VENV)/.done: pyproject.toml
	$(PY) -m venv $(TEST_VENV)
	$(TEST_VENV)/bin/pip install -q --upgrade pip
	$(TEST_VENV)/bin/pip install -q "$(TORCH_PIN)" "numpy<2" -e ".[torch,mindspore,hf,lightning,export,dask,alerts,dev]"
	# DeepSpeed is an sdist whose setup imports torch: built against the torch just installed
	# (no build isolation), no C++ ops compiled (DS_BUILD_OPS=0; ZeRO on the CPU needs none).
	# Measured: 7 s after torch. setuptools is named because Python 3.12's venv has none. The
	# range is pyproject's `deepspeed` extra (tests/thirdparty/test_deepspeed_style.py).
	$(TEST_VENV)/bin/pip install -q setuptools
	DS_BUILD_OPS=0 $(TEST_VENV)/bin/pip install -q --no-build-isolation "deepspeed>=0.14"
	touch $@

demo: $(DEMO_VENV)/.done
	$(DEMO_VENV)/bin/stepscope demo $(ARGS)

test: $(TEST_VENV)/.done
	$(TEST_VENV)/bin/python -m pytest -n 2 --dist loadgroup --reruns 2 $(PYTEST_ARGS)

lint: $(TEST_VENV)/.done
	$(TEST_VENV)/bin/ruff check src tests benchmarks
	$(TEST_VENV)/bin/mypy src

bench: $(TEST_VENV)/.done
	$(TEST_VENV)/bin/python benchmarks/overhead.py

clean:
	rm -rf $(DEMO_VENV) $(TEST_VENV) build dist *.egg-info
