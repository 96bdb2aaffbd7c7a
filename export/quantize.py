"""K-quants through llama.cpp: `llama_model_quantize` from llama-cpp-python on an F16 GGUF.

gguf's numpy code cannot make K-quants (Q4_K, Q5_K, Q6_K raise NotImplementedError), so those
types, and llama.cpp's per-tensor mixes ("_M" = some tensors at higher precision), come from
llama.cpp itself. Note for Qwen2.5-0.5B: hidden size 896 is not a multiple of 256, so llama.cpp
falls back to other types for many tensors; measure before choosing a K-quant for it.
"""

from __future__ import annotations

from pathlib import Path

from dgpo_edge.errors import InputError

# --quant name -> llama.cpp's LLAMA_FTYPE_MOSTLY_* constant name.
LLAMA_CPP_QUANTS = {
    "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
    "q4_k_s": "LLAMA_FTYPE_MOSTLY_Q4_K_S",
    "q5_k_m": "LLAMA_FTYPE_MOSTLY_Q5_K_M",
    "q6_k": "LLAMA_FTYPE_MOSTLY_Q6_K",
}


def import_llama_cpp():
    """llama_cpp, or InputError telling the user which extra installs it."""
    try:
        import llama_cpp
    except ImportError:
        raise InputError("llama-cpp-python is not installed (pip install 'dgpo-edge[export]')") \
            from None
    return llama_cpp


def quantize_gguf(src: str | Path, dst: str | Path, quant: str, threads: int = 2) -> Path:
    """Quantize the F16 GGUF `src` into `dst` (written directly: callers pass a temp path)."""
    import ctypes

    llama_cpp = import_llama_cpp()
    if quant not in LLAMA_CPP_QUANTS:
        raise InputError(f"llama.cpp quantization {quant!r} unknown "
                         f"(choose from {', '.join(LLAMA_CPP_QUANTS)})")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, LLAMA_CPP_QUANTS[quant])
    params.nthread = threads
    from llama_cpp._utils import suppress_stdout_stderr

    # llama.cpp logs a line per tensor (and every K-quant fallback) straight to fd 2
    with suppress_stdout_stderr(disable=False):
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(),
                                            ctypes.byref(params))
    if rc != 0:
        raise InputError(f"llama.cpp could not quantize to {quant} (status {rc})", src)
    return Path(dst)
