"""The board's server-sent event kinds are one enum of the protocol, and the board page
listens for every one of them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cubicle.protocol.board import BoardEvent
from cubicle.server.board.feed import BoardFeed

pytestmark = pytest.mark.fast

PAGE = Path(__file__).resolve().parents[2] / "web" / "board.js"


def test_the_board_page_listens_for_every_kind():
    listened = set(re.findall(r'events\.addEventListener\("([a-z]+)"', PAGE.read_text()))
    assert listened == {kind.value for kind in BoardEvent}


async def test_a_listener_gets_hello_then_each_event_by_its_kind():
    events = BoardFeed()
    stream = events.listen()
    assert await anext(stream) == "retry: 1000\nevent: hello\ndata: {}\n\n"
    events.publish(BoardEvent.DELETED, id=7)
    assert await anext(stream) == 'event: deleted\ndata: {"id": 7}\n\n'
    events.close()
    with pytest.raises(StopAsyncIteration):
        await anext(stream)
