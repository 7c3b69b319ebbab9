"""``kmq ui``: a small web console for kmq queues (overview, DLQ browser, redrive, trace).

Needs the ``ui`` extra (Starlette, Jinja2, uvicorn; ``kmq[ui]``).
Nothing here is imported by ``import kmq``; :mod:`kmq.ui.app` builds the
application, :mod:`kmq.ui.auth` decides who may use it, :mod:`kmq.ui.redrive`
moves chosen dead letters back through :func:`kmq.ops.dlq.replay`.
"""
