"""Kafka's wire protocol on the broker: the listener (``listener.py``), its connections
(``conn.py``), requests in progress (``exchange.py``), the served versions (``versions.py``)
and the api families (``handlers.py`` composes them), all over the broker's own components.
The codec is below, in ``mq/protocol/kafka``."""
