"""The results cache's keys: a short hash of the question a tuning answers (request, model, target, versions).

Kept apart from the cache itself so that the context can name its keys without importing the store.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def run_key(parts: dict[str, Any]) -> str:
    """24 hex digits of the SHA-256 of the parts as sorted JSON: stable across runs and processes."""
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]
