"""Who may call the api: named keys, each with a role, from API_KEY, API_KEYS and API_KEYS_FILE.

Two roles: `use` (generate, read predictions) and `manage` (register and delete adapters:
whatever changes the server for everyone); a manage key may also use. The one API_KEY of a
single-user setup holds both, under the name `default`. An entry is `name:role:secret`, the
secret as given or `sha256:<64 hex digits>` of it, so a file or `.env` need not hold the key
itself. Every key is kept as its sha256 and a presented key is compared with all of them in
constant time: the time taken tells neither how much of a guess was right nor which key matched.
An entry may end in its rate limits, `:rpm=N` and `:tpm=N` (requests and tokens per minute, 0 =
none; unset = RATE_LIMIT_RPM and RATE_LIMIT_TPM): rate_limit.py enforces them.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from pydantic import SecretStr

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_HASHED = re.compile(r"^sha256:([0-9a-fA-F]{64})$")
# A limit at an entry's end. Read from the end, since a secret may hold `:` itself; a secret
# that ends like one must then be given as its sha256.
_LIMIT = re.compile(r":\s*(rpm|tpm)\s*=\s*([^:]*?)\s*$")
DEFAULT_NAME = "default"  # API_KEY's name on predictions and in the metrics


class Role(StrEnum):
    USE = "use"
    MANAGE = "manage"


_GRANTS = {Role.USE: frozenset({Role.USE}), Role.MANAGE: frozenset({Role.USE, Role.MANAGE})}


@dataclass(frozen=True)
class ApiKey:
    name: str
    roles: frozenset[Role]
    digest: bytes  # sha256 of the secret: the secret itself is not kept
    rpm: int | None = None  # requests per minute; None: RATE_LIMIT_RPM; 0: no limit
    tpm: int | None = None  # tokens per minute (prompt + max_tokens x n); as rpm

    def has(self, role: Role) -> bool:
        return role in self.roles


def digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def parse_entry(entry: str, where: str) -> ApiKey:
    """One `name:role:secret[:rpm=N][:tpm=N]`; ValueError naming `where` (never the secret) if
    malformed."""
    limits: dict[str, int] = {}
    while found := _LIMIT.search(entry):
        kind, value = found[1], found[2]
        if not re.fullmatch(r"[0-9]{1,9}", value) or kind in limits:
            label = entry.split(":", 1)[0].strip()  # the value is not shown: it may be secret
            raise ValueError(f"{where}: key {label} has a malformed {kind}; a limit is written "
                             f"once, as a whole number ({kind}=60)")  # fmt: skip
        limits[kind] = int(value)
        entry = entry[: found.start()]
    name, role, secret = [*entry.split(":", 2), "", ""][:3]
    name, role, secret = name.strip(), role.strip(), secret.strip()
    if not NAME.match(name):
        raise ValueError(f"{where}: the name {name!r} is not a key name (letters, digits, "
                         "`.`, `_`, `-`; at most 64), as in name:role:key")  # fmt: skip
    if role not in Role.__members__.values():
        raise ValueError(f"{where}: key {name} has role {role!r}; the roles are use and manage")
    if not secret:
        raise ValueError(f"{where}: key {name} has no secret, as in name:role:key")
    hashed = _HASHED.match(secret)
    value = bytes.fromhex(hashed[1]) if hashed else digest(secret)
    return ApiKey(name, _GRANTS[Role(role)], value, limits.get("rpm"), limits.get("tpm"))


def parse_keys(text: str, where: str, separator: str = ",") -> list[ApiKey]:
    """Every entry of `text` (comma-separated, or a file's lines; `#` starts a comment line)."""
    keys = []
    for number, entry in enumerate(text.split(separator), 1):
        if entry.strip() and not entry.strip().startswith("#"):
            place = f"{where} line {number}" if separator == "\n" else where
            keys.append(parse_entry(entry, place))
    return keys


def load_keys(
    api_key: SecretStr | None, api_keys: SecretStr | None, api_keys_file: Path | None
) -> list[ApiKey]:
    """The keys the settings name; ValueError saying what is wrong (a name, a line)."""
    keys = []
    if api_key is not None:  # the single key of a one-user setup: it may do everything
        keys.append(ApiKey(DEFAULT_NAME, _GRANTS[Role.MANAGE], digest(api_key.get_secret_value())))
    if api_keys is not None:
        keys += parse_keys(api_keys.get_secret_value(), "API_KEYS")
    if api_keys_file is not None:
        try:
            text = api_keys_file.read_text()
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(f"API_KEYS_FILE: cannot read {api_keys_file}: {error}") from None
        keys += parse_keys(text, f"API_KEYS_FILE {api_keys_file}", separator="\n")
    names: set[str] = set()
    digests: dict[bytes, str] = {}
    for key in keys:
        if key.name in names:
            raise ValueError(f"API_KEYS: two keys are named {key.name}")
        if key.digest in digests:
            raise ValueError(f"API_KEYS: keys {digests[key.digest]} and {key.name} are one key")
        names.add(key.name)
        digests[key.digest] = key.name
    return keys


class KeyRing:
    def __init__(self, keys: list[ApiKey]) -> None:
        self._keys = keys

    @property
    def open(self) -> bool:
        """No key is set: every route is open (to this machine only, unless opened on purpose)."""
        return not self._keys

    def identify(self, presented: str) -> ApiKey | None:
        """The key `presented` is, or None. Compared with every key, never stopping early."""
        given = digest(presented)
        found = None
        for key in self._keys:
            if secrets.compare_digest(given, key.digest):
                found = key
        return found
