"""``scale_out.py``'s SSE client reads messages out of whatever chunks the socket gives."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _scale_out_clients import sse_data  # noqa: E402


def test_messages_split_across_chunks_come_out_whole_and_in_order() -> None:
    stream = ('id: 1\nevent: content_token\ndata: {"seq": 1}\n\n'
              ": ping\n\n"
              'id: 2\nevent: run_completed\ndata: {"seq": 2,\ndata:  "x": 1}\n\n'
              "id: 3\nevent: content_token\ndata: {\"seq\": 3}")  # not ended yet
    got, buffered = [], ""
    for i in range(0, len(stream), 7):  # 7-character chunks cut lines and the blank line apart
        payloads, buffered = sse_data(buffered + stream[i:i + 7])
        got += payloads
    assert got == ['{"seq": 1}', '{"seq": 2,\n "x": 1}']
    assert buffered == 'id: 3\nevent: content_token\ndata: {"seq": 3}'
