"""The control side without ROS: action queue and aggregation, hold logic, chunk requests, tick timing."""
from edgefm_ros.control.aggregate import AGGREGATE_FUNCTIONS, REPLACING, get_aggregate
from edgefm_ros.control.commander import Command, Commander
from edgefm_ros.control.delay import DelayConfig, DelayEstimator, latency_ticks
from edgefm_ros.control.queue import ActionQueue, MergeResult, TickGrid, resample
from edgefm_ros.control.request import ChunkRequester, QueueState, queue_state
from edgefm_ros.control.slot import LatestSlot
from edgefm_ros.control.stats import RollingStats, TickStats, period_errors
from edgefm_ros.control.ticker import Tick, Ticker

__all__ = [
    "AGGREGATE_FUNCTIONS", "REPLACING", "get_aggregate", "Command", "Commander", "DelayConfig", "DelayEstimator",
    "latency_ticks", "ActionQueue", "MergeResult", "TickGrid",
    "resample", "ChunkRequester", "QueueState", "queue_state", "LatestSlot", "RollingStats", "TickStats",
    "period_errors", "Tick", "Ticker",
]
