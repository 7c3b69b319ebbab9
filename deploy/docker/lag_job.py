"""spark-submit main file for the kmq lag job (SparkApplication mainApplicationFile).

The spark-operator runs a Python file, not a console script; this file runs
``kmq lag-job`` with the application's arguments.
"""

import sys

from kmq.cli import main

if __name__ == "__main__":
    main(["lag-job", *sys.argv[1:]])
