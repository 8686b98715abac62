"""Structured output on the cpu engine: guides compiled from TensorRT-LLM's inputs (grammar.py),
and the real default model constrained by them, in-process through the in-flight batcher."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tritonbox_common.errors import RequestError
from tritonbox_triton.engine.grammar import GuideCompiler
from tritonbox_triton.engine.params import EngineLimits, SamplingParams
from tritonbox_triton.engine.scheduler import EngineFinish, EngineRequest, InflightBatcher
from tritonbox_triton.engine.words import text_decoder

EOS = 2
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer"},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "address"],
    "additionalProperties": False,
}


def strings(**values: str) -> dict[str, np.ndarray[Any, Any]]:
    """Input tensors as Triton hands a TYPE_STRING [1] input to a Python model: bytes."""
    return {name: np.array([[value.encode()]], dtype=np.object_) for name, value in values.items()}


@pytest.fixture(scope="module")
def compiler(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel) -> GuideCompiler:
    return GuideCompiler(tokenizer, int(model.config.vocab_size), cache_size=2)


def test_no_inputs_no_guide(compiler: GuideCompiler) -> None:
    assert compiler.from_tensors({}) is None


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"guided_decoding_guide_type": "xml"}, "guided_decoding_guide_type: must be one of json"),
        ({"guided_decoding_guide_type": "regex"}, "guided_decoding_guide: required for"),
        ({"guided_decoding_guide": "[0-9]+"}, "guided_decoding_guide: needs"),
        (
            {"guided_decoding_guide_type": "regex", "guided_decoding_guide": "(a"},
            "guided_decoding_guide: invalid regex: Regex parsing error",
        ),
        (
            {"guided_decoding_guide_type": "json_schema", "guided_decoding_guide": "{"},
            "guided_decoding_guide: invalid json_schema:",
        ),
        (
            {"guided_decoding_guide_type": "json_schema", "guided_decoding_guide": '{"type": 5}'},
            "guided_decoding_guide: invalid json_schema:",
        ),
        (
            {"guided_decoding_guide_type": "ebnf_grammar", "guided_decoding_guide": "root ::= ("},
            "guided_decoding_guide: invalid ebnf_grammar: EBNF parser error",
        ),
    ],
)
def test_a_bad_guide_is_a_request_error_naming_the_input(
    compiler: GuideCompiler, inputs: dict[str, str], message: str
) -> None:
    with pytest.raises(RequestError) as raised:
        compiler.from_tensors(strings(**inputs))
    assert str(raised.value).startswith(message)
    assert ".cc:" not in str(raised.value)  # xgrammar's source location is cut


def test_compiled_guides_are_cached_least_recently_used_first_out(
    compiler: GuideCompiler,
) -> None:
    first = compiler.compile("regex", "a+")
    assert compiler.compile("regex", "a+") is first
    second = compiler.compile("json", None)
    assert compiler.compile("regex", "a+") is first  # now the most recent
    compiler.compile("regex", "b+")  # evicts `json`, the least recent (cache_size 2)
    assert compiler.cached() == 2
    assert compiler.compile("regex", "a+") is first
    assert compiler.compile("json", None) is not second


def test_mask_allows_only_what_the_grammar_allows_in_any_float_dtype(
    compiler: GuideCompiler, tokenizer: PreTrainedTokenizerBase
) -> None:
    guide = compiler.compile("regex", "(yes|no)")
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        state = guide.matcher(EOS)
        logits = torch.zeros(int(compiler_vocab(compiler)), dtype=dtype)
        state.mask(logits)
        allowed = (~torch.isneginf(logits)).nonzero().flatten().tolist()
        assert {tokenizer.decode([i]) for i in allowed} == {"y", "ye", "yes", "n", "no"}
        assert state.accept(tokenizer.encode("yes", add_special_tokens=False)[0])
        logits = torch.zeros_like(logits)
        state.mask(logits)
        assert (~torch.isneginf(logits)).nonzero().flatten().tolist() == [EOS]
        assert state.accept(EOS) and state.finished


def compiler_vocab(compiler: GuideCompiler) -> int:
    return int(compiler.compile("json", None).compiled.tokenizer_info.vocab_size)


# --- the real model, constrained -------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> Iterator[InflightBatcher]:
    batcher = InflightBatcher(
        model, text_decoder(tokenizer), EngineLimits(256, 128, 8192), max_batch_size=8
    )
    batcher.start()
    yield batcher
    batcher.stop()


def chat(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer(rendered).input_ids)


def run(engine: InflightBatcher, sink: Any, prompt: list[int], **params: Any) -> Any:
    settings = {"max_tokens": 96, "end_id": EOS, "pad_id": EOS, "temperature": 0.0, **params}
    engine.submit(
        EngineRequest(
            prompt=prompt, params=SamplingParams(**settings), sink=sink, stop_words=[], bad_words=[]
        )
    )
    return sink


def test_guided_rows_beside_a_free_row_each_keep_their_own_rule(
    engine: InflightBatcher,
    compiler: GuideCompiler,
    tokenizer: PreTrainedTokenizerBase,
    make_sink: Any,
) -> None:
    """One batch: a nested strict schema (greedy and sampled), builtin JSON, a regex, a choice
    as a grammar, and an unguided row that must be the model's own greedy answer."""
    prompt = chat(tokenizer, "Describe a person as JSON.")
    schema = compiler.compile("json_schema", json.dumps(SCHEMA))
    free_alone = run(engine, make_sink(), prompt, max_tokens=24).wait().tokens
    sinks = {
        "schema": run(engine, make_sink(), prompt, guide=schema),
        "sampled": run(engine, make_sink(), prompt, guide=schema, temperature=1.0, seed=7),
        "json": run(engine, make_sink(), prompt, guide=compiler.compile("json", None)),
        "regex": run(engine, make_sink(), prompt, guide=compiler.compile("regex", r"[0-9]{3}")),
        "choice": run(
            engine,
            make_sink(),
            prompt,
            guide=compiler.compile("ebnf_grammar", 'root ::= "red" | "green"'),
        ),
        "free": run(engine, make_sink(), prompt, max_tokens=24),
    }
    # The end token that ended an answer comes last (with its log-prob); the text is before it.
    texts = {
        name: str(tokenizer.decode([t for t in sink.wait().tokens if t != EOS]))
        for name, sink in sinks.items()
    }
    for name in ("schema", "sampled", "regex", "choice"):
        assert sinks[name].finish is EngineFinish.STOP, (name, texts[name])
        assert sinks[name].tokens[-1] == EOS and EOS not in sinks[name].tokens[:-1]
    for name in ("schema", "sampled"):
        value = json.loads(texts[name])
        assert set(value) == {"name", "age", "address"} and isinstance(value["age"], int)
        assert set(value["address"]) == {"city"}
    # Any JSON may be long: complete when it ended, else a JSON value's start.
    if sinks["json"].finish is EngineFinish.STOP:
        json.loads(texts["json"])
    else:
        assert texts["json"].lstrip()[0] in '[{"-0123456789tfn', texts["json"]
    assert re.fullmatch(r"[0-9]{3}", texts["regex"])
    assert texts["choice"] in ("red", "green")
    assert sinks["free"].tokens == free_alone


