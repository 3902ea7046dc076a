"""flywheel's bus: NATS JetStream channels with envelopes, dead letters, KV and objects; an embedded server.

See ``_bus`` (Bus), ``_consumer`` (deliveries), ``_outbox`` (coalesced publish-then-ack), ``_server`` (EmbeddedNats),
``_envelope`` (wire format), ``_inflight`` (deliveries being worked on: keepalives, redeliveries).
"""

from topology._names import DEADLETTER
from topology.bus._bus import Bus, EphemeralMessage, EphemeralSubscription
from topology.bus._consumer import ChannelConsumer, Delivery
from topology.bus._envelope import ENVELOPE_VERSION, Envelope, decode, encode, new_id
from topology.bus._errors import BUS_AWAY, BusError, EnvelopeError
from topology.bus._inflight import InFlight
from topology.bus._outbox import Outbox
from topology.bus._server import EmbeddedNats, find_nats_server
from topology.bus._stats import BusStats

__all__ = [
    "BUS_AWAY",
    "DEADLETTER",
    "ENVELOPE_VERSION",
    "Bus",
    "BusError",
    "BusStats",
    "ChannelConsumer",
    "Delivery",
    "EmbeddedNats",
    "Envelope",
    "EnvelopeError",
    "EphemeralMessage",
    "EphemeralSubscription",
    "InFlight",
    "Outbox",
    "decode",
    "encode",
    "find_nats_server",
    "new_id",
]
