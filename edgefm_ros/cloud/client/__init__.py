"""The robot's side: base.py (errors, the one ClientConfig, admission, retried POSTs, PendingCall,
breaker/link bookkeeping), policy.py (CloudPolicy for task vla, and the RemotePolicy protocol vla_node
calls) and vqa.py (VqaClient for task vqa: ask, stream)."""
