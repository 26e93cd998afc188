"""INAR-VL: the input-aware edge-versus-cloud router. Imports no ROS (runs on robots and servers).

Before any model runs, cheap features of the camera images and the instruction predict, per
candidate configuration (model, precision, input resolution, placement), the quality it would
reach and what it would cost; the edge serves unless the cloud is clearly better and the link can
carry it.

API (import the modules; this package imports nothing itself, so ``routing.link`` works without
OpenCV on a cloud server)::

    from edgefm_ros.routing.router import Router
    from edgefm_ros.routing.link import LinkEstimator

    link = LinkEstimator()                               # shared with the cloud client, which calls
    link.observe(upload_bytes, upload_s, rtt_s, now)     #   after every successful cloud call
    link.observe_failure(now)                            #   after every failed / timed-out one
    link.bandwidth_mbps(now), link.rtt_s(now)            # estimates (NaN while unknown)

    router = Router.from_yaml("config/router.yaml", link=link)
    d = router.decide(images, instruction, deadline_s=0.5, now=time.monotonic())
    #   images: camera key -> uint8 (H, W, 3) RGB, or the JPEG bytes of a CompressedImage
    #   d: edgefm_ros.types.RouteDecision: target "edge"|"cloud", candidate, reason (the rule
    #   that decided, router.REASONS), features with names, predictions per candidate
    #   (quality, latency_s, energy_j), guard_open, bandwidth_mbps, rtt_s and params:
    #   jpeg_quality (0 on the edge) and resolution of the chosen candidate, model, precision,
    #   breaker_open, upload_bytes, deadline_s, delta_min, decision_s (overhead)
    router.set_thresholds(delta_min=0.05, guard_mbps=10.0)  # ValueError naming a bad value
    router.observe_latency(candidate, measured_s)         # measured history -> latency predictions

Modules, one job each: ``features`` (10-d feature vector, JPEG quality from DQT), ``predictor``
(quality probability, latency, energy per candidate), ``payload`` (encoded bytes of the images),
``pareto`` (per-request frontier), ``link`` (bandwidth/RTT estimation, circuit breaker),
``router`` (guard with hysteresis, the decision rules, ``Router``), ``config`` (router.yaml),
``log`` (the JSONL request log), ``calibrate`` (logistic/Platt fit, Brier, ECE), ``evaluate``
(replay against edge-only, cloud-only, random and oracle), ``chunk_quality`` (the quality of an
action chunk, the label shadow mode logs for calibration; the logging itself is edgefm_ros.placement's),
``synth`` (synthetic logs from known coefficients). CLI: ``edgefm-router``.
"""
