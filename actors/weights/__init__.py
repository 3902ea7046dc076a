"""Versioned weights: manifests, transports, and the publish → watch → swap flow between learner and generators."""

from actors.weights._distributed import DistributedTransport, advertise_address, weight_transports
from actors.weights._flow import WeightPublisher, WeightSubscriber
from actors.weights._manifest import (
    TensorInfo,
    WeightManifest,
    WeightPayloadError,
    WeightPayloadGone,
    check_state_dict,
    describe,
)
from actors.weights._shared import SharedMemoryTransport, SharedTensors, SlotSpaceError, shm_root
from actors.weights._transports import (
    CollectiveTransport,
    ObjectStoreTransport,
    SafetensorsDirTransport,
    WeightTransport,
)

__all__ = [
    "CollectiveTransport",
    "DistributedTransport",
    "ObjectStoreTransport",
    "SafetensorsDirTransport",
    "SharedMemoryTransport",
    "SharedTensors",
    "SlotSpaceError",
    "TensorInfo",
    "WeightManifest",
    "WeightPayloadError",
    "WeightPayloadGone",
    "WeightPublisher",
    "WeightSubscriber",
    "WeightTransport",
    "advertise_address",
    "check_state_dict",
    "describe",
    "shm_root",
    "weight_transports",
]
