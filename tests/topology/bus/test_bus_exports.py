import topology.bus as bus_pkg


def test_public_names_are_exactly_these() -> None:
    assert set(bus_pkg.__all__) == {
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
        "Outbox",
        "decode",
        "encode",
        "find_nats_server",
        "new_id",
    }
    for name in bus_pkg.__all__:
        assert getattr(bus_pkg, name) is not None
