"""The pure protocol core: marker codec, offset ranges, settlement rules,
backoff, lease and lag state, copies, retention, trace building and the ledger.

Nothing here does I/O or imports a Kafka client, Redis, Prometheus or Spark
(a contract checked in CI): every function takes its inputs, including the
time, as arguments, so the consumer, the tracker, the Spark job and the
simulator all run the same rules.
"""
