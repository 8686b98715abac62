"""The names of the Triton models that make up the served ensemble, shared by the server that
renders and launches them and the api that checks they are ready and calls them."""

from __future__ import annotations

ENGINE_MODEL = "tensorrt_llm"
ENSEMBLE_MODEL = "ensemble"
# The ensemble's steps other than the engine, rendered from folders of the same name.
PIPELINE_MODELS = ("preprocessing", "postprocessing")
# Every model that must report ready before the ensemble can serve a request.
READY_MODELS = ("preprocessing", ENGINE_MODEL, "postprocessing", ENSEMBLE_MODEL)
