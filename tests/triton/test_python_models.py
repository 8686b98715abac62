"""The preprocessing/postprocessing model.py glue, run against a stand-in for Triton's
`triton_python_backend_utils` (the real server is exercised under tests/triton/server)."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import pytest

from tritonbox_triton.render import templates_dir


class Tensor:
    def __init__(self, name: str, array: npt.NDArray[Any]) -> None:
        self._name, self._array = name, array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> npt.NDArray[Any]:
        return self._array


class TritonError:
    INVALID_ARG = "INVALID_ARG"

    def __init__(self, message: str, code: str | None = None) -> None:
        self.text, self.code = message, code

    def message(self) -> str:
        return self.text


class InferenceResponse:
    def __init__(self, output_tensors: list[Tensor], error: TritonError | None = None) -> None:
        self.outputs = {tensor.name(): tensor.as_numpy() for tensor in output_tensors}
        self.error = error


class Request:
    def __init__(self, **arrays: npt.NDArray[Any]) -> None:
        self.tensors = {name: Tensor(name, array) for name, array in arrays.items()}


class Logger:
    lines: ClassVar[list[str]] = []

    @classmethod
    def log_info(cls, message: str) -> None:
        cls.lines.append(message)

    log_error = log_warn = log_verbose = log_info


def _fake_pb_utils() -> types.ModuleType:
    module = types.ModuleType("triton_python_backend_utils")
    attributes: dict[str, Any] = {
        "Tensor": Tensor,
        "TritonError": TritonError,
        "InferenceResponse": InferenceResponse,
        "Logger": Logger,
        "get_input_tensor_by_name": lambda request, name: request.tensors.get(name),
    }
    for name, value in attributes.items():
        setattr(module, name, value)
    return module


ModelFactory = Callable[[str, dict[str, str]], Any]


@pytest.fixture
def load_model(monkeypatch: pytest.MonkeyPatch) -> ModelFactory:
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", _fake_pb_utils())

    def load(name: str, parameters: dict[str, str]) -> Any:
        path = templates_dir() / name / "1" / "model.py"
        spec = importlib.util.spec_from_file_location(f"_tritonbox_test_{name}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        model = module.TritonPythonModel()
        config = {"parameters": {k: {"string_value": v} for k, v in parameters.items()}}
        model.initialize({"model_config": json.dumps(config)})
        return model

    return load


def text(*values: str) -> npt.NDArray[Any]:
    array = np.empty((1, len(values)), dtype=object)
    array[0] = [value.encode() for value in values]
    return array


def int32(value: int) -> npt.NDArray[Any]:
    return np.array([[value]], dtype=np.int32)


def test_preprocessing_answers_each_request_on_its_own(
    load_model: ModelFactory, tokenizer_dir: Path, tokenizer: Any
) -> None:
    model = load_model(
        "preprocessing",
        {"tokenizer_dir": str(tokenizer_dir), "max_input_len": "16", "max_output_len": "8"},
    )
    good = Request(QUERY=text("Hello"), REQUEST_OUTPUT_LEN=int32(4), STOP_WORDS_DICT=text("Paris"))
    empty = Request(QUERY=text(""), REQUEST_OUTPUT_LEN=int32(4))
    too_long = Request(QUERY=text("word " * 40), REQUEST_OUTPUT_LEN=int32(4))
    responses = model.execute([good, empty, too_long])

    assert len(responses) == 3
    assert responses[0].error is None
    assert responses[0].outputs["INPUT_ID"].tolist() == [tokenizer.encode("Hello")]
    assert responses[0].outputs["STOP_WORDS_IDS"].tolist() == [[[38634, 7042], [1, 2]]]
    assert responses[0].outputs["OUT_END_ID"].tolist() == [[2]]
    assert responses[1].error.message() == "QUERY: the prompt is empty"
    assert responses[1].error.code == TritonError.INVALID_ARG
    assert "more than max_input_len 16" in responses[2].error.message()


def test_preprocessing_refuses_an_unrendered_config(
    load_model: ModelFactory, tokenizer_dir: Path
) -> None:
    with pytest.raises(ValueError, match="'max_input_len' was never rendered"):
        load_model(
            "preprocessing",
            {
                "tokenizer_dir": str(tokenizer_dir),
                "max_input_len": "${max_input_len}",
                "max_output_len": "8",
            },
        )


def test_postprocessing_decodes_and_passes_log_probs_through(
    load_model: ModelFactory, tokenizer_dir: Path, tokenizer: Any
) -> None:
    model = load_model("postprocessing", {"tokenizer_dir": str(tokenizer_dir)})
    ids = tokenizer.encode(" Paris.")
    plain = Request(
        TOKENS_BATCH=np.array([[[*ids, 2]]], dtype=np.int32),
        SEQUENCE_LENGTH=np.array([[len(ids)]], dtype=np.int32),
    )
    with_log_probs = Request(
        TOKENS_BATCH=np.array([[ids]], dtype=np.int32),
        SEQUENCE_LENGTH=np.array([[len(ids)]], dtype=np.int32),
        CUM_LOG_PROBS=np.array([[-1.5]], dtype=np.float32),
        OUTPUT_LOG_PROBS=np.array([[[-1.0, -0.5]]], dtype=np.float32),
    )
    broken = Request(TOKENS_BATCH=np.zeros((1, 3), np.int32), SEQUENCE_LENGTH=int32(3))
    first, second, third = model.execute([plain, with_log_probs, broken])

    assert set(first.outputs) == {"OUTPUT"}  # no log probs in, none out
    assert first.outputs["OUTPUT"].tolist() == [[b" Paris."]]
    assert second.outputs["OUTPUT"].tolist() == [[b" Paris."]]
    assert second.outputs["OUT_CUM_LOG_PROBS"].tolist() == [[-1.5]]
    assert second.outputs["OUT_OUTPUT_LOG_PROBS"].tolist() == [[[-1.0, -0.5]]]
    assert first.error is None and second.error is None
    assert "postprocessing failed" in third.error.message()
