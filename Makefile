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
