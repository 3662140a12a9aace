"""Object ids shaped like OpenAI's (``file-…``, ``batch_…``, ``batch_req_…``).

Random, not sequential: ids are handed to users and must not reveal or collide across
router replicas that create objects at the same time.
"""

from __future__ import annotations

import secrets


def new_id(prefix: str) -> str:
    """``prefix`` followed by 24 random hex digits (96 bits)."""
    return prefix + secrets.token_hex(12)
