"""Link estimation from real cloud calls: bandwidth, round-trip time and a circuit breaker.

The cloud client reports every call (``observe`` on success, ``observe_failure`` on an error or a
timeout); the router reads ``bandwidth_mbps(now)``, ``rtt_s(now)`` and ``breaker_open(now)``.
``now`` is any monotonic clock in seconds, the same for all calls.

- Bandwidth: the harmonic mean of the last ``window`` throughput samples (upload bytes * 8 /
  upload seconds), divided by ``1 + max`` relative prediction error of the last ``error_window``
  samples (the RobustMPC discount: the estimate is pessimistic while it has been wrong). Calls that
  uploaded fewer than ``min_sample_bytes`` say more about latency than throughput and only refresh
  the RTT. ``upload_s`` is the transfer time alone (request sent -> server has the body), not the
  server's compute time.
- RTT: SRTT/RTTVAR smoothing as in RFC 6298 (alpha 1/8, beta 1/4); ``rtt_s`` returns SRTT.
- Staleness: ``stale_after_s`` after the last successful call, the estimates decay: bandwidth is
  halved and RTT doubled every ``stale_half_life_s``, so a link not heard from for a while reads as
  slow (the router's bandwidth guard then keeps requests on the edge) until a call, e.g. a health
  probe, refreshes it. Unknown (no sample yet) reads as NaN.
- Circuit breaker: ``breaker_failures`` consecutive failures open it for ``breaker_cooldown_s``;
  after that one trial call is let through (half open): a success closes it, a failure opens it again
  with the cool-down doubled (up to ``breaker_max_cooldown_s``).
"""
from __future__ import annotations

