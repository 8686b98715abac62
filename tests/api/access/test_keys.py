"""Named keys and their roles, read from API_KEY, API_KEYS and API_KEYS_FILE: what is accepted,
what each role may do, and that nothing of a secret reaches an error (the live api's answers:
test_api_key.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tritonbox_api.keys import DEFAULT_NAME, KeyRing, Role, load_keys
from tritonbox_api.settings import ApiSettings

SETTINGS: Any = ApiSettings  # built from plain strings, as the environment gives them
HASHED = hashlib.sha256(b"ci-secret").hexdigest()


def _ring(**settings: str) -> KeyRing:
    return KeyRing(SETTINGS(_env_file=None, **settings).keys())


def test_one_api_key_holds_both_roles_as_default() -> None:
    ring = _ring(api_key="only-one")
    key = ring.identify("only-one")
    assert key is not None and key.name == DEFAULT_NAME
    assert key.has(Role.USE) and key.has(Role.MANAGE)
    assert ring.identify("only-on") is None and ring.identify("") is None
    assert _ring().open and not ring.open


def test_named_keys_with_roles_plain_or_hashed(tmp_path: Path) -> None:
    listed = tmp_path / "keys"
    listed.write_text("# the team\n\nbob:use:bobs-key\n  ops : manage : ops-key \n")
    ring = _ring(
        api_key="root", api_keys=f"alice:manage:alices-key, ci:use:sha256:{HASHED}",
        api_keys_file=str(listed),
    )  # fmt: skip
    found = {secret: ring.identify(secret) for secret in
             ("root", "alices-key", "ci-secret", "bobs-key", "ops-key")}  # fmt: skip
    assert {s: k.name for s, k in found.items() if k} == {
        "root": "default", "alices-key": "alice", "ci-secret": "ci", "bobs-key": "bob",
        "ops-key": "ops",
    }  # fmt: skip
    assert ring.identify(f"sha256:{HASHED}") is None  # the hash is not the key
    uses = {k.name for k in found.values() if k and not k.has(Role.MANAGE)}
    assert uses == {"ci", "bob"}
    assert all(k is not None and k.has(Role.USE) for k in found.values())  # manage may use


@pytest.mark.parametrize(
    ("entries", "reason"),
    [
        ("alice:admin:s3cret-1", "key alice has role 'admin'; the roles are use and manage"),
        ("alice:use:", "key alice has no secret"),
        ("alice:s3cret-1", "key alice has role 's3cret-1'"),
        ("../x:use:s3cret-1", "the name '../x' is not a key name"),
        ("a:use:s3cret-1,a:manage:s3cret-2", "two keys are named a"),
        ("a:use:s3cret-1,b:manage:s3cret-1", "keys a and b are one key"),
        ("default:use:s3cret-2", "two keys are named default"),
    ],
)
def test_malformed_keys_stop_the_start_without_showing_a_secret(entries: str, reason: str) -> None:
    with pytest.raises(ValidationError) as refused:
        SETTINGS(_env_file=None, api_key="s3cret-0", api_keys=entries)
    message = str(refused.value)
    assert reason in message, message
    assert "s3cret-0" not in message and "s3cret-2" not in message
    assert "s3cret-1" not in message or "role 's3cret-1'" in message  # a secret in the role slot


def test_a_keys_file_error_names_its_line(tmp_path: Path) -> None:
    listed = tmp_path / "keys"
    listed.write_text("# comment\nbob:use:x\nbad line\n")
    with pytest.raises(ValueError, match=rf"API_KEYS_FILE {listed} line 3: the name 'bad line'"):
        load_keys(None, None, listed)
    with pytest.raises(ValueError, match="API_KEYS_FILE: cannot read"):
        load_keys(None, None, tmp_path / "missing")


def test_any_key_opens_the_api_to_other_machines() -> None:
    with pytest.raises(ValidationError, match=r"PUBLISH_ADDRESS=0\.0\.0\.0"):
        SETTINGS(_env_file=None, publish_address="0.0.0.0")
    for keys in ({"api_key": "k"}, {"api_keys": "a:use:k"}):
        SETTINGS(_env_file=None, publish_address="0.0.0.0", **keys)
