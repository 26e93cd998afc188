"""The cloud tier: an MLServer runtime serving the edgefm Engine over the Open Inference Protocol
(runtime.py, started by ``edgefm-cloud serve``: serve.py, serving.py, cli.py), and the robot's client
for it (client.py: deadline, retries, circuit breaker, hedging, link measurements). Importing this
package loads neither MLServer nor torch. See README.md here.
"""
from edgefm_ros.cloud.breaker import BreakerConfig, CircuitBreaker
from edgefm_ros.cloud.client import (ClientConfig, CloudDeadlineExceeded, CloudError, CloudPolicy, CloudRejected,
                                     CloudUnavailable, PendingCall)
from edgefm_ros.cloud.images import Encoding

__all__ = ["BreakerConfig", "CircuitBreaker", "ClientConfig", "CloudDeadlineExceeded", "CloudError", "CloudPolicy",
           "CloudRejected", "CloudUnavailable", "Encoding", "PendingCall"]
