"""The abuse suite's harness (tests/abuse, `scripts/benchmark abuse`): hostile requests sent
from a process of their own while interactive streams run, the streams' time to first token
and the servers' resident memory read meanwhile.

stack.py: the api's keys and limits; adapters.py: the hostile adapter folders; cases.py: the
hostile cases and what each must be answered; streams.py: the interactive streams;
memory.py: resident memory of the real processes; scenario.py: a quiet phase, then the attack.
"""
