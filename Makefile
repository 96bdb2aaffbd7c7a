# dgpo-edge developer entry points. Each target sets up what it needs.
#   make demo   build FactbookQA and show statistics and sample questions
#   make test   run the whole test suite
PY     ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.dev-installed

.PHONY: demo test clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/dgpo-edge data factbook --out out/factbookqa --samples 3

test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) out .pytest_cache .hypothesis
