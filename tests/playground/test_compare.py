"""Compare's own logic (the browser tests run it for real): shared seeds, the share link, what
differs between settings, and what the page says the stop words and bad words did."""

from __future__ import annotations

from typing import Any

from tritonbox_playground import display
from tritonbox_playground.api_client import PredictionView
from tritonbox_playground.compare import (
    COLUMN_FIELDS,
    column_defaults,
    differences,
    parse_ids,
    restored,
    share_query,
    with_shared_seed,
)


def prediction(output: str = "", finish_reason: str = "stop", **applied: Any) -> PredictionView:
    sent = {"prompt": "List the days: Monday,", "stop_words_list": [], "bad_words_list": []}
    return PredictionView(
        id=f"id-{len(output)}-{finish_reason}",
        status="succeeded",
        input={"prompt": sent["prompt"]},
        applied=sent | {"temperature": 0.0, "max_tokens": 40, "seed": 7} | applied,
        output=output,
        finish_reason=finish_reason,
        metrics={"completion_tokens": 5},
    )


def test_settings_start_different_so_a_first_comparison_shows_something() -> None:
    first, second = column_defaults(0), column_defaults(1)
    assert set(first) == set(COLUMN_FIELDS)
    assert first["temperature"] != second["temperature"]


def test_columns_without_a_seed_share_one_and_a_given_seed_is_kept() -> None:
    columns = with_shared_seed([{"seed": ""}, {"seed": None}, {"seed": "42"}])
    assert columns[0]["seed"] == columns[1]["seed"] and columns[0]["seed"].isdigit()
    assert columns[2]["seed"] == "42"
    assert with_shared_seed([{"seed": ""}])[0]["seed"] != "" and len(columns[0]["seed"]) <= 10


def test_the_share_link_holds_only_prediction_ids() -> None:
    assert share_query(["a1", "b2"]) == "?compare=a1,b2"
    assert parse_ids(" a1 , http://host/p/b2/ ,, c3,d4") == ["a1", "b2", "c3"]
    assert parse_ids("") == [] and parse_ids(None) == []


def test_each_setting_says_how_it_differs() -> None:
    cold = prediction("Tuesday", temperature=0.0, seed=1)
    warm = prediction("Tues", temperature=1.0, seed=2, stop_words_list=["day"])
    assert differences([cold, warm]) == [
        "Temperature 0 · Stop words none",
        "Temperature 1 · Stop words “day”",
    ]  # the seeds differ too, but by chance: not shown
    assert differences([cold, cold]) == ["", ""]


def test_a_comparison_reopens_with_each_settings_values() -> None:
    shared, columns = restored([prediction(temperature=0.0), prediction(temperature=1.0)])
    assert shared["prompt"] == "List the days: Monday,"
    assert [column["temperature"] for column in columns] == [0.0, 1.0]
    assert columns[0]["seed"] == "7"


def test_the_stop_word_that_ended_the_answer_is_named_with_where() -> None:
    one = prediction(" Tuesday, Wednesday,", "stop_word", stop_words_list=["Thursday"])
    notes = display.words_notes(one)
    assert notes == [
        "✂️ Ended by the stop word “Thursday”: the answer stops right before it, after 20 "
        "characters (5 tokens); the stop word itself is not shown.",
        "Where: Tuesday, Wednesday, ✂ “Thursday”",
    ]
    long = one.model_copy(update={"output": "Monday, " * 10})
    assert display.words_notes(long)[1] == (
        "Where: …Monday, Monday, Monday, Monday, Monday, ✂ “Thursday”"
    )
    several = prediction("x", "stop_word", stop_words_list=["Thursday", "\n"])
    assert "one of “Thursday”, “\\\\n”" in display.words_notes(several)[0]
    recorded = several.model_copy(update={"stop_word": "\n"})  # once the api says which
    assert "the stop word “\\\\n”" in display.words_notes(recorded)[0]
    missed = prediction("x", "length", stop_words_list=["Sunday"])
    assert display.words_notes(missed) == ["Stop words “Sunday”: not reached."]


def test_banned_words_are_said_next_to_the_answer() -> None:
    banned = prediction("apple", bad_words_list=["cherry", "cherries"])
    assert display.words_notes(banned) == [
        "Banned (the model could not write them): “cherry”, “cherries”."
    ]
    assert "Banned" in display.outcome(banned)
    assert display.words_notes(prediction("apple")) == []


def test_the_recent_list_shows_what_was_asked_in_a_chat() -> None:
    chat = PredictionView(
        id="c",
        status="succeeded",
        input={"messages": [{"role": "system", "content": "Be brief."},
                            {"role": "user", "content": "Capital of France?"}]},
        applied={"prompt": None, "messages": None, "engine_prompt": "<s>..."},
    )  # fmt: skip
    assert display.prompt_of(chat) == "Capital of France?"
    assert display.recent_row(chat)[3] == "Capital of France?"
