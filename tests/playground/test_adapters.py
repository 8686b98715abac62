"""The adapter as a setting of the form and of Compare: what is sent, what a saved prediction
restores, what the page says about it (the browser test runs it against the real stack)."""

from __future__ import annotations

from typing import Any

from tritonbox_playground import display
from tritonbox_playground.adapters import BASE, choices, note_text, pick, sent, sha256_of
from tritonbox_playground.api_client import AdapterInfo, AdapterRef, PredictionView
from tritonbox_playground.compare import (
    COLUMN_FIELDS,
    base_vs_adapter,
    column_defaults,
    differences,
    restored,
)
from tritonbox_playground.form import defaults, from_prediction, generation_input

SHA = "3f2a9c1b7d4e" + "5" * 52


def made(adapter: str | None, output: str = "Ahoy", asked: str | None = None) -> PredictionView:
    sent_input: dict[str, Any] = {"prompt": "Tell me about the sea."}
    if asked or adapter:
        sent_input["adapter"] = asked or adapter
    return PredictionView(
        id=f"id-{adapter}",
        status="succeeded",
        input=sent_input,
        applied={"prompt": "Tell me about the sea.", "temperature": 0.0, "max_tokens": 30},
        output=output,
        finish_reason="length",
        urls={"web": f"http://api/p/id-{adapter}"},
        adapter=None if adapter is None else AdapterRef(name=adapter, sha256=SHA),
    )


def test_the_base_model_sends_no_adapter_and_an_adapter_is_sent_by_name() -> None:
    base = generation_input(defaults() | {"prompt": "Hi"})
    assert "adapter" not in base and defaults()["adapter"] == BASE
    for empty in ("", None, BASE, "  "):
        assert sent(empty) is None
    assert generation_input(defaults() | {"prompt": "Hi", "adapter": "pirate"})["adapter"] == (
        "pirate"
    )


def test_a_saved_prediction_restores_the_adapter_that_made_it() -> None:
    assert from_prediction(made("pirate")).values["adapter"] == "pirate"
    assert from_prediction(made(None)).values["adapter"] == BASE
    # Failed before it ran (an adapter the api did not know): what was asked, to fix it.
    failed = made(None, asked="gone").model_copy(update={"status": "failed"})
    assert from_prediction(failed).values["adapter"] == "gone"
    # Run again, it asks for the same adapter.
    assert generation_input(from_prediction(made("pirate")).values)["adapter"] == "pirate"


def test_the_picker_lists_the_base_first_then_each_adapter_with_its_short_hash() -> None:
    listed = [AdapterInfo(name="pirate", sha256=SHA), AdapterInfo(name="poet", sha256="")]
    assert choices(listed) == [(BASE, BASE), ("pirate · 3f2a9c1b7d4e", "pirate"), ("poet", "poet")]
    assert note_text(listed) == ""
    assert "No adapters are registered" in note_text([])
    assert "turned off" in note_text(None)


def test_base_vs_adapter_prefers_the_run_tabs_adapter_then_the_first_listed() -> None:
    assert pick(["pirate", "poet"], "poet") == "poet"
    assert pick(["pirate", "poet"], BASE) == "pirate"
    assert pick(["pirate"], "gone") == "pirate"
    assert pick([], BASE) is None
    first, second = base_vs_adapter("poet", 64)
    assert set(first) == set(COLUMN_FIELDS)
    assert first["adapter"] == BASE and second["adapter"] == "poet"
    # Greedy and otherwise identical: the answers differ by the fine-tune alone.
    assert first | {"adapter": "poet"} == second
    assert first["temperature"] == 0.0 and first["max_tokens"] == 64
    assert base_vs_adapter("poet")[0]["max_tokens"] == column_defaults(0)["max_tokens"]


def test_a_result_names_the_adapter_and_its_hash_next_to_the_permalink() -> None:
    shown = display.outcome(made("pirate"))
    assert "Permalink: [http://api/p/id-pirate](http://api/p/id-pirate) · adapter **pirate** " in (
        shown
    )
    assert "(sha256 `3f2a9c1b7d4e`)" in shown
    assert "adapter" not in display.outcome(made(None))
    odd = made("pirate").model_copy(
        update={"adapter": AdapterRef(name="a_b", sha256="<b>"), "urls": {}}
    )
    assert display.adapter(odd) == "adapter **a\\_b**"  # escaped, a hash that is no hex hidden
    assert "Made with the adapter **a\\_b**" in display.outcome(odd)


def test_a_comparison_says_base_or_adapter_and_reopens_each_side() -> None:
    pair = [made(None, "The sea is big."), made("pirate", "Arr, the sea!")]
    assert differences(pair) == ["Adapter base model", "Adapter pirate"]
    shared, columns = restored(pair)
    assert shared["prompt"] == "Tell me about the sea."
    assert [column["adapter"] for column in columns] == [BASE, "pirate"]
    assert differences([made("pirate"), made("pirate")]) == ["", ""]


def test_the_recent_list_says_which_adapter_answered() -> None:
    assert display.recent_row(made("pirate"))[2] == "api · pirate"
    assert display.recent_row(made(None))[2] == "api"


def test_a_snippet_takes_the_listed_hash_of_the_picked_adapter() -> None:
    listed = [AdapterInfo(name="pirate", sha256=SHA), AdapterInfo(name="poet", sha256="")]
    assert sha256_of(listed, "pirate") == SHA
    for unknown in ("poet", "gone", None):  # no hash listed, not listed, the base model
        assert sha256_of(listed, unknown) is None
    assert sha256_of(None, "pirate") is None  # adapters off on this api
