"""The cloud tier: an MLServer runtime serving the edgefm Engine over the Open Inference Protocol
(runtime.py, started by ``edgefm-cloud serve``: serve.py, serving.py, cli.py), and the robot's client
for it (client.py: deadline, retries, circuit breaker, hedging, link measurements). ``--task vqa``
serves scene questions with the autoregressive engine instead (vqa_runtime.py, vqa_protocol.py,
vqa_settings.py; answers also streamed token by token as Server-Sent Events), for vqa_client.py
(``ask``, ``ask_stream``/``stream``). probe.py measures the link with uploads to nginx's /edgefm/probe
while the router's estimate is unknown or stale. Importing this package loads neither MLServer nor
torch. See README.md here.
"""
from edgefm_ros.cloud.breaker import BreakerConfig, CircuitBreaker
from edgefm_ros.cloud.client import (ClientConfig, CloudDeadlineExceeded, CloudError, CloudPolicy, CloudRejected,
                                     CloudUnavailable, PendingCall)
from edgefm_ros.cloud.images import Encoding

__all__ = ["BreakerConfig", "CircuitBreaker", "ClientConfig", "CloudDeadlineExceeded", "CloudError", "CloudPolicy",
           "CloudRejected", "CloudUnavailable", "Encoding", "PendingCall"]
