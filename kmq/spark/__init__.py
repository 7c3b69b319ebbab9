"""The Spark lag job (``kmq lag-job``) and its Kafka data source.

Import the submodules explicitly: this package itself imports nothing heavy,
so ``import kmq`` never pulls in pyspark. ``lag_state`` and ``decode`` are
pure Python; ``source``, ``job`` and ``sinks`` need pyspark.
"""
