"""Triton's side of the cpu engine: what `triton/models/tensorrt_llm_cpu/1/model.py` imports."""
