"""A node's own threads without ROS: the model worker that serves queued requests off the executor (worker),
and SCHED_FIFO scheduling of one thread with a bounded join (realtime)."""
