"""The chat-robot server (tests/support/chat_robots.py), started and stopped per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.chat_robots import ChatRobots


@pytest.fixture
def robots() -> Iterator[ChatRobots]:
    server = ChatRobots()
    try:
        yield server
    finally:
        server.stop()
