"""The wire protocol between the broker and its clients, sans I/O (no sockets in here).

A frame is a 4-byte big-endian length followed by that many bytes of msgpack: an array
``[api, request_id, *fields]`` for a request and ``[api, request_id, error_code,
error_message, *fields]`` for a response. Request ids let a client pipeline requests; the
broker answers in order per connection, but clients match by id. Record batches are never
re-encoded: a Produce batch travels as the raw tail of a tail frame (to a broker that offers
``frame_tail``; ``frames.py``), anything else as msgpack ``bin`` values. Api numbers are
Kafka's where the meaning matches (Produce 0, ListOffsets 2, Metadata 3, ...); mq's own start
at 1000.

Every connection opens with a Handshake carrying the client's protocol version; a broker that
cannot serve that version answers ``UnsupportedVersion`` with a message saying which versions
it speaks, and closes the connection.

Also shared by both sides, below both: ``state.py``, the layout of the shared-memory region
the broker publishes partition offsets in and clients read, and ``paths.py``, the default data
dir and socket path.
"""

from mq.protocol.frames import FrameReader, encode_frame
from mq.protocol.messages import (
    PROTOCOL_VERSION,
    Api,
    Request,
    Response,
    check_request,
    request,
    response,
)

__all__ = ["FrameReader", "encode_frame", "PROTOCOL_VERSION", "Api", "Request", "Response",
           "check_request", "request", "response"]
