"""flywheel's bus: NATS JetStream channels with envelopes, dead letters, KV and objects; an embedded server.

See ``_bus`` (Bus), ``_consumer`` (deliveries), ``_outbox`` (coalesced publish-then-ack), ``_server`` (EmbeddedNats),
``_envelope`` (wire format).
"""

from ._bus import Bus, EphemeralMessage, EphemeralSubscription
from ._consumer import ChannelConsumer, Delivery
from ._envelope import ENVELOPE_VERSION, Envelope, decode, encode, new_id
from ._errors import BusError, EnvelopeError
from ._outbox import Outbox
from ._server import EmbeddedNats, find_nats_server
from ._settings import DEADLETTER, BusSettings, stream_name, subject
from ._stats import BusStats

__all__ = [
    "DEADLETTER",
    "ENVELOPE_VERSION",
    "Bus",
    "BusError",
    "BusSettings",
    "BusStats",
    "ChannelConsumer",
    "Delivery",
    "EmbeddedNats",
    "Envelope",
    "EnvelopeError",
    "EphemeralMessage",
    "EphemeralSubscription",
    "Outbox",
    "decode",
    "encode",
    "find_nats_server",
    "new_id",
    "stream_name",
    "subject",
]
