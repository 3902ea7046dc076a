"""The bus tests use the shared fixtures of tests/conftest.py (embedded_nats, bus, bus_settings)."""
