"""A chosen token on its way out: appended to its sequence, the sequence's end judged, and sent
alone or, while many sequences run, in a pair with the next one (`EngineTimings.pairs_from`:
each response costs ~0.8 ms of CPU on its way to the client, taken from the engine's cores)."""

from __future__ import annotations

from .request import EngineFinish, EngineObserver, Running
from .sampling import TokenChoice


class Responses:
    """Sends each sequence's tokens to its sink, and counts them and its ending."""

    def __init__(self, observer: EngineObserver, pairs_from: int) -> None:
        self._observer = observer
        self._pairs_from = pairs_from

    def advance(self, run: Running, choice: TokenChoice, running: int) -> bool:
        """Emit `run`'s chosen token, one of `running` sequences'; True when it has finished."""
        state, params, sink = run.state, run.request.params, run.request.sink
        state.append(choice.token)
        self._observer.on_tokens(1)
        finish: EngineFinish | None = None
        if choice.token == params.end_id:
            # The end token is sent too, with its log-prob (vLLM's and OpenAI's log-probs have
            # its entry; an evaluation harness scores it); the api keeps it out of the text. A
            # grammar's end without an end id (-1, sampling.py) is no token: not sent.
            finish = EngineFinish.STOP
        elif state.words.hits_stop_word(state.generated):
            finish = EngineFinish.STOP_WORD
        elif len(state.generated) >= params.max_tokens:
            finish = EngineFinish.LENGTH
        if finish is None and self._holds(run, running):
            run.held.append(choice)
            return False
        sent, run.held = [*run.held, *([choice] if choice.token >= 0 else [])], []
        top = [(c.top_ids, c.top_logprobs) for c in sent] if params.num_top_logprobs else []
        sink.on_tokens([c.token for c in sent], [c.logprob for c in sent], finish, top)
        if finish is not None:
            self._observer.on_finished(finish.value)
        return finish is not None

    def _holds(self, run: Running, running: int) -> bool:
        """Whether `run`'s token just made waits to go with its next one: from `pairs_from`
        running sequences on, not its first, not one after a held one, not one asked with its
        top log-probs."""
        return (
            running >= self._pairs_from
            and not run.held
            and len(run.state.generated) > 1
            and not run.request.params.num_top_logprobs
        )
