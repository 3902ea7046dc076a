"""Versioned weights: manifests, transports, and the publish → watch → swap flow between learner and generators."""

from actors.weights._flow import CURRENT, SERVING, WeightPublisher, WeightSubscriber, weights_bucket
from actors.weights._manifest import (
    TensorInfo,
    WeightManifest,
    WeightPayloadError,
    check_state_dict,
    describe,
)
from actors.weights._transports import ObjectStoreTransport, SafetensorsDirTransport, WeightTransport

__all__ = [
    "CURRENT",
    "SERVING",
    "ObjectStoreTransport",
    "SafetensorsDirTransport",
    "TensorInfo",
    "WeightManifest",
    "WeightPayloadError",
    "WeightPublisher",
    "WeightSubscriber",
    "WeightTransport",
    "check_state_dict",
    "describe",
    "weights_bucket",
]
