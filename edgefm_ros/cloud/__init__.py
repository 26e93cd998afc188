"""The cloud tier: one Open Inference Protocol core (core/), a task registry with two adapters
(tasks/vla.py: action chunks for vla_node, tasks/vqa.py: scene questions, streamed token by token),
the MLServer runtime that serves any task behind nginx (server/: ``edgefm-cloud serve``) and the
robot's clients (client/: CloudPolicy, VqaClient; deadline, retries, circuit breaker, link
measurements). probe.py measures the link with uploads to nginx's /edgefm/probe while the router's
estimate is unknown or stale. Importing this package loads neither MLServer nor torch. See README.md.
"""
from edgefm_ros.cloud.breaker import BreakerConfig, CircuitBreaker
from edgefm_ros.cloud.client.base import (ClientConfig, CloudDeadlineExceeded, CloudError, CloudRejected,
                                          CloudUnavailable, PendingCall)
from edgefm_ros.cloud.client.policy import CloudPolicy, RemotePolicy
from edgefm_ros.cloud.client.vqa import VqaAnswer, VqaClient
from edgefm_ros.cloud.images import Encoding

__all__ = ["BreakerConfig", "CircuitBreaker", "ClientConfig", "CloudDeadlineExceeded", "CloudError", "CloudPolicy",
           "CloudRejected", "CloudUnavailable", "Encoding", "PendingCall", "RemotePolicy", "VqaAnswer", "VqaClient"]
