"""Control plane (FastAPI): transaction and batch state over REST, replay of aborted batches.

Not built yet: see the control-plane issue. The ``api`` extra pins its dependencies.
"""
