"""Versioned weights: manifests, transports, and the publish → watch → swap flow between learner and generators."""

from actors.weights._distributed import DistributedTransport, advertise_address, group_members
from actors.weights._flow import CURRENT, SERVING, WeightPublisher, WeightSubscriber, weights_bucket
from actors.weights._manifest import (
    TensorInfo,
    WeightManifest,
    WeightPayloadError,
    check_state_dict,
    describe,
)
from actors.weights._transports import (
    CollectiveTransport,
    ObjectStoreTransport,
    SafetensorsDirTransport,
    WeightTransport,
)

__all__ = [
    "CURRENT",
    "SERVING",
    "CollectiveTransport",
    "DistributedTransport",
    "ObjectStoreTransport",
    "SafetensorsDirTransport",
    "TensorInfo",
    "WeightManifest",
    "WeightPayloadError",
    "WeightPublisher",
    "WeightSubscriber",
    "WeightTransport",
    "advertise_address",
    "check_state_dict",
    "describe",
    "group_members",
    "weights_bucket",
]
