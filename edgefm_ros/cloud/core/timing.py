"""One request's seconds on the server, all on time.perf_counter. The client's ``deadline_s`` is the
budget it had left when it sent the request, so the server counts it from receipt: queueing, payload
decoding and (for generation) every token spend the same budget."""
from __future__ import annotations

import time

from edgefm_ros.cloud.core.protocol import ProtocolError


class RequestClock:
    def __init__(self) -> None:
        self.received = time.perf_counter()
        self.decoded = self.started = self.received

    def mark_decoded(self) -> None:
        self.decoded = time.perf_counter()

    def start(self, request_id: str, deadline_s: float | None) -> None:
        """On the engine thread, before the model runs: 504 when the budget is already spent."""
        self.started = time.perf_counter()
        if deadline_s is not None and self.started - self.received > deadline_s:
            raise ProtocolError(f"request {request_id!r} waited {self.started - self.received:.3f} s since it was "
                                f"received ({self.started - self.decoded:.3f} s in the queue), past its deadline of "
                                f"{deadline_s:.3f} s; not run", 504)

    def out_of_time(self, deadline_s: float | None) -> bool:
        return deadline_s is not None and time.perf_counter() - self.received > deadline_s

    def timings(self, engine: dict) -> dict[str, float]:
        """``engine``'s seconds (engine_s, prefill_s, decode_s) plus queue_s, decode_input_s, server_s."""
        return {**engine, "queue_s": self.started - self.decoded, "decode_input_s": self.decoded - self.received,
                "server_s": time.perf_counter() - self.received}
