"""mq for asyncio: clients whose every wait is a coroutine in the caller's event loop, with no
thread of their own (``mq/aio/connection.py``), over the same parts as the blocking clients.
Shaped like aiokafka; ``docs/api.md`` describes them.
"""

from mq.aio.admin import Admin
from mq.aio.consumer import Consumer
from mq.aio.producer import Producer

__all__ = ["Admin", "Consumer", "Producer"]
