"""The stack the abuse suite attacks: the api's named keys (one per kind of caller), and the
api's and the engine's limits set low enough that a test reaches them in seconds."""

from __future__ import annotations

from pathlib import Path

# name -> (role, secret, the limits at its entry's end).
KEYS = {
    "people": ("use", "people-key", ""),  # the interactive users: no limits of their own
    "script": ("use", "script-key", ":rpm=3"),  # the flood: 3 requests a minute
    "greedy": ("use", "greedy-key", ":tpm=1000"),  # asks more tokens than its minute holds
    "intruder": ("use", "intruder-key", ""),  # every other hostile request, and managing
    "admin": ("manage", "admin-key", ""),  # the adapter bombs need a manage key to get far
}
SCRIPT_RPM = 3
GREEDY_TPM = 1000
# Four interactive streams and four slots more: room for a little, not for `n` = 8.
MAX_CONCURRENT_REQUESTS = 8
# Small, so that the upload bomb costs the test little; the limit's check is the same.
MAX_BATCH_FILE_BYTES = 65_536
HUB_PATTERN = "tritonbox-tests/*"  # the one Hub pattern allowed; nothing matches it offline
# Below the test server's MAX_INPUT_LEN (512), so that a longer echo is refused by this limit.
ECHO_MAX_PROMPT_TOKENS = 384
# The engine's wait for a guide to compile: short, so that the slow guide's requests (each
# waits it out) leave their block in about a second. A guide past it is refused the same way.
GUIDE_COMPILE_TIMEOUT_S = 1.0


def secret(name: str) -> str:
    return KEYS[name][1]


def api_settings(adapter_root: Path) -> dict[str, str]:
    """The api's settings (launch_api's keyword arguments; environment variables upper-cased)."""
    keys = ",".join(f"{name}:{role}:{key}{limits}" for name, (role, key, limits) in KEYS.items())
    return {
        "api_keys": keys,
        "max_concurrent_requests": str(MAX_CONCURRENT_REQUESTS),
        "max_batch_file_bytes": str(MAX_BATCH_FILE_BYTES),
        "adapter_dirs": str(adapter_root),
        "adapter_hub_repos": HUB_PATTERN,
        "echo_max_prompt_tokens": str(ECHO_MAX_PROMPT_TOKENS),
    }


def triton_settings() -> dict[str, float]:
    """tritonserver's settings beside the defaults (TritonSettings field names)."""
    return {"guide_compile_timeout_s": GUIDE_COMPILE_TIMEOUT_S}
