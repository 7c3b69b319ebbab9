#!/bin/bash
# Entry point of the kmq Spark image (target "spark").
#
# spark-on-kubernetes (and so the spark-operator) starts driver and executor
# pods with the first argument "driver" or "executor"; this follows the
# contract of Apache Spark's resource-managers/kubernetes/docker entrypoint.sh,
# with SPARK_HOME being the pip-installed pyspark. Anything else is a kmq
# command line (default: the lag job in local mode).
set -eo pipefail

case "${1:-}" in
  driver)
    shift
    exec "${SPARK_HOME}/bin/spark-submit" \
      --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS}" \
      --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=${SPARK_DRIVER_BIND_ADDRESS}" \
      --deploy-mode client "$@"
    ;;
  executor)
    shift
    mapfile -t java_opts < <(env | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n | sed 's/[^=]*=\(.*\)/\1/g')
    exec "${JAVA_HOME}/bin/java" "${java_opts[@]}" \
      -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
      -cp "${SPARK_HOME}/jars/*${SPARK_CLASSPATH:+:$SPARK_CLASSPATH}" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "${SPARK_DRIVER_URL}" --executor-id "${SPARK_EXECUTOR_ID}" \
      --cores "${SPARK_EXECUTOR_CORES}" --app-id "${SPARK_APPLICATION_ID}" \
      --hostname "${SPARK_EXECUTOR_POD_IP}" --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID}" \
      --podName "${SPARK_EXECUTOR_POD_NAME}"
    ;;
  *)
    exec kmq "$@"
    ;;
esac
