"""The playground's named endpoints through gradio_client, against the real stack: the real
playground process, in front of the real api, in front of the real Triton."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gradio_client import Client
from tritonbox_testing.api_process import RunningApi, launch_api
from tritonbox_testing.playground_process import RunningPlayground
from tritonbox_testing.ports import free_port

from tritonbox_playground.form import FIELDS

PROMPT = "The capital of France is"


@pytest.fixture
def client(playground_server: RunningPlayground) -> Iterator[Client]:
    client = Client(playground_server.url, verbose=False)
    yield client
    client.close()


def run(client: Client, **values: Any) -> tuple[str, str, str]:
    answer, result, prediction_id = client.predict(api_name="/run", **values)
    return str(answer), str(result), str(prediction_id)


def test_a_run_is_a_playground_prediction_with_a_permalink(
    client: Client, api: httpx.Client, playground_api: RunningApi
) -> None:
    job = client.submit(
        prompt=PROMPT, max_tokens=12, temperature=0, stop_words_list="zebra\n.", api_name="/run"
    )
    answer, result, prediction_id = job.result(timeout=120)
    assert "Paris" in answer and "." not in answer
    assert "Done" in result and "Ended by the stop word “.”" in result  # which of the two
    assert f"{playground_api.url}/p/{prediction_id}" in result
    assert "time to first token" in result and "tokens/s" in result
    # It streamed: the answer grew piece by piece before the final result.
    partial = [outputs[0] for outputs in job.outputs() if "Generating" in outputs[1]]
    assert partial and partial[-1] and answer.startswith(partial[-1])

    saved = api.get(f"/v1/predictions/{prediction_id}").json()
    assert saved["source"] == "playground" and saved["status"] == "succeeded"
    assert saved["finish_reason"] == "stop_word" and saved["output"] == answer
    assert saved["stop_word"] == "." and saved["input"]["stop_words_list"] == ["zebra", "."]


def test_open_prediction_restores_the_form_and_the_answer(client: Client) -> None:
    answer, _, prediction_id = run(
        client,
        mode="Chat",
        system_prompt="Answer in one word.",
        prompt="What is the capital of France?",
        max_tokens=8,
        temperature=0,
        seed="123",
        bad_words_list="Lyon\n\\n",
    )
    for reference in (prediction_id, f"http://somewhere/p/{prediction_id}"):
        outputs = client.predict(reference, api_name="/open_prediction")
        values = dict(zip(FIELDS, outputs, strict=False))
        assert values["mode"] == "Chat"
        assert values["system_prompt"] == "Answer in one word."
        assert values["prompt"] == "What is the capital of France?"
        assert values["max_tokens"] == 8 and values["temperature"] == 0
        assert values["seed"] == "123"
        assert values["bad_words_list"] == "Lyon\n\\n"
        assert outputs[len(FIELDS) + 1] == answer  # after the earlier-messages note
        assert outputs[-1] == prediction_id


def test_open_prediction_of_an_unknown_id_says_so(client: Client) -> None:
    outputs = client.predict("no-such-id", api_name="/open_prediction")
    assert "no prediction with id 'no-such-id'" in outputs[-2]
    assert outputs[0] == outputs[-1] == {"__type__": "update"}  # the form is left as it was


def test_the_apis_error_message_is_shown_and_the_page_stays_usable(client: Client) -> None:
    _, result, prediction_id = run(client, prompt=PROMPT, max_tokens=100_000)
    assert "Error" in result and "Max tokens" in result and "at most 512" in result
    assert prediction_id == ""
    _, result, prediction_id = run(client, prompt=" ", max_tokens=4)
    assert "Write a prompt first" in result and prediction_id == ""  # nothing was sent
    answer, result, _ = run(client, prompt=PROMPT, max_tokens=4, temperature=0)
    assert answer and "Done" in result


def test_stop_cancels_the_prediction_on_the_api(client: Client, api: httpx.Client) -> None:
    job = client.submit(
        mode="Chat",
        prompt="Write a long story about a dragon who learns to cook.",
        max_tokens=400,
        min_tokens=390,  # no early end: the test stops it long before
        seed="1",
        api_name="/run",
    )
    deadline = time.monotonic() + 90
    while not any(outputs[0] for outputs in job.outputs()):  # some text streamed
        assert time.monotonic() < deadline, "no text streamed"
        assert not job.done(), job.result()
        time.sleep(0.1)
    client.predict(api_name="/stop")
    answer, result, prediction_id = job.result(timeout=60)
    assert "Stopped" in result and prediction_id in result
    saved = api.get(f"/v1/predictions/{prediction_id}").json()
    assert saved["status"] == "canceled" and saved["finish_reason"] == "canceled"
    assert saved["output"] == answer and saved["metrics"]["completion_tokens"] < 400


def test_stop_without_a_run_is_harmless(client: Client) -> None:
    assert client.predict(api_name="/stop") in (None, ())


def test_recent_lists_the_playgrounds_runs(client: Client) -> None:
    _, _, prediction_id = run(client, prompt=PROMPT, max_tokens=3, temperature=0)
    table = client.predict("playground", api_name="/recent")
    rows = table["data"]
    assert rows[0][-1] == prediction_id  # newest first
    assert table["headers"] == ["when", "status", "from", "prompt", "answer", "id"]
    # "playground", or "playground · <adapter>" for a run a fine-tune answered (other tests')
    assert all(row[2].split(" · ")[0] == "playground" for row in rows), rows
    assert rows[0][2] == "playground"  # this run: the base model


def test_the_python_snippet_runs_against_the_api(client: Client, tmp_path: Path) -> None:
    curl, python, openai = client.predict(
        prompt=PROMPT, max_tokens=6, temperature=0, stop_words_list=".", api_name="/snippets"
    )
    assert '"stop_words_list": [\n      "."\n    ]' in curl
    assert "client.completions.create(" in openai
    script = tmp_path / "snippet.py"
    script.write_text(python)
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    assert "permalink:" in done.stdout and "Paris" in done.stdout


def test_an_api_that_is_down_is_reported(launch: Callable[..., RunningPlayground]) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    playground = launch(down)
    client = Client(playground.url, verbose=False)
    for _ in range(2):  # and again: the page keeps working
        answer, result, _ = run(client, prompt=PROMPT, max_tokens=4)
        assert answer == "" and "cannot be reached" in result and "Is it running?" in result
    assert client.predict("playground", api_name="/recent")["data"] in (
        [],
        [["", "", "", "", "", ""]],
    )
    client.close()


def test_the_api_key_stays_on_the_server(
    triton_server: Any, tmp_path: Path, launch: Callable[..., RunningPlayground]
) -> None:
    secret = "playground-test-key-8d1f"
    keyed = launch_api(triton_server, tmp_path / "keyed-api", api_key=secret)
    try:
        with_key = launch(keyed.url, api_key=secret)
        client = Client(with_key.url, verbose=False)
        answer, result, _ = run(client, prompt=PROMPT, max_tokens=4, temperature=0)
        assert answer and "Done" in result
        curl, _, _ = client.predict(prompt=PROMPT, api_name="/snippets")
        assert "Bearer $API_KEY" in curl
        for path in ("/", "/config", "/gradio_api/info"):
            assert secret not in httpx.get(f"{with_key.url}{path}", timeout=10).text
        client.close()

        without_key = launch(keyed.url)
        client = Client(without_key.url, verbose=False)
        _, result, _ = run(client, prompt=PROMPT, max_tokens=4)
        assert "Error" in result and "API" in result
        client.close()
    finally:
        keyed.stop()


def test_several_people_generate_at_once(
    playground_server: RunningPlayground, api: httpx.Client
) -> None:
    # Gradio's default (one run at a time per event) would hold the second run in the queue
    # until the first ended; PLAYGROUND_CONCURRENCY lets both stream together.
    people = [Client(playground_server.url, verbose=False) for _ in range(2)]
    jobs = [
        person.submit(prompt=f"Story number {n}:", max_tokens=200, min_tokens=190, api_name="/run")
        for n, person in enumerate(people)
    ]
    deadline = time.monotonic() + 90
    while not all(any(outputs[0] for outputs in job.outputs()) for job in jobs):
        assert time.monotonic() < deadline, "the runs did not stream side by side"
        assert not any(job.done() for job in jobs), [job.result() for job in jobs]
        time.sleep(0.1)
    people[0].predict(api_name="/stop")  # Stop ends only its own session's run
    _, result, first_id = jobs[0].result(timeout=60)
    assert "Stopped" in result and not jobs[1].done()
    people[1].predict(api_name="/stop")
    _, _, second_id = jobs[1].result(timeout=60)
    for prediction_id in (first_id, second_id):
        assert api.get(f"/v1/predictions/{prediction_id}").json()["status"] == "canceled"
    for person in people:
        person.close()


def test_compare_runs_each_setting_as_its_own_prediction(client: Client, api: httpx.Client) -> None:
    outputs = client.predict(
        prompt=PROMPT,
        a_max_tokens=4,
        b_max_tokens=4,
        b_stop_words_list="Paris",
        api_name="/compare",
    )
    answers, results, (share, link) = outputs[:3], outputs[3:6], outputs[6:]
    ids = link.removeprefix("?compare=").split(",")
    assert link.startswith("?compare=") and len(ids) == 2  # the browser adds its own address
    assert f"({link})" in share
    first, second = (api.get(f"/v1/predictions/{i}").json() for i in ids)
    assert first["applied"]["temperature"] == 0 and second["applied"]["temperature"] == 1
    assert first["applied"]["seed"] == second["applied"]["seed"]  # one shared seed
    assert second["applied"]["stop_words_list"] == ["Paris"]
    assert [first["output"], second["output"]] == list(answers[:2]) and answers[2] == ""
    assert "**Setting A**: Temperature 0" in results[0] and "Stop words “Paris”" in results[1]
    assert results[2] == ""