import math
import numbers
from collections import deque
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class LinkConfig:
    window: int = 5  # throughput samples in the harmonic mean
    error_window: int = 5  # prediction errors in the discount
    min_sample_bytes: int = 16384  # smaller uploads refresh the RTT only
    srtt_alpha: float = 0.125
    rttvar_beta: float = 0.25
    stale_after_s: float = 10.0
    stale_half_life_s: float = 10.0
    breaker_failures: int = 3
    breaker_cooldown_s: float = 10.0
    breaker_max_cooldown_s: float = 120.0

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"LinkConfig.{f.name} must be a finite number >= 0, got {v!r}")
        for name in ("window", "error_window", "breaker_failures"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise ValueError(f"LinkConfig.{name} must be an int >= 1, got {getattr(self, name)!r}")
        for name in ("srtt_alpha", "rttvar_beta"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"LinkConfig.{name} must be in (0, 1], got {getattr(self, name)!r}")
        if self.stale_half_life_s <= 0:
            raise ValueError(f"LinkConfig.stale_half_life_s must be > 0, got {self.stale_half_life_s!r}")
        if self.breaker_max_cooldown_s < self.breaker_cooldown_s:
            raise ValueError(f"LinkConfig.breaker_max_cooldown_s {self.breaker_max_cooldown_s} is below "
                             f"breaker_cooldown_s {self.breaker_cooldown_s}")


@dataclass(frozen=True)
class LinkSnapshot:
    """The link as the policy sees it at one instant."""

    bandwidth_mbps: float = math.nan  # NaN: unknown
    rtt_s: float = math.nan
    breaker_open: bool = False
    age_s: float = math.inf  # since the last successful call


def _check(name: str, value: float, lo: float = 0.0, strict: bool = False) -> None:
    ok = isinstance(value, (int, float)) and math.isfinite(value) and (value > lo if strict else value >= lo)
    if not ok:
        raise ValueError(f"LinkEstimator: {name} must be a finite number {'>' if strict else '>='} {lo}, "
                         f"got {value!r}")


class LinkEstimator:
    """Bandwidth/RTT estimates and the circuit breaker (see module docstring)."""

    def __init__(self, cfg: LinkConfig = LinkConfig()):
        self.cfg = cfg
        self._mbps: deque[float] = deque(maxlen=cfg.window)
        self._errors: deque[float] = deque(maxlen=cfg.error_window)
        self._srtt = math.nan
        self._rttvar = math.nan
        self._last_ok = -math.inf
        self._failures = 0
        self._open_until = -math.inf
        self._cooldown = cfg.breaker_cooldown_s

    # -- reports from the cloud client ---------------------------------------------------------

    def observe(self, upload_bytes: int, upload_s: float, rtt_s: float, now: float) -> None:
        """One successful call: ``upload_bytes`` sent in ``upload_s`` seconds, round trip ``rtt_s``."""
        if isinstance(upload_bytes, bool) or not isinstance(upload_bytes, numbers.Integral) or upload_bytes < 0:
            raise ValueError(f"LinkEstimator: upload_bytes must be an int >= 0, got {upload_bytes!r}")
        _check("upload_s", upload_s, strict=upload_bytes > 0)
        _check("rtt_s", rtt_s)
        _check("now", now, -math.inf)
        if upload_bytes >= self.cfg.min_sample_bytes and upload_s > 0:
            sample = int(upload_bytes) * 8.0 / upload_s / 1e6
            predicted = self._harmonic_discounted()
            if not math.isnan(predicted):
                self._errors.append(abs(predicted - sample) / sample)
            self._mbps.append(sample)
        if math.isnan(self._srtt):
            self._srtt, self._rttvar = rtt_s, rtt_s / 2.0
        else:
            b, a = self.cfg.rttvar_beta, self.cfg.srtt_alpha
            self._rttvar = (1 - b) * self._rttvar + b * abs(self._srtt - rtt_s)
            self._srtt = (1 - a) * self._srtt + a * rtt_s
        self._last_ok = max(self._last_ok, now)
        self._failures = 0
        self._open_until = -math.inf
        self._cooldown = self.cfg.breaker_cooldown_s

    def observe_failure(self, now: float) -> None:
        """One failed call (error, refused, or past its deadline)."""
        _check("now", now, -math.inf)
        self._failures += 1
        if self._failures < self.cfg.breaker_failures:
            return
        if self._failures > self.cfg.breaker_failures and now >= self._open_until:
            # the trial call after a cool-down failed: open again, for longer
            self._cooldown = min(2.0 * self._cooldown, self.cfg.breaker_max_cooldown_s)
        if now >= self._open_until:
            self._open_until = now + self._cooldown

    # -- estimates -------------------------------------------------------------------------------

    def _harmonic_discounted(self) -> float:
        if not self._mbps:
            return math.nan
        hm = len(self._mbps) / sum(1.0 / x for x in self._mbps)
        return hm / (1.0 + max(self._errors, default=0.0))

    def _decay(self, now: float) -> float:
        """1 while fresh, halving every stale_half_life_s after stale_after_s."""
        excess = now - self._last_ok - self.cfg.stale_after_s
        return 1.0 if excess <= 0 else 0.5 ** (excess / self.cfg.stale_half_life_s)

    def bandwidth_mbps(self, now: float) -> float:
        return self._harmonic_discounted() * self._decay(now)

    def rtt_s(self, now: float) -> float:
        return self._srtt / self._decay(now) if not math.isnan(self._srtt) else math.nan

    def rttvar_s(self, now: float) -> float:
        return self._rttvar / self._decay(now) if not math.isnan(self._rttvar) else math.nan

    def breaker_open(self, now: float) -> bool:
        return now < self._open_until

    @property
    def consecutive_failures(self) -> int:
        return self._failures

    def snapshot(self, now: float) -> LinkSnapshot:
        return LinkSnapshot(bandwidth_mbps=self.bandwidth_mbps(now), rtt_s=self.rtt_s(now),
                            breaker_open=self.breaker_open(now), age_s=now - self._last_ok)

    def static_snapshot(self, now: float, bandwidth_mbps: float, rtt_s: float) -> LinkSnapshot:
        """A known fixed link (a node's ``static_bandwidth_mbps``): that rate and round trip, with this
        estimator's breaker, which the cloud client's failures still open and its successes close."""
        _check("bandwidth_mbps", bandwidth_mbps, strict=True)
        _check("rtt_s", rtt_s)
        return LinkSnapshot(bandwidth_mbps=float(bandwidth_mbps), rtt_s=float(rtt_s),
                            breaker_open=self.breaker_open(now), age_s=0.0)
