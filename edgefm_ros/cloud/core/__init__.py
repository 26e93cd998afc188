"""What every task shares on the wire (protocol.py: tensors, base64 images, request checks naming the
field, server seconds), on the server's clock (timing.py: the deadline counts from receipt) and in a
task adapter (task.py: what the server and the clients need of a task). No MLServer, no torch."""
