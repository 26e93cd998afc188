"""The server side: the MLServer runtime for every task (runtime.py), ``edgefm-cloud serve``'s config and
rendered files (settings.py) and its process supervision (serve.py). Only runtime.py imports MLServer."""
