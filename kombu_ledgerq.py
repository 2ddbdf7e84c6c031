"""Static registration of the ``ledgerq`` kombu transport: ``Celery(broker="ledgerq:///dir")``.

kombu finds a transport by name in ``kombu.transport.TRANSPORT_ALIASES`` and has no entry
point for transports.  The entry points it does load, from every installed
distribution, are its serializers' (group ``kombu.serializers``), when
``kombu.serialization`` is imported - which every Celery app does before it opens a
connection.  So ledgerq declares one: loading ``kombu_ledgerq:SERIALIZER`` imports this
module, which adds the alias.  The "serializer" registered under the entry point's name
``ledgerq-transport`` has no encoder and no decoder (kombu then registers only its name
and content type), so no message can be written or read with it.

This module imports nothing but ``kombu.transport`` - not ledgerq - because every
process that imports kombu in an environment with ledgerq loads it.  ``import
ledgerq.celery`` registers the same alias, for programs that use kombu without
Celery (``kombu.Connection`` does not import the serializers).
"""

from __future__ import annotations

from kombu.transport import TRANSPORT_ALIASES

TRANSPORT_ALIASES.setdefault("ledgerq", "ledgerq.celery.transport:Transport")

# kombu calls register("ledgerq-transport", *SERIALIZER): (encoder, decoder,
# content_type, content_encoding).
SERIALIZER = (None, None, "application/x-ledgerq-transport", "binary")

__all__ = ["SERIALIZER"]