def test_without_an_end_id_the_grammar_still_ends_the_answer(
    engine: InflightBatcher,
    compiler: GuideCompiler,
    tokenizer: PreTrainedTokenizerBase,
    make_sink: Any,
) -> None:
    """end_id -1 (ignore_eos): the grammar's end ends it, with no end token in the output."""
    prompt = chat(tokenizer, "Pick a number.")
    guide = compiler.compile("regex", r"[0-9]{2}")
    sink = run(engine, make_sink(), prompt, end_id=-1, guide=guide).wait()
    assert sink.finish is EngineFinish.STOP
    assert re.fullmatch(r"[0-9]{2}", str(tokenizer.decode(sink.tokens)))


def test_min_tokens_cannot_push_an_answer_out_of_its_grammar(
    engine: InflightBatcher,
    compiler: GuideCompiler,
    tokenizer: PreTrainedTokenizerBase,
    make_sink: Any,
) -> None:
    prompt = chat(tokenizer, "Yes or no?")
    guide = compiler.compile("regex", "(yes|no)")
    sink = run(engine, make_sink(), prompt, min_tokens=10, guide=guide).wait()
    assert sink.finish is EngineFinish.STOP
    assert sink.tokens[-1] == EOS  # sent with the answer, the grammar's one stop token
    assert tokenizer.decode(sink.tokens[:-1]) in ("yes", "no")
